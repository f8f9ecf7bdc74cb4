"""Parity of passive forces (springs, dampers, gravity compensation) with MuJoCo C."""

from __future__ import annotations

import mujoco
import pytest

import diffmj
from diffmj.passive import passive
from tests.conftest import check_stage, mj_model, random_state

WRITES = ("qfrc_spring", "qfrc_damper", "qfrc_gravcomp", "qfrc_passive")


def _check(mjm, seed):
    m = diffmj.put_model(mjm)
    mjd = random_state(mjm, seed)
    mujoco.mj_forward(mjm, mjd)
    check_stage(passive, m, mjd, WRITES)


@pytest.mark.parametrize("seed", range(4))
def test_passive(smooth_model, seed):
    _check(smooth_model, seed)


@pytest.mark.parametrize("flags", ["spring", "damper", "gravity", "spring damper"])
def test_passive_disable_flags(flags):
    mjm = mj_model("chain")
    for flag in flags.split():
        mjm.opt.disableflags |= getattr(mujoco.mjtDisableBit, f"mjDSBL_{flag.upper()}")
    _check(mjm, 0)
