"""Cart-pole swing-up by model-predictive control (predictive sampling), with MuJoCo C as the plant.

MJPC's cart-pole task (``tasks.cartpole``: model and cost) starts hanging down at rest. Every 10 ms
``diffmj.optim.mpc`` plans 2 s ahead (MJPC's 1 s horizon sees no way up from hanging) by predictive
sampling over 10 cubic spline knots, rolled out by ``mujoco.rollout`` and scored by the task's cost,
and applies the plan's first control to MuJoCo C's ``mj_step`` (``swingup.mpc``). The example prints
when the pole came up and where it ends, writes a plot of each plan's cost and the trajectory
(optim_examples/out/cartpole_mpc.png) and a GIF of the run (cartpole_mpc.gif).

Run: python optim_examples/cartpole_mpc.py [--duration 5] [--horizon 2] [--samples 64] [--seed 0]
"""

from __future__ import annotations

from optim_examples import swingup, tasks


def main(argv: list[str] | None = None) -> bool:
    args = swingup.mpc_options(__doc__.splitlines()[0], duration=5.0, horizon=2.0, noise=1.0, argv=argv)
    return swingup.mpc(tasks.cartpole(), args)


if __name__ == "__main__":
    main()
