"""Sensors against MuJoCo C: every implemented type, forward and step, the ant benchmark, ray casting.

tests/models/sensors.xml has every sensor type diffmj computes, with contacts
(touch, force, torque, accelerometer), reached joint and tendon limits, cutoffs
on both sides and rangefinders that hit each primitive geom type. Its solver
settings converge (100 iterations, tolerance 1e-12, no islands), so sensors
that read constraint forces can be compared at the smooth tolerance.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj.forward import fwd_position, fwd_velocity
from diffmj.sensor import ray_geom, sensor_acc, sensor_pos, sensor_vel
from tests.conftest import BENCHMARK_MODELS, TOL, assert_close, check_stage, mj_model, random_state, settled_state

INTEGRATORS = {"euler": 0, "rk4": 1, "implicitfast": 3}


def _sensor_names(mjm: mujoco.MjModel) -> list[str]:
    def name(obj, i):
        return mujoco.mj_id2name(mjm, obj, i) or f"#{i}"

    return [
        f"sensor {i} {mujoco.mjtSensor(mjm.sensor_type[i]).name[7:].lower()} "
        f"{name(mjm.sensor_objtype[i], mjm.sensor_objid[i]) if mjm.sensor_objid[i] >= 0 else ''}"
        for i in range(mjm.nsensor)
    ]


def assert_sensordata(mjm: mujoco.MjModel, label: str, actual, expected: np.ndarray, tol: float = TOL["sensor"]):
    """Compare sensor by sensor, so that a failure names the state and the sensor."""
    actual = actual.detach().numpy()
    for i, name in enumerate(_sensor_names(mjm)):
        adr = slice(mjm.sensor_adr[i], mjm.sensor_adr[i] + mjm.sensor_dim[i])
        assert_close(f"{label}: {name}", actual[adr], expected[adr], tol)


def _states(mjm: mujoco.MjModel) -> list[tuple[str, mujoco.MjData]]:
    return [(f"random {s}", random_state(mjm, s)) for s in range(2)] + [
        (f"settled {n}", settled_state(mjm, n)) for n in (60, 200)
    ]


@pytest.fixture
def sensor_model() -> mujoco.MjModel:
    return mj_model("sensors")


def _entries(mjm: mujoco.MjModel, stage: mujoco.mjtStage) -> np.ndarray:
    """sensordata entries of the sensors MuJoCo computes at ``stage``."""
    sensors = np.flatnonzero(mjm.sensor_needstage == stage)
    return np.concatenate([np.arange(mjm.sensor_adr[i], mjm.sensor_adr[i] + mjm.sensor_dim[i]) for i in sensors])


@pytest.mark.parametrize("cone", ["pyramidal", "elliptic"])
def test_sensor_stages_match_mujoco(sensor_model, cone):
    """Each sensor stage writes its sensors' entries of sensordata (sensor_acc also mj_rnePostConstraint's
    cacc, cfrc_int, cfrc_ext) and nothing else. Its input is diffmj.forward of MuJoCo's state:
    put_data carries no contacts or constraint rows, which touch, force and limit sensors read."""
    mjm = sensor_model
    mjm.opt.cone = getattr(mujoco.mjtCone, f"mjCONE_{cone.upper()}")
    m = diffmj.put_model(mjm)
    stages = (
        (sensor_pos, {"sensordata": _entries(mjm, mujoco.mjtStage.mjSTAGE_POS)}),
        (sensor_vel, {"sensordata": _entries(mjm, mujoco.mjtStage.mjSTAGE_VEL)}),
        (sensor_acc, {"sensordata": _entries(mjm, mujoco.mjtStage.mjSTAGE_ACC), "cacc": None, "cfrc_int": None,
                      "cfrc_ext": None}),
    )
    contacts = 0
    for label, mjd in _states(mjm):
        mujoco.mj_forward(mjm, mjd)
        contacts += mjd.ncon
        d = diffmj.forward(m, diffmj.put_data(m, mjd))
        for stage, writes in stages:
            try:
                check_stage(stage, m, mjd, writes, TOL["sensor"], d=d)
            except AssertionError as error:
                raise AssertionError(f"{label}, {stage.__name__}: {error}") from error
    assert contacts > 10


@pytest.mark.parametrize("integrator", INTEGRATORS)
def test_step_matches_mujoco(sensor_model, integrator):
    """sensordata after each step is the one of the step's first forward (RK4 stages skip sensors)."""
    mjm = sensor_model
    mjm.opt.integrator = INTEGRATORS[integrator]
    m = diffmj.put_model(mjm)
    mjd = settled_state(mjm, 60)
    mjd.qvel[:] += np.random.default_rng(1).normal(scale=0.3, size=mjm.nv)
    d = diffmj.put_data(m, mjd)
    for k in range(2):
        mujoco.mj_step(mjm, mjd)
        d = diffmj.step(m, d)
        assert_sensordata(mjm, f"step {k}", d.sensordata, mjd.sensordata, TOL["rollout"])


