"""Cylinder-mesh (collision/mesh_convex.py) against MuJoCo C (float64).

MuJoCo's GJK / EPA run at ccd_tolerance 1e-14; diffmj's signed distance is
exact, so the distances agree to rounding (TOL["ccd_dist"]) and positions
and normals to MuJoCo's convergence error (TOL["ccd_contact"]), as for the
other mesh pairs. A rim point against a hull edge is a curved contact, where
MuJoCo's EPA locates the normal only to ~sqrt of its error in the support
sum, as for ellipsoid-mesh: f at MuJoCo's single-contact normal (multi-CCD
off) exceeds f at diffmj's by ``excess`` >= 0 (measured up to 2e-10), and
normals and positions are compared to 1e-9 + SQRT_FACTOR sqrt(excess)
(measured normal differences up to 1.6e-6). A side line clipped by a face
starts at the single contact's rim point, so its contacts' distances carry
that error too (measured 1.1e-7) and are compared to the same bound. The meshes are random convex hulls (Gaussian clouds,
flattened) and a box-shaped mesh (coplanar triangles); the cylinder at
seeded random poses, standing nearly upright above the hull (a cap within
~5 degrees of a hull face: up to 4 contacts) or lying nearly flat (a side
line on a face: 2); with and without margin. Where the four contacts are
a quadrilateral among equally large ones of the clipped polygon (a cap's
16-gon, whole or in part, has many: ``convex.largest_quad``), MuJoCo's
strict comparisons pick one by the last bit of their rounding, diffmj the
first: there each of MuJoCo's contacts is compared with the nearest vertex
of diffmj's clipped polygon, as in test_collision_convex.py.
"""

from __future__ import annotations

import copy

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj.collision import convex, mesh_convex
from diffmj.collision.common import GeomPose, MeshPose
from diffmj.collision.driver import collision
from diffmj.collision.mesh import mesh_shape
from diffmj.collision.mesh_convex import cylinder_mesh, mesh_polytope
from tests.conftest import (CCD_TOL, TOL, as_numpy, assert_close, compare_contacts, emitted_contacts,
                            finite_gradients_when_lowered, free_pair_model, mujoco_states, vmap_equals_batched)
from tests.test_collision_convex import SQRT_FACTOR, VALUE_ROUNDING

BOX = np.array([[x, y, z] for x in (-.1, .1) for y in (-.08, .08) for z in (-.04, .04)])


def _pair_model(margin: float, seed: int = 0, size: str = ".03 .05") -> mujoco.MjModel:
    """A free cylinder (geom 0) and a free mesh (geom 1): a random hull, or the box (seed None)."""
    cloud = BOX if seed is None else \
        np.random.default_rng(seed).standard_normal((20, 3)) * 0.1 * np.array([1, 1, 0.4])
    return free_pair_model(f'<mesh name="m" vertex="{" ".join(map(str, cloud.ravel()))}"/>',
                           f'<geom name="can" type="cylinder" size="{size}" margin="{margin}"/>',
                           '<geom name="hull" type="mesh" mesh="m"/>')


def _poses(rng, count: int, mode: str):
    """qpos of the two free bodies: random, the cylinder upright ("cap") or lying ("side") above the hull,
    both tilted by a few degrees."""
    for _ in range(count):
        if mode == "random":
            quat = rng.standard_normal((2, 4))
            pos = rng.uniform(-0.12, 0.12, (2, 3))
        else:
            lying = [np.cos(np.pi / 4), 0, np.sin(np.pi / 4), 0]  # the axis (z) turned about y to lie along x
            quat = np.array([lying if mode == "side" else [1, 0, 0, 0], [1, 0, 0, 0]]) + \
                rng.standard_normal((2, 4)) * 0.02
            pos = np.array([[*rng.uniform(-0.05, 0.05, 2), rng.uniform(0.0, 0.15)], [0, 0, 0]])
        yield np.concatenate((pos, quat / np.linalg.norm(quat, axis=1, keepdims=True)), 1).ravel()


