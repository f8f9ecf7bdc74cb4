"""Parity with MuJoCo C on seeded random contact-free models (tests/mjcf_random.py).

For each seed: build the model, draw a non-trivial state (pose, velocity,
controls and activations partly outside their ranges, applied forces, mocap
pose, time), and check

* ``diffmj.forward`` against ``mujoco.mj_forward``: every field ``get_data``
  copies back, plus qM (``mj_fullM``), ten_J and actuator_moment (densified)
  and the Cholesky factor qLD (L L' = qM);
* ten ``diffmj.step`` calls against ten ``mujoco.mj_step`` calls: qpos, qvel,
  act and time after each step.

diffmj starts from the state and inputs alone (no field MuJoCo computed is
handed to it), so every compared field is diffmj's own.

The mismatches these seeds exposed while the tests were written each have a
minimal regression test at the end of this file.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj.io import _MJDATA_FIELDS
from diffmj import BiasType, DynType, GainType, IntegratorType, JointType, TrnType
from tests.conftest import TOL, assert_close
from tests.mjcf_random import INTEGRATORS, random_mjcf

SEEDS = range(20)
SWEEP_SEEDS = range(20, 220)
NSTEP = 10
STEP_FIELDS = ("qpos", "qvel", "act", "time")

def _random_state(mjm: mujoco.MjModel, seed: int) -> mujoco.MjData:
    """State and inputs only (nothing computed yet): pose near qpos0, velocities, controls
    and activations partly outside their ranges, applied forces, mocap pose, time."""
    rng = np.random.default_rng([seed, 1])  # a stream apart from the model generator's
    mjd = mujoco.MjData(mjm)
    mjd.qpos[:] = mjm.qpos0 + 0.5 * rng.standard_normal(mjm.nq)
    mujoco.mj_normalizeQuat(mjm, mjd.qpos)
    mjd.qvel[:] = rng.standard_normal(mjm.nv)
    mjd.ctrl[:] = rng.uniform(-2.5, 2.5, mjm.nu)
    mjd.act[:] = rng.uniform(-1.2, 1.2, mjm.na)
    mjd.qfrc_applied[:] = rng.standard_normal(mjm.nv)
    mjd.xfrc_applied[:, :3] = rng.standard_normal((mjm.nbody, 3))
    mjd.xfrc_applied[:, 3:] = 0.2 * rng.standard_normal((mjm.nbody, 3))  # light bodies spin up fast
    mjd.mocap_pos[:] += 0.2 * rng.standard_normal((mjm.nmocap, 3))
    quat = rng.standard_normal((mjm.nmocap, 4))
    mjd.mocap_quat[:] = quat / np.linalg.norm(quat, axis=1, keepdims=True)
    mjd.time = rng.uniform(0.0, 10.0)
    return mjd


def _setup(seed: int) -> tuple[mujoco.MjModel, mujoco.MjData, diffmj.Model, diffmj.Data]:
    """The seed's model in both engines and the same random state in both."""
    mjm = mujoco.MjModel.from_xml_string(random_mjcf(seed))
    mjd = _random_state(mjm, seed)
    m = diffmj.put_model(mjm, dtype=torch.float64)
    return mjm, mjd, m, diffmj.put_data(m, mjd)


def _sparse_to_dense(values, rownnz, rowadr, colind, ncol: int) -> np.ndarray:
    dense = np.zeros((len(rownnz), ncol))
    if dense.size:
        mujoco.mju_sparse2dense(dense, np.asarray(values, dtype=np.float64), rownnz, rowadr, colind)
    return dense


