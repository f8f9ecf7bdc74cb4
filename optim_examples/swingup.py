"""The swing-ups that the cart-pole and acrobot examples run on their task (``tasks.py``).

``ilqr``: iLQR (``diffmj.optim.ilqr``) plans the whole swing-up from hanging at rest, open loop,
linearising every step of the horizon with one batched call of diffmj's exact transition Jacobians per
iteration (``--fd``: MuJoCo C's ``mjd_transitionFD``). The plan is then run in MuJoCo C
(``mujoco.rollout``) from the same state.

``mpc``: ``diffmj.optim.mpc`` plans from the plant's state at every step by predictive sampling
(MJPC's planner: candidates perturb cubic spline knots, are rolled out by ``mujoco.rollout`` and scored
by the task's cost in diffmj), applies the plan's first control to MuJoCo C's ``mj_step`` and
warm-starts the next plan with this one shifted; ``closed_loop`` runs and reports that loop for any
planner (``hopper_mpc.py``: iLQR).

Both print what they achieved, plot the cost and the trajectory and render MuJoCo C's run.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from diffmj import optim
from optim_examples import report, tasks


def ilqr_options(description: str, duration: float, timestep: float, iterations: int,
                 argv: list[str] | None) -> argparse.Namespace:
    """The iLQR examples' options, with the example's defaults."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--duration", type=float, default=duration, help="seconds to plan (open loop)")
    parser.add_argument("--timestep", type=float, default=timestep,
                        help="seconds per step (MJPC plans at 0.01; a coarser step is cheaper)")
    parser.add_argument("--iterations", type=int, default=iterations, help="iLQR iterations at most")
    parser.add_argument("--fd", action="store_true", help="linearise with MuJoCo C's mjd_transitionFD")
    parser.add_argument("--float32", action="store_true")
    report.add_output_arguments(parser)
    return parser.parse_args(argv)


