"""benchmarks/planners.py runs every planner, open loop and in MPC, on a tiny horizon (its smallest
configuration), and its records say what happened. The figures themselves are the benchmark's, not a test's."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest
import torch

from optim_examples import tasks

ROOT = pathlib.Path(__file__).parents[1]
_spec = importlib.util.spec_from_file_location("planners_benchmark", ROOT / "benchmarks" / "planners.py")
planners = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(planners)

TINY = planners.QUICK._replace(ilqr_iterations=1, shooting_iterations=1, sampling_iterations=2, samples=4, seeds=1)


@pytest.fixture(scope="module")
def cartpole():
    return planners.setups()["cartpole"]


@pytest.mark.parametrize("name", planners.PLANNERS)
def test_open_loop_runs_one_step(name, cartpole):
    record = planners.open_loop(name, cartpole, TINY, "mujoco", horizon=3)
    expected = TINY.sampling_iterations if name in planners.SAMPLING else 1
    assert record["iterations"] == expected
    times, costs = zip(*record["trace"])
    assert len(costs) == expected + 1 and times[0] == 0 and np.all(np.diff(times) > 0)
    assert record["initial_cost"] == costs[0] and record["final_cost"] == costs[-1]
    if name not in ("mppi", "cem"):  # a weighted or elite mean may cost more; these never do
        assert np.all(np.diff(costs) <= 0)
    # the planners' own states against MuJoCo C's replay of their controls: the same physics
    assert record["replay_difference"] < 1e-10
    # hanging down after 3 steps: far from up, and the record says so
    assert record["mujoco_final_error"] > 3 and not record["success"]


@pytest.mark.parametrize("name", planners.PLANNERS)
def test_closed_loop_runs_two_steps(name, cartpole):
    record = planners.closed_loop(name, cartpole, TINY, "mujoco", seed=0, mpc_steps=2, horizon=3)
    assert record["steps"] == 2 and record["plan_time_mean"] > 0
    assert not record["success"] and record["first_up_time"] is None and record["final_error"] > 3


def test_closed_loop_success_is_the_tasks_criterion(cartpole):
    """Starting upright at rest and planning to stay there counts as a success; hanging does not."""
    upright = cartpole._replace(task=cartpole.task._replace(qpos0=(0.0, 0.0)), perturbation=0.0)
    record = planners.closed_loop("predictive_sampling", upright, TINY, "mujoco", seed=0, mpc_steps=3, horizon=5)
    assert record["success"] and record["first_up_time"] == pytest.approx(upright.timestep)


def test_seeds_perturb_the_start(cartpole):
    loaded = planners.load(cartpole)
    assert loaded.d.qpos.tolist() == list(tasks.cartpole().qpos0)
    first, second = (planners.closed_loop("ilqr_fd", cartpole, TINY, "mujoco", seed=s, mpc_steps=1, horizon=2)
                     for s in (0, 1))
    assert first["final_error"] != second["final_error"]


def test_table_lists_every_record(cartpole):
    result = {"open_loop": [planners.open_loop("predictive_sampling", cartpole, TINY, "mujoco", horizon=2)],
              "closed_loop": [planners.closed_loop("cem", cartpole, TINY, "mujoco", seed=s, mpc_steps=1, horizon=2)
                              for s in (0, 1)]}
    table = planners.markdown(result)
    assert "| cartpole | predictive_sampling | 2 | 2 |" in table
    assert "| cartpole | cem | 2 | 1 | 0/2 |" in table


def test_hopper_starts_crouched_on_the_floor():
    """The hopper's start touches the floor with its flat foot, at rest, 0.31 m from standing."""
    setup = planners.setups()["hopper"]
    loaded = planners.load(setup)
    top, ankle = tasks.hopper_points(loaded.d.qpos)
    assert float(ankle[1]) == pytest.approx(0.06, abs=1e-12) and float(top[1]) < tasks.HOPPER_STAND_HEIGHT - 0.2
    assert float(loaded.d.qpos[2:].sum()) == pytest.approx(0.0, abs=1e-12)  # the foot is flat
    assert setup.task.error(loaded.d.qpos.numpy()) > setup.task.tolerance
    assert loaded.m.opt.timestep.item() == setup.timestep and torch.all(loaded.d.qvel == 0)
