"""Geom surface velocities (conveyor belts, turntables, rollers; mj_referenceConstraint's
mj_addSurfaceVel) against MuJoCo C: constraint velocities, a free rollout, batched and differentiated."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from tests.conftest import MODELS, TOL, assert_close, match_efc, mj_model

CONES = {"pyramidal": mujoco.mjtCone.mjCONE_PYRAMIDAL, "elliptic": mujoco.mjtCone.mjCONE_ELLIPTIC}


def _start(cone: str) -> tuple[mujoco.MjModel, mujoco.MjData]:
    mjm = mj_model("surface_velocity")
    mjm.opt.cone = CONES[cone]
    mjd = mujoco.MjData(mjm)
    mjd.qvel[:] = 0.2 * np.random.default_rng(0).standard_normal(mjm.nv)
    return mjm, mjd


@pytest.mark.parametrize("cone", CONES)
def test_surface_velocity_rows_and_rollout(cone):
    """efc_vel and efc_aref of every row after each step, and 100 free steps; the crate ends up riding
    the belt at the belt's surface velocity."""
    mjm, mjd = _start(cone)
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, mjd)
    dims = set()
    for t in range(100):
        mujoco.mj_step(mjm, mjd)
        d = diffmj.step(m, d)
        if t % 25 == 0:
            mujoco.mj_forward(mjm, mjd)
            out = diffmj.forward(m, diffmj.put_data(m, mjd))
            ours, theirs = match_efc(m, out, mjd)
            assert_close("efc_vel", out.efc_vel[ours], mjd.efc_vel[theirs])
            assert_close("efc_aref", out.efc_aref[ours], mjd.efc_aref[theirs], TOL["impedance"])
            dims |= {int(c.dim) for c in mjd.contact}
    assert dims == {1, 3, 4, 6}
    for name in ("qpos", "qvel"):
        assert_close(name, getattr(d, name), getattr(mjd, name), TOL["rollout"])
    # that the surface velocity acts at all (the crate would otherwise be near rest, 0.5 m/s off), not a
    # parity bound: MuJoCo's soft contact leaves the crate creeping 5.6e-5 m/s behind the belt here
    np.testing.assert_allclose(mjd.qvel[:2], mjm.geom_surfacevel[mjm.geom("belt").id, :2], atol=1e-3)


def test_surface_velocity_batched_and_differentiable():
    """vmap over initial velocities equals the loop, and the crate's travel is differentiable w.r.t. the
    belt's speed (d x / d v = the time it rode the belt, about 0.1 s over 50 steps)."""
    mjm, mjd = _start("pyramidal")
    m = diffmj.put_model(mjm)
    d0 = diffmj.put_data(m, mjd)
    rest = m.geom_surfacevel[mjm.geom("belt").id, 1:]

    def crate_x(speed, qvel):
        model = diffmj.set_param(m, "geom_surfacevel", torch.cat((speed[None], rest)), "belt")
        d = d0.replace(qvel=qvel)
        for _ in range(50):
            d = diffmj.step(model, d)
        return d.qpos[0]

    speed = torch.tensor(0.5, dtype=torch.float64)
    qvel = d0.qvel + 0.05 * torch.randn(3, mjm.nv, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    each = torch.stack([crate_x(speed, q) for q in qvel])
    assert_close("vmap", torch.vmap(crate_x, in_dims=(None, 0))(speed, qvel), each)
    grad = torch.func.grad(crate_x)(speed, d0.qvel)
    assert 0.05 < grad < 0.1, grad  # the crate accelerates to the belt's speed within the first steps


def test_surface_velocity_refused_where_not_loaded():
    m = diffmj.load(MODELS / "pendulum.xml")
    with pytest.raises(ValueError, match="no geom's surface velocity set"):
        diffmj.set_param(m, "geom_surfacevel", 1.0)
