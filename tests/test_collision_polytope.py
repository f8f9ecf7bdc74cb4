"""Box-mesh and mesh-mesh (collision/polytope.py) against MuJoCo C (float64).

MuJoCo's GJK / EPA run at ccd_tolerance 1e-14; diffmj's separating-axis test
and GJK are exact for polytopes, so the distances agree to rounding
(TOL["ccd_dist"] bounds them; measured 7e-15) and the positions and normals
to MuJoCo's convergence error (TOL["ccd_contact"]; measured 5e-9 on the
position with a margin, where MuJoCo's EPA runs on rounded geoms). The
meshes are random convex hulls (Gaussian clouds, flattened, so that faces
meet faces), posed at seeded random positions and orientations, or nearly
flat one above the other (face-face: multi-contact); with and without
margin. The random poses make MuJoCo's multi-contact rules fire often: an
edge within 5 degrees of parallel to a face (2 contacts) in about a third of
the contacts, a face-face pair (4) in a few.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj.collision.common import GeomPose, MeshPose
from diffmj.collision.driver import collision
from diffmj.collision.mesh import mesh_shape
from diffmj.collision.polytope import box_mesh, mesh_mesh
from tests.conftest import (CCD_TOL, TOL, as_numpy, assert_close, assert_contacts_match, check_stage,
                            emitted_contacts, finite_gradients_when_lowered, free_pair_model, mujoco_states)
from tests.test_solver import assert_solution, converged


def _cloud(rng, count: int, scale: float) -> np.ndarray:
    return rng.standard_normal((count, 3)) * scale * np.array([1, 1, 0.4])


def _pair_model(second: str, margin: float, seed: int = 0, clouds=None) -> mujoco.MjModel:
    """A free mesh or box (geom 0) and a free mesh (geom 1), bounding filters off; the meshes
    ``clouds`` or random ones."""
    rng = np.random.default_rng(seed)
    clouds = clouds or [_cloud(rng, 12, 0.1), _cloud(rng, 20, 0.08)]
    assets = "".join(f'<mesh name="m{i}" vertex="{" ".join(map(str, v.ravel()))}"/>' for i, v in enumerate(clouds))
    first = ('<geom name="box" type="box" size=".1 .07 .05"' if second == "box" else
             '<geom name="mesh0" type="mesh" mesh="m0"') + f' margin="{margin}"/>'
    return free_pair_model(assets, first, '<geom name="mesh1" type="mesh" mesh="m1"/>')


def _poses(rng, count: int, flat: bool):
    """qpos of the two free bodies: random, or nearly flat with body 1 above body 0."""
    for _ in range(count):
        if flat:
            quat = np.concatenate((np.ones((2, 1)), rng.standard_normal((2, 3)) * 0.03), 1)
            pos = np.array([[0, 0, 0], [*rng.uniform(-0.05, 0.05, 2), rng.uniform(0.0, 0.12)]])
        else:
            quat = rng.standard_normal((2, 4))
            pos = rng.uniform(-0.12, 0.12, (2, 3))
        yield np.concatenate((pos, quat / np.linalg.norm(quat, axis=1, keepdims=True)), 1).ravel()


def test_face_on_face_keeps_mujocos_quadrilateral():
    """A prism on an irregular heptagon lying face down on a large box: the clipped polygon is the
    heptagon, and MuJoCo 4.0's polygonQuad keeps four of its corners (sometimes one twice). No two
    quadrilaterals tie here, so the contacts are MuJoCo's, duplicates included. (MuJoCo's later area4,
    the area of a, c, b, d, ends the search elsewhere on 3 of these 6 prisms.)"""
    rng = np.random.default_rng(3)
    counts = []
    for _ in range(6):
        angle = np.sort(rng.uniform(0, 2 * np.pi, 7))
        corner = np.stack((0.06 * np.cos(angle), 0.04 * np.sin(angle)), -1)
        prism = np.concatenate([np.c_[corner, np.full(7, z)] for z in (-0.02, 0.02)])
        mjm = free_pair_model(f'<mesh name="prism" vertex="{" ".join(map(str, prism.ravel()))}"/>',
                              '<geom type="box" size=".3 .3 .05"/>', '<geom type="mesh" mesh="prism"/>')
        qpos = np.array([0, 0, 0, 1, 0, 0, 0, *rng.uniform(-0.05, 0.05, 2), 0.069, 1, *rng.normal(0, 0.01, 3)])
        qpos[10:] /= np.linalg.norm(qpos[10:])
        counts += assert_contacts_match(mjm, [qpos])
    assert counts == [3, 4, 4, 4, 4, 3]  # three where the heptagon was cut to three corners below the box face


@pytest.mark.parametrize("margin", [0.0, 0.02])
@pytest.mark.parametrize("second", ["mesh", "box"])
@pytest.mark.parametrize("flat", [False, True])
def test_matches_mujoco(second, margin, flat):
    mjm = _pair_model(second, margin, seed=int(flat) + 2 * (second == "box"))
    counts = assert_contacts_match(mjm, _poses(np.random.default_rng(7), 60, flat))
    # outcomes exercised: single contacts, edge-face pairs; face-face quads when flat, misses when not
    assert counts.count(1) > 5 and counts.count(2) > 3
    assert counts.count(4) >= 3 if flat else counts.count(0) > 3


def test_large_meshes_match_mujoco():
    """Hulls of 150 and 200 points (MuJoCo climbs their hull graphs; so do diffmj's supports along the
    triangle normals, from more vertices than their 64 starting directions reach). The compiler's polygons
    of the 200-point hull leave out one of its vertices (1e-5 outside them): the hull of the polygons'
    vertices alone changes the depth of the last of these poses by 5e-6."""
    rng = np.random.default_rng(6)
    large = _cloud(rng, 200, 0.1)
    assert_contacts_match(_pair_model("mesh", 0.0, clouds=[_cloud(rng, 150, 0.08), large]), _poses(rng, 29, False))


def _pair_inputs(m: diffmj.Model, d: diffmj.Data):
    """(geom 0, geom 1 as a MeshPose, margin) of a two-geom model, batched over one pair."""
    plan = m.collision_plan
    pose = [GeomPose(d.geom_xpos[[g]], d.geom_xmat[[g]], m.geom_size[[g]]) for g in (0, 1)]
    mesh = lambda g: MeshPose(pose[g], mesh_shape(plan.meshes, plan.geom_mesh[[g]]))  # noqa: E731
    return pose, mesh, torch.full((1,), 0.02, dtype=torch.float64)


@pytest.mark.parametrize("second", ["mesh", "box"])
def test_vmap_equals_batched(second):
    """vmap over the pairs (each call sees one pair) equals the batched call, on poses with single and
    multiple contacts."""
    mjm = _pair_model(second, 0.02, seed=1)
    m = diffmj.put_model(mjm)
    rng = np.random.default_rng(3)
    inputs = [_pair_inputs(m, d) for _, d in mujoco_states(mjm, m, [*_poses(rng, 4, True), *_poses(rng, 4, False)])]
    fn, first = (box_mesh, lambda p, mesh: p[0]) if second == "box" else (mesh_mesh, lambda p, mesh: mesh(0))
    cat = lambda parts: type(parts[0])(*(cat(x) if isinstance(x[0], tuple) else torch.cat(x)  # noqa: E731
                                          for x in zip(*parts)))
    geom1 = cat([first(p, mesh) for p, mesh, _ in inputs])
    geom2 = cat([mesh(1) for _, mesh, _ in inputs])
    margin = torch.cat([x for _, _, x in inputs])
    batched = fn(geom1, geom2, margin)
    counts = {int(torch.isfinite(d).sum()) for d in batched.dist}
    assert len(counts) >= 2 and max(counts) >= 2, counts
    for a, b in zip(torch.vmap(fn)(geom1, geom2, margin), batched):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_vmap_over_data_equals_loop():
    """collision vmapped over a batch of Data equals collision of each Data."""
    mjm = _pair_model("box", 0.02, seed=1)
    m = diffmj.put_model(mjm)
    ds = [d for _, d in mujoco_states(mjm, m, _poses(np.random.default_rng(3), 4, True))]
    mapped = torch.vmap(lambda d: collision(m, d).contact)(torch.stack(ds))
    assert torch.isfinite(mapped.dist).sum() >= 4
    for i, d in enumerate(ds):
        for name in ("dist", "pos", "frame", "active"):
            torch.testing.assert_close(getattr(mapped[i], name), getattr(collision(m, d).contact, name), rtol=0,
                                       atol=TOL["batch"], equal_nan=True)


@pytest.mark.slow  # the compile takes minutes (measured 14 min on the loaded 2-core machine)
def test_compiled_equals_eager():
    mjm = _pair_model("mesh", 0.02, seed=1)
    m = diffmj.put_model(mjm)
    mjd = mujoco.MjData(mjm)
    mjd.qpos[:] = next(_poses(np.random.default_rng(3), 1, True))
    mujoco.mj_kinematics(mjm, mjd)
    d = diffmj.put_data(m, mjd)
    compiled = torch.compile(lambda d: collision(m, d).contact, fullgraph=True)(d)
    eager = collision(m, d).contact
    assert torch.isfinite(eager.dist).sum() >= 1
    for name in ("dist", "pos", "frame", "active"):
        torch.testing.assert_close(getattr(compiled, name), getattr(eager, name), rtol=0, atol=TOL["compiled"],
                                   equal_nan=True)


@pytest.mark.parametrize("second", ["mesh", "box"])
def test_gradients_finite_through_make_and_break(second):
    """d(contacts) / d(qpos) is finite as one geom is lowered through the other (separated within the
    margin, touching, penetrating; single, edge and face contacts) in tilted and flat poses."""
    rng = np.random.default_rng(5)
    poses = [next(_poses(rng, 1, flat)) for flat in (False, True)]
    seen = finite_gradients_when_lowered(_pair_model(second, 0.02, seed=4), poses, 9, np.linspace(0.15, -0.05, 9))
    assert {0, 1} <= seen and max(seen) >= 2


@pytest.mark.parametrize("case", ["separated", "penetrating", "flat"])
def test_gradcheck(case):
    """Analytic gradients of the contacts match finite differences at generic poses: separated within
    the margin (GJK), penetrating (separating axes), both a single contact, and face-face (four)."""
    margin = 0.02 if case == "separated" else 0.0
    mjm = _pair_model("mesh", margin, seed=1)
    m = diffmj.put_model(mjm)
    mjd = mujoco.MjData(mjm)
    count = 4 if case == "flat" else 1
    for qpos in _poses(np.random.default_rng(11), 100, case == "flat"):  # the first pose that fits the case
        mjd.qpos[:] = qpos
        mujoco.mj_forward(mjm, mjd)
        depth = mjd.contact.dist[0] if mjd.ncon else 0
        if mjd.ncon == count and (depth > 1e-3 if case == "separated" else depth < -1e-3):
            break
    d = diffmj.put_data(m, mjd)
    qpos = d.qpos.clone().requires_grad_()
    assert int((emitted_contacts(m, d)(qpos)[0] != 0).sum()) == count
    assert torch.autograd.gradcheck(emitted_contacts(m, d), (qpos,), eps=1e-7, atol=1e-6)


# A gripper: two mesh fingers on slide joints, position-controlled, closing on a mesh object on the floor.
GRIPPER = """
<mujoco><option timestep="0.004" ccd_tolerance="1e-14" ccd_iterations="3000"/>
  <asset><mesh name="finger" vertex="{finger}"/><mesh name="object" vertex="{object}"/></asset>
  <worldbody><geom type="plane" size="1 1 .1"/>
    <body name="object" pos="0 0 .03"><freejoint/><geom type="mesh" mesh="object" density="300"/></body>
    <body name="palm" pos="0 0 .05">
      <body pos=".08 0 0"><joint name="left" type="slide" axis="1 0 0" damping="2"/><geom type="mesh" mesh="finger"/></body>
      <body pos="-.08 0 0"><joint name="right" type="slide" axis="1 0 0" damping="2"/>
        <geom type="mesh" mesh="finger" euler="0 0 180"/></body>
    </body>
  </worldbody>
  <actuator><position joint="left" kp="200" ctrlrange="-.1 .1"/><position joint="right" kp="200" ctrlrange="-.1 .1"/></actuator>