def _mujoco_fields(mjm: mujoco.MjModel, mjd: mujoco.MjData, like: diffmj.Data) -> dict[str, np.ndarray]:
    """MuJoCo's forward quantities in diffmj's dense shapes."""
    out = {}
    for name in _MJDATA_FIELDS:
        if name == "eq_active":  # not a forward quantity (and bool)
            continue
        out[name] = np.asarray(getattr(mjd, name), dtype=np.float64).reshape(getattr(like, name).shape)
    qm = np.zeros((mjm.nv, mjm.nv))
    if mjm.nv:
        mujoco.mj_fullM(mjm, mjd, qm)
    out["qM"] = qm
    out["ten_J"] = _sparse_to_dense(mjd.ten_J, mjm.ten_J_rownnz, mjm.ten_J_rowadr, mjm.ten_J_colind, mjm.nv)
    out["actuator_moment"] = _sparse_to_dense(
        mjd.actuator_moment, mjd.moment_rownnz, mjd.moment_rowadr, mjd.moment_colind, mjm.nv)
    return out


def _check_forward(seed: int) -> None:
    """Every forward field within TOL['smooth']; the message lists each field that is not."""
    mjm, mjd, m, d = _setup(seed)
    mujoco.mj_forward(mjm, mjd)
    out = diffmj.forward(m, d)
    expected = _mujoco_fields(mjm, mjd, out)
    actual = {name: getattr(out, name) for name in expected}
    actual["qLD (L L')"] = out.qLD @ out.qLD.T
    expected["qLD (L L')"] = expected["qM"]
    failures = []
    for name, value in expected.items():
        try:
            # a random model may have no sites, tendons, actuators, mocap bodies or sensors
            assert_close(f"seed {seed}: forward {name}", actual[name], value, TOL["smooth"], empty_ok=True)
        except AssertionError as error:
            failures.append(str(error).splitlines()[0])
    assert not failures, "\n".join(failures)


def _check_step(seed: int) -> None:
    mjm, mjd, m, d = _setup(seed)
    for k in range(1, NSTEP + 1):
        mujoco.mj_step(mjm, mjd)
        d = diffmj.step(m, d)
        for name in STEP_FIELDS:
            expected = np.asarray(getattr(mjd, name), dtype=np.float64)
            assert_close(f"seed {seed}: step {k} {name}", getattr(d, name), expected, TOL["rollout"], empty_ok=True)


