"""Trajectory optimisation through contact: push a box to a target by gradient descent.

A sphere driven by two slide motors pushes a free box across a floor with
friction. The controls (piecewise linear between a few knots) are optimised
with Adam on the gradient of the final box position error, taken through the
whole rollout: contacts between the pusher and the box, friction with the
floor, the constraint solver (implicit adjoint) and checkpointed memory. The
best plan is then replayed in MuJoCo C to show it works in the reference
simulator; the example writes a plot of the error per iteration and of MuJoCo C's
replay (optim_examples/out/push_box.png) and a GIF of the replay (push_box.gif).

Run: python optim_examples/push_box.py [--iterations 30] [--horizon 50] [--out DIR] [--no-video]
"""

from __future__ import annotations

import argparse
import time

import mujoco
import numpy as np
import torch

import diffmj
from optim_examples import report

XML = """
<mujoco model="push_box">
  <option timestep="0.01" iterations="10" ls_iterations="10"/>
  <worldbody>
    <light pos="0 0 2"/>
    <camera name="above" pos="0.05 -0.9 0.9" xyaxes="1 0 0 0 0.7 0.7"/>
    <geom name="floor" type="plane" size="2 2 .1" friction="0.5" contype="1" conaffinity="1"/>
    <body name="pusher" pos="-0.25 0 0.05">
      <joint name="x" type="slide" axis="1 0 0" damping="2"/>
      <joint name="y" type="slide" axis="0 1 0" damping="2"/>
      <geom name="pusher" type="sphere" size="0.05" mass="1" contype="2" conaffinity="2"/>
    </body>
    <body name="box" pos="0 0 0.05">
      <freejoint/>
      <geom name="box" type="box" size="0.05 0.05 0.05" mass="0.2" contype="3" conaffinity="3"/>
    </body>
  </worldbody>
  <actuator>
    <motor name="x" joint="x" ctrlrange="-8 8"/>
    <motor name="y" joint="y" ctrlrange="-8 8"/>
  </actuator>
</mujoco>
"""


def knots_to_controls(knots: torch.Tensor, horizon: int) -> torch.Tensor:
    """Piecewise-linear controls [horizon, nu] through ``knots`` [k, nu] spread over the horizon."""
    k = knots.shape[0]
    t = torch.linspace(0, k - 1, horizon, dtype=knots.dtype)
    i = t.floor().long().clamp(max=k - 2)
    w = (t - i)[:, None]
    return (1 - w) * knots[i] + w * knots[i + 1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--horizon", type=int, default=50, help="steps of 10 ms")
    parser.add_argument("--knots", type=int, default=6)
    parser.add_argument("--target", type=float, nargs=2, default=(0.3, 0.08))
    report.add_output_arguments(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # tiny matrices: threading costs more than it saves

    mjm = mujoco.MjModel.from_xml_string(XML)
    m = diffmj.put_model(mjm)
    d0 = diffmj.make_data(m)
    box, pusher = (mujoco.mj_name2id(mjm, mujoco.mjtObj.mjOBJ_BODY, name) for name in ("box", "pusher"))
    geom = {name: mujoco.mj_name2id(mjm, mujoco.mjtObj.mjOBJ_GEOM, name) for name in ("pusher", "box")}
    slots = m.collision_plan.contact_geom
    pusher_box = ((slots == geom["pusher"]).any(-1) & (slots == geom["box"]).any(-1)).nonzero()[:, 0]
    target = torch.tensor(args.target, dtype=m.dtype)

    # start from a plain push along +x; the optimiser has to learn to steer the box
    knots = torch.zeros(args.knots, m.nu, dtype=m.dtype)
    knots[:, 0] = 3.0
    knots.requires_grad_(True)
    optimiser = torch.optim.Adam([knots], lr=0.5)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, args.iterations)
    best = (float("inf"), None)
    errors = []

    start = time.perf_counter()
    bar = report.Progress(args.iterations, "Adam")
    for it in range(args.iterations):
        optimiser.zero_grad()
        ctrl = knots_to_controls(knots, args.horizon)
        traj = diffmj.rollout(m, d0, ctrl)  # checkpointed, implicit adjoint through every contact solve
        final = traj.xpos[-1, box, :2]
        loss = ((final - target) ** 2).sum()
        loss.backward()
        if loss.item() < best[0]:
            best = (loss.item(), ctrl.detach().clone())
        optimiser.step()
        schedule.step()
        with torch.no_grad():
            knots.clamp_(-8, 8)
        errors.append(loss.item() ** 0.5)
        bar.update(error_m=errors[-1], box=f"({final[0]:.3f}, {final[1]:.3f})",
                   pushing=f"{int(traj.contact.active[:, pusher_box].any(-1).sum())}/{args.horizon} steps")
    bar.close()
    print(f"{args.iterations} iterations in {time.perf_counter() - start:.0f}s")

    # replay the best plan in MuJoCo C
    mjd = mujoco.MjData(mjm)
    qpos, xy = [mjd.qpos.copy()], []  # xy: [T, (box, pusher), 2]
    for u in best[1].numpy():
        mjd.ctrl[:] = u
        mujoco.mj_step(mjm, mjd)
        qpos.append(mjd.qpos.copy())
        xy.append(mjd.xpos[[box, pusher], :2].copy())
    achieved = mjd.xpos[box, :2]
    print(f"target                       ({args.target[0]:.3f}, {args.target[1]:.3f})")
    print(f"best diffmj plan error       {best[0] ** 0.5:.4f} m")
    print(f"MuJoCo C replay of the plan  ({achieved[0]:.3f}, {achieved[1]:.3f}), "
          f"error {np.linalg.norm(achieved - np.asarray(args.target)):.4f} m")

    xy = np.array(xy)
    curves = {f"{body} {axis} (m)": xy[:, i, j]
              for i, body in enumerate(("box", "pusher")) for j, axis in enumerate("xy")}
    report.save_plot(args.out / "push_box.png", f"push a box to ({args.target[0]}, {args.target[1]}) by Adam "
                     "through contact (MuJoCo C replay)", {"final box error (m)": errors}, "iteration",
                     np.arange(1, args.horizon + 1) * mjm.opt.timestep, curves)
    if not args.no_video:
        report.save_video(args.out / "push_box.gif", mjm, np.array(qpos), camera="above")


if __name__ == "__main__":
    main()