def mpc_options(description: str, duration: float, horizon: float, noise: float, samples: int,
                argv: list[str] | None) -> argparse.Namespace:
    """The MPC examples' options, with the example's defaults."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--duration", type=float, default=duration, help="seconds of closed loop")
    parser.add_argument("--horizon", type=float, default=horizon, help="seconds each plan looks ahead")
    parser.add_argument("--samples", type=int, default=samples, help="candidates per plan (the nominal included)")
    parser.add_argument("--noise", type=float, default=noise, help="knot perturbation's standard deviation")
    parser.add_argument("--knots", type=int, default=10, help="cubic spline knots over the horizon (MJPC's 10)")
    parser.add_argument("--seed", type=int, default=0)
    report.add_output_arguments(parser)
    return parser.parse_args(argv)


def ilqr(task: tasks.Task, args: argparse.Namespace, push: float) -> bool:
    """Plan ``task``'s swing-up by iLQR from a constant control ``push`` (hanging straight down, every
    gradient of the cost is zero: the push breaks the symmetry); report it. Returns whether MuJoCo C's
    run of the plan ends up (``task.error`` below ``task.tolerance``)."""
    torch.set_num_threads(1)  # tiny matrices: threading costs more than it saves
    mj_model, m, d = tasks.load(task, torch.float32 if args.float32 else torch.float64, args.timestep)
    horizon = round(args.duration / args.timestep)
    ctrl = torch.full((horizon, m.nu), push, dtype=m.dtype)
    print(f"{task.name}: iLQR over {horizon} steps of {args.timestep} s from hanging at rest, "
          f"{'mjd_transitionFD' if args.fd else 'exact'} Jacobians, {m.dtype}", flush=True)

    with report.Progress(args.iterations, "iLQR") as bar:
        result = optim.ilqr(m, d, ctrl, task.cost, max_iterations=args.iterations,
                            fd_model=mj_model if args.fd else None,
                            callback=lambda info: bar.update(cost=info.cost, alpha=info.alpha,
                                                             mu=info.regularization))
    print(f"{result.iterations} iterations, converged {result.converged}, cost {result.cost_history[0]:.2f} -> "
          f"{result.cost.item():.4f}, {result.wall_time:.1f}s")

    planned = result.trajectory
    replayed = optim.rollout_mujoco(mj_model, m, d, result.ctrl)  # the same controls, open loop, in MuJoCo C
    final = {name: (states.qpos[-1].double().numpy(), states.qvel[-1].double().numpy())
             for name, states in (("diffmj", planned), ("MuJoCo C", replayed))}
    for name, (qpos, qvel) in final.items():
        print(f"{name + ':':10s}{task.describe(qpos, qvel)}")
    difference = max((planned.qpos - replayed.qpos).abs().max().item(),
                     (planned.qvel - replayed.qvel).abs().max().item())
    swung_up = task.error(final["MuJoCo C"][0]) < task.tolerance
    print(f"largest state difference between the two runs {difference:.2e}; "
          f"MuJoCo C's run ends up (within {task.tolerance} of the goal): {'yes' if swung_up else 'NO'}")

    times = np.arange(1, horizon + 1) * args.timestep
    curves = {f"qpos[{i}]": planned.qpos[:, i].double().numpy() for i in range(m.nq)}
    curves |= {f"ctrl[{i}]": result.ctrl[:, i].double().numpy() for i in range(m.nu)}
    report.save_plot(args.out / f"{task.name}_ilqr.png", f"{task.name} swing-up by iLQR",
                     {"total cost": result.cost_history.double().numpy()}, "iteration", times, curves)
    if not args.no_video:
        qpos = np.concatenate((np.asarray([task.qpos0]), replayed.qpos.double().numpy()))
        report.save_video(args.out / f"{task.name}_ilqr.gif", mj_model, qpos, camera="fixed")
    return swung_up


def mpc(task: tasks.Task, args: argparse.Namespace) -> bool:
    """Swing ``task`` up in closed loop by predictive sampling, MuJoCo C as the plant; report it (``closed_loop``).
    Returns whether the plant stayed up (``task.error`` below ``task.tolerance``) through the last second."""
    mj_model, m, d = tasks.load(task)
    horizon = round(args.horizon / mj_model.opt.timestep)
    generator = torch.Generator().manual_seed(args.seed)

    def planner(d, knots):
        return optim.predictive_sampling(m, d, knots, task.cost, horizon=horizon, spline="cubic",
                                         num_samples=args.samples, noise=args.noise, generator=generator,
                                         mj_model=mj_model)

    return closed_loop(task, args, mj_model, m, d, planner, torch.zeros(args.knots, m.nu, dtype=m.dtype),
                       lambda plan: optim.shift_knots(plan.knots, horizon, "cubic"),
                       f"predictive sampling of {args.samples} candidates over {horizon} steps")


def closed_loop(task: tasks.Task, args: argparse.Namespace, mj_model, m, d, planner, nominal: torch.Tensor,
                warm_start, what: str) -> bool:
    """``diffmj.optim.mpc`` of ``planner`` (d, nominal) -> plan for ``args.duration`` seconds from d, MuJoCo C's
    ``mj_step`` as the plant, with a progress bar; prints where it ends and since when it is up, plots the plan
    costs and the trajectory and renders the run. Returns whether the plant stayed up (``task.error`` below
    ``task.tolerance``) through the last second."""
    torch.set_num_threads(1)  # small batches: threading costs more than it saves
    timestep = mj_model.opt.timestep
    steps = round(args.duration / timestep)
    print(f"{task.name}: MPC for {steps} steps of {timestep} s, {what}, MuJoCo C as the plant", flush=True)

    with report.Progress(steps, "MPC") as bar:

        def reporting(d, nominal):
            plan = planner(d, nominal)
            bar.update(plan_cost=plan.cost.item())
            return plan

        result = optim.mpc(m, d, reporting, nominal, steps, plant=mj_model, warm_start=warm_start)

    qpos, qvel = result.trajectory.qpos.double().numpy(), result.trajectory.qvel.double().numpy()
    error = np.array([task.error(q) for q in qpos])
    last_second = error[-round(1 / timestep):]
    since = int(np.flatnonzero(error >= task.tolerance)[-1]) + 1 if (error >= task.tolerance).any() else 0
    print(f"{steps} steps in {result.wall_time:.1f}s ({1000 * result.plan_time.mean():.1f} ms per plan)")
    print(f"end: {task.describe(qpos[-1], qvel[-1])}")
    up = bool(last_second.max() < task.tolerance)
    print(f"up (within {task.tolerance} of the goal) through the last second: {'yes' if up else 'NO'}; "
          f"largest distance from the goal in it {last_second.max():.3f}"
          + (f"; up from t = {(since + 1) * timestep:.2f} s on" if since < steps else ""))

    times = np.arange(1, steps + 1) * timestep
    curves = {f"qpos[{i}]": qpos[:, i] for i in range(m.nq)}
    curves |= {f"ctrl[{i}]": result.ctrl[:, i].double().numpy() for i in range(m.nu)}
    report.save_plot(args.out / f"{task.name}_mpc.png", f"{task.name} by MPC (MuJoCo C plant)",
                     {"plan cost": result.plan_cost.double().numpy()}, "MPC step", times, curves)
    if not args.no_video:
        report.save_video(args.out / f"{task.name}_mpc.gif", mj_model, np.concatenate(([task.qpos0], qpos)),
                          camera="fixed")
    return up