@pytest.mark.parametrize("seed", SEEDS)
def test_forward_matches_mujoco(seed):
    _check_forward(seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_step_matches_mujoco(seed):
    _check_step(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SWEEP_SEEDS)
def test_forward_matches_mujoco_sweep(seed):
    _check_forward(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SWEEP_SEEDS)
def test_step_matches_mujoco_sweep(seed):
    _check_step(seed)


# ---- the generator


def test_generator_is_deterministic():
    assert random_mjcf(3) == random_mjcf(3)
    assert random_mjcf(3) != random_mjcf(4)


@pytest.mark.parametrize("integrator", INTEGRATORS)
def test_generator_options(integrator):
    xml = random_mjcf(5, max_bodies=3, max_depth=2, max_tendons=0, max_actuators=0,
                      integrator=integrator, disable_flags=False)
    mjm = mujoco.MjModel.from_xml_string(xml)
    depth = np.zeros(mjm.nbody, dtype=int)
    for b in range(1, mjm.nbody):
        depth[b] = depth[mjm.body_parentid[b]] + 1
    assert mjm.opt.integrator == IntegratorType[integrator.upper()]
    assert mjm.nbody - 1 <= 3 and depth.max() <= 2
    assert mjm.ntendon == mjm.nu == mjm.opt.disableflags == 0


JOINT_TRANSMISSIONS = (TrnType.JOINT, TrnType.JOINTINPARENT)


def _features(mjm: mujoco.MjModel) -> set:
    """What a model exercises, in MuJoCo's own terms."""
    found = {("integrator", int(mjm.opt.integrator))}
    found |= {("joint", int(t)) for t in mjm.jnt_type}
    found |= {("joints per body", min(int(n), 3)) for n in mjm.body_jntnum[1:]}
    depth = np.zeros(mjm.nbody, dtype=int)
    for b in range(1, mjm.nbody):
        depth[b] = depth[mjm.body_parentid[b]] + 1
    found.add(("depth", int(depth.max())))
    for i in range(mjm.nu):
        jnt = mjm.actuator_trnid[i, 0]
        target = int(mjm.jnt_type[jnt]) if mjm.actuator_trntype[i] in JOINT_TRANSMISSIONS else None
        found |= {
            ("transmission", int(mjm.actuator_trntype[i]), target),
            ("dynamics", int(mjm.actuator_dyntype[i])),
            ("gain", int(mjm.actuator_gaintype[i])),
            ("bias", int(mjm.actuator_biastype[i])),
        }
        for flag in ("ctrllimited", "forcelimited", "actlimited", "actearly"):
            if getattr(mjm, f"actuator_{flag}")[i]:
                found.add((flag,))
    checks = {
        "mocap": mjm.nmocap > 0,
        "gravcomp": np.any(mjm.body_gravcomp > 0),
        "actuatorgravcomp": np.any(mjm.jnt_actgravcomp),
        "joint actuatorfrcrange": np.any(mjm.jnt_actfrclimited),
        "joint stiffness": np.any(mjm.jnt_stiffness > 0),
        "joint springref": np.any(mjm.qpos_spring != mjm.qpos0),
        "joint ref": np.any(mjm.qpos0[mjm.jnt_qposadr[np.isin(mjm.jnt_type, (JointType.SLIDE, JointType.HINGE))]] != 0),
        "joint damping": np.any(mjm.dof_damping > 0),
        "joint armature": np.any(mjm.dof_armature > 0),
        "rotated inertial frame": np.any(np.abs(mjm.body_iquat[1:, 0]) < 1 - 1e-9),
        "tendon stiffness": np.any(mjm.tendon_stiffness > 0),
        "tendon deadband": np.any(mjm.tendon_lengthspring[:, 0] < mjm.tendon_lengthspring[:, 1]),
        "tendon damping": np.any(mjm.tendon_damping > 0),
        "tendon armature": np.any(mjm.tendon_armature > 0),
        "tendon actuatorfrcrange": np.any(mjm.tendon_actfrclimited),
        "actuator group disabled": mjm.opt.disableactuator != 0,
        "gravity off axis": np.any(mjm.opt.gravity[:2] != 0),
    }
    found |= {(name,) for name, present in checks.items() if present}
    return found


def test_default_seeds_cover_every_supported_feature():
    """The default seeds exercise each feature put_model accepts (so the fast suite means something)."""
    found = set().union(*(_features(mujoco.MjModel.from_xml_string(random_mjcf(s))) for s in SEEDS))
    expected = {("integrator", IntegratorType[name.upper()]) for name in INTEGRATORS}
    expected |= {("joint", t) for t in JointType} | {("joints per body", n) for n in (0, 1, 2, 3)}
    expected |= {("depth", 5)}
    expected |= {("transmission", trn, jnt) for trn in JOINT_TRANSMISSIONS for jnt in JointType}
    expected |= {("transmission", TrnType.TENDON, None), ("transmission", TrnType.SITE, None)}
    expected |= {("dynamics", i) for i in (DynType.NONE, DynType.INTEGRATOR, DynType.FILTER, DynType.FILTEREXACT,
                                           DynType.MUSCLE)}
    expected |= {("gain", i) for i in (GainType.FIXED, GainType.AFFINE, GainType.MUSCLE)}
    expected |= {("bias", i) for i in (BiasType.NONE, BiasType.AFFINE, BiasType.MUSCLE)}
    expected |= {("ctrllimited",), ("forcelimited",), ("actlimited",), ("actearly",)}
    expected |= {
        (name,) for name in (
            "mocap", "gravcomp", "actuatorgravcomp", "joint actuatorfrcrange", "joint stiffness",
            "joint springref", "joint ref", "joint damping", "joint armature", "rotated inertial frame",
            "tendon stiffness", "tendon deadband", "tendon damping", "tendon armature",
            "tendon actuatorfrcrange", "actuator group disabled", "gravity off axis",
        )
    }
    assert expected <= found, f"features no default seed exercises: {sorted(expected - found, key=str)}"


# ---- minimal reproducers of the mismatches in BUGS

_GEOM = 'contype="0" conaffinity="0"'


def _both(xml: str, qvel, ctrl) -> tuple[mujoco.MjModel, mujoco.MjData, diffmj.Model, diffmj.Data]:
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    mjd.qvel[:] = qvel
    mjd.ctrl[:] = ctrl
    m = diffmj.put_model(mjm)
    return mjm, mjd, m, diffmj.put_data(m, mjd)


def test_regression_actuator_velocity_with_actuation_disabled():
    xml = f"""<mujoco><option><flag actuation="disable"/></option><worldbody>
      <body><joint name="j" axis="0 1 0"/><geom size=".1" pos=".2 0 0" {_GEOM}/></body></worldbody>
      <actuator><motor joint="j" gear="2"/></actuator></mujoco>"""
    mjm, mjd, m, d = _both(xml, qvel=[1.0], ctrl=[0.5])
    mujoco.mj_forward(mjm, mjd)  # MuJoCo sets it to 0
    assert_close("actuator_velocity", diffmj.forward(m, d).actuator_velocity, mjd.actuator_velocity)


def test_regression_tendon_armature_across_trees():
    arm = f'<geom type="capsule" fromto="0 0 0 .3 0 0" size=".05" {_GEOM}/>'
    xml = f"""<mujoco><worldbody>
      <body><joint name="a" axis="0 1 0"/>{arm}</body>
      <body pos="0 .5 0"><joint name="b" axis="0 1 0"/>{arm}</body></worldbody>
      <tendon><fixed armature="0.1"><joint joint="a" coef="1"/><joint joint="b" coef="1"/></fixed></tendon>
      </mujoco>"""
    mjm, mjd, m, d = _both(xml, qvel=[0.0, 0.0], ctrl=[])
    mujoco.mj_forward(mjm, mjd)
    qm = np.zeros((2, 2))
    mujoco.mj_fullM(mjm, mjd, qm)  # qM[0, 1] = 0: armature only within M's sparsity
    assert_close("qM", diffmj.forward(m, d).qM, qm)


def test_regression_implicit_with_ctrl_outside_ctrlrange():
    xml = f"""<mujoco><option integrator="implicitfast" timestep="0.003"/><worldbody>
      <body><joint name="j" axis="0 1 0"/><geom size=".1" pos=".2 0 0" {_GEOM}/></body></worldbody>
      <actuator><general joint="j" gaintype="affine" gainprm="0.1 0 0.5" ctrlrange="-0.5 0.5"/></actuator>
      </mujoco>"""
    mjm, mjd, m, d = _both(xml, qvel=[1.0], ctrl=[2.0])
    mujoco.mj_step(mjm, mjd)  # the velocity derivative uses the clamped control
    assert_close("qvel", diffmj.step(m, d).qvel, mjd.qvel, TOL["rollout"])


def test_regression_site_actuator_without_dofs():
    xml = f"""<mujoco><worldbody><body><geom size=".1" {_GEOM}/><site name="s"/></body></worldbody>
      <actuator><general site="s"/></actuator></mujoco>"""
    mjm, mjd, m, d = _both(xml, qvel=[], ctrl=[0.5])
    mujoco.mj_forward(mjm, mjd)
    assert_close("actuator_length", diffmj.forward(m, d).actuator_length, mjd.actuator_length)


def test_regression_rk4_fast_spinning_ball():
    xml = f"""<mujoco><option integrator="RK4" timestep="0.005"/><worldbody>
      <body><joint type="ball"/><geom type="box" size=".05 .1 .2" {_GEOM}/></body></worldbody></mujoco>"""
    mjm, mjd, m, d = _both(xml, qvel=[30.0, 40.0, 50.0], ctrl=[])
    mujoco.mj_step(mjm, mjd)  # exact inverse dexp, not its 1/12 truncation
    assert_close("qpos", diffmj.step(m, d).qpos, mjd.qpos, TOL["rollout"])
