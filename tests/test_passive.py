"""Parity of passive forces (springs, dampers, gravity compensation) with MuJoCo C."""

from __future__ import annotations

import mujoco
import pytest

import diffmj
from diffmj.passive import passive
from tests.conftest import assert_close, mj_model, random_state, reference


@pytest.mark.parametrize("seed", range(4))
def test_passive(smooth_model, seed):
    m = diffmj.put_model(smooth_model)
    mjd = random_state(smooth_model, seed)
    mujoco.mj_forward(smooth_model, mjd)
    ref = reference(m, mjd)
    out = passive(m, ref)
    for name in ("qfrc_spring", "qfrc_damper", "qfrc_gravcomp", "qfrc_passive"):
        assert_close(name, getattr(out, name), getattr(ref, name))


@pytest.mark.parametrize("flags", ["spring", "damper", "gravity", "spring damper"])
def test_passive_disable_flags(flags):
    mjm = mj_model("chain")
    for flag in flags.split():
        mjm.opt.disableflags |= getattr(mujoco.mjtDisableBit, f"mjDSBL_{flag.upper()}")
    m = diffmj.put_model(mjm)
    mjd = random_state(mjm, 0)
    mujoco.mj_forward(mjm, mjd)
    out = passive(m, reference(m, mjd))
    for name in ("qfrc_spring", "qfrc_damper", "qfrc_gravcomp", "qfrc_passive"):
        assert_close(name, getattr(out, name), getattr(mjd, name))
