"""Parity of actuation (activation dynamics, gains, biases, clamps, DC motors) with MuJoCo C.

Muscles: test_muscle.py; rollouts of these models under every integrator: test_forward.py. Here also
the muscle and DC motor models batched, compiled and differentiated.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj.actuation import actuation, actuator_force_vel
from tests.conftest import ACTUATOR_MODELS, TOL, assert_close, check_stage, mj_model, random_state

WRITES = ("act_dot", "actuator_force", "qfrc_actuator")


def _compare(mjm, mjd):
    m = diffmj.put_model(mjm)
    mujoco.mj_forward(mjm, mjd)
    check_stage(actuation, m, mjd, WRITES)


@pytest.mark.parametrize("seed", range(6))
def test_actuation(seed):
    mjm = mj_model("actuators")
    mjd = random_state(mjm, seed)
    mjd.ctrl[:] *= 3  # exercise ctrl, force, tendon and joint force clamps
    _compare(mjm, mjd)


@pytest.mark.parametrize("seed", range(4))
def test_dcmotors(seed):
    """Voltages beyond the current's rate limit and the force limit; currents beyond actrange (not clamped)."""
    mjm = mj_model("dcmotors")
    mjd = random_state(mjm, seed)
    mjd.ctrl[:] *= ACTUATOR_MODELS["dcmotors"]
    mjd.act[:] *= 5
    mjd.qvel[:] *= 20
    _compare(mjm, mjd)


@pytest.mark.parametrize("flag", ["clampctrl", "actuation", "gravity"])
def test_actuation_disable_flags(flag):
    mjm = mj_model("actuators")
    mjm.opt.disableflags |= getattr(mujoco.mjtDisableBit, f"mjDSBL_{flag.upper()}")
    mjd = random_state(mjm, 1)
    mjd.ctrl[:] *= 3
    _compare(mjm, mjd)


def test_disabled_actuator_group():
    mjm = mj_model("actuators")
    mjm.actuator_group[:] = np.arange(mjm.nu) % 3
    mjm.opt.disableactuator = 1 << 1
    _compare(mjm, random_state(mjm, 2))


def test_bad_ctrl_zeroes_all_controls():
    mjm = mj_model("actuators")
    mjd = random_state(mjm, 3)
    mjd.ctrl[2] = np.nan
    _compare(mjm, mjd)


MUSCLE_AND_DCMOTOR = ("muscles", "dcmotors")


def _batch(model: str, n: int) -> tuple[mujoco.MjModel, diffmj.Model, diffmj.Data]:
    mjm = mj_model(model)
    mjm.opt.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST  # differentiates the actuator forces
    m = diffmj.put_model(mjm)
    states = [random_state(mjm, 10 + k) for k in range(n)]
    d = diffmj.make_data(m, (n,)).replace(**{
        name: torch.as_tensor(np.stack([getattr(s, name) for s in states]), dtype=m.dtype)
        for name in ("qpos", "qvel", "ctrl", "act")
    })
    return mjm, m, d.replace(ctrl=d.ctrl * ACTUATOR_MODELS[model])


@pytest.mark.parametrize("model", MUSCLE_AND_DCMOTOR)
def test_vmap_equals_loop_and_gradients_are_finite(model):
    _, m, d = _batch(model, 8)
    names = ("actuator_gainprm", "actuator_biasprm", "actuator_dynprm", "actuator_lengthrange", "actuator_acc0")
    params = {name: getattr(m, name).clone().requires_grad_(True) for name in names}
    ctrl = d.ctrl.clone().requires_grad_(True)
    out = diffmj.step(m.replace(**params), d.replace(ctrl=ctrl))
    for k in range(d.qpos.shape[0]):
        one = diffmj.step(m, d[k])
        for name in ("qpos", "qvel", "act"):
            assert_close(f"{k} {name}", getattr(out, name)[k], getattr(one, name), TOL["batch"])
    loss = (out.qvel**2).sum() + (out.act**2).sum()
    grads = dict(zip(["ctrl", *params], torch.autograd.grad(loss, [ctrl, *params.values()], allow_unused=True,
                                                            materialize_grads=True)))
    for name, g in grads.items():
        assert torch.isfinite(g).all(), name
    assert grads["ctrl"].abs().max() > 0 and grads["actuator_gainprm"].abs().max() > 0


@pytest.mark.slow
@pytest.mark.parametrize("model", MUSCLE_AND_DCMOTOR)
def test_compiled_actuation_equals_eager(model):
    """The stage and its velocity derivative compiled (fullgraph, vmapped); the whole step: slow test below."""
    _, m, d = _batch(model, 4)
    d = torch.vmap(diffmj.forward, in_dims=(None, 0))(m, d)

    def stage(m, d):
        out = actuation(m, d)
        return out.act_dot, out.actuator_force, out.qfrc_actuator, actuator_force_vel(m, out)

    compiled = torch.compile(torch.vmap(stage, in_dims=(None, 0)), fullgraph=True)(m, d)
    eager = torch.vmap(stage, in_dims=(None, 0))(m, d)
    for name, a, b in zip(("act_dot", "actuator_force", "qfrc_actuator", "force_vel"), compiled, eager):
        assert_close(name, a, b, TOL["compiled"])


@pytest.mark.slow
@pytest.mark.parametrize("model", MUSCLE_AND_DCMOTOR)
def test_compiled_step_equals_eager(model):
    _, m, d = _batch(model, 4)
    step = torch.compile(torch.vmap(diffmj.step, in_dims=(None, 0)), fullgraph=True)
    compiled, eager = step(m, d), diffmj.step(m, d)
    for name in ("qpos", "qvel", "act", "actuator_force"):
        assert_close(name, getattr(compiled, name), getattr(eager, name), TOL["compiled"])
