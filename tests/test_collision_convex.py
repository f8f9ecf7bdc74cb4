"""The general convex pairs (collision/convex.py) against MuJoCo C's mjc_Convex (float64).

For each type pair, two free bodies are posed at seeded random configurations:
generic ones (random orientations, penetrating to separated), stacks with
aligned axes (faces, caps and side lines flush: the multi-CCD cases), the
same stacks tilted by ~1 degree, world-aligned poses and concentric geoms.
convex_pairs.xml has every pair in contact in a simulated scene.

How close to MuJoCo. MuJoCo's GJK / EPA stop at ``opt.ccd_tolerance``
(1e-6) or after ``opt.ccd_iterations`` (35); for curved contacts its distance
is then off by up to ~1e-5, its normal by ~1e-2 and its position by ~1e-3,
while diffmj's values are exact to rounding. So the values are compared with
MuJoCo run at ``ccd_tolerance = 1e-14`` and 3000 iterations (TIGHT), within
bounds measured from MuJoCo's own convergence (see TOL["ccd_dist"] below); the
default model is used for the contact count. Where the answer is not unique
MuJoCo's is arbitrary and only the unique parts are compared: the witness
point of side lines or edges lying parallel, the normal of coaxial concentric
geoms, the order of the two contacts of an edge lying on a face, the sign of
the normal of concentric geoms.
"""

from __future__ import annotations

import functools

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj.collision import convex
from diffmj.collision.driver import collision
from diffmj.collision.common import GeomPose, make_frame
from diffmj.collision.pairs import COLLIDERS
from diffmj.enums import GeomType
from diffmj.math import quat_normalize, quat_to_mat
from tests.conftest import TOL, as_numpy, assert_close, check_stage, match_efc, mj_efc_J, mj_model, settled_state
from tests.test_collision_primitive import SPECIAL_QUATS, _extent, _quat_mul, _random_size
from tests.test_solver import assert_solution

NCASE = 96
TIGHT = dict(ccd_tolerance=1e-14, ccd_iterations=3000)
TIGHTER = dict(ccd_tolerance=0, ccd_iterations=20000)  # measures TIGHT's own error

# pair name -> (geom type 1, geom type 2, pair function, contacts per pair)
PAIRS = {
    f"{type1.name.lower()}_{type2.name.lower()}": (type1, type2, c.collide, c.max_contacts)
    for (type1, type2), c in COLLIDERS.items()
    # meshes: test_collision_mesh.py and others; hfields: test_collision_hfield.py
    if c.general_convex and not {GeomType.MESH, GeomType.HFIELD} & {type1, type2}
}


def _model(type1: GeomType, type2: GeomType, multiccd: str = "enable", **option) -> mujoco.MjModel:
    opt = " ".join(f'{k}="{v}"' for k, v in option.items())
    xml = f"""<mujoco><option {opt}><flag gravity="disable" multiccd="{multiccd}"/></option><worldbody>
      <body><freejoint/><geom type="{type1.name.lower()}" size="0.1 0.1 0.1"/></body>
      <body><freejoint/><geom type="{type2.name.lower()}" size="0.1 0.1 0.1"/></body></worldbody></mujoco>"""
    m = mujoco.MjModel.from_xml_string(xml)
    m.geom_rbound[:] = 100  # sizes change per case: disable the bounding filters
    m.geom_aabb[:, 3:] = 100
    return m


