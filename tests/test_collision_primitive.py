"""Parity of the primitive narrow-phase pair functions with MuJoCo C (float64).

For each geom-type pair, a two-geom model (free bodies; a plane sits in the
world body) is posed at seeded random configurations: penetrating,
near-touching, separated within and beyond a positive margin, and degenerate
ones (aligned boxes, parallel capsules, concentric spheres, cylinder axes
parallel or perpendicular to a plane, ...). ``mj_forward`` gives MuJoCo's
contacts; the pair function, applied to MuJoCo's geom poses, must give the
same number of contacts (finite-dist slots) with the same dist, pos and
frame, in the same order.
"""

from __future__ import annotations

import functools

import mujoco
import numpy as np
import pytest
import torch

from diffmj.collision.common import GeomPose, make_frame
from diffmj.collision.pairs import COLLIDERS
from diffmj.enums import GeomType
from tests.conftest import assert_close

NCASE = 200

# pair name -> (geom type 1, geom type 2, pair function, contacts per pair)
PAIRS = {
    f"{type1.name.lower()}_{type2.name.lower()}": (type1, type2, c.collide, c.max_contacts)
    for (type1, type2), c in COLLIDERS.items()
    if not c.general_convex and GeomType.MESH not in (type1, type2)  # meshes: test_collision_mesh.py
}

# rotations that produce exactly aligned / perpendicular axes (quaternions w, x, y, z)
_S = np.sqrt(0.5)
SPECIAL_QUATS = np.array([
    [1, 0, 0, 0], [_S, _S, 0, 0], [_S, 0, _S, 0], [_S, 0, 0, _S], [0, 1, 0, 0],
    [0.5, 0.5, 0.5, 0.5],
])


def _xml(type1: GeomType, type2: GeomType) -> str:
    def geom(t: GeomType) -> str:
        return f'<geom type="{t.name.lower()}" size="0.1 0.1 0.1"/>'

    first = geom(type1) if type1 == GeomType.PLANE else f"<body><freejoint/>{geom(type1)}</body>"
    return f"""<mujoco><option><flag gravity="disable"/></option><worldbody>
      {first}<body><freejoint/>{geom(type2)}</body></worldbody></mujoco>"""


def _random_size(rng, geom_type: GeomType) -> np.ndarray:
    size = rng.uniform(0.05, 0.5, 3)
    if geom_type == GeomType.SPHERE:
        size[1:] = 0
    elif geom_type in (GeomType.CAPSULE, GeomType.CYLINDER):
        size[2] = 0
    elif geom_type == GeomType.PLANE:
        size = np.array([0.0, 0.0, 1.0])
    return size


def _rbound(geom_type: GeomType, size: np.ndarray) -> float:
    return {
        GeomType.PLANE: 0.0, GeomType.SPHERE: size[0], GeomType.CAPSULE: size[0] + size[1],
        GeomType.ELLIPSOID: size.max(), GeomType.CYLINDER: np.hypot(size[0], size[1]),
        GeomType.BOX: np.linalg.norm(size),
    }[geom_type]


def _random_quat(rng) -> np.ndarray:
    q = rng.standard_normal(4)
    return q / np.linalg.norm(q)


def _quat_mul(a, b):
    res = np.zeros(4)
    mujoco.mju_mulQuat(res, a, b)
    return res


def _extent(geom_type: GeomType, size: np.ndarray) -> np.ndarray:
    """Half-extent of a geom along its local axes."""
    r = size[0]
    return {
        GeomType.SPHERE: np.full(3, r), GeomType.CAPSULE: np.array([r, r, r + size[1]]),
        GeomType.ELLIPSOID: size, GeomType.CYLINDER: np.array([r, r, size[1]]), GeomType.BOX: size,
    }[geom_type]


