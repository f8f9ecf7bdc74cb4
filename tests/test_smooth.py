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


# every SameFrame kind: frames within the compiler's tolerance (1e-9 here) of the body's or its inertial frame;
# the last body's geom and site are BODYROT though their pos is within 1e-7 of the inertial frame's (MuJoCo
# tests the body's frame first)
SAME_FRAME_XML = """<mujoco><worldbody><body pos="0 0 1"><freejoint/>
  <inertial pos="0.01 0.02 0" quat="1 0.1 0 0" mass="1" diaginertia="1 2 3"/>
  <geom size=".1" pos="1e-9 0 0" quat="1 1e-9 0 0"/><geom size=".1" pos="0.01 0.02 1e-9" quat="1 0.1 1e-9 0"/>
  <geom size=".1" pos="0.3 0 0" quat="1 1e-9 0 0"/><geom size=".1" pos="0.3 0 0" quat="1 0.1 0 1e-9"/>
  <site pos="1e-9 0 0"/><site pos="0.01 0.02 1e-9" quat="1 0.1 0 0"/></body>
  <body pos="0 0 2"><joint type="hinge"/><inertial pos="1e-9 0 0" mass="1" diaginertia="1 1 1"/><geom size=".1"/></body>
  <body pos="0 0 3"><joint type="hinge" axis="0 1 0"/><inertial pos="0.2 0 0" mass="1" diaginertia="1 1 1"/>
    <geom size=".1" pos="0.2 0 1e-7"/><site pos="0.2 1e-7 0"/></body>
</worldbody></mujoco>"""


@pytest.mark.parametrize("seed", SEEDS)
def test_kinematics_copies_the_frames_the_compiler_found_equal(seed):
    """MuJoCo copies the body's (or inertial) frame where geom_, site_ or body_sameframe says the element's
    is the same, though its pos / quat differ by up to the compiler's tolerance: composing them instead
    is off by ~1e-9 here (dm_control's dog: 1e-8 in a tail geom, 2e-7 in qvel after a step)."""
    mjm = mujoco.MjModel.from_xml_string(SAME_FRAME_XML)
    assert set(mjm.geom_sameframe) == {1, 2, 3, 4} and set(mjm.site_sameframe) == {1, 2, 3} and mjm.body_sameframe[2] == 1
    check_stage(smooth.kinematics, *_setup(mjm, seed), KINEMATICS)


def test_copied_frames_have_the_compositions_derivative():
    """A copied frame's value is the body's or inertial frame, its derivative the composition's: d xipos /
    d body_ipos and d geom_xpos / d geom_pos are the body's xmat for every element, copied or not (a fit of
    geom_pos or body_ipos starting where the compiler found them equal would otherwise see no gradient)."""
    mjm = mujoco.MjModel.from_xml_string(SAME_FRAME_XML)
    m, mjd = _setup(mjm, 0)
    d = diffmj.put_data(m, mjd)

    def frames(body_ipos, geom_pos):
        out = smooth.kinematics(m.replace(body_ipos=body_ipos, geom_pos=geom_pos), d)
        return out.xipos, out.geom_xpos

    jac_ipos, jac_gpos = torch.func.jacrev(frames, argnums=(0, 1))(m.body_ipos, m.geom_pos)
    bodies, geoms = torch.arange(mjm.nbody), torch.arange(mjm.ngeom)
    assert_close("d xipos / d body_ipos", jac_ipos[0][bodies, :, bodies], mjd.xmat.reshape(-1, 3, 3))
    assert_close("d geom_xpos / d geom_pos", jac_gpos[1][geoms, :, geoms], mjd.xmat.reshape(-1, 3, 3)[mjm.geom_bodyid])


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


@pytest.mark.parametrize("seed", SEEDS)
def test_jac_dif_frame(smooth_model, seed):
    """frame @ (J(body2) - J(body1)) against MuJoCo's mj_jac, every pair of bodies; the columns of
    dofs that move both bodies are exact zeros (as mj_jacDifPair's J2 - J1)."""
    m, mjd = _setup(smooth_model, seed)
    ref = reference(m, mjd)
    rng = np.random.default_rng(seed)
    pairs = np.array([(b1, b2) for b1 in range(m.nbody) for b2 in range(m.nbody)])
    points, frames = rng.standard_normal((len(pairs), 3)), rng.standard_normal((len(pairs), 3, 3))
    rows = smooth.jac_dif_frame(m, ref, torch.as_tensor(points), torch.as_tensor(pairs[:, 0]),
                                torch.as_tensor(pairs[:, 1]), torch.as_tensor(frames), rotation=True)
    ancestor = m.tree.body_dof_ancestor.numpy()
    for i, (b1, b2) in enumerate(pairs):
        jacs = []
        for b in (b1, b2):
            jacp, jacr = np.zeros((3, m.nv)), np.zeros((3, m.nv))
            mujoco.mj_jac(smooth_model, mjd, jacp, jacr, points[i], int(b))
            jacs.append((jacp, jacr))
        expected = np.concatenate([frames[i] @ (two - one) for one, two in zip(*jacs)])
        assert_close(f"bodies {b1}, {b2}", rows[i], expected)
        shared = (ancestor[b1] * ancestor[b2]) > 0
        assert (rows[i][:, torch.as_tensor(shared)] == 0).all()
    translation = smooth.jac_dif_frame(m, ref, torch.as_tensor(points), torch.as_tensor(pairs[:, 0]),
                                       torch.as_tensor(pairs[:, 1]), torch.as_tensor(frames[:, :1]))
    assert_close("one frame row", translation, rows[:, :1])


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