def _pose(rng, case: int, type1: GeomType, type2: GeomType, size1, size2):
    """qpos of the two free bodies for one case (cycling through the scenarios)."""
    scenario = case % 4
    special = SPECIAL_QUATS[rng.integers(len(SPECIAL_QUATS), size=2)]
    q1 = rng.standard_normal(4)
    q1 = q1 / np.linalg.norm(q1) if rng.random() < 0.5 else special[0]
    if scenario == 0:  # generic
        q2 = rng.standard_normal(4)
        q2 /= np.linalg.norm(q2)
    else:  # axes aligned with geom 1's (scenario 2: tilted ~1 degree), scenario 3 in the world too
        q1 = special[0] if scenario == 3 else q1
        q2 = _quat_mul(q1, special[1])
        if scenario == 2:
            q2 = _quat_mul(q2, np.array([1, *(rng.standard_normal(3) * 0.01)]))
            q2 /= np.linalg.norm(q2)
    pos1 = rng.uniform(-0.3, 0.3, 3)
    mat1, mat2 = np.zeros(9), np.zeros(9)
    mujoco.mju_quat2Mat(mat1, q1)
    mujoco.mju_quat2Mat(mat2, q2)
    mat1, mat2 = mat1.reshape(3, 3), mat2.reshape(3, 3)
    if scenario == 0 or case % 17 == 0:
        direction = rng.standard_normal(3)
        direction /= np.linalg.norm(direction)
        reach = np.linalg.norm(_extent(type1, size1)) + np.linalg.norm(_extent(type2, size2))
        distance = 0.0 if case % 17 == 0 else reach * rng.uniform(0.2, 1.0)
        pos2 = pos1 + direction * distance
    else:  # geom 2 resting on a face of geom 1, overlapping it partly
        ext1 = _extent(type1, size1)
        ext2 = np.abs(mat1.T @ mat2) @ _extent(type2, size2)
        k = rng.integers(3)
        local = rng.uniform(-1, 1, 3) * np.maximum(ext1 - 0.3 * ext2, 0.01) * 0.8
        local[k] = rng.choice([-1, 1]) * (ext1[k] + ext2[k] - rng.uniform(-0.01, 0.02))
        pos2 = pos1 + mat1 @ local
    return np.concatenate((pos1, q1, pos2, q2))


def _contacts(d: mujoco.MjData):
    return [(c.dist, c.pos.copy(), c.frame[:3].copy()) for c in d.contact[: d.ncon]]


@functools.cache
def _cases(name: str):
    """Inputs (geom positions, rotation matrices, sizes, margin, body quaternions), MuJoCo's contacts (default and TIGHT options) and its TIGHT EPA result (dist,
    position and normal with multi-CCD off; None without contact) for NCASE configurations."""
    type1, type2, _, _ = PAIRS[name]
    models = (_model(type1, type2), _model(type1, type2, **TIGHT), _model(type1, type2, "disable", **TIGHT),
              _model(type1, type2, **TIGHTER))
    datas = [mujoco.MjData(m) for m in models]
    rng = np.random.default_rng(sum(map(ord, name)))
    inputs, default, tight, epa, tighter = [], [], [], [], []
    for case in range(NCASE):
        size1, size2 = _random_size(rng, type1), _random_size(rng, type2)
        margin = rng.uniform(0, 0.05) * (rng.random() < 0.3)
        qpos = _pose(rng, case, type1, type2, size1, size2)
        for m, d in zip(models, datas):
            m.geom_size[:] = [size1, size2]
            m.geom_margin[:] = [margin, 0]
            d.qpos[:] = qpos
            mujoco.mj_forward(m, d)
        inputs.append((datas[0].geom_xpos.copy(), datas[0].geom_xmat.reshape(2, 3, 3).copy(),
                       models[0].geom_size.copy(), margin, qpos.reshape(2, 7)[:, 3:]))
        default.append(_contacts(datas[0]))
        tight.append(_contacts(datas[1]))
        single = _contacts(datas[2])
        epa.append(single[0] if single else None)
        tighter.append(_contacts(datas[3]))
    return tuple(np.stack(x) for x in zip(*inputs)), default, tight, epa, tighter


def _geoms(inputs, dtype=torch.float64):
    """The two geoms and the margin, with MuJoCo's rotation matrices (bit for bit: the same geometry)."""
    xpos, mat, size, margin = (torch.tensor(x, dtype=dtype) for x in inputs[:4])
    return GeomPose(xpos[:, 0], mat[:, 0], size[:, 0]), GeomPose(xpos[:, 1], mat[:, 1], size[:, 1]), margin


@functools.cache
def _ours(name: str):
    """diffmj's contacts and exact solution for the cases of a pair (computed once)."""
    type1, type2, fn, _ = PAIRS[name]
    g1, g2, margin = _geoms(_cases(name)[0])
    out = fn(g1, g2, margin)
    terms1, terms2 = convex._geom_terms(type1, g1), convex._geom_terms(type2, g2)
    return out, convex._penetration(terms1, terms2), convex._difference(terms1, terms2)


