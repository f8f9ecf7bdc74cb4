"""The solver at truncated settings (few iterations, few line-search evaluations) against MuJoCo C.

A model that truncates the solver (the shared humanoid: 1 iteration, 4 line-search
evaluations) ends where MuJoCo's path ends, not at the optimum: only the same
algorithm, line search included (solver._line_search, MuJoCo's PrimalSearch),
reproduces its qacc. Each test starts diffmj from MuJoCo C's states along a
random-control rollout and checks that the states exercise the truncation: at
least one line search spent its budget, and the converged optimum differs.
"""

from __future__ import annotations

import copy

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from tests.conftest import BENCHMARK_MODELS, TOL, assert_close
from tests.mjcf_random import random_contact_mjcf

FINGER = """
<mujoco><option timestep="0.005" iterations="2" ls_iterations="8" cone="elliptic">
    <flag gravity="disable"/></option>
  <default><geom solimp="0 0.9 0.01" solref=".02 1"/><joint type="hinge" axis="0 -1 0"/></default>
  <worldbody><geom type="plane" size=".6 .2 10"/>
    <body pos="-.2 0 .4"><joint name="proximal" range="-110 110" ref="-90" damping="2.5" limited="true"/>
      <geom type="capsule" size=".03" fromto="0 0 0 0 0 -.17" condim="6"/>
      <body pos="0 0 -.18"><joint name="distal" range="-110 110" damping="2.5" limited="true"/>
        <geom type="capsule" size=".028" fromto="0 0 0 0 0 -.16" condim="6"/></body></body>
    <body pos=".05 0 .2"><joint name="hinge" frictionloss=".1" armature=".01" damping=".05"/>
      <geom type="capsule" size=".02" fromto=".1 0 0 -.25 0 0" condim="4"/></body>
  </worldbody>
  <actuator><motor joint="proximal" gear="4" ctrlrange="-1 1"/><motor joint="distal" gear="2" ctrlrange="-1 1"/>
  </actuator></mujoco>"""


def _rollout(mjm: mujoco.MjModel, steps: tuple[int, ...], seed: int = 0, ctrl_scale: float = 0.5):
    """MuJoCo C's states (before mj_forward, controls set) at ``steps`` of a random-control rollout."""
    rng = np.random.default_rng(seed)
    mjd = mujoco.MjData(mjm)
    for k in range(max(steps) + 1):
        mjd.ctrl[:] = ctrl_scale * rng.uniform(-1, 1, mjm.nu)
        if k in steps:
            yield copy.copy(mjd)
        mujoco.mj_step(mjm, mjd)


def _spent_budget(mjm: mujoco.MjModel, mjd: mujoco.MjData) -> bool:
    """Whether MuJoCo's solve (after mj_forward) of some island ran out of iterations or line-search
    evaluations (island i's statistics start at solver[i * mjNSOLVER])."""
    for island in range(max(mjd.nisland, 1)):
        niter = int(mjd.solver_niter[island])
        first = island * mujoco.mjNSOLVER
        evals = [mjd.solver[first + i].neval for i in range(min(niter, mujoco.mjNSOLVER))]
        if niter == mjm.opt.iterations or max(evals, default=0) >= mjm.opt.ls_iterations:
            return True
    return False


def _check_states(mjm: mujoco.MjModel, states) -> None:
    """diffmj's forward and step from each MuJoCo C state against mj_forward and mj_step; the states
    must exercise the truncation (a solve that spent its budget, an answer off the optimum)."""
    m = diffmj.put_model(mjm)
    optimum = copy.copy(mjm)
    optimum.opt.iterations, optimum.opt.ls_iterations, optimum.opt.tolerance = 100, 50, 1e-12
    spent, off_optimum = False, 0.0
    for mjd in states:
        d = diffmj.put_data(m, mjd)
        expected = copy.copy(mjd)
        mujoco.mj_forward(mjm, expected)
        assert expected.nefc > 0
        spent |= _spent_budget(mjm, expected)
        converged = copy.copy(mjd)
        mujoco.mj_forward(optimum, converged)
        off_optimum = max(off_optimum, np.abs(converged.qacc - expected.qacc).max() / max(1, np.abs(expected.qacc).max()))
        out = diffmj.forward(m, d)
        scale = max(1.0, np.abs(expected.qacc).max())
        assert_close("qacc", out.qacc / scale, expected.qacc / scale, TOL["smooth"])
        mujoco.mj_step(mjm, mjd)
        stepped = diffmj.step(m, d)
        assert_close("qvel", stepped.qvel, mjd.qvel, TOL["smooth"])
    assert spent, "no state ran the solver out of its budget"
    assert off_optimum > 1e-6, f"truncated and converged solves agree ({off_optimum:.1e}): nothing is tested"


