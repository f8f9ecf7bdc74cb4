"""Parity of actuation (activation dynamics, gains, biases, clamps) with MuJoCo C."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

import diffmj
from diffmj.actuation import actuation
from tests.conftest import check_stage, mj_model, random_state

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