def _pose(rng, case: int, type1: GeomType, type2: GeomType, size1, size2):
    """Positions and orientations of the two geoms for one case (cycling through scenarios)."""
    rb1, rb2 = _rbound(type1, size1), _rbound(type2, size2)
    scenario = case % 6
    special = SPECIAL_QUATS[rng.integers(len(SPECIAL_QUATS), size=2)]
    if scenario in (0, 1):  # generic
        q1, q2 = _random_quat(rng), _random_quat(rng)
    elif scenario == 2:  # exactly axis-aligned (plane normal / box faces / capsule axes)
        q1, q2 = special
    elif scenario in (3, 5):  # same arbitrary orientation, or a quarter turn from it
        q1 = _random_quat(rng)
        q2 = q1 if rng.random() < 0.5 else _quat_mul(q1, special[1])
    else:  # small tilt from aligned
        q1 = special[0]
        q2 = _quat_mul(special[1], _random_quat(rng) * [1e3, 1, 1, 1])
        q2 /= np.linalg.norm(q2)
    pos1 = rng.uniform(-0.5, 0.5, 3)
    direction = rng.standard_normal(3)
    if scenario in (2, 4) and rng.random() < 0.5:  # offset along a coordinate axis
        direction = np.eye(3)[rng.integers(3)] * rng.choice([-1, 1])
    direction /= np.linalg.norm(direction)
    mat1 = np.zeros(9)
    mujoco.mju_quat2Mat(mat1, q1)
    mat1 = mat1.reshape(3, 3)
    if type1 == GeomType.PLANE:
        normal = mat1[:, 2]
        height = rb2 * rng.uniform(-0.6, 1.3)
        tangential = direction - normal * direction.dot(normal)
        pos2 = pos1 + normal * height + tangential * rng.uniform(0, 1)
    elif scenario == 5:  # resting on a face of geom1, side faces flush or nearly so
        ext1, ext2 = _extent(type1, size1), _extent(type2, size2)
        k = rng.integers(3)
        local = (ext1 - ext2) * rng.choice([-1, 0, 1], 3) + rng.choice([0, 1e-12, -1e-12, 1e-7], 3)
        local[k] = rng.choice([-1, 1]) * (ext1[k] + ext2[k]) * rng.uniform(0.9, 1.02)
        pos2 = pos1 + mat1 @ local
    else:
        distance = (rb1 + rb2) * rng.uniform(0, 1.2)
        if case % 17 == 0:  # concentric
            distance = 0.0
        pos2 = pos1 + direction * distance
    return pos1, q1, pos2, q2


@functools.cache
def _mujoco_cases(name: str):
    """Inputs and MuJoCo's contacts for NCASE random configurations of one pair type."""
    type1, type2, _, _ = PAIRS[name]
    m = mujoco.MjModel.from_xml_string(_xml(type1, type2))
    d = mujoco.MjData(m)
    m.geom_rbound[:] = 100  # sizes change per case: disable the bounding filters
    m.geom_aabb[:, 3:] = 100
    rng = np.random.default_rng(sum(map(ord, name)))
    inputs, contacts = [], []
    for case in range(NCASE):
        size1, size2 = _random_size(rng, type1), _random_size(rng, type2)
        if case % 11 == 0 and type1 == type2:  # identical geoms
            size2 = size1.copy()
        m.geom_size[:] = [size1, size2]
        margin = rng.uniform(0, 0.1, 2) * (rng.random(2) < 0.5)
        gap = rng.uniform(0, 0.05, 2) * (rng.random(2) < 0.25)
        m.geom_margin[:], m.geom_gap[:] = margin, gap
        pos1, q1, pos2, q2 = _pose(rng, case, type1, type2, size1, size2)
        if type1 == GeomType.PLANE:
            m.geom_pos[0], m.geom_quat[0] = pos1, q1
            d.qpos[:] = np.concatenate((pos2, q2))
        else:
            d.qpos[:] = np.concatenate((pos1, q1, pos2, q2))
        mujoco.mj_forward(m, d)
        con = d.contact[: d.ncon]
        assert all((c.geom == (0, 1)).all() for c in con)  # geom1 is the lower type
        inputs.append((d.geom_xpos.copy(), d.geom_xmat.reshape(-1, 3, 3).copy(), m.geom_size.copy(),
                       margin.sum() + gap.sum()))
        contacts.append([(c.dist, c.pos.copy(), c.frame.reshape(3, 3).copy()) for c in con])
    xpos, xmat, size, margins = (np.stack(x) for x in zip(*inputs))
    return (xpos, xmat, size, margins), contacts