</mujoco>"""


def _gripper() -> mujoco.MjModel:
    rng = np.random.default_rng(9)
    # a finger: a slab jittered off regular (no exact ties between faces), an object: a random hull
    slab = np.array([[x, y, z] for x in (-0.01, 0.01) for y in (-0.02, 0.02) for z in (-0.04, 0.04)])
    finger = slab + rng.uniform(-1e-3, 1e-3, slab.shape)
    obj = _cloud(rng, 14, 0.03)
    return mujoco.MjModel.from_xml_string(GRIPPER.format(finger=" ".join(map(str, finger.ravel())),
                                                         object=" ".join(map(str, obj.ravel()))))


def closed_grasp(mjm: mujoco.MjModel) -> mujoco.MjData:
    """MuJoCo C's state after 150 steps of a two-finger grasp model (ctrl -0.06, 0.06: closing)."""
    mjd = mujoco.MjData(mjm)
    mjd.ctrl[:] = [-0.06, 0.06]
    for _ in range(150):
        mujoco.mj_step(mjm, mjd)
    mujoco.mj_forward(mjm, mjd)
    return mjd


def assert_grasp_matches(mjm: mujoco.MjModel, mjd: mujoco.MjData) -> None:
    """At MuJoCo C's state: contacts, the constraint solution, and 5 steps of diffmj against 5 of MuJoCo C."""
    m = diffmj.put_model(mjm)
    check_stage(collision, m, mjd, ("contact",), tol=CCD_TOL)
    d = diffmj.put_data(m, mjd)
    assert_solution(m, diffmj.forward(m, d), mjm, mjd)
    for _ in range(5):
        d = diffmj.step(m, d)
        mujoco.mj_step(mjm, mjd)
    assert_close("qpos", as_numpy(d.qpos), mjd.qpos, TOL["ccd_contact"])
    assert_close("qvel", as_numpy(d.qvel), mjd.qvel, TOL["ccd_contact"])


def test_gripper_matches_mujoco():
    """The fingers closed on the object (MuJoCo C states, 150 steps): contacts, the constraint solution,
    and 5 steps of diffmj against 5 of MuJoCo C from there."""
    mjm = converged(_gripper())
    mjd = closed_grasp(mjm)
    pairs = {tuple(sorted(mjm.geom_type[c.geom])) for c in mjd.contact[:mjd.ncon]}
    assert (mujoco.mjtGeom.mjGEOM_MESH,) * 2 in pairs and mjd.ncon >= 4, pairs
    assert_grasp_matches(mjm, mjd)
