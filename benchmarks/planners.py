"""Planners side by side: cost against wall time open loop, and closed-loop MPC success with MuJoCo C as the plant.

    python benchmarks/planners.py --quick          # every planner and task, tiny budgets: a few minutes
    python benchmarks/planners.py                  # the full run (about an hour on 2 loaded cores)
    python benchmarks/planners.py --table benchmarks/results/planners.json

``--ilqr-compile`` (with ``--rollouts diffmj``) runs iLQR's forward passes compiled (``optim.ilqr(compile=True)``):
each run first makes one warm-up call from its start (``warmup_time``: one iteration, plus the compile in the
process's first call for a model), then the timed one.

Tasks (``optim_examples/tasks.py``, one place for their models and costs): MJPC's cart-pole and acrobot
swing-ups with MJPC's costs, and the hopper standing up from a crouch (contact). Planners (``diffmj.optim``):

    ilqr_exact           iLQR on diffmj's exact transition Jacobians, per-step controls
    ilqr_fd              the same iLQR linearised by MuJoCo C's mjd_transitionFD (centred, eps 1e-6)
    shooting             gradient shooting: L-BFGS (strong-Wolfe line search, max_iter 5 per iteration) on
                         the gradient through diffmj's checkpointed rollout, per-step controls
    predictive_sampling  MJPC's predictive sampling on cubic spline knots
    mppi                 MPPI on the same knots (a temperature per task)
    cem                  the cross-entropy method (elite fraction 0.1, minimum noise 0.01)

The sampling planners' candidates and iLQR's forward passes (which need no derivative) run in MuJoCo C
(``mj_model=``: ``mujoco.rollout``, ``optim.rollout_feedback_mujoco``) by default, or in diffmj
(``--rollouts diffmj``); the costs, and iLQR-exact's Jacobians, are diffmj's either way. Gradient shooting
differentiates diffmj's rollout.

Open loop: every planner starts from the same initial state (the task's) and the same plan (a constant
control ``push``: per-step controls for iLQR and shooting, spline knots for the sampling planners) over the
same horizon, and records (wall time, cost) after each iteration: iLQR and shooting through their
callbacks; the sampling planners have none, and as every iteration rolls out the same number of
candidates, iteration i's time is i / iterations of the call's wall time. The final plan is replayed in
MuJoCo C (``optim.rollout_mujoco``) and its final state scored by the task's ``error``.

Closed loop: ``optim.mpc(..., plant=mj_model)`` for ``--seeds`` seeds (the sampling planners) or
``--gradient-seeds`` (iLQR and shooting, on ``--gradient-mpc-tasks`` only: see GRADIENT_MPC_TASKS); seed s
draws the initial joint velocities N(0, ``perturbation``^2) and seeds the sampling noise. Each MPC step
runs one planner iteration (MJPC's real-time setting) warm-started by the last plan shifted one step.
Success: the task's ``error`` below its ``tolerance`` at every step of the last ``hold`` seconds.

Writes ``benchmarks/results/planners.json`` (after every record) and prints markdown tables;
``python benchmarks/plot.py benchmarks/results/planners.json`` plots cost against wall time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import mujoco
import numpy as np
import torch

import diffmj
from diffmj import optim

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]
from step_throughput import machine_info  # noqa: E402
from optim_examples import tasks  # noqa: E402

PLANNERS = ("ilqr_exact", "ilqr_fd", "shooting", "predictive_sampling", "mppi", "cem")
SAMPLING = {"predictive_sampling": optim.predictive_sampling, "mppi": optim.mppi, "cem": optim.cem}
MPC_PLANNERS = ("predictive_sampling", "mppi", "cem", "ilqr_fd")
# An iLQR plan rolls the horizon out in diffmj twice (the nominal, then the line search's trials as one batch):
# eager ~20 ms a step here, seconds per MPC step; with --ilqr-compile (after minutes of compile per model)
# about 1 s on the cart-pole. By default the gradient-based planners run in MPC on the cart-pole only, with
# their own seed count (--gradient-mpc-tasks cartpole hopper with --ilqr-compile adds the hopper).
GRADIENT_MPC_TASKS = ("cartpole",)
KNOTS = 10  # cubic spline knots over the horizon, MJPC's default
ELITE_FRACTION, MIN_NOISE = 0.1, 0.01  # CEM
LBFGS_STEPS = 5  # L-BFGS's inner iterations per shooting iteration (its line search needs at least 4)


class Setup(NamedTuple):
    """A task with the benchmark's settings for it.

    timestep: seconds per step (plan and plant). duration: the open-loop plan's length (s). push: the
    constant control every planner starts from (hanging straight down every gradient is zero: the push
    breaks the symmetry). noise: the sampling planners' knot noise (control units). temperature: MPPI's.
    mpc_horizon, mpc_duration: seconds each MPC plan looks ahead, seconds of closed loop. hold: seconds at
    the end of the closed loop the task must stay within tolerance. perturbation: the standard deviation
    of the seeds' initial joint velocities (rad/s or m/s).
    """

    task: tasks.Task
    timestep: float
    duration: float
    push: float
    noise: float
    temperature: float
    mpc_horizon: float
    mpc_duration: float
    hold: float
    perturbation: float


def setups() -> dict[str, Setup]:
    """The tasks and their settings. The swing-ups plan at 0.02 s (cartpole_ilqr.py's step: half the
    steps of MJPC's 0.01 for the same seconds); the hopper at its XML's 0.01 s. MPPI's temperature is
    about the cost differences between good candidates at the start (a few percent of the nominal's)."""
    return {
        "cartpole": Setup(tasks.cartpole(), 0.02, 2.4, 0.1, 0.5, 10.0, 1.5, 4.0, 1.0, 0.1),
        "acrobot": Setup(tasks.acrobot(), 0.02, 3.0, 0.1, 1.0, 100.0, 2.0, 5.0, 1.0, 0.1),
        "hopper": Setup(tasks.hopper(), 0.01, 0.6, 0.0, 0.3, 10.0, 0.5, 2.0, 1.0, 0.1),
    }


class Budget(NamedTuple):
    """How much each planner may do: iterations open loop per kind, candidates per sampling iteration,
    MPC seeds of the sampling planners and of the gradient-based ones (iLQR, shooting), and a factor on
    every task's MPC duration (the hold window is min(hold, duration))."""

    ilqr_iterations: int
    shooting_iterations: int
    sampling_iterations: int
    samples: int
    seeds: int
    gradient_seeds: int
    mpc_duration_scale: float


FULL = Budget(ilqr_iterations=15, shooting_iterations=4, sampling_iterations=100, samples=64, seeds=10,
              gradient_seeds=1, mpc_duration_scale=1.0)
QUICK = Budget(ilqr_iterations=2, shooting_iterations=1, sampling_iterations=5, samples=16, seeds=2,
               gradient_seeds=1, mpc_duration_scale=0.05)


class Loaded(NamedTuple):
    mj_model: mujoco.MjModel
    m: diffmj.Model
    d: diffmj.Data


def load(setup: Setup) -> Loaded:
    return Loaded(*tasks.load(setup.task, torch.float64, setup.timestep))


def steps(seconds: float, timestep: float) -> int:
    return max(1, round(seconds / timestep))


def sampling_options(name: str, setup: Setup, budget: Budget) -> dict:
    """A sampling planner's settings: its keyword arguments but the horizon, iterations, generator and
    backend."""
    options = {"num_samples": budget.samples, "noise": setup.noise, "spline": "cubic"}
    if name == "mppi":
        options["temperature"] = setup.temperature
    if name == "cem":
        options |= {"elite_fraction": ELITE_FRACTION, "min_noise": MIN_NOISE}
    return options


def planner_settings(name: str, setup: Setup, budget: Budget, backend: str, ilqr_compile: bool = False) -> dict:
    """The settings a planner runs with, as recorded in the JSON."""
    if name.startswith("ilqr"):
        return {"controls": "per step", "jacobians": "exact" if name == "ilqr_exact" else "mjd_transitionFD",
                "rollouts": backend, "line_search": "parallel" if backend == "diffmj" else "sequential trials in C",
                "compiled": ilqr_compile}
    if name == "shooting":
        return {"controls": "per step", "optimizer": f"L-BFGS(max_iter={LBFGS_STEPS}, strong_wolfe)"}
    return {"controls": f"{KNOTS} knots", "rollouts": backend} | sampling_options(name, setup, budget)


def sampling_planner(name: str, loaded: Loaded, setup: Setup, budget: Budget, backend: str, horizon: int,
                     iterations: int, generator: torch.Generator) -> Callable[[diffmj.Data, torch.Tensor], Any]:
    """``(d, knots) -> plan`` for one of the sampling planners with the benchmark's settings."""
    options = sampling_options(name, setup, budget) | {
        "iterations": iterations, "horizon": horizon, "generator": generator,
        "mj_model": loaded.mj_model if backend == "mujoco" else None}
    return lambda d, knots: SAMPLING[name](loaded.m, d, knots, setup.task.cost, **options)


def ilqr_planner(name: str, loaded: Loaded, setup: Setup, backend: str, compile: bool,
                 **options: Any) -> Callable[[diffmj.Data, torch.Tensor], optim.ILQRResult]:
    """``(d, ctrl) -> plan`` by iLQR (exact or mjd_transitionFD Jacobians by name, forward passes in ``backend``)
    with the given options; compiled, after a warm-up call from the same start that compiles its graphs
    (``warmup_time``: the process's first call for a model pays the compile; later ones reuse the graphs)."""
    fd_model = loaded.mj_model if name == "ilqr_fd" else None
    mj_model = loaded.mj_model if backend == "mujoco" else None
    return lambda d, ctrl, **more: optim.ilqr(loaded.m, d, ctrl, setup.task.cost, fd_model=fd_model,
                                              mj_model=mj_model, compile=compile, **(options | more))


def warm_up(planner: Callable, d: diffmj.Data, ctrl: torch.Tensor) -> float:
    """Seconds of one iLQR iteration from (d, ctrl) that compiles the graphs a compiled planner runs."""
    return planner(d, ctrl, max_iterations=1).wall_time


def lbfgs(params: list[torch.Tensor]) -> torch.optim.Optimizer:
    return torch.optim.LBFGS(params, max_iter=LBFGS_STEPS, line_search_fn="strong_wolfe")


def open_loop(name: str, setup: Setup, budget: Budget, backend: str, horizon: int | None = None,
              ilqr_compile: bool = False) -> dict:
    """One open-loop trajectory optimisation: the record of (wall time, cost) per iteration, the final
    cost, and MuJoCo C's replay of the plan scored by the task. horizon: steps (default: the setup's)."""
    loaded = load(setup)
    m, d = loaded.m, loaded.d
    horizon = horizon or steps(setup.duration, setup.timestep)
    trace: list[tuple[float, float]] = []
    warmup_time = None
    if name in SAMPLING:
        knots = torch.full((KNOTS, m.nu), setup.push, dtype=m.dtype)
        planner = sampling_planner(name, loaded, setup, budget, backend, horizon, budget.sampling_iterations,
                                   torch.Generator().manual_seed(0))
        plan = planner(d, knots)
        history = plan.cost_history.tolist()
        trace = [(plan.wall_time * i / budget.sampling_iterations, cost) for i, cost in enumerate(history)]
        iterations = budget.sampling_iterations
    else:
        ctrl = torch.full((horizon, m.nu), setup.push, dtype=m.dtype)
        if name == "shooting":
            plan = optim.gradient_shooting(m, d, ctrl, setup.task.cost, optimizer=lbfgs,
                                           iterations=budget.shooting_iterations,
                                           callback=lambda info: trace.append((info.wall_time, info.cost.item())))
        else:
            planner = ilqr_planner(name, loaded, setup, backend, ilqr_compile, max_iterations=budget.ilqr_iterations)
            warmup_time = warm_up(planner, d, ctrl) if ilqr_compile else None
            plan = planner(d, ctrl, callback=lambda info: trace.append((info.wall_time, info.cost)))
        trace.insert(0, (0.0, plan.cost_history[0].item()))  # the initial plan's cost, as the sampling planners'
        iterations = int(plan.iterations)
    replayed = optim.rollout_mujoco(loaded.mj_model, m, d, plan.ctrl)
    final_qpos = replayed.qpos[-1].numpy()
    error = setup.task.error(final_qpos)
    return {
        "task": setup.task.name, "planner": name,
        "settings": planner_settings(name, setup, budget, backend, ilqr_compile),
        "horizon": horizon, "timestep": setup.timestep, "iterations": iterations,
        "wall_time": plan.wall_time, "warmup_time": warmup_time, "trace": trace, "initial_cost": trace[0][1],
        "final_cost": plan.cost.item(),
        "mujoco_final_error": error, "success": bool(error < setup.task.tolerance),
        "mujoco_final_state": setup.task.describe(final_qpos, replayed.qvel[-1].numpy()),
        # the plan's states in diffmj against MuJoCo C's replay of its controls
        "replay_difference": (plan.trajectory.qpos - replayed.qpos).abs().max().item(),
    }


def closed_loop(name: str, setup: Setup, budget: Budget, backend: str, seed: int,
                mpc_steps: int | None = None, horizon: int | None = None, ilqr_compile: bool = False) -> dict:
    """One MPC run with MuJoCo C as the plant from the seed's perturbed start; success by the task's
    error over the last ``hold`` seconds. mpc_steps, horizon: override the setup's (steps)."""
    loaded = load(setup)
    m = loaded.m
    rng = np.random.default_rng(seed)
    d = loaded.d.replace(qvel=torch.as_tensor(setup.perturbation * rng.standard_normal(m.nv), dtype=m.dtype))
    horizon = horizon or steps(setup.mpc_horizon, setup.timestep)
    mpc_steps = mpc_steps or steps(setup.mpc_duration * budget.mpc_duration_scale, setup.timestep)
    warmup_time = None
    if name in SAMPLING:
        planner = sampling_planner(name, loaded, setup, budget, backend, horizon, 1,
                                   torch.Generator().manual_seed(seed))
        nominal = torch.full((KNOTS, m.nu), setup.push, dtype=m.dtype)
        warm_start = lambda plan: optim.shift_knots(plan.knots, horizon, "cubic")  # noqa: E731
    elif name.startswith("ilqr"):
        planner = ilqr_planner(name, loaded, setup, backend, ilqr_compile, max_iterations=1)
        nominal, warm_start = torch.full((horizon, m.nu), setup.push, dtype=m.dtype), optim.shift_ctrl
        warmup_time = warm_up(planner, d, nominal) if ilqr_compile else None
    else:
        planner = lambda d, ctrl: optim.gradient_shooting(m, d, ctrl, setup.task.cost,  # noqa: E731
                                                          optimizer=lbfgs, iterations=1)
        nominal, warm_start = torch.full((horizon, m.nu), setup.push, dtype=m.dtype), optim.shift_ctrl
    result = optim.mpc(m, d, planner, nominal, mpc_steps, plant=loaded.mj_model, warm_start=warm_start)
    errors = np.array([setup.task.error(q) for q in result.trajectory.qpos.numpy()])
    held = errors[-steps(min(setup.hold, mpc_steps * setup.timestep), setup.timestep):]
    up = errors < setup.task.tolerance
    return {
        "task": setup.task.name, "planner": name, "seed": seed,
        "settings": planner_settings(name, setup, budget, backend, ilqr_compile), "warmup_time": warmup_time,
        "horizon": horizon, "steps": mpc_steps, "timestep": setup.timestep,
        "success": bool((held < setup.task.tolerance).all()), "final_error": float(errors[-1]),
        "hold_max_error": float(held.max()),
        "first_up_time": float((np.argmax(up) + 1) * setup.timestep) if up.any() else None,
        "plan_time_mean": result.plan_time.mean().item(), "wall_time": result.wall_time,
    }


def fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def markdown(result: dict) -> str:
    """The open-loop and closed-loop tables of a result."""
    lines = ["Open loop: same start, same initial plan, same horizon; the plan replayed in MuJoCo C", "",
             "| task | planner | horizon | iterations | wall s | warm-up s | initial cost | final cost "
             "| MuJoCo C final error | within tolerance |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["open_loop"]:
        lines.append(f"| {r['task']} | {r['planner']} | {r['horizon']} | {r['iterations']} | {r['wall_time']:.1f} "
                     f"| {fmt(r.get('warmup_time'))} | {r['initial_cost']:.1f} | {r['final_cost']:.1f} "
                     f"| {r['mujoco_final_error']:.3f} "
                     f"| {'yes' if r['success'] else 'no'} |")
    lines += ["", "Closed loop: MPC, MuJoCo C as the plant, one planner iteration per step", "",
              "| task | planner | horizon | steps | successes | median final error | median ms per plan "
              "| first up (s, median of successes) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in result["closed_loop"]:
        runs.setdefault((r["task"], r["planner"]), []).append(r)
    for (task, planner), records in runs.items():
        up = [r["first_up_time"] for r in records if r["success"]]
        lines.append(
            f"| {task} | {planner} | {records[0]['horizon']} | {records[0]['steps']} "
            f"| {sum(r['success'] for r in records)}/{len(records)} "
            f"| {np.median([r['final_error'] for r in records]):.3f} "
            f"| {1000 * np.median([r['plan_time_mean'] for r in records]):.0f} "
            f"| {fmt(float(np.median(up)) if up else None)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny budgets (QUICK): a few minutes")
    parser.add_argument("--tasks", nargs="+", default=list(setups()), choices=list(setups()))
    parser.add_argument("--planners", nargs="*", default=list(PLANNERS), choices=PLANNERS, help="open loop")
    parser.add_argument("--mpc-planners", nargs="*", default=list(MPC_PLANNERS), choices=PLANNERS)
    parser.add_argument("--gradient-mpc-tasks", nargs="*", default=list(GRADIENT_MPC_TASKS), choices=list(setups()),
                        help="tasks on which iLQR and shooting run in MPC")
    parser.add_argument("--rollouts", choices=("mujoco", "diffmj"), default="mujoco",
                        help="where the sampling planners' candidates and iLQR's forward passes run")
    for field in Budget._fields:
        kind = float if field == "mpc_duration_scale" else int
        parser.add_argument(f"--{field.replace('_', '-')}", type=kind,
                            help=f"overrides the budget's (full {getattr(FULL, field)}, quick {getattr(QUICK, field)})")
    parser.add_argument("--ilqr-compile", action="store_true",
                        help="iLQR's forward steps compiled (after a warm-up call per run: warmup_time)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the examples' 1: small problems)")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "planners.json")
    parser.add_argument("--table", type=Path, help="print the tables of an existing result and exit")
    args = parser.parse_args()
    if args.ilqr_compile and args.rollouts == "mujoco":
        parser.error("--ilqr-compile compiles diffmj's forward passes: give --rollouts diffmj too")
    if args.table:
        print(markdown(json.loads(args.table.read_text())))
        return
    torch.set_num_threads(args.threads)
    budget = (QUICK if args.quick else FULL)._replace(
        **{f: getattr(args, f) for f in Budget._fields if getattr(args, f) is not None})
    chosen = {name: setup for name, setup in setups().items() if name in args.tasks}
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": machine_info(), "settings": vars(args) | {"out": str(args.out), "table": None},
              "budget": budget._asdict(),
              "tasks": {name: {k: v for k, v in s._asdict().items() if k != "task"} | {
                  "tolerance": s.task.tolerance, "qpos0": s.task.qpos0} for name, s in chosen.items()},
              "open_loop": [], "closed_loop": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save(record: dict, part: str, line: str) -> None:
        result[part].append(record)
        result["machine"]["load_average_end"] = os.getloadavg()
        args.out.write_text(json.dumps(result, indent=1))
        print(line, flush=True)

    start = time.perf_counter()
    for name, setup in chosen.items():
        for planner in args.planners:
            r = open_loop(planner, setup, budget, args.rollouts, ilqr_compile=args.ilqr_compile)
            save(r, "open_loop", f"[{time.perf_counter() - start:6.0f}s] open loop {name} {planner}: "
                 f"{r['iterations']} iterations, {r['wall_time']:.1f}s, cost {r['initial_cost']:.1f} -> "
                 f"{r['final_cost']:.1f}; MuJoCo C: {r['mujoco_final_state']}")
    for name, setup in chosen.items():
        for planner in args.mpc_planners:
            gradient = planner not in SAMPLING
            if gradient and name not in args.gradient_mpc_tasks:
                continue
            for seed in range(budget.gradient_seeds if gradient else budget.seeds):
                r = closed_loop(planner, setup, budget, args.rollouts, seed,
                                ilqr_compile=args.ilqr_compile)
                save(r, "closed_loop", f"[{time.perf_counter() - start:6.0f}s] MPC {name} {planner} seed {seed}: "
                     f"{'up' if r['success'] else 'NOT up'}, final error {r['final_error']:.3f}, "
                     f"{1000 * r['plan_time_mean']:.0f} ms per plan")
    print()
    print(markdown(result))


if __name__ == "__main__":
    main()
