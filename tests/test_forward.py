"""forward() and step() against mujoco.mj_forward / mj_step, every integrator; purity; batching."""

from __future__ import annotations

import functools

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj.actuation import actuation
from diffmj.forward import fwd_acceleration, fwd_constraint, fwd_position, fwd_velocity
from tests.conftest import ACTUATOR_MODELS, TOL, assert_close, check_stage, mj_model, random_state
from tests.test_smooth import KINEMATICS

INTEGRATORS = {name: diffmj.IntegratorType[name.upper()] for name in ("euler", "rk4", "implicit", "implicitfast")}
# what each stage writes in a model without contacts or constraint rows
POSITION = KINEMATICS + ("subtree_com", "cinert", "cdof", "ten_length", "ten_J", "crb", "qM", "qLD",
                         "actuator_length", "actuator_moment")
VELOCITY = ("ten_velocity", "actuator_velocity", "cvel", "cdof_dot", "qfrc_spring", "qfrc_damper",
            "qfrc_gravcomp", "qfrc_passive", "qfrc_bias")
ACTUATION = ("act_dot", "actuator_force", "qfrc_actuator")
STAGES = {
    "fwd_position": (fwd_position, POSITION),
    "fwd_velocity": (fwd_velocity, VELOCITY),
    "actuation": (actuation, ACTUATION),
    "fwd_acceleration": (fwd_acceleration, ("qfrc_smooth", "qacc_smooth")),
    "fwd_constraint": (functools.partial(fwd_constraint, mode=diffmj.BackwardMode.IMPLICIT), ("qacc", "qfrc_constraint")),
    "forward": (diffmj.forward, POSITION + VELOCITY + ACTUATION + ("qfrc_smooth", "qacc_smooth", "qacc",
                                                                   "qfrc_constraint")),
}


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("seed", range(3))
def test_forward_stages(smooth_model, stage, seed):
    """forward and each of its stages write exactly their fields, equal to MuJoCo's
    (the chain has no actuators: its actuator fields are empty)."""
    m = diffmj.put_model(smooth_model)
    mjd = random_state(smooth_model, seed)
    mujoco.mj_forward(smooth_model, mjd)
    check_stage(*STAGES[stage][:1], m, mjd, STAGES[stage][1], empty_ok=True)


@pytest.mark.parametrize("integrator", INTEGRATORS)
@pytest.mark.parametrize("seed", range(2))
def test_step(smooth_model, integrator, seed):
    smooth_model.opt.integrator = INTEGRATORS[integrator]
    m = diffmj.put_model(smooth_model)
    mjd = random_state(smooth_model, seed)
    d = diffmj.put_data(m, mjd)
    mujoco.mj_step(smooth_model, mjd)
    out = diffmj.step(m, d)
    for name in ("qpos", "qvel", "act", "time", "qacc_warmstart", "qacc", "actuator_force"):
        assert_close(name, getattr(out, name), getattr(mjd, name), empty_ok=True)  # the chain has no actuators


@pytest.mark.parametrize("model", ACTUATOR_MODELS)
@pytest.mark.parametrize("integrator", INTEGRATORS)
def test_rollout_matches(integrator, model):
    """25 steps; the implicit integrators differentiate the actuator forces (affine, muscle, DC motor) in the
    velocity."""
    mjm = mj_model(model)
    mjm.opt.integrator = INTEGRATORS[integrator]
    m = diffmj.put_model(mjm)
    mjd = random_state(mjm, 7)
    mjd.ctrl[:] *= ACTUATOR_MODELS[model]
    d = diffmj.put_data(m, mjd)
    for _ in range(25):
        mujoco.mj_step(mjm, mjd)
        d = diffmj.step(m, d)
    for name in ("qpos", "qvel", "act"):
        assert_close(name, getattr(d, name), getattr(mjd, name), TOL["rollout"])


def test_euler_without_implicit_damping():
    mjm = mj_model("chain")
    mjm.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_EULERDAMP
    m = diffmj.put_model(mjm)
    mjd = random_state(mjm, 3)
    d = diffmj.put_data(m, mjd)
    mujoco.mj_step(mjm, mjd)
    assert_close("qvel", diffmj.step(m, d).qvel, mjd.qvel)


def test_step_is_pure(smooth_model):
    m = diffmj.put_model(smooth_model)
    d = diffmj.put_data(m, random_state(smooth_model, 0))
    before = d.to_tensordict().clone()
    diffmj.step(m, d)
    diffmj.forward(m, d)
    for k, v in d.to_tensordict().items(include_nested=True, leaves_only=True):
        assert torch.equal(v, before[k]), f"step modified its input field {k}"


def test_batched_data_equals_each_element():
    mjm = mj_model("actuators")
    m = diffmj.put_model(mjm)
    ds = [diffmj.put_data(m, random_state(mjm, s)) for s in range(3)]
    batch = torch.stack([torch.stack(ds), torch.stack(ds[::-1])])  # batch shape (2, 3)
    out = diffmj.step(m, batch)
    assert out.batch_size == torch.Size([2, 3])
    for i, d in enumerate(ds):
        single = diffmj.step(m, d)
        for name in ("qpos", "qvel", "act", "qacc"):
            assert_close(name, getattr(out[0, i], name), getattr(single, name), TOL["batch"])
            assert_close(name, getattr(out[1, 2 - i], name), getattr(single, name), TOL["batch"])


def test_make_data_matches_mjdata(smooth_model):
    m = diffmj.put_model(smooth_model)
    d = diffmj.make_data(m)
    mjd = mujoco.MjData(smooth_model)
    for name in ("qpos", "qvel", "act", "ctrl", "mocap_pos", "mocap_quat", "time"):
        # the chain has no actuators, the actuator model no mocap bodies
        assert_close(name, getattr(d, name), getattr(mjd, name), 0.0, empty_ok=True)
    batch = diffmj.make_data(m, (4, 2))
    assert batch.batch_size == torch.Size([4, 2]) and batch.qpos.shape == (4, 2, m.nq)


def test_get_data_roundtrip(smooth_model):
    m = diffmj.put_model(smooth_model)
    mjd = random_state(smooth_model, 5)
    out = diffmj.forward(m, diffmj.put_data(m, mjd))
    back = diffmj.get_data(smooth_model, out)
    mujoco.mj_forward(smooth_model, mjd)
    for name in ("qpos", "qvel", "xpos", "qfrc_bias", "qacc", "actuator_force"):
        assert_close(name, getattr(back, name), getattr(mjd, name), empty_ok=True)  # the chain has no actuators
    batch = diffmj.get_data(smooth_model, torch.stack([out, out]))
    assert len(batch) == 2 and np.array_equal(batch[1].qpos, back.qpos)