def _geoms(inputs, dtype=torch.float64, requires_grad=False):
    xpos, xmat, size, margin = (torch.tensor(x, dtype=dtype) for x in inputs)
    leaves = [t.requires_grad_(requires_grad) for t in (xpos, xmat, size)]
    g1 = GeomPose(xpos[:, 0], xmat[:, 0], size[:, 0])
    g2 = GeomPose(xpos[:, 1], xmat[:, 1], size[:, 1])
    return g1, g2, margin, leaves


@pytest.mark.parametrize("name", PAIRS)
def test_matches_mujoco(name):
    fn, k = PAIRS[name][2], PAIRS[name][3]
    inputs, contacts = _mujoco_cases(name)
    g1, g2, margin, _ = _geoms(inputs)
    out = fn(g1, g2, margin)
    assert out.dist.shape == (NCASE, k) and out.pos.shape == (NCASE, k, 3)
    frame = make_frame(out.normal, out.tangent)
    ncon = [len(c) for c in contacts]
    assert sum(ncon) > NCASE // 4 and ncon.count(0) > NCASE // 20  # both outcomes exercised
    for case, expected in enumerate(contacts):
        slots = torch.isfinite(out.dist[case]).nonzero()[:, 0]
        assert len(slots) == len(expected), f"case {case}: {len(slots)} != {len(expected)}"
        for slot, (dist, pos, mjframe) in zip(slots, expected):
            where = f"case {case} slot {int(slot)}"
            assert_close(f"{where} dist", out.dist[case, slot], dist)
            assert_close(f"{where} pos", out.pos[case, slot], pos)
            assert_close(f"{where} frame", frame[case, slot], mjframe)


@pytest.mark.parametrize("name", PAIRS)
def test_gradients_finite(name):
    """d(dist, pos, normal of emitted contacts) / d(pos, mat, size) is finite in every case,
    degenerate ones included."""
    fn = PAIRS[name][2]
    inputs, _ = _mujoco_cases(name)
    g1, g2, margin, leaves = _geoms(inputs, requires_grad=True)
    out = fn(g1, g2, margin)
    finite = torch.isfinite(out.dist)
    total = (torch.where(finite, out.dist, 0).sum() + (out.pos * finite[..., None]).sum()
             + (out.normal * finite[..., None]).sum())
    grads = torch.autograd.grad(total, leaves, allow_unused=True)
    for leaf, grad in zip(("pos", "mat", "size"), grads):
        assert grad is None or torch.isfinite(grad).all(), f"{leaf} gradient not finite"


@pytest.mark.parametrize("name", PAIRS)
def test_gradcheck(name):
    """Analytic gradients match finite differences at generic configurations with contacts.

    MuJoCo puts capsule-box's second point exactly where the capsule axis leaves the box
    (on a face plane of the box), a kink of the sphere-box clamp with only one-sided
    derivatives; only its first contact is checked.
    """
    fn = PAIRS[name][2]
    slots = 1 if name == "capsule_box" else PAIRS[name][3]
    inputs, contacts = _mujoco_cases(name)
    cases = [c for c in range(NCASE) if c % 6 in (0, 1) and c % 17 and contacts[c]][:3]
    xpos, xmat, size, margin = (torch.tensor(x[cases]) for x in inputs)

    def emitted(xpos, xmat, size):
        g1 = GeomPose(xpos[:, 0], xmat[:, 0], size[:, 0])
        g2 = GeomPose(xpos[:, 1], xmat[:, 1], size[:, 1])
        dist, pos, normal, _ = (x[:, :slots] for x in fn(g1, g2, margin))
        finite = torch.isfinite(dist)
        return torch.where(finite, dist, 0), pos * finite[..., None], normal * finite[..., None]

    args = tuple(x.requires_grad_() for x in (xpos, xmat, size))
    assert torch.autograd.gradcheck(emitted, args, eps=1e-7, atol=1e-6)


@pytest.mark.parametrize("name", PAIRS)
def test_vmap(name):
    """An extra batch dimension under torch.vmap gives the same numbers."""
    fn = PAIRS[name][2]
    inputs, _ = _mujoco_cases(name)
    g1, g2, margin, _ = _geoms(inputs)
    direct = fn(g1, g2, margin)
    batch = lambda x: x.reshape(4, -1, *x.shape[1:])  # noqa: E731
    mapped = torch.vmap(fn)(GeomPose(*map(batch, g1)), GeomPose(*map(batch, g2)), batch(margin))
    for a, b in zip(direct, mapped):
        torch.testing.assert_close(b.reshape(a.shape), a, rtol=0, atol=0)


