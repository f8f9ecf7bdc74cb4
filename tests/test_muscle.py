"""Muscles (mju_muscleGain, mju_muscleBias, mju_muscleDynamics) against MuJoCo C.

The curves alone on arguments spread over every piece; the muscle zoo (tests/models/muscles.xml)
through actuation, the transition Jacobians (mjd_transitionFD) and set_const's actuator_acc0; its
batched, compiled and differentiated steps. Its rollouts under every integrator: test_forward.py.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj.actuation import actuation, actuator_force_vel, muscle_bias, muscle_dynamics, muscle_gain
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


@pytest.mark.parametrize("integrator", ["euler", "implicit", "implicitfast"])
def test_transition_jacobians_match_mujoco(integrator):
    """Exact Jacobians against mjd_transitionFD (centred, eps 1e-6): within its truncation error."""
    mjm = mj_model("muscles")
    mjm.opt.integrator = diffmj.IntegratorType[integrator.upper()]
    mjd = _muscle_state(mjm, 2)
    mjd.ctrl[:] = np.clip(mjd.ctrl, 0.05, 0.95)  # away from the muscle's control clamp
    mujoco.mj_forward(mjm, mjd)
    m = diffmj.put_model(mjm)
    A, B, _, _ = diffmj.grad.transition_jacobians(m, diffmj.put_data(m, mjd))
    nx = 2 * mjm.nv + mjm.na
    Am, Bm = np.zeros((nx, nx)), np.zeros((nx, mjm.nu))
    mujoco.mjd_transitionFD(mjm, mjd, 1e-6, 1, Am, Bm, None, None)
    assert np.abs(Bm[2 * mjm.nv :]).max() > 0.1  # the activations respond to the controls (dt / tau)
    for label, ours, theirs in (("A", A, Am), ("B", B, Bm)):
        err = np.abs(ours.numpy() - theirs).max() / max(1.0, np.abs(theirs).max())
        assert err <= 1e-6, f"{label}: relative error {err:.2e} vs mjd_transitionFD"


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


def _batch(m: diffmj.Model, mjm: mujoco.MjModel, n: int) -> diffmj.Data:
    states = [_muscle_state(mjm, 10 + k) for k in range(n)]
    d = diffmj.make_data(m, (n,))
    return d.replace(**{name: torch.as_tensor(np.stack([getattr(s, name) for s in states]), dtype=m.dtype)
                        for name in ("qpos", "qvel", "ctrl", "act")})


def test_vmap_equals_loop_and_gradients_are_finite():
    mjm = mj_model("muscles")
    mjm.opt.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    m = diffmj.put_model(mjm)
    d = _batch(m, mjm, 8)
    params = {name: getattr(m, name).clone().requires_grad_(True)
              for name in ("actuator_gainprm", "actuator_biasprm", "actuator_dynprm", "actuator_lengthrange",
                           "actuator_acc0")}
    ctrl = d.ctrl.clone().requires_grad_(True)
    out = diffmj.step(m.replace(**params), d.replace(ctrl=ctrl))
    for k in range(d.qpos.shape[0]):
        one = diffmj.step(m, d[k])
        for name in ("qpos", "qvel", "act"):
            assert_close(f"{k} {name}", getattr(out, name)[k], getattr(one, name), TOL["batch"])
    loss = (out.qvel**2).sum() + (out.act**2).sum()
    grads = torch.autograd.grad(loss, [ctrl, *params.values()])
    for name, g in zip(["ctrl", *params], grads):
        assert torch.isfinite(g).all(), name
    assert grads[0].abs().max() > 0 and grads[-1].abs().max() > 0


def test_compiled_actuation_equals_eager():
    """The muscle stage and its velocity derivative compiled (fullgraph, vmapped); the whole step: slow test."""
    mjm = mj_model("muscles")
    m = diffmj.put_model(mjm)
    d = torch.vmap(diffmj.forward, in_dims=(None, 0))(m, _batch(m, mjm, 4))

    def stage(m, d):
        out = actuation(m, d)
        return out.act_dot, out.actuator_force, out.qfrc_actuator, actuator_force_vel(m, out)

    compiled = torch.compile(torch.vmap(stage, in_dims=(None, 0)), fullgraph=True)(m, d)
    eager = torch.vmap(stage, in_dims=(None, 0))(m, d)
    for name, a, b in zip(("act_dot", "actuator_force", "qfrc_actuator", "force_vel"), compiled, eager):
        assert_close(name, a, b, TOL["compiled"])


@pytest.mark.slow
def test_compiled_step_equals_eager():
    mjm = mj_model("muscles")
    mjm.opt.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    m = diffmj.put_model(mjm)
    d = _batch(m, mjm, 4)
    step = torch.compile(torch.vmap(diffmj.step, in_dims=(None, 0)), fullgraph=True)
    compiled, eager = step(m, d), diffmj.step(m, d)
    for name in ("qpos", "qvel", "act", "actuator_force"):
        assert_close(name, getattr(compiled, name), getattr(eager, name), TOL["compiled"])
