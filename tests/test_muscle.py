"""Muscles (mju_muscleGain, mju_muscleBias, mju_muscleDynamics) against MuJoCo C.

The curves alone on arguments spread over every piece; the muscle zoo (tests/models/muscles.xml)
through actuation and set_const's actuator_acc0. Its rollouts under every integrator: test_forward.py;
its transition Jacobians: test_grad.py; its batched, compiled and differentiated steps: test_actuation.py.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj.actuation import actuation, muscle_bias, muscle_dynamics, muscle_gain
from tests.conftest import TOL, assert_close, check_stage, mj_model



def _curve_arguments(n: int, seed: int) -> dict[str, np.ndarray]:
    """Muscle parameters and lengths / velocities reaching below, inside and beyond every curve piece."""
    rng = np.random.default_rng(seed)
    lo = rng.uniform(0.5, 0.9, n)
    prm = np.stack([
        lo, lo + rng.uniform(0.1, 0.5, n),  # range
        np.where(rng.random(n) < 0.5, -1.0, rng.uniform(1, 50, n)),  # force (< 0: scale / acc0)
        rng.uniform(50, 300, n),  # scale
        rng.uniform(0.2, 0.8, n), rng.uniform(1.2, 2.0, n),  # lmin, lmax
        rng.uniform(0.5, 3.0, n), rng.uniform(0.5, 2.0, n), rng.uniform(1.1, 2.0, n),  # vmax, fpmax, fvmax
    ], -1)
    lengthrange = np.sort(rng.uniform(-0.5, 0.5, (n, 2)), -1)
    span = lengthrange[:, 1] - lengthrange[:, 0]
    length = lengthrange[:, 0] + span * rng.uniform(-1.5, 2.5, n)
    velocity = rng.uniform(-1.5, 1.5, n) * span / (prm[:, 1] - prm[:, 0]) * prm[:, 6]  # V in [-1.5, 1.5]
    acc0 = rng.uniform(0.5, 100, n)
    dynprm = np.stack([rng.uniform(0.005, 0.05, n), rng.uniform(0.02, 0.1, n),
                       np.where(rng.random(n) < 0.5, 0.0, rng.uniform(0.05, 0.5, n))], -1)
    ctrl, act = rng.uniform(-0.3, 1.3, n), rng.uniform(-0.3, 1.3, n)
    return dict(prm=prm, lengthrange=lengthrange, length=length, velocity=velocity, acc0=acc0, dynprm=dynprm,
                ctrl=ctrl, act=act)


def test_muscle_curves_match_mujoco():
    a = _curve_arguments(3000, 0)
    t = {k: torch.as_tensor(v, dtype=torch.float64) for k, v in a.items()}
    gain = muscle_gain(t["length"], t["velocity"], t["lengthrange"], t["acc0"], t["prm"])
    bias = muscle_bias(t["length"], t["lengthrange"], t["acc0"], t["prm"])
    act_dot = muscle_dynamics(t["ctrl"], t["act"], t["dynprm"])
    expected_gain, expected_bias, expected_act_dot = (np.array([
        f(*(a[k][i] for k in keys)) for i in range(len(a["length"]))
    ]) for f, keys in (
        (mujoco.mju_muscleGain, ("length", "velocity", "lengthrange", "acc0", "prm")),
        (mujoco.mju_muscleBias, ("length", "lengthrange", "acc0", "prm")),
        (mujoco.mju_muscleDynamics, ("ctrl", "act", "dynprm")),
    ))
    # the arguments reach the curves' zero and nonzero pieces
    assert 0.1 < np.mean(expected_gain == 0) < 0.7 and 0.1 < np.mean(expected_bias == 0) < 0.7
    assert_close("muscle gain", gain, expected_gain, TOL["batch"])
    assert_close("muscle bias", bias, expected_bias, TOL["batch"])
    assert_close("muscle act_dot", act_dot, expected_act_dot, TOL["batch"])


def _muscle_state(mjm: mujoco.MjModel, seed: int) -> mujoco.MjData:
    """Joints over their range and beyond, fast velocities, controls and activations around [0, 1]."""
    rng = np.random.default_rng(seed)
    mjd = mujoco.MjData(mjm)
    lo, hi = mjm.jnt_range[:, 0], mjm.jnt_range[:, 1]
    mjd.qpos[:] = lo + (hi - lo) * rng.uniform(-0.2, 1.2, mjm.nq)
    mjd.qvel[:] = 2 * rng.standard_normal(mjm.nv)
    mjd.ctrl[:] = rng.uniform(-0.3, 1.3, mjm.nu)
    mjd.act[:] = rng.uniform(-0.2, 1.2, mjm.na)
    mjd.qfrc_applied[:] = rng.standard_normal(mjm.nv)
    return mjd


@pytest.mark.parametrize("seed", range(6))
def test_actuation_matches_mujoco(seed):
    mjm = mj_model("muscles")
    mjd = _muscle_state(mjm, seed)
    mujoco.mj_forward(mjm, mjd)
    check_stage(actuation, diffmj.put_model(mjm), mjd, ("act_dot", "actuator_force", "qfrc_actuator"))


def test_set_const_recomputes_acc0_and_the_scaled_force():
    """force < 0 muscles peak at scale / acc0: a heavier arm changes acc0 and the force with it."""
    mjm = mj_model("muscles")
    m = diffmj.put_model(mjm)
    mjm.body_mass[1] *= 3
    mujoco.mj_setConst(mjm, mujoco.MjData(mjm))
    heavier = diffmj.set_param(m, "body_mass", m.body_mass[1] * 3, "upper")
    assert not np.allclose(m.actuator_acc0.numpy(), mjm.actuator_acc0)
    assert_close("actuator_acc0", heavier.actuator_acc0, mjm.actuator_acc0, TOL["setconst"])
    mjd = _muscle_state(mjm, 3)
    mujoco.mj_forward(mjm, mjd)
    out = diffmj.forward(heavier, diffmj.put_data(heavier, mjd))
    assert_close("actuator_force", out.actuator_force, mjd.actuator_force)
