"""Cart-pole swing-up by iLQR on diffmj's exact transition Jacobians, replayed in MuJoCo C.

The model re-creates dm_control's cartpole (a 1 kg cart on a slider driven by a motor with
gear 10 and ctrlrange [-1, 1], a 1 m, 0.1 kg capsule pole on a hinge; the rail's joint limits
are left out); the pole starts hanging down. The cost is MJPC-style: running terms keep the
pole up (the tip's offset from upright), the cart near the middle and the controls small; terminal terms ask
for the pole up and at rest. iLQR linearises every step with one batched
``diffmj.grad.transition_jacobians`` call per iteration (``--fd`` uses MuJoCo C's
``mjd_transitionFD`` instead); the plan is then run open loop in MuJoCo C.

Run: python optim_examples/cartpole_ilqr.py [--horizon 120] [--iterations 60] [--fd] [--float32]
"""

from __future__ import annotations

import argparse
import math

import mujoco
import numpy as np
import torch

import diffmj
from diffmj import optim

XML = """
<mujoco model="cartpole">
  <option timestep="0.02" integrator="Euler"/>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <body name="cart" pos="0 0 1">
      <joint name="slider" type="slide" axis="1 0 0" damping="5e-4"/>
      <geom name="cart" type="box" size="0.2 0.15 0.1" mass="1"/>
      <body name="pole">
        <joint name="hinge" type="hinge" axis="0 1 0" damping="2e-6"/>
        <geom name="pole" type="capsule" fromto="0 0 0 0 0 1" size="0.045" mass="0.1"/>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor name="slide" joint="slider" gear="10" ctrlrange="-1 1" ctrllimited="true"/>
  </actuator>
</mujoco>
"""


def upright(m: diffmj.Model, d: diffmj.Data) -> torch.Tensor:
    """The pole tip's offset from upright per metre of pole, (sin a, cos a - 1), a = 0 up: its squared
    norm 2 - 2 cos a is quadratic near upright (where 1 - cos a alone would be quartic and flat)."""
    angle = d.qpos[1]
    return torch.stack((torch.sin(angle), torch.cos(angle) - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horizon", type=int, default=120, help="steps of 20 ms")
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--fd", action="store_true", help="linearise with MuJoCo C's mjd_transitionFD")
    parser.add_argument("--float32", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny matrices: threading costs more than it saves

    mjm = mujoco.MjModel.from_xml_string(XML)
    m = diffmj.put_model(mjm, dtype=torch.float32 if args.float32 else torch.float64)
    d = diffmj.make_data(m).replace(qpos=torch.tensor([0.0, math.pi], dtype=m.dtype))
    cost = optim.Cost(
        running=(
            optim.Term(upright, 1.0),
            optim.Term(lambda m, d: d.qpos[:1], 0.1),  # the cart near the middle
            optim.Term(lambda m, d: d.ctrl, 0.1),
        ),
        terminal=(
            optim.Term(upright, 1000.0),
            optim.Term(lambda m, d: d.qvel, 100.0),
        ),
    )
    # a small push breaks the symmetry: hanging straight down, every gradient of the cost is zero
    ctrl = torch.full((args.horizon, m.nu), 0.1, dtype=m.dtype)

    def report(info: optim.IterationInfo) -> None:
        print(f"iter {info.iteration:3d}  cost {info.cost:12.6f}  alpha {info.alpha:<8.4g} "
              f"mu {info.regularization:<8.2g} {info.wall_time:6.1f}s", flush=True)

    result = optim.ilqr(m, d, ctrl, cost, max_iterations=args.iterations,
                        fd_model=mjm if args.fd else None, callback=report)
    final = result.trajectory[-1]
    angle = math.remainder(final.qpos[1].item(), 2 * math.pi)
    print(f"{result.iterations} iterations, converged {result.converged}, cost {result.cost_history[0]:.3f} -> "
          f"{result.cost.item():.6f}, {result.wall_time:.1f}s")
    print(f"diffmj:    cart {final.qpos[0].item():+.4f} m, pole angle {angle:+.5f} rad from upright, "
          f"qvel ({final.qvel[0].item():+.4f}, {final.qvel[1].item():+.4f})")

    # the same controls, open loop, in MuJoCo C
    mjd = mujoco.MjData(mjm)
    mjd.qpos[:] = [0.0, math.pi]
    for u in result.ctrl.detach().cpu().double().numpy():
        mjd.ctrl[:] = u
        mujoco.mj_step(mjm, mjd)
    angle_c = math.remainder(mjd.qpos[1], 2 * math.pi)
    print(f"MuJoCo C:  cart {mjd.qpos[0]:+.4f} m, pole angle {angle_c:+.5f} rad from upright, "
          f"qvel ({mjd.qvel[0]:+.4f}, {mjd.qvel[1]:+.4f}); "
          f"largest state difference {np.abs(np.r_[mjd.qpos, mjd.qvel] - np.r_[final.qpos, final.qvel]).max():.2e}")

    try:
        import matplotlib.pyplot as plt
    except ImportError:
        return
    t = np.arange(1, args.horizon + 1) * mjm.opt.timestep
    figure, axes = plt.subplots(2, 1, sharex=True)
    axes[0].plot(t, result.trajectory.qpos[:, 1].numpy(), label="pole angle (rad)")
    axes[0].plot(t, result.trajectory.qpos[:, 0].numpy(), label="cart (m)")
    axes[0].legend()
    axes[1].step(t, result.ctrl[:, 0].numpy(), label="ctrl")
    axes[1].set_xlabel("time (s)")
    axes[1].legend()
    figure.savefig("cartpole_ilqr.png")
    print("plot: cartpole_ilqr.png")


if __name__ == "__main__":
    main()