@functools.cache
def _quad_ties(name: str):
    """Which cases' multi-CCD contacts are a quadrilateral picked among equally large ones of the
    clipped polygon (a cylinder cap's 16-gon, whole or in part, has many), and every vertex of
    that polygon as a contact (diffmj's contacts with no cap on their number)."""
    type1, type2, fn, maxc = PAIRS[name]
    if maxc == 1:
        return torch.zeros(NCASE, dtype=torch.bool), None
    g1, g2, margin = _geoms(_cases(name)[0])
    sol = _ours(name)[1]
    nseg1 = convex._geom_terms(type1, g1).seg_len.shape[-1]
    tied = convex._multicontact((type1, type2), (g1, g2), sol, nseg1, margin, maxc)[5]
    return tied, convex.collide((type1, type2), g1, g2, margin, convex._CAPACITY)


def _one(terms: convex._Terms, k: int) -> convex._Terms:
    """The terms of pair k alone."""
    return convex._Terms(*(x[k:k + 1] if isinstance(x, torch.Tensor) else x for x in terms))


def _unique_witness(name: str, k: int) -> bool:
    """Whether case k's witness points are unique: its held kinks are independent (not two
    parallel side lines or edges, not a face on a face)."""
    _, sol, terms = _ours(name)
    active = convex._active_constraints(sol.seg_act[k:k + 1], sol.disk_act[k:k + 1])
    rank = convex._feasible_basis(sol.normal[k:k + 1].detach(), convex._constraints(_one(terms, k)), active)[2]
    return int(active.sum()) == int(rank.sum())


def _emitted(out, case: int):
    slots = torch.isfinite(out.dist[case]).nonzero()[:, 0]
    frame = make_frame(out.normal[case], out.tangent[case])
    return [(float(out.dist[case, s]), out.pos[case, s].detach().numpy(), frame[s, 0].detach().numpy())
            for s in slots]



# How MuJoCo's values are compared (measured, see below).
# - Distances to TOL["ccd_dist"]. MuJoCo's own answer certifies an interval for the true minimum of the
#   support function f: its reported depth -dist is a lower bound (EPA's polytope lies inside the
#   Minkowski difference; GJK's simplex too) and f at its normal an upper bound. Where that
#   interval is wider than TOL["ccd_dist"], MuJoCo has not converged even at TIGHT options (coaxial
#   concentric geoms: a whole circle of minima; measured up to 1.7e-5) and diffmj's depth must lie
#   in it instead (up to rounding, VALUE_ROUNDING).
# - Normals to 1e-9 + SQRT_FACTOR * sqrt(excess + VALUE_ROUNDING), where excess =
#   f(MuJoCo's normal) - f(diffmj's normal) >= -VALUE_ROUNDING (checked: no direction of MuJoCo's
#   has a lower value). EPA locates the normal as the minimiser of support values, which fixes it
#   only to within sqrt(2 excess / curvature): measured, MuJoCo's normals move by up to 6e-7
#   between TIGHT and TIGHTER while its distances agree to 1e-14, and its values carry ~1e-15 of
#   rounding (VALUE_ROUNDING) even when converged. SQRT_FACTOR = 4 bounds sqrt(2 / curvature) for
#   these sizes (measured ratios |normal error| / sqrt(excess) <= 3.6). Where the normal is not
#   unique (f flat along the held kinks) it is not compared.
# - Positions to the same bound plus TIGHT's own position error, measured against TIGHTER (EPA's
#   witness points come from barycentric coordinates on its last face: up to 7.5e-7 off at TIGHT
#   on crossing cylinder side lines of deeply penetrating geoms, where the normal is exact).
# - Concentric geoms have f(u) = f(-u): either sign of the normal is a minimum, and MuJoCo's runs
#   pick either. A single contact is compared with MuJoCo's or its mirror image through the centre;
#   multi-CCD contacts are not mirror images (the clipped 16-gon's vertex order, which breaks ties
#   between equal-area quadrilaterals, is not), so they are compared with whichever of MuJoCo's
#   TIGHT and default runs picked diffmj's sign (face contacts do not depend on the EPA tolerance).
# - Where the multi-CCD contacts are a quadrilateral among equally large ones (_quad_ties), MuJoCo's
#   strict area comparisons pick one by the last bit of their rounding: the choice flips between
#   CPUs (numpy's BLAS rounds the seeded poses differently) while diffmj keeps the first of equal
#   ones. There each of MuJoCo's contacts is compared with the nearest vertex of diffmj's polygon.
SQRT_FACTOR = 4.0
VALUE_ROUNDING = 1e-15


