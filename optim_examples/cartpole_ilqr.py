"""Cart-pole swing-up by iLQR on diffmj's exact transition Jacobians, replayed in MuJoCo C.

MJPC's cart-pole model (``tasks.cartpole``: dm_control's, a 1 kg cart pushed by at most 10 N, a
1 m, 0.1 kg pole) starts hanging down at rest. iLQR plans 2.4 s open loop on the task's open-loop
cost (the pole up and at rest at the end, the cart near the middle, small controls), linearising all
steps with one batched ``diffmj.grad.transition_jacobians`` call per iteration (``--fd``: MuJoCo C's
``mjd_transitionFD``). The plan is then run in MuJoCo C; the example prints where both runs end,
writes a plot of the cost and the trajectory (optim_examples/out/cartpole_ilqr.png) and a GIF of
MuJoCo C's run (cartpole_ilqr.gif).

Run: python optim_examples/cartpole_ilqr.py [--duration 2.4] [--iterations 60] [--fd] [--float32]
"""

from __future__ import annotations

from optim_examples import swingup, tasks


def main(argv: list[str] | None = None) -> bool:
    args = swingup.ilqr_options(__doc__.splitlines()[0], duration=2.4, timestep=0.02, iterations=60, argv=argv)
    return swingup.ilqr(tasks.cartpole(open_loop=True), args, push=0.1)


if __name__ == "__main__":
    main()
