"""Stage-by-stage parity of diffmj.smooth with MuJoCo C (float64).

Each test feeds one stage MuJoCo's own inputs (put_data of an mj_forward'ed
state) and compares every field the stage writes.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj import smooth
from tests.conftest import assert_close, random_state, reference

SEEDS = range(4)


def _setup(mjm, seed):
    m = diffmj.put_model(mjm)
    mjd = random_state(mjm, seed)
    mujoco.mj_forward(mjm, mjd)
    return m, mjd, reference(m, mjd)


def _check(fields, actual, expected):
    for name in fields:
        assert_close(name, getattr(actual, name), getattr(expected, name))


@pytest.mark.parametrize("seed", SEEDS)
def test_kinematics(smooth_model, seed):
    m, _, ref = _setup(smooth_model, seed)
    blank = diffmj.make_data(m).replace(qpos=ref.qpos, mocap_pos=ref.mocap_pos, mocap_quat=ref.mocap_quat)
    out = smooth.kinematics(m, blank)
    _check(
        ("xpos", "xquat", "xmat", "xipos", "ximat", "xanchor", "xaxis", "geom_xpos", "geom_xmat",
         "site_xpos", "site_xmat"),
        out,
        ref,
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_com_pos(smooth_model, seed):
    m, _, ref = _setup(smooth_model, seed)
    _check(("subtree_com", "cinert", "cdof"), smooth.com_pos(m, ref), ref)


@pytest.mark.parametrize("seed", SEEDS)
def test_tendon(smooth_model, seed):
    m, _, ref = _setup(smooth_model, seed)
    _check(("ten_length", "ten_J"), smooth.tendon(m, ref), ref)


@pytest.mark.parametrize("seed", SEEDS)
def test_crb_and_solve(smooth_model, seed):
    m, mjd, ref = _setup(smooth_model, seed)
    out = smooth.crb(m, ref)
    _check(("crb", "qM"), out, ref)
    out = smooth.factor_m(m, out)
    rhs = np.random.default_rng(seed).standard_normal((m.nv, 3))
    expected = np.zeros((3, m.nv))
    mujoco.mj_solveM(smooth_model, mjd, expected, rhs.T.copy())
    assert_close("solve_m", smooth.solve_m(m, out, torch.as_tensor(rhs)), expected.T)


@pytest.mark.parametrize("seed", SEEDS)
def test_com_vel_and_rne(smooth_model, seed):
    m, mjd, ref = _setup(smooth_model, seed)
    out = smooth.com_vel(m, ref)
    _check(("cvel", "cdof_dot"), out, ref)
    assert_close("qfrc_bias", smooth.rne(m, out), ref.qfrc_bias)
    qacc = np.random.default_rng(seed).standard_normal(m.nv)
    expected = np.zeros(m.nv)
    mjd.qacc[:] = qacc
    mujoco.mj_rne(smooth_model, mjd, 1, expected)
    assert_close("rne with qacc", smooth.rne(m, out, torch.as_tensor(qacc)), expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_transmission(smooth_model, seed):
    m, _, ref = _setup(smooth_model, seed)
    _check(("actuator_length", "actuator_moment"), smooth.transmission(m, ref), ref)


@pytest.mark.parametrize("seed", SEEDS)
def test_jac_and_apply_ft(smooth_model, seed):
    m, mjd, ref = _setup(smooth_model, seed)
    rng = np.random.default_rng(seed)
    bodies = np.arange(m.nbody)
    points = rng.standard_normal((m.nbody, 3))
    force, torque = rng.standard_normal((m.nbody, 3)), rng.standard_normal((m.nbody, 3))
    jacp, jacr = smooth.jac(m, ref, torch.as_tensor(points), torch.as_tensor(bodies))
    expected_qfrc = np.zeros(m.nv)
    for b in bodies:
        expected_p, expected_r = np.zeros((3, m.nv)), np.zeros((3, m.nv))
        mujoco.mj_jac(smooth_model, mjd, expected_p, expected_r, points[b], int(b))
        assert_close(f"jacp body {b}", jacp[b], expected_p)
        assert_close(f"jacr body {b}", jacr[b], expected_r)
        mujoco.mj_applyFT(smooth_model, mjd, force[b], torque[b], points[b], int(b), expected_qfrc)
    qfrc = smooth.apply_ft(m, ref, *(torch.as_tensor(x) for x in (force, torque, points, bodies)))
    assert_close("apply_ft", qfrc, expected_qfrc)