def _pair_inputs(m: diffmj.Model, d: diffmj.Data, margin: float):
    """(the cylinder, the mesh as a MeshPose, margin) of the two-geom model, batched over one pair."""
    plan = m.collision_plan
    cylinder, hull = (GeomPose(d.geom_xpos[[g]], d.geom_xmat[[g]], m.geom_size[[g]]) for g in (0, 1))
    return cylinder, MeshPose(hull, mesh_shape(plan.meshes, plan.geom_mesh[[1]])), torch.full((1,), margin,
                                                                                            dtype=torch.float64)


def _polygon_if_tied(m: diffmj.Model, d: diffmj.Data, margin: float):
    """Where the pose's four contacts are a quadrilateral among equally large ones: every vertex of the
    clipped polygon within the margin as a contact (dist [k], pos [k, 3], normal [k, 3]); else None."""
    cylinder, hull, margin = _pair_inputs(m, d, margin)
    p = mesh_polytope(hull)
    con = mesh_convex.cylinder_contact(cylinder, p)
    if not mesh_convex._cylinder_multicontact(cylinder, p, con, margin)[5]:
        return None
    every = max(convex._CAPACITY, 2 * p.poly_vert.shape[-1] + 4)
    _, dist, pos, normal, count, _ = mesh_convex._cylinder_multicontact(cylinder, p, con, margin, every)
    keep = (torch.arange(every) < count[0]) & (dist[0] < margin[0])
    return dist[0, keep], pos[0, keep], normal[0, keep]


def _support_sum(m: diffmj.Model, d: diffmj.Data, normal: torch.Tensor) -> float:
    """f(u) = h_cylinder(u) + h_hull(-u) at the unit normal u [3]: the least f is minus the distance."""
    cylinder, hull, _ = _pair_inputs(m, d, 0.0)
    vert = mesh_polytope(hull).vert[0]
    return float(mesh_convex._cylinder_support(cylinder, normal[None])[0] + (-(vert @ normal)).max())


def _tolerance(mjm: mujoco.MjModel, m: diffmj.Model, d: diffmj.Data, qpos) -> dict[str, float]:
    """CCD_TOL, widened by MuJoCo's own convergence error where the contact is curved (see module doc)."""
    single = copy.deepcopy(mjm)
    single.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_MULTICCD
    mjd = mujoco.MjData(single)
    mjd.qpos[:] = qpos
    mujoco.mj_forward(single, mjd)
    if not mjd.ncon:
        return CCD_TOL
    cylinder, hull, _ = _pair_inputs(m, d, 0.0)
    normal = mesh_convex.cylinder_contact(cylinder, mesh_polytope(hull)).normal[0]
    excess = _support_sum(m, d, torch.as_tensor(mjd.contact.frame[0, :3])) - _support_sum(m, d, normal)
    assert excess >= -VALUE_ROUNDING, f"MuJoCo's normal has a lower support sum by {-excess:.1e}"
    curved = 1e-9 + SQRT_FACTOR * np.sqrt(excess + VALUE_ROUNDING)
    multi = int(torch.isfinite(collision(m, d).contact.dist).sum()) > 1
    return {"contact.dist": max(TOL["ccd_dist"], curved if multi else 0),
            "contact.pos": max(TOL["ccd_contact"], curved), "contact.frame": max(TOL["ccd_contact"], curved)}