@pytest.mark.parametrize("name", PAIRS)
def test_float32(name):
    """float32 inputs give float32 outputs close to the float64 ones."""
    fn = PAIRS[name][2]
    inputs, _ = _mujoco_cases(name)
    out64 = fn(*_geoms(inputs)[:3])
    out32 = fn(*_geoms(inputs, torch.float32)[:3])
    assert all(x.dtype == torch.float32 for x in out32)
    agree = torch.isfinite(out32.dist) == torch.isfinite(out64.dist)
    assert agree.float().mean() > 0.95  # contact decisions may flip at float32 rounding
    both = (agree & torch.isfinite(out64.dist)).all(-1)
    torch.testing.assert_close(out32.dist[both].double(), out64.dist[both], rtol=0, atol=1e-4)


def test_make_frame_degenerate():
    """make_frame at zero tangents and tangents along the normal: mju_makeFrame's fallbacks,
    finite gradients. (Its values are compared with MuJoCo in every contact frame of
    test_matches_mujoco.)"""
    f64 = dict(dtype=torch.float64)
    normal = torch.tensor([[0.0, 0, 2], [0, 0.8, 0], [0.3, -0.4, 0.5]], **f64, requires_grad=True)
    tangent = torch.tensor([[0.0, 0, 0], [0, 0, 0], [0.6, -0.8, 1]], **f64, requires_grad=True)
    frame = make_frame(normal, tangent)
    expected = torch.tensor(
        [[[0.0, 0, 1], [0, 1, 0], [-1, 0, 0]], [[0, 1, 0], [0, 0, 1], [1, 0, 0]]], **f64
    )
    torch.testing.assert_close(frame[:2], expected)  # default tangents (0, 1, 0) and (0, 0, 1)
    # a tangent along the normal leaves y = 0 after orthogonalisation: mju_normalize3 gives x
    torch.testing.assert_close(frame[2, 1], torch.tensor([1.0, 0, 0], **f64))
    for grad in torch.autograd.grad(frame.sum(), (normal, tangent)):
        assert torch.isfinite(grad).all()


@pytest.mark.slow
@pytest.mark.parametrize("name", PAIRS)
def test_compile(name):
    """torch.compile(fullgraph=True) gives the eager numbers."""
    fn = PAIRS[name][2]
    inputs, _ = _mujoco_cases(name)
    args = _geoms(inputs)[:3]
    compiled = torch.compile(fn, fullgraph=True)(*args)
    for a, b in zip(fn(*args), compiled):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


@pytest.mark.slow  # 2-4 minutes of inductor compile each
@pytest.mark.parametrize("name", ["capsule_box", "box_box"])
def test_compiled_reverse_mode_jacobian(name):
    """jacrev of the contacts mapped over cases, compiled by inductor, gives eager's Jacobians. Under vmap
    index_select's backward (an index_add into an expanded zero tensor) was summed over the mapped rows by
    torch 2.13's inductor: capsule-box's Jacobians were off by up to 3.6 in 3 of 4 cases."""
    fn = PAIRS[name][2]
    inputs, contacts = _mujoco_cases(name)
    cases = [c for c in range(NCASE) if contacts[c]][:4]
    xpos, xmat, size, margin = (torch.tensor(x[cases]) for x in inputs)

    def emitted(xpos, xmat, size, margin):
        g1 = GeomPose(xpos[None, 0], xmat[None, 0], size[None, 0])
        g2 = GeomPose(xpos[None, 1], xmat[None, 1], size[None, 1])
        dist, pos, _, _ = fn(g1, g2, margin[None])
        finite = torch.isfinite(dist)
        return torch.cat((torch.where(finite, dist, 0).flatten(), (pos * finite[..., None]).flatten()))

    jacobians = torch.vmap(torch.func.jacrev(emitted, argnums=(0, 1, 2)))
    torch._dynamo.reset()
    compiled = torch.compile(jacobians, fullgraph=True)(xpos, xmat, size, margin)
    for ours, eager in zip(compiled, jacobians(xpos, xmat, size, margin)):
        torch.testing.assert_close(ours, eager, rtol=1e-12, atol=1e-12)
