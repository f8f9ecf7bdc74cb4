"""Hopper standing up from a crouch by model-predictive control (iLQR on exact Jacobians), MuJoCo C as the plant.

The hopper (``tasks.hopper``: gym's one-legged hopper, three hinge motors, contact with the floor) starts
crouched on its foot at rest and falls if not held. Every 10 ms ``diffmj.optim.mpc`` plans 0.5 s ahead by
one iLQR iteration (``diffmj.optim.ilqr``: all steps linearised by one batched call of diffmj's exact
transition Jacobians through the contacts; the forward passes, which need no derivative, run in MuJoCo C,
``mj_model=``), warm-started from the previous plan shifted, and applies the plan's first control to MuJoCo
C's ``mj_step`` (``--fd``: MuJoCo C's ``mjd_transitionFD`` Jacobians instead; ``--diffmj-rollouts``: the
forward passes in diffmj, the step sizes as one batch). The example prints when it stood up and where it ends, writes a plot
of each plan's cost and the trajectory (optim_examples/out/hopper_mpc.png) and a GIF of the run
(hopper_mpc.gif).

Measured (2-core machine, idle, 2026-12-05 evening): standing (torso's top within 0.1 m) from t = 0.09 s on,
0.4 mm from standing at the end, 200 steps in 23 s (0.11 s per plan: one linearisation by eager exact
Jacobians, the rollouts in C; 271 s, 1.35 s per plan, with ``--diffmj-rollouts`` before iLQR stopped
linearising twice per iteration). benchmarks/planners.py's MPC runs
of the same loop from perturbed starts: 1 of 1 held on exact and on mjd_transitionFD Jacobians, where the
sampling planners with 64 candidates per step held it in 1 of 30.

Run: python optim_examples/hopper_mpc.py [--duration 2] [--horizon 0.5] [--fd] [--diffmj-rollouts]
"""

from __future__ import annotations

import argparse

import torch

from diffmj import optim
from optim_examples import report, swingup, tasks


def main(argv: list[str] | None = None) -> bool:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=2.0, help="seconds of closed loop")
    parser.add_argument("--horizon", type=float, default=0.5, help="seconds each plan looks ahead")
    parser.add_argument("--fd", action="store_true", help="linearise with MuJoCo C's mjd_transitionFD")
    parser.add_argument("--diffmj-rollouts", action="store_true", help="iLQR's forward passes in diffmj, not MuJoCo C")
    report.add_output_arguments(parser)
    args = parser.parse_args(argv)

    task = tasks.hopper()
    mj_model, m, d = tasks.load(task)
    horizon = round(args.horizon / mj_model.opt.timestep)
    fd_model = mj_model if args.fd else None
    rollouts = None if args.diffmj_rollouts else mj_model

    def planner(d, ctrl):
        return optim.ilqr(m, d, ctrl, task.cost, max_iterations=1, fd_model=fd_model, mj_model=rollouts)

    jacobians = "mjd_transitionFD" if args.fd else "exact"
    return swingup.closed_loop(task, args, mj_model, m, d, planner, torch.zeros(horizon, m.nu, dtype=m.dtype),
                               optim.shift_ctrl, f"one iLQR iteration ({jacobians} Jacobians, forward passes in "
                               f"{'diffmj' if args.diffmj_rollouts else 'MuJoCo C'}) over {horizon} steps")


if __name__ == "__main__":
    main()