def _assert_matches(mjm: mujoco.MjModel, poses, margin: float) -> tuple[list[int], int]:
    """Contacts of each pose against MuJoCo's; returns MuJoCo's contact counts and how many were tied."""
    m = diffmj.put_model(mjm)
    counts, tied = [], 0
    poses = list(poses)
    for qpos, (mjd, d) in zip(poses, mujoco_states(mjm, m, poses)):
        counts.append(mjd.ncon)
        polygon = _polygon_if_tied(m, d, margin)
        if polygon is None:
            compare_contacts(m, collision(m, d), mjd, tol=_tolerance(mjm, m, d, qpos))
            continue
        tied += 1
        assert mjd.ncon == 4 and int(torch.isfinite(collision(m, d).contact.dist).sum()) == 4
        for c in mjd.contact[:4]:
            nearest = int(torch.linalg.norm(polygon[1] - torch.as_tensor(c.pos), dim=-1).argmin())
            assert_close("dist", float(polygon[0][nearest]), c.dist, TOL["ccd_dist"])
            assert_close("pos", as_numpy(polygon[1][nearest]), c.pos, TOL["ccd_contact"])
            assert_close("normal", as_numpy(polygon[2][nearest]), c.frame[:3], TOL["ccd_contact"])
    return counts, tied


@pytest.mark.parametrize("margin", [0.0, 0.02])
@pytest.mark.parametrize("mode", ["random", "cap", "side"])
def test_cylinder_mesh_matches_mujoco(margin, mode):
    counts, tied = _assert_matches(_pair_model(margin, seed={"random": 0, "cap": 1, "side": 2}[mode]),
                                   _poses(np.random.default_rng(7), 100, mode), margin)
    assert tied < len(counts) // 4, tied  # most compared exactly
    # outcomes exercised: misses, single contacts, a side line clipped (2), a cap clipped (4)
    least = {"random": {0: 10, 1: 10}, "cap": {1: 5, 4: 1}, "side": {1: 5, 2: 3}}[mode]
    assert all(counts.count(k) >= n for k, n in least.items()), counts


@pytest.mark.parametrize("mode", ["random", "cap", "side"])
def test_box_mesh_matches_mujoco(mode):
    """A box-shaped mesh: its faces split into coplanar triangles, so features tie on the hull's side (and
    a cap within a face's bounds is a whole 16-gon: always a tie among quadrilaterals)."""
    counts, _ = _assert_matches(_pair_model(0.01, seed=None), _poses(np.random.default_rng(5), 40, mode), 0.01)
    assert len(set(counts)) >= 2, counts


# A square pyramid, apex up, and a pose of the cylinder (position, quaternion) for each pair of features
# the contact can come from (the hull at the origin), found by search: the kind wins at that pose.
PYRAMID = np.array([[x, y, 0] for x in (-.08, .08) for y in (-.08, .08)] + [[0, 0, .06]])
FEATURE_POSES = {
    "cap on the apex": (mesh_convex._CAP_VERTEX, [.004, .002, .107, 1, 0, 0, 0]),
    "rim on a face": (mesh_convex._FACE, [.05, .005, .0925, .9997, 0, .025, 0]),
    "side across an edge": (mesh_convex._SIDE_EDGE, [.0493, .0493, .0547, .7071, .5, .5, 0]),
    "rim at an edge": (mesh_convex._RIM_EDGE, [.0489, .0285, .0823, .9976, .0643, -.0201, -.0136]),
    "side on the apex": (mesh_convex._SIDE_VERTEX, [.003, .002, .088, .693, -.1405, .693, .1405]),
    "rim near the apex (separated)": (mesh_convex._RIM_VERTEX, [.032, .001, .116, 1, 0, 0, 0]),
}


@pytest.mark.parametrize("case", FEATURE_POSES)
def test_each_feature_pair_matches_mujoco_with_gradients(case):
    """At a pose where each pair of features gives the contact: the search picks it, the contacts match
    MuJoCo's, and their analytic gradients match finite differences."""
    kind, pose = FEATURE_POSES[case]
    mjm = free_pair_model(f'<mesh name="m" vertex="{" ".join(map(str, PYRAMID.ravel()))}"/>',
                          '<geom name="can" type="cylinder" size=".03 .05" margin=".02"/>',
                          '<geom name="hull" type="mesh" mesh="m"/>')
    m = diffmj.put_model(mjm)
    qpos = np.r_[pose, 0, 0, 0, 1, 0, 0, 0]
    qpos[3:7] /= np.linalg.norm(qpos[3:7])
    mjd, d = next(mujoco_states(mjm, m, [qpos]))
    cylinder, hull, _ = _pair_inputs(m, d, 0.02)
    with torch.no_grad():
        candidates = mesh_convex._cylinder_candidates(cylinder, mesh_polytope(hull))
    assert int(candidates.kind[0, candidates.value[0].argmin()]) == kind
    assert mjd.ncon >= 1
    compare_contacts(m, collision(m, d), mjd, tol=_tolerance(mjm, m, d, qpos))
    assert torch.autograd.gradcheck(emitted_contacts(m, d), (d.qpos.clone().requires_grad_(),), eps=1e-7, atol=1e-6)