def test_humanoid_at_its_own_settings():
    """The shared humanoid (Newton, pyramidal, 1 iteration, 4 line-search evaluations), islands as
    MuJoCo's default: one island, scaled by its trace(M)."""
    mjm = mujoco.MjModel.from_xml_path(str(BENCHMARK_MODELS / "humanoid.xml"))
    assert (mjm.opt.iterations, mjm.opt.ls_iterations) == (1, 4)
    _check_states(mjm, _rollout(mjm, (30, 90, 150, 240, 260, 270)))


@pytest.mark.parametrize("solver", ["newton", "cg"])
def test_elliptic_finger(solver):
    """A finger turning a spinner (dm_control's finger, elliptic cones, condim 6 and 4, frictionloss,
    limits) at mujoco_playground's settings: 2 iterations, 8 line-search evaluations."""
    mjm = mujoco.MjModel.from_xml_string(FINGER)
    mjm.opt.solver = getattr(mujoco.mjtSolver, f"mjSOL_{solver.upper()}")
    _check_states(mjm, _rollout(mjm, (0, 40, 200, 300, 380), ctrl_scale=1.0))


ISLANDS = """
<mujoco><option iterations="1" ls_iterations="3"/>
  <worldbody><geom type="plane" size="5 5 .1"/>
    <body pos="0 0 .2" euler="20 10 0"><freejoint/><geom type="box" size=".1 .1 .1" mass="1"/></body>
    <body pos="1 0 .25" euler="0 30 5"><freejoint/><geom type="box" size=".1 .2 .1" mass="3"/></body>
    <body pos="3 0 3"><freejoint/><geom type="sphere" size=".3" mass="20"/></body>
  </worldbody></mujoco>"""


def test_islands_are_solved_apart():
    """Two boxes landing apart (two islands: each its own line search, scale and stopping) and a falling
    sphere in none (left at qacc_smooth)."""
    mjm = mujoco.MjModel.from_xml_string(ISLANDS)
    states = list(_rollout(mjm, (90, 110, 140, 160)))
    for mjd in states:
        expected = copy.copy(mjd)
        mujoco.mj_forward(mjm, expected)
        assert expected.nisland == 2 and expected.nidof == 12, (expected.nisland, expected.nidof)
    _check_states(mjm, states)


# seeds whose rollouts truncate a solve off its optimum (others converge within the budget: _check_states refuses them)
RANDOM_SEEDS = (1, 3, 6, 7, 9, 10, 12, 13)


@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_random_contact_models(seed):
    """Random contact models (tests/mjcf_random.py) with 1-3 iterations and 1-8 evaluations, islands as
    MuJoCo's default: each island solved on its own."""
    mjm = mujoco.MjModel.from_xml_string(random_contact_mjcf(seed))
    rng = np.random.default_rng([seed, 7])
    mjm.opt.iterations, mjm.opt.ls_iterations = int(rng.integers(1, 4)), int(rng.integers(1, 9))
    mjm.opt.solver = mujoco.mjtSolver.mjSOL_CG if seed % 3 == 0 else mujoco.mjtSolver.mjSOL_NEWTON
    _check_states(mjm, _rollout(mjm, (30, 60, 90), seed=seed, ctrl_scale=1.0))


@pytest.mark.slow  # the compile takes minutes (9 on this project's loaded 2-core machine)
def test_islands_batched_and_compiled():
    """vmap equals each state alone, and compile(vmap(step)) equals eager, where the states' islands differ
    (one box landed, then both: the island masks are batched like the states)."""
    mjm = mujoco.MjModel.from_xml_string(ISLANDS)
    m = diffmj.put_model(mjm)
    datas = [diffmj.put_data(m, mjd) for mjd in _rollout(mjm, (65, 90, 140))]
    batch = torch.stack(datas)
    stepped = diffmj.step(m, batch)
    for i, d in enumerate(datas):
        assert_close("qvel", stepped[i].qvel, diffmj.step(m, d).qvel, TOL["compiled"])
    torch._dynamo.reset()
    compiled = torch.compile(torch.vmap(diffmj.step, in_dims=(None, 0)), fullgraph=True)
    assert_close("qvel", compiled(m, batch).qvel, stepped.qvel, TOL["compiled"])
