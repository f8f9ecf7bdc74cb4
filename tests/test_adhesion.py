"""Adhesion actuators (body transmissions, mj_transmission's mjTRN_BODY) against MuJoCo C.

Their moment arm is minus the mean normal Jacobian of the body's contacts, those in the margin's gap
(no constraint rows) included, so it changes with the contacts made and broken.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj import smooth
from diffmj.collision.driver import collision
from tests.conftest import TOL, assert_close, check_stage, mj_model

CONES = {"pyramidal": mujoco.mjtCone.mjCONE_PYRAMIDAL, "elliptic": mujoco.mjtCone.mjCONE_ELLIPTIC}


def _model(cone: str) -> mujoco.MjModel:
    mjm = mj_model("adhesion")
    mjm.opt.cone = CONES[cone]
    return mjm


def _state(mjm: mujoco.MjModel, seed: int) -> mujoco.MjData:
    """Box and ball a few mm above or into the floor and each other, tilted; the arm's tip in the gap
    or clear of the floor; every adhesion partly on."""
    rng = np.random.default_rng(seed)
    mjd = mujoco.MjData(mjm)
    mjd.qpos[:] = mjm.qpos0
    for z, quat in ((2, slice(3, 7)), (9, slice(10, 14))):
        mjd.qpos[z] += rng.uniform(-0.01, 0.015)
        mjd.qpos[quat] += 0.05 * rng.standard_normal(4)
    mjd.qpos[14] = rng.uniform(-0.3, 0.3)
    mujoco.mj_normalizeQuat(mjm, mjd.qpos)
    mjd.qvel[:] = 0.1 * rng.standard_normal(mjm.nv)
    mjd.ctrl[:] = rng.uniform(0, 1, mjm.nu)
    return mjd


@pytest.mark.parametrize("cone", CONES)
def test_adhesion_moment(cone):
    """Moment arms and forces over states whose contacts are active, in the gap, or absent."""
    mjm = _model(cone)
    m = diffmj.put_model(mjm)
    kinds = set()
    for seed in range(4):
        mjd = _state(mjm, seed)
        mujoco.mj_forward(mjm, mjd)
        kinds |= {(int(c.exclude), int(c.dim)) for c in mjd.contact}
        d = collision(m, diffmj.put_data(m, mjd))  # put_data leaves the contact slots empty
        out = check_stage(smooth.transmission, m, mjd, ("actuator_length", "actuator_moment"), d=d)
        assert (out.actuator_moment[:3] != 0).any(-1).all()  # every adhesion has contacts to act through
        assert_close("qfrc_actuator", diffmj.forward(m, diffmj.put_data(m, mjd)).qfrc_actuator, mjd.qfrc_actuator)
    assert kinds >= {(0, 1), (0, 3), (0, 4), (1, 3), (1, 4)}, kinds
    # the arm lifted clear of the floor: no contact, a zero moment (MuJoCo's count 0)
    mjd = _state(mjm, 0)
    mjd.qpos[14] = 0.5
    mujoco.mj_forward(mjm, mjd)
    out = check_stage(smooth.transmission, m, mjd, ("actuator_length", "actuator_moment"),
                      d=collision(m, diffmj.put_data(m, mjd)))
    assert (out.actuator_moment[2] == 0).all()


@pytest.mark.parametrize("cone", CONES)
def test_adhesion_rollout(cone):
    """50 steps with the adhesions on: contacts made, broken and kept in the gap along the way."""
    mjm = _model(cone)
    m = diffmj.put_model(mjm)
    mjd = _state(mjm, 1)
    mjd.ctrl[:3] = 1.0
    d = diffmj.put_data(m, mjd)
    for _ in range(50):
        mujoco.mj_step(mjm, mjd)
        d = diffmj.step(m, d)
    for name in ("qpos", "qvel"):
        assert_close(name, getattr(d, name), getattr(mjd, name), TOL["rollout"])


def _box_height(m: diffmj.Model):
    def box_height(ctrl, d):
        """The box's height after two steps from d with controls ctrl."""
        d = diffmj.step(m, d.replace(ctrl=ctrl))
        return diffmj.step(m, d).qpos[..., 2]

    return box_height


def _batch() -> tuple[diffmj.Model, diffmj.Data]:
    mjm = _model("pyramidal")
    m = diffmj.put_model(mjm)
    return m, torch.stack([diffmj.put_data(m, _state(mjm, seed)) for seed in range(3)])


def test_adhesion_batched_and_differentiable():
    """vmap equals the loop, and the gradient of where the box ends w.r.t. its adhesion is finite and
    non-zero (the adhesion acts through its contacts)."""
    m, d = _batch()
    box_height = _box_height(m)
    each = torch.stack([box_height(d.ctrl[i], d[i]) for i in range(3)])
    assert_close("vmap", torch.vmap(box_height)(d.ctrl, d), each)
    grad = torch.func.grad(box_height)(d.ctrl[0], d[0])
    assert torch.isfinite(grad).all() and grad[0] != 0


@pytest.mark.slow  # ~8 min: a batched compile of a contact model
def test_adhesion_compiled_equals_eager():
    m, d = _batch()
    box_height = _box_height(m)
    assert_close("compiled", torch.compile(box_height, fullgraph=True)(d.ctrl, d), box_height(d.ctrl, d))