def test_vmap_equals_batched():
    """vmap over the pairs (each call sees one pair) equals the batched call, on poses with none, one, two
    and four contacts."""
    mjm = _pair_model(0.02, seed=1)
    m = diffmj.put_model(mjm)
    rng = np.random.default_rng(3)
    poses = [*_poses(rng, 6, "cap"), *_poses(rng, 6, "side"), *_poses(rng, 6, "random")]
    inputs = [_pair_inputs(m, d, 0.02) for _, d in mujoco_states(mjm, m, poses)]
    counts = vmap_equals_batched(cylinder_mesh, inputs)
    assert counts == {0, 1, 2, 4}, counts


def test_gradients_finite_through_make_and_break():
    """d(contacts) / d(qpos) is finite as the cylinder is lowered through the hull (separated within the
    margin, touching, penetrating), upright (a cap on a face: four contacts), lying (a side line: two) and
    at a random tilt."""
    poses = [next(_poses(np.random.default_rng(seed), 1, mode)) for seed, mode in ((6, "cap"), (6, "side"),
                                                                                  (2, "random"))]
    for qpos in poses:
        qpos[[0, 1, 7, 8, 9]] = 0  # the hull at the origin, the cylinder lowered onto it
    seen = finite_gradients_when_lowered(_pair_model(0.02, seed=1), poses, 2, np.linspace(0.15, -0.05, 11))
    assert {0, 1, 2, 4} <= seen, seen


@pytest.mark.parametrize("count", [2, 4])
def test_multicontact_gradcheck(count):
    """Analytic gradients of the clipped contacts match finite differences: a side line on a face (two), a
    cap on a face (four), at the first seeded pose with that many contacts and no tie among quadrilaterals."""
    mjm = _pair_model(0.0, seed=1)
    m = diffmj.put_model(mjm)
    poses = _poses(np.random.default_rng(12), 200, "side" if count == 2 else "cap")
    for mjd, d in mujoco_states(mjm, m, poses):
        if mjd.ncon == count and _polygon_if_tied(m, d, 0.0) is None:
            break
    else:
        raise AssertionError(f"no pose with {count} contacts")
    assert int(torch.isfinite(collision(m, d).contact.dist).sum()) == count
    assert torch.autograd.gradcheck(emitted_contacts(m, d), (d.qpos.clone().requires_grad_(),), eps=1e-7, atol=1e-6)


@pytest.mark.slow  # the compile takes minutes on the loaded 2-core machine
def test_compiled_equals_eager():
    """collision compiled (fullgraph) equals eager at a cylinder-mesh pose with four contacts."""
    mjm = _pair_model(0.02, seed=1)
    m = diffmj.put_model(mjm)
    for mjd, d in mujoco_states(mjm, m, _poses(np.random.default_rng(3), 50, "cap")):
        if mjd.ncon == 4:
            break
    compiled = torch.compile(lambda d: collision(m, d).contact, fullgraph=True)(d)
    eager = collision(m, d).contact
    assert torch.isfinite(eager.dist).sum() == 4
    for name in ("dist", "pos", "frame", "active"):
        torch.testing.assert_close(getattr(compiled, name), getattr(eager, name), rtol=0, atol=TOL["compiled"],
                                   equal_nan=True)
