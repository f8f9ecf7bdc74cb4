"""Stage-by-stage parity of diffmj.smooth with MuJoCo C (float64).

Each test runs one stage on MuJoCo's state (put_data of an mj_forward'ed state)
with the stage's output fields poisoned, and compares every field it writes
(conftest.check_stage).
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj import smooth
from tests.conftest import TOL, assert_close, check_stage, mj_model, random_state, reference

SEEDS = range(4)
KINEMATICS = ("xpos", "xquat", "xmat", "xipos", "ximat", "xanchor", "xaxis", "geom_xpos", "geom_xmat",
              "site_xpos", "site_xmat")


def _setup(mjm, seed):
    m = diffmj.put_model(mjm)
    mjd = random_state(mjm, seed)
    mujoco.mj_forward(mjm, mjd)
    return m, mjd


def bias_stage(m, d):
    """fwd_velocity's use of rne: qfrc_bias."""
    return d.replace(qfrc_bias=smooth.rne(m, d))


@pytest.mark.parametrize("seed", SEEDS)
def test_kinematics(smooth_model, seed):
    check_stage(smooth.kinematics, *_setup(smooth_model, seed), KINEMATICS)


@pytest.mark.parametrize("seed", SEEDS)
def test_com_pos(smooth_model, seed):
    check_stage(smooth.com_pos, *_setup(smooth_model, seed), ("subtree_com", "cinert", "cdof"))


@pytest.mark.parametrize("seed", SEEDS)
def test_tendon(smooth_model, seed):
    check_stage(smooth.tendon, *_setup(smooth_model, seed), ("ten_length", "ten_J"))


@pytest.mark.parametrize("seed", SEEDS)
def test_crb_and_solve(smooth_model, seed):
    m, mjd = _setup(smooth_model, seed)
    check_stage(smooth.crb, m, mjd, ("crb", "qM"))
    # MuJoCo's qLD is a sparse L'DL in its own layout: no counterpart; check_stage compares diffmj's
    # dense Cholesky factor with the Cholesky factor of MuJoCo's qM, and mj_solveM checks its use.
    out = check_stage(smooth.factor_m, m, mjd, ("qLD",))
    rhs = np.random.default_rng(seed).standard_normal((m.nv, 3))
    expected = np.zeros((3, m.nv))
    mujoco.mj_solveM(smooth_model, mjd, expected, rhs.T.copy())
    assert_close("solve_m", smooth.solve_m(m, out, torch.as_tensor(rhs)), expected.T)


@pytest.mark.parametrize("seed", SEEDS)
def test_com_vel_and_rne(smooth_model, seed):
    m, mjd = _setup(smooth_model, seed)
    check_stage(smooth.com_vel, m, mjd, ("cvel", "cdof_dot"))
    out = check_stage(bias_stage, m, mjd, ("qfrc_bias",))
    qacc = np.random.default_rng(seed).standard_normal(m.nv)
    expected = np.zeros(m.nv)
    mjd.qacc[:] = qacc
    mujoco.mj_rne(smooth_model, mjd, 1, expected)
    assert_close("rne with qacc", smooth.rne(m, out, torch.as_tensor(qacc)), expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_transmission(seed):
    """On the actuator model (the chain has no actuators)."""
    mjm = mj_model("actuators")
    check_stage(smooth.transmission, *_setup(mjm, seed), ("actuator_length", "actuator_moment"))


@pytest.mark.parametrize("seed", SEEDS)
def test_jac_and_apply_ft(smooth_model, seed):
    m, mjd = _setup(smooth_model, seed)
    ref = reference(m, mjd)
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


@pytest.mark.slow
def test_compiled_kinematics_equals_eager():
    """Kinematics (every joint type) compiled by inductor equals eager: a formulation of the quaternion
    products that inductor miscompiled in this composition (xpos off by 2.5e-2 here, each product alone exact)
    would fail here and nowhere else."""
    mjm = mj_model("chain")
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, random_state(mjm, 0))
    torch._dynamo.reset()
    compiled = torch.compile(smooth.kinematics, fullgraph=True)(m, d)
    eager = smooth.kinematics(m, d)
    for name in ("xpos", "xquat", "xmat", "xipos", "xanchor", "xaxis", "geom_xpos", "geom_xmat", "site_xpos"):
        assert_close(name, getattr(compiled, name), getattr(eager, name), TOL["compiled"])
