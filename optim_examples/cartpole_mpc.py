"""Cart-pole swing-up by model-predictive control (predictive sampling), with MuJoCo C as the plant.

MJPC's cart-pole task (``tasks.cartpole``: model and cost) starts hanging down at rest. Every 10 ms
``diffmj.optim.mpc`` plans 1.5 s ahead (from hanging, MJPC's 1 s horizon sees no way up: every plan
stayed at rest) by predictive sampling over 10 cubic spline knots, rolled out by ``mujoco.rollout``
and scored by the task's cost, and applies the plan's first control to MuJoCo C's ``mj_step``
(``swingup.mpc``). The example prints
when the pole came up and where it ends, writes a plot of each plan's cost and the trajectory
(optim_examples/out/cartpole_mpc.png) and a GIF of the run (cartpole_mpc.gif).

Run: python optim_examples/cartpole_mpc.py [--duration 6] [--horizon 1.5] [--noise 0.5] [--samples 64]
"""

from __future__ import annotations

from optim_examples import swingup, tasks


def main(argv: list[str] | None = None) -> bool:
    args = swingup.mpc_options(__doc__.splitlines()[0], duration=6.0, horizon=1.5, noise=0.5, samples=64, argv=argv)
    return swingup.mpc(tasks.cartpole(), args)


if __name__ == "__main__":
    main()