def _outside(kind: GeomType, pos, mat, size, point) -> float:
    """An upper bound on the distance from ``point`` to the geom (0 inside)."""
    x, y, z = mat.T @ (point - pos)
    if kind == GeomType.SPHERE:
        return max(np.linalg.norm((x, y, z)) - size[0], 0)
    if kind == GeomType.CAPSULE:
        return max(np.linalg.norm((x, y, z - np.clip(z, -size[1], size[1]))) - size[0], 0)
    if kind == GeomType.CYLINDER:
        return np.hypot(max(np.hypot(x, y) - size[0], 0), max(abs(z) - size[1], 0))
    if kind == GeomType.BOX:
        return np.linalg.norm(np.maximum(np.abs((x, y, z)) - size, 0))
    k = np.linalg.norm(np.array((x, y, z)) / size)  # ellipsoid: (x, y, z) / k is on its surface
    return max(np.linalg.norm((x, y, z)) * (1 - 1 / k), 0)


def _f(name: str, case: int, u) -> float:
    """diffmj's support function f of case ``case`` at the unit vector u [3]."""
    t = _one(_ours(name)[2], case)
    return float(convex._value(t, torch.as_tensor(u, dtype=torch.float64)[None])[0])


def _unique_normal(name: str, case: int) -> bool:
    """Whether diffmj's normal is an isolated minimum: f curves up along every direction the held
    kinks leave free (coaxial concentric geoms have a circle of minima)."""
    _, sol, terms = _ours(name)
    t, u = _one(terms, case), sol.normal[case:case + 1].detach()
    seg_act, disk_act = sol.seg_act[case:case + 1], sol.disk_act[case:case + 1]
    b1, b2, rank, _, _ = convex._feasible_basis(u, convex._constraints(t), convex._active_constraints(seg_act, disk_act))
    _, g, h = convex._evaluate(t, u, seg_act, disk_act)
    basis = torch.stack((b1, b2), -1)[0, :, : max(0, 2 - int(rank))]
    curvature = basis.T @ (h[0] - (u[0] @ g[0]) * torch.eye(3, dtype=u.dtype)) @ basis
    return bool((torch.linalg.eigvalsh(curvature) > 1e-8).all())


def _reflected(contacts, center: np.ndarray):
    """Contacts mirrored through ``center``."""
    return [(dist, 2 * center - pos, -normal) for dist, pos, normal in contacts]


def _errors(ours, theirs) -> tuple[float, ...]:
    """Largest dist, position and normal differences of two equally long contact lists."""
    return tuple(max((np.abs(np.asarray(a[i]) - b[i]).max() for a, b in zip(ours, theirs)), default=0.0)
                 for i in range(3))


def _best_match(ours, options: list, center: np.ndarray | None):
    """Of MuJoCo's contact lists ``options`` as long as ours (None if none is), the one nearest
    ours, in the order nearest ours (the two contacts of an edge on a face come in either order)
    and, for concentric geoms (``center`` not None), possibly mirrored."""
    options = [o for o in options if len(o) == len(ours)]
    if center is not None:
        options += [_reflected(o, center) for o in options]
    if len(ours) == 2:
        options += [o[::-1] for o in options]
    return min(options, key=lambda o: max(_errors(ours, o)), default=None)


