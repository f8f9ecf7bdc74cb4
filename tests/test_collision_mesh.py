"""Mesh geoms (collision/mesh.py) against MuJoCo C (float64).

Mesh-plane: MuJoCo's contacts are mesh vertices, so they agree to rounding
(TOL["rows"]) wherever MuJoCo's discrete choices are not tied. The meshes are
random convex point clouds (small ones searched exhaustively by MuJoCo,
larger ones by hill climbing), an irregular prism with 12-gon faces (whose
polygon gives more than 4 candidates: the largest-quadrilateral cut), a box
and a tetrahedron, posed at seeded random heights and orientations, one in
three nearly flat on the plane (multi-contact), with and without margin.
Regular polygons are avoided: their equal-area quadrilaterals are told apart
by MuJoCo's last bit.

Sphere-mesh: MuJoCo's GJK / EPA (run at ccd_tolerance 1e-14) against diffmj's
exact distance from the sphere centre to the hull's facets, with the convex
pairs' tolerances (TOL["ccd_dist"], TOL["ccd_contact"]); measured 1.3e-15 on
the distance, 7e-10 on the position, 4e-14 on the normal. The random hulls
include polygons the compiler merged from nearly coplanar facets (not
planar): taking their one plane instead of their facets was off by up to
4e-5.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj.collision.common import GeomPose, MeshPose
from diffmj.collision.driver import collision
from diffmj.collision.mesh import mesh_shape, plane_mesh, sphere_mesh
from diffmj.smooth import kinematics
from tests.conftest import TOL, as_numpy, assert_close, check_stage, compare_contacts, match_efc, mj_efc_J, settled_state
from tests.test_solver import assert_solution, converged

NCASE = 60


def _prism(rng) -> np.ndarray:
    """An irregular prism: two 12-gons (radii and angles jittered) 0.06 apart."""
    angle = np.arange(12) * 2 * np.pi / 12 + rng.uniform(-0.1, 0.1, 12)
    radius = 0.1 + rng.uniform(-0.01, 0.01, 12)
    ring = np.stack((radius * np.cos(angle), radius * np.sin(angle)), -1)
    return np.concatenate([np.concatenate((ring, np.full((12, 1), z)), -1) for z in (-0.03, 0.03)])


def _meshes(rng) -> list[np.ndarray]:
    clouds = [rng.standard_normal((n, 3)) * 0.1 * rng.uniform(0.5, 1.5, 3) for n in (8, 30, 200)]
    box = np.array([[x, y, z] for x in (-0.1, 0.1) for y in (-0.07, 0.07) for z in (-0.05, 0.05)])
    tetra = np.array([[0, 0, 0], [0.1, 0, 0], [0, 0.1, 0], [0, 0, 0.1]])
    return [*clouds, _prism(rng), box, tetra]


def _plane_model(margin: float, seed: int = 0) -> mujoco.MjModel:
    """A plane and one free mesh body per mesh; the meshes collide with the plane only."""
    meshes = _meshes(np.random.default_rng(seed))
    assets = "".join(f'<mesh name="m{i}" vertex="{" ".join(map(str, v.ravel()))}"/>' for i, v in enumerate(meshes))
    bodies = "".join(f'<body><freejoint/><geom name="g{i}" type="mesh" mesh="m{i}" margin="{margin}" '
                     f'contype="2" conaffinity="0"/></body>' for i in range(len(meshes)))
    xml = f"""<mujoco><option><flag gravity="disable"/></option><asset>{assets}</asset><worldbody>
      <geom name="floor" type="plane" size="1 1 .1" contype="0" conaffinity="2"/>{bodies}</worldbody></mujoco>"""
    return mujoco.MjModel.from_xml_string(xml)


def _random_states(mjm: mujoco.MjModel, count: int, seed: int):
    """MuJoCo states with every mesh body at a random pose near the plane (one in three nearly flat)."""
    rng = np.random.default_rng(seed)
    mjd = mujoco.MjData(mjm)
    for case in range(count):
        for body in range(mjm.nbody - 1):
            quat = rng.standard_normal(4) if case % 3 else np.array([1, *(rng.standard_normal(3) * 0.02)])
            mjd.qpos[7 * body: 7 * body + 7] = [*rng.uniform(-0.5, 0.5, 2), rng.uniform(-0.05, 0.1),
                                                *quat / np.linalg.norm(quat)]
        mujoco.mj_forward(mjm, mjd)
        yield mjd


@pytest.mark.parametrize("margin", [0.0, 0.02])
def test_plane_mesh_matches_mujoco(margin):
    mjm = _plane_model(margin)
    m = diffmj.put_model(mjm)
    counts = []
    for mjd in _random_states(mjm, NCASE, seed=1):
        counts += [sum(c.geom2 == g for c in mjd.contact[: mjd.ncon]) for g in range(1, mjm.ngeom)]
        if mjd.ncon:
            compare_contacts(m, collision(m, diffmj.put_data(m, mjd)), mjd)
    assert counts.count(0) > 20 and counts.count(4) > 20 and counts.count(2) > 5  # all outcomes exercised


def test_only_the_hull_vertices_are_kept():
    """A point cloud's interior vertices are no part of the geom: the padded arrays hold the hull's (the
    200-point cloud's hull has 22); every mesh's kept vertices are its hull graph's (meshes in geom order)."""
    mjm = _plane_model(0.0)
    meshes = diffmj.put_model(mjm).collision_plan.meshes
    hull = [int(mjm.mesh_graph[mjm.mesh_graphadr[k]]) if mjm.mesh_vertnum[k] >= 10 else mjm.mesh_vertnum[k]
            for k in range(mjm.nmesh)]
    assert meshes.vert.shape[1] == max(hull) < mjm.mesh_vertnum.max() / 2
    for k in range(mjm.nmesh):
        assert meshes.on_hull[k].sum() == hull[k]


def _sphere_model() -> mujoco.MjModel:
    """A free sphere and free meshes (random hulls, the prism, the box), each colliding with the sphere."""
    meshes = _meshes(np.random.default_rng(2))[:5]
    assets = "".join(f'<mesh name="m{i}" vertex="{" ".join(map(str, v.ravel()))}"/>' for i, v in enumerate(meshes))
    bodies = "".join(f'<body><freejoint/><geom name="g{i}" type="mesh" mesh="m{i}" contype="2" conaffinity="0"/>'
                     f'</body>' for i in range(len(meshes)))
    xml = f"""<mujoco><option ccd_tolerance="1e-14" ccd_iterations="3000"><flag gravity="disable"/></option>
      <asset>{assets}</asset><worldbody>
      <body><freejoint/><geom name="ball" size=".05" contype="0" conaffinity="2"/></body>{bodies}</worldbody></mujoco>"""
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjm.geom_rbound[:] = 100  # poses change per case: disable the bounding filters
    mjm.geom_aabb[:, 3:] = 100
    return mjm


@pytest.mark.parametrize("margin", [0.0, 0.02])
def test_sphere_mesh_matches_mujoco(margin):
    mjm = _sphere_model()
    mjm.geom_margin[0] = margin
    m = diffmj.put_model(mjm)
    rng = np.random.default_rng(3)
    mjd = mujoco.MjData(mjm)
    tol = {"contact.dist": TOL["ccd_dist"], "contact.pos": TOL["ccd_contact"], "contact.frame": TOL["ccd_contact"]}
    ncon = []
    for _ in range(40):
        quat = rng.standard_normal((mjm.nbody - 1, 4))
        pos = rng.uniform(-0.15, 0.15, (mjm.nbody - 1, 3))
        pos[0] = 0  # the ball at the origin, the meshes around it
        mjd.qpos[:] = np.concatenate((pos, quat / np.linalg.norm(quat, axis=1, keepdims=True)), 1).ravel()
        mujoco.mj_forward(mjm, mjd)
        ncon.append(mjd.ncon)
        compare_contacts(m, collision(m, diffmj.put_data(m, mjd)), mjd, tol=tol)
    assert sum(ncon) > 60 and sum(n < 5 for n in ncon) > 10  # contacts made and missed


def test_sphere_mesh_vmap_and_gradients():
    """Sphere-mesh under vmap over the pairs equals the batched call; d(contacts) / d(qpos) is finite
    as the ball passes through the meshes (contacts made and broken) and matches finite differences
    at a generic penetrating pose."""
    mjm = _sphere_model()
    m = diffmj.put_model(mjm)
    mjd = mujoco.MjData(mjm)
    mjd.qpos[:] = np.concatenate([[0.06 * i, 0.02, 0, 1, 0.1 * i, 0.2, 0.3] for i in range(mjm.nbody - 1)])
    mujoco.mj_forward(mjm, mjd)
    d = diffmj.put_data(m, mjd)
    _assert_vmap_over_pairs(sphere_mesh, m, d)

    def emitted(qpos):
        contact = collision(m, kinematics(m, d.replace(qpos=qpos))).contact
        finite = torch.isfinite(contact.dist)
        return torch.where(finite, contact.dist, 0), contact.pos * finite[..., None], contact.frame * finite[..., None, None]

    for x in np.linspace(-0.1, 0.4, 12):  # the ball through the row of meshes
        qpos = d.qpos.clone()
        qpos[0] = x
        qpos.requires_grad_()
        (grad,) = torch.autograd.grad(sum(y.sum() for y in emitted(qpos)), qpos)
        assert torch.isfinite(grad).all(), f"ball at x = {x}"
    qpos = d.qpos.clone()
    qpos[0] = 0.13
    assert torch.isfinite(emitted(qpos)[0]).sum() >= 2
    assert torch.autograd.gradcheck(emitted, (qpos.requires_grad_(),), eps=1e-7, atol=1e-6)


def _states(mjm: mujoco.MjModel, m: diffmj.Model, seeds) -> list[diffmj.Data]:
    """diffmj data of the first random state of each seed."""
    return [diffmj.put_data(m, next(_random_states(mjm, 1, seed))) for seed in seeds]


def _assert_same_contacts(a: diffmj.types.Contact, b: diffmj.types.Contact, tol: float) -> None:
    for name in ("dist", "pos", "frame", "active"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=tol, equal_nan=True)


def _assert_vmap_over_pairs(fn, m: diffmj.Model, d: diffmj.Data) -> None:
    """``fn`` of geom 0 against each mesh geom: torch.vmap over the pairs (each call sees one pair)
    equals the batched call."""
    meshes = torch.arange(1, m.ngeom)
    first = GeomPose(*(x[[0] * len(meshes)] for x in (d.geom_xpos, d.geom_xmat, m.geom_size)))
    mesh = MeshPose(GeomPose(d.geom_xpos[meshes], d.geom_xmat[meshes], m.geom_size[meshes]),
                    mesh_shape(m.collision_plan.meshes, m.collision_plan.geom_mesh[meshes]))
    margin = torch.full((len(meshes),), 0.02, dtype=torch.float64)
    for a, b in zip(torch.vmap(fn)(first, mesh, margin), fn(first, mesh, margin)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_vmap_equals_loop():
    mjm = _plane_model(0.01)
    m = diffmj.put_model(mjm)
    ds = _states(mjm, m, range(3))
    mapped = torch.vmap(lambda d: collision(m, d).contact)(torch.stack(ds))
    for i, d in enumerate(ds):
        _assert_same_contacts(mapped[i], collision(m, d).contact, TOL["batch"])

    _assert_vmap_over_pairs(plane_mesh, m, ds[0])


@pytest.mark.slow
def test_compiled_equals_eager():
    mjm = _plane_model(0.01)
    m = diffmj.put_model(mjm)
    d = _states(mjm, m, [4])[0]
    compiled = torch.compile(lambda d: collision(m, d).contact, fullgraph=True)(d)
    _assert_same_contacts(compiled, collision(m, d).contact, TOL["compiled"])


def test_gradients_finite_through_make_and_break():
    """d(emitted contacts) / d(qpos) through kinematics and mesh-plane is finite, for mesh bodies
    lowered through the plane (each making contacts vertex by vertex) and lifted off it."""
    mjm = _plane_model(0.01)
    m = diffmj.put_model(mjm)
    mjd = next(_random_states(mjm, 1, seed=3))
    for height in np.linspace(-0.06, 0.12, 10):
        qpos = torch.tensor(mjd.qpos).reshape(-1, 7)
        qpos[:, 2] = height
        qpos = qpos.reshape(-1).requires_grad_()

        def emitted(qpos):
            contact = collision(m, kinematics(m, diffmj.put_data(m, mjd).replace(qpos=qpos))).contact
            finite = torch.isfinite(contact.dist)
            return torch.where(finite, contact.dist, 0).sum() + (contact.pos * finite[..., None]).sum()

        (grad,) = torch.autograd.grad(emitted(qpos), qpos)
        assert torch.isfinite(grad).all(), f"height {height}"


def test_gradcheck():
    """Analytic gradients of the contacts match finite differences at a generic multi-contact pose."""
    mjm = _plane_model(0.01)
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, next(_random_states(mjm, 1, seed=0)))  # case 0: nearly flat, multi-contact

    def emitted(qpos):
        contact = collision(m, kinematics(m, d.replace(qpos=qpos))).contact
        finite = torch.isfinite(contact.dist)
        assert finite.sum() >= 3
        return torch.where(finite, contact.dist, 0), contact.pos * finite[..., None]

    assert torch.autograd.gradcheck(emitted, (d.qpos.clone().requires_grad_(),), eps=1e-7, atol=1e-6)


# A robot-like model: a mesh torso and two hinged mesh legs on the floor, meshes colliding with the floor only.
ROBOT = """
<mujoco><option timestep="0.004"/>
  <asset>
    <mesh name="torso" vertex="{torso}"/>
    <mesh name="leg" vertex="{leg}"/>
  </asset>
  <default><geom type="mesh" contype="2" conaffinity="0"/></default>
  <worldbody><geom type="plane" size="2 2 .1" contype="0" conaffinity="2"/>
    <body pos="0 0 .25"><freejoint/><geom mesh="torso"/>
      <body pos=".12 0 -.05"><joint name="j0" axis="0 1 0" range="-1 1"/><geom mesh="leg" pos="0 0 -.08"/></body>
      <body pos="-.12 0 -.05"><joint name="j1" axis="0 1 0" range="-1 1"/><geom mesh="leg" pos="0 0 -.08"/></body>
    </body>
  </worldbody>
  <actuator><motor joint="j0" gear="5"/><motor joint="j1" gear="5"/></actuator>
</mujoco>"""


def _robot() -> mujoco.MjModel:
    rng = np.random.default_rng(5)
    torso = rng.standard_normal((40, 3)) * [0.12, 0.08, 0.04]
    leg = rng.standard_normal((25, 3)) * [0.025, 0.025, 0.07]
    return mujoco.MjModel.from_xml_string(ROBOT.format(torso=" ".join(map(str, torso.ravel())),
                                                       leg=" ".join(map(str, leg.ravel()))))


@pytest.mark.parametrize("steps", [150, 400])
def test_robot_contacts_and_solution(steps):
    """The robot after falling onto the floor and kicking (MuJoCo C states): contacts, efc_J, qacc."""
    mjm = converged(_robot())
    mjd = settled_state(mjm, steps, ctrl_scale=1.0)
    assert mjd.ncon >= 2
    m = diffmj.put_model(mjm)
    check_stage(collision, m, mjd, ("contact",))
    out = diffmj.forward(m, diffmj.put_data(m, mjd))
    ours, theirs = match_efc(m, out, mjd)
    assert_close("efc_J", as_numpy(out.efc_J)[ours], mj_efc_J(mjm, mjd)[theirs], TOL["rows"])
    assert_solution(m, out, mjm, mjd)