def _ant() -> mujoco.MjModel:
    mjm = mujoco.MjModel.from_xml_path(str(BENCHMARK_MODELS / "ant.xml"))
    mjm.opt.iterations, mjm.opt.tolerance = 100, 1e-12
    return mjm


def test_ant_forward_and_step():
    mjm = _ant()
    m = diffmj.put_model(mjm)
    for label, mjd in _states(mjm):
        d = diffmj.put_data(m, mjd)
        mujoco.mj_forward(mjm, mjd)
        assert_sensordata(mjm, label, diffmj.forward(m, d).sensordata, mjd.sensordata)
    d = diffmj.put_data(m, mjd)
    for k in range(3):
        mujoco.mj_step(mjm, mjd)
        d = diffmj.step(m, d)
        assert_sensordata(mjm, f"step {k}", d.sensordata, mjd.sensordata, TOL["rollout"])


@pytest.mark.parametrize("geom_type", ["plane", "sphere", "capsule", "ellipsoid", "cylinder", "box"])
def test_ray_geom_matches_mujoco(geom_type):
    """Distances and normals of mju_rayGeom for rays from outside and inside, aimed and axis-aligned."""
    gtype = int(getattr(mujoco.mjtGeom, f"mjGEOM_{geom_type.upper()}"))
    rng = np.random.default_rng(gtype)
    n = 300
    pos = rng.normal(size=(n, 3)) * 0.3
    quat = rng.normal(size=(n, 4))
    mat = np.zeros((n, 9))
    for i in range(n):
        mujoco.mju_quat2Mat(mat[i], quat[i] / np.linalg.norm(quat[i]))
    size = rng.uniform(0.1, 0.6, size=(n, 3))
    if geom_type == "plane":
        size[: n // 2, :2] = 0  # infinite plane
    pnt = pos + rng.normal(size=(n, 3)) * 0.6
    vec = pos + rng.normal(size=(n, 3)) * 0.2 - pnt  # mostly aimed at the geom
    vec[n // 3 : n // 2] = rng.normal(size=(n // 2 - n // 3, 3))
    axes = np.eye(3)[rng.integers(0, 3, n // 4)] * rng.choice([-1.0, 1.0], (n // 4, 1))
    vec[-(n // 4) :] = np.einsum("kij,kj->ki", mat[-(n // 4) :].reshape(-1, 3, 3), axes)  # along geom axes
    vec /= np.linalg.norm(vec, axis=1, keepdims=True)
    dist, normal = np.zeros(n), np.zeros((n, 3))
    for i in range(n):
        dist[i] = mujoco.mju_rayGeom(pos[i], mat[i], size[i], pnt[i], vec[i], gtype, normal[i])
    hit = dist >= 0
    assert 0.2 * n < hit.sum() < 0.9 * n

    x, nrm = ray_geom(gtype, *(torch.as_tensor(a) for a in (pos, mat.reshape(n, 3, 3), size, pnt, vec)))
    assert_close("dist", torch.where(torch.isfinite(x), x, -1.0), dist)
    assert_close("normal", nrm[torch.as_tensor(hit)], normal[hit])


def test_gradients_are_finite_through_rays_and_touch(sensor_model):
    """d sensordata / d (qpos, qvel, efc_force) is finite for hits, misses and inactive contacts."""
    mjm = sensor_model
    m = diffmj.put_model(mjm)
    mjd = settled_state(mjm, 60)
    base = diffmj.forward(m, diffmj.put_data(m, mjd))
    qpos = base.qpos.clone().requires_grad_(True)
    qvel = base.qvel.clone().requires_grad_(True)
    efc_force = base.efc_force.clone().requires_grad_(True)
    d = sensor_pos(m, fwd_position(m, base.replace(qpos=qpos)))
    d = sensor_vel(m, fwd_velocity(m, d.replace(qvel=qvel)))
    d = sensor_acc(m, d.replace(qacc=base.qacc, efc_force=efc_force))
    weights = torch.linspace(0.5, 1.5, m.nsensordata, dtype=m.dtype)
    grads = torch.autograd.grad((d.sensordata * weights).sum(), (qpos, qvel, efc_force))
    for name, grad in zip(("qpos", "qvel", "efc_force"), grads):
        assert torch.isfinite(grad).all(), f"non-finite gradient w.r.t. {name}"
        assert grad.abs().sum() > 0, f"zero gradient w.r.t. {name}"

    # rays through every surface kind, including misses and rays parallel to faces
    origin = torch.tensor([[0.0, 0.0, 2.0], [0.3, 0.0, 0.0], [0.05, 0.02, 0.0], [2.0, 2.0, 2.0]], dtype=m.dtype)
    direction = torch.tensor([[0.0, 0.0, -1.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=m.dtype)
    origin.requires_grad_(True)
    size = torch.tensor([0.2, 0.1, 0.15], dtype=m.dtype, requires_grad=True)
    for gtype in (0, 2, 3, 4, 5, 6):
        x, normal = ray_geom(gtype, torch.zeros(3, dtype=m.dtype), torch.eye(3, dtype=m.dtype), size, origin,
                             direction)
        value = torch.where(torch.isfinite(x), x, -1.0).sum() + torch.where(torch.isfinite(x)[:, None], normal, 0).sum()
        grads = torch.autograd.grad(value, (origin, size), allow_unused=True)  # a plane ignores size
        assert all(g is None or torch.isfinite(g).all() for g in grads), f"geom type {gtype}: non-finite gradient"


def test_vmap_equals_each_element(sensor_model):
    """Sensors of a vmapped forward equal the sensor stages run on each element alone."""
    mjm = sensor_model
    mjm.opt.iterations = 20  # the solver's own vmap parity is tested in test_solver
    m = diffmj.put_model(mjm)
    batch = torch.stack([diffmj.put_data(m, mjd) for _, mjd in _states(mjm)[1:3]])
    out = torch.vmap(diffmj.forward, in_dims=(None, 0))(m, batch)
    for i in range(2):
        single = sensor_acc(m, sensor_vel(m, sensor_pos(m, out[i])))
        for name in ("sensordata", "cacc", "cfrc_int", "cfrc_ext"):
            assert_close(name, getattr(out[i], name), getattr(single, name), TOL["batch"])


def test_sensor_stages_compile_without_graph_breaks(sensor_model):
    m = diffmj.put_model(sensor_model)
    d = diffmj.forward(m, diffmj.put_data(m, settled_state(sensor_model, 60)))
    for stage in (sensor_pos, sensor_vel, sensor_acc):
        compiled = torch.compile(stage, fullgraph=True, backend="eager")
        assert torch.equal(compiled(m, d).sensordata, stage(m, d).sensordata)


def test_disabled_sensors_leave_sensordata(sensor_model):
    mjm = sensor_model
    mjm.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_SENSOR
    m = diffmj.put_model(mjm)
    mjd = random_state(mjm, 0)
    mjd.sensordata[:] = np.arange(mjm.nsensordata)
    out = diffmj.forward(m, diffmj.put_data(m, mjd))
    mujoco.mj_forward(mjm, mjd)
    assert_close("sensordata", out.sensordata, mjd.sensordata, 0.0)


REFUSED = {
    "camprojection": (
        '<camera name="cam" pos="0 0 1"/><site name="s"/>',
        '<camprojection name="proj" site="s" camera="cam"/>',
        "sensor 'proj': type 'camprojection' is not supported",
    ),
    "user": ("<site name='s'/>", '<user name="mine" dim="2" needstage="vel"/>', "sensor 'mine': type 'user'"),
    "camera frame": (
        '<camera name="cam" pos="0 0 1"/>',
        '<framepos name="campos" objtype="camera" objname="cam"/>',
        "sensor 'campos': camera frames",
    ),
    "delay": ("<site name='s'/>", '<clock name="late" delay="0.01" nsample="3"/>', "history buffers"),
    "rangefinder on mesh": (
        '<site name="s"/><geom name="m" type="mesh" mesh="tet" contype="0" conaffinity="0"/>',
        '<rangefinder name="rf" site="s"/>',
        "sensor 'rf': rangefinder ray against mesh geom 'm'",
    ),
}
MESH = '<asset><mesh name="tet" vertex="0 0 0 1 0 0 0 1 0 0 0 1"/></asset>'


@pytest.mark.parametrize("feature", REFUSED)
def test_unsupported_sensors_are_refused_by_name(feature):
    body, sensor, message = REFUSED[feature]
    xml = f"<mujoco>{MESH}<worldbody>{body}</worldbody><sensor>{sensor}</sensor></mujoco>"
    with pytest.raises(NotImplementedError, match=message):
        diffmj.put_model(mujoco.MjModel.from_xml_string(xml))