@pytest.mark.parametrize("name", PAIRS)
def test_matches_mujoco(name):
    """Contact count as MuJoCo's (default options); dist, normal and position as MuJoCo's at
    TIGHT options, within the bounds explained above."""
    inputs, default, tight, epa, tighter = _cases(name)
    out, sol, _ = _ours(name)
    ncon = [len(c) for c in default]
    assert sum(ncon) > NCASE // 4 and ncon.count(0) > NCASE // 20  # both outcomes exercised
    if PAIRS[name][3] > 1:
        assert max(ncon) > 1  # multi-CCD exercised
    compared = 0
    for case in range(NCASE):
        ours = _emitted(out, case)
        assert len(ours) == len(default[case]), f"case {case}: {len(ours)} contacts, MuJoCo {len(default[case])}"
        if not ours:
            continue
        assert len(tight[case]) == len(ours), f"case {case}: TIGHT MuJoCo has {len(tight[case])} contacts"
        concentric = bool(np.all(inputs[0][case, 0] == inputs[0][case, 1]))
        center = inputs[0][case, 0] if concentric else None
        theirs = _best_match(ours, [tight[case]] + [default[case]] * (concentric and len(ours) > 1), center)
        if _quad_ties(name)[0][case]:
            vertices = _emitted(_quad_ties(name)[1], case)
            ours = [min(vertices, key=lambda v: max(_errors([v], [c]))) for c in theirs]
        again = _best_match(theirs, [tighter[case]], center)
        self_error = _errors(theirs, again)[1] if again is not None else 0.0

        epa_dist, epa_pos, epa_normal = epa[case]
        depth, upper = -float(sol.dist[case]), _f(name, case, epa_normal)
        excess = upper - depth
        assert excess >= -VALUE_ROUNDING, f"case {case}: MuJoCo's normal has a lower support value by {-excess:.1e}"
        converged = upper + epa_dist <= TOL["ccd_dist"]
        if not converged:
            # separated: MuJoCo's distance bounds the true one only up to how far its witness points
            # lie outside the geoms (GJK's rounding: measured 8.3e-13 on cylinder_box case 10 with the
            # poses numpy's Haswell BLAS kernel gives, as on AMD Zen 2/3; elsewhere <= 5e-16)
            if epa_dist > 0:
                epa_dist += sum(_outside(PAIRS[name][g], inputs[0][case, g], inputs[1][case, g], inputs[2][case, g],
                                         epa_pos + (g - 0.5) * epa_dist * epa_normal) for g in range(2))
            assert -epa_dist - VALUE_ROUNDING <= depth, f"case {case}: depth {depth} below MuJoCo's bound {-epa_dist}"
        tol = 1e-9 + SQRT_FACTOR * np.sqrt(excess + VALUE_ROUNDING)
        unique_normal = _unique_normal(name, case)
        unique_witness = unique_normal and _unique_witness(name, case)
        compared += unique_witness
        for slot, ((dist, pos, normal), (mjdist, mjpos, mjnormal)) in enumerate(zip(ours, theirs)):
            where = f"case {case} slot {slot}"
            if converged:
                assert_close(f"{where} dist", dist, mjdist, TOL["ccd_dist"])
            if unique_normal:
                assert_close(f"{where} normal", normal, mjnormal, tol)
            if unique_witness:
                assert_close(f"{where} pos", pos, mjpos, tol + self_error)
    assert compared > NCASE // 4


def _posed(xpos: torch.Tensor, quat: torch.Tensor, size: torch.Tensor):
    """The two geoms [n] from positions [n, 2, 3], (unnormalised) quaternions [n, 2, 4], sizes [n, 2, 3]."""
    mat = quat_to_mat(quat_normalize(quat))
    return GeomPose(xpos[:, 0], mat[:, 0], size[:, 0]), GeomPose(xpos[:, 1], mat[:, 1], size[:, 1])


def _emitted_sum(out) -> torch.Tensor:
    """Sum of dist and pos over the emitted contacts."""
    finite = torch.isfinite(out.dist)
    return torch.where(finite, out.dist, 0).sum() + (out.pos * finite[..., None]).sum()


@pytest.mark.parametrize("name", PAIRS)
def test_gradients_finite(name):
    """d(dist + pos of the emitted contacts) / d(positions, rotations) is finite in every case,
    degenerate ones (concentric, flush, parallel) included."""
    fn = PAIRS[name][2]
    inputs = _cases(name)[0]
    xpos, quat, size, margin = (torch.tensor(inputs[k]) for k in (0, 4, 2, 3))
    xpos.requires_grad_(), quat.requires_grad_()
    for grad in torch.autograd.grad(_emitted_sum(fn(*_posed(xpos, quat, size), margin)), (xpos, quat)):
        assert torch.isfinite(grad).all()


@pytest.mark.slow
@pytest.mark.parametrize("name", PAIRS)
def test_gradcheck(name):
    """Analytic gradients of dist and pos w.r.t. positions and quaternions match central finite
    differences at generic configurations with contacts."""
    fn = PAIRS[name][2]
    inputs, default = _cases(name)[:2]
    cases = [c for c in range(NCASE) if c % 4 == 0 and c % 17 and default[c]][:3]
    xpos, quat, size, margin = (torch.tensor(inputs[k][cases]) for k in (0, 4, 2, 3))
    valid = torch.isfinite(fn(*_posed(xpos, quat, size), margin).dist)  # fixed: no contact flips

    def emitted(xpos, quat):
        out = fn(*_posed(xpos, quat, size), margin)
        return torch.where(valid, out.dist, 0), out.pos * valid[..., None]

    assert valid.any()
    args = (xpos.requires_grad_(), quat.requires_grad_())
    assert torch.autograd.gradcheck(emitted, args, eps=1e-7, atol=1e-6, fast_mode=True)


@pytest.mark.parametrize("name", PAIRS)
def test_vmap(name):
    """torch.vmap over the pairs (each call sees one pair) gives the batched call's numbers."""
    fn, some = PAIRS[name][2], slice(0, NCASE, 3)
    g1, g2, margin = _geoms(tuple(x[some] for x in _cases(name)[0]))
    mapped = torch.vmap(fn)(g1, g2, margin)
    for a, b in zip(_ours(name)[0], mapped):
        torch.testing.assert_close(b, a[some], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("name", PAIRS)
def test_float32(name):
    """float32 inputs give finite float32 contacts; the exact contact's distance is close to the
    float64 one. (Multi-CCD contacts are not compared: its choice among equal-area
    quadrilaterals of a cap's 16-gon, and the order of an edge's two contacts, follow rounding.)"""
    type1, type2, fn, _ = PAIRS[name]
    inputs = _cases(name)[0]
    out64, out32 = _ours(name)[0], fn(*_geoms(inputs, torch.float32))
    assert all(x.dtype == torch.float32 for x in out32)
    emitted = torch.isfinite(out32.dist)
    assert torch.isfinite(out32.pos[emitted]).all() and torch.isfinite(out32.normal[emitted]).all()
    agree = (emitted == torch.isfinite(out64.dist)).all(-1)
    assert agree.float().mean() > 0.9  # contact decisions may flip at float32 rounding
    g1, g2, _ = _geoms(inputs, torch.float32)
    dist32 = convex._penetration(convex._geom_terms(type1, g1), convex._geom_terms(type2, g2)).dist
    assert dist32.dtype == torch.float32
    torch.testing.assert_close(dist32.double(), _ours(name)[1].dist, rtol=0, atol=1e-5)


# Model level: the frames of curved contacts carry MuJoCo's own EPA error even at the model's tight
# ccd_tolerance (see the bounds above; measured up to 2e-7 in these states, positions 9e-9), and so
# does efc_J, which is linear in them (measured 3e-7): TOL["ccd_contact"]; distances to TOL["ccd_dist"].


@pytest.mark.parametrize("steps", [20, 50])
def test_model_contacts_and_solution(steps):
    """convex_pairs.xml (every general convex pair in contact) from a MuJoCo C state: contacts,
    efc_J and the converged qacc."""
    mjm = mj_model("convex_pairs")
    mjd = settled_state(mjm, steps)
    m = diffmj.put_model(mjm)
    types = {tuple(sorted(mjm.geom_type[c.geom])) for c in mjd.contact[: mjd.ncon]}
    assert len(types & {key for key, c in COLLIDERS.items() if c.general_convex}) >= 5
    tol = {"contact.dist": TOL["ccd_dist"], "contact.pos": TOL["ccd_contact"], "contact.frame": TOL["ccd_contact"]}
    check_stage(collision, m, mjd, ("contact",), tol)
    out = diffmj.forward(m, diffmj.put_data(m, mjd))
    ours, theirs = match_efc(m, out, mjd)
    assert_close("efc_J", as_numpy(out.efc_J)[ours], mj_efc_J(mjm, mjd)[theirs], TOL["ccd_contact"])
    assert_solution(m, out, mjm, mjd)


@pytest.mark.parametrize("name", [name for name, pair in PAIRS.items() if pair[3] > 1])
def test_ulp_stable(name):
    """Moving geom 2 by one ulp leaves the multi-CCD contacts as they are: no choice among equally
    valid contacts (equal-area quadrilaterals of a cap's 16-gon) follows the last bit.
    Concentric cases are left out: their normal's sign is arbitrary (see above); the two contacts
    of an edge lying on a face may swap (their order follows near-duplicate clipped vertices)."""
    fn = PAIRS[name][2]
    inputs = _cases(name)[0]
    g1, g2, margin = _geoms(inputs)
    moved = GeomPose(torch.nextafter(g2.pos, torch.full_like(g2.pos, torch.inf)), g2.mat, g2.size)
    out, again = _ours(name)[0], fn(g1, moved, margin)
    for case in range(NCASE):
        if case % 17:
            ours, theirs = _emitted(out, case), _emitted(again, case)
            assert len(ours) == len(theirs), f"case {case}"
            theirs = _best_match(ours, [theirs], None)
            assert max(_errors(ours, theirs), default=0) < 1e-9, f"case {case}: {_errors(ours, theirs)}"
