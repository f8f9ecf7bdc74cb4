"""System identification: a mass, a damping and a motor gear recovered from MuJoCo C recordings.

A 1-dof mass-spring-damper driven by a motor; jointpos / jointvel sensors. MuJoCo C records two
sequences (mj_step, then sensordata) with the "true" parameters (mass 2, damping 0.5, gear 1.5)
and optional Gaussian sensor noise; diffmj fits them from a wrong model (mass 1, damping 0.1,
gear 1) by Levenberg-Marquardt on exact Jacobians (``diffmj.optim.sysid.fit``), and with
``--minimize`` also by ``mujoco.minimize.least_squares`` given diffmj's Jacobian. It writes a plot of the
cost per iteration and of the recorded, initial and fitted positions (optim_examples/out/sysid_mass_damping.png).

Run: python optim_examples/sysid_mass_damping.py [--horizon 40] [--noise 0.0] [--minimize] [--out DIR]
"""

from __future__ import annotations

import argparse
import math
import pathlib
import time

import mujoco
import mujoco.minimize
import numpy as np
import torch

import diffmj
from diffmj.optim import sysid
from optim_examples import report

XML = """
<mujoco><option timestep="0.02"/>
  <worldbody><body name="mass"><joint name="x" type="slide" axis="1 0 0" stiffness="10" damping="{damping}"/>
    <geom type="sphere" size=".1" mass="{mass}" contype="0" conaffinity="0"/></body></worldbody>
  <actuator><motor name="motor" joint="x" gear="{gear}"/></actuator>
  <sensor><jointpos joint="x"/><jointvel joint="x"/></sensor></mujoco>"""
TRUE = dict(mass=2.0, damping=0.5, gear=1.5)
WRONG = dict(mass=1.0, damping=0.1, gear=1.0)


def record(mjm: mujoco.MjModel, qpos0: np.ndarray, ctrl: np.ndarray) -> np.ndarray:
    """MuJoCo C's sensordata after each mj_step: [batch, T, nsensordata]."""
    out = np.zeros((*ctrl.shape[:2], mjm.nsensordata))
    for b in range(ctrl.shape[0]):
        mjd = mujoco.MjData(mjm)
        mjd.qpos[:] = qpos0[b]
        for t in range(ctrl.shape[1]):
            mjd.ctrl[:] = ctrl[b, t]
            mujoco.mj_step(mjm, mjd)
            out[b, t] = mjd.sensordata
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horizon", type=int, default=40, help="steps of 20 ms per sequence")
    parser.add_argument("--noise", type=float, default=0.0, help="sensor noise standard deviation")
    parser.add_argument("--minimize", action="store_true", help="also solve with mujoco.minimize.least_squares")
    parser.add_argument("--iterations", type=int, default=100, help="Levenberg-Marquardt iterations at most")
    parser.add_argument("--out", type=pathlib.Path, default=report.DEFAULT_OUT, help="directory for the plot")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # tiny matrices: threading costs more than it saves

    qpos0 = np.array([[0.1], [-0.2]])
    t = np.arange(args.horizon) * 0.02
    ctrl = np.stack((np.sin(3 * t), np.cos(5 * t)))[..., None]
    measured = record(mujoco.MjModel.from_xml_string(XML.format(**TRUE)), qpos0, ctrl)
    measured += args.noise * np.random.default_rng(0).standard_normal(measured.shape)

    m = diffmj.put_model(mujoco.MjModel.from_xml_string(XML.format(**WRONG)))
    d = diffmj.make_data(m, batch_shape=(2,)).replace(qpos=torch.tensor(qpos0))
    data = sysid.Recording(d, torch.tensor(ctrl), sensordata=torch.tensor(measured))
    params = [
        sysid.Parameter("body_mass", "mass", log=True),  # initial values: the wrong model's
        sysid.Parameter("dof_damping", "x", lower=0.0, upper=5.0),
        sysid.Parameter("actuator_gear", "motor", index=0),
    ]

    with report.Progress(args.iterations, "Levenberg-Marquardt") as bar:
        result = sysid.fit(m, params, data, max_iterations=args.iterations,
                           callback=lambda iteration, cost, x: bar.update(cost=cost))
    print(f"diffmj LM: {result.iterations} iterations ({result.status}), cost {result.cost_history[0]:.3e} -> "
          f"{result.cost:.3e}, {result.wall_time:.1f}s")
    for p, true in zip(params, TRUE.values()):
        low, high = (v.item() for v in result.confidence[p.label])
        value = result.params[p.label].item()
        print(f"  {p.label:23s} {value:.8f}  (true {true}, error {abs(value - true):.1e}; 95% CI [{low:.6f}, {high:.6f}])")

    if args.minimize:
        x0, residual, jacobian, box = sysid.least_squares_functions(m, params, data)
        start = time.perf_counter()
        x, trace = mujoco.minimize.least_squares(x0, residual, jacobian=jacobian, bounds=box, verbose=0)
        wall = time.perf_counter() - start
        found = sysid.values(m, params, torch.tensor(x))
        print(f"mujoco.minimize.least_squares with diffmj's Jacobian: {len(trace)} iterations, {wall:.1f}s")
        for p, true in zip(params, TRUE.values()):
            value = found[p.label].item()
            print(f"  {p.label:23s} {value:.8f}  (true {true}, error {abs(value - true):.1e})")
        print(f"largest difference between the two solutions: "
              f"{max(abs(found[k].item() - result.params[k].item()) for k in found):.1e}")
    if args.noise == 0.0:
        print(f"largest error: {max(abs(result.params[p.label].item() - v) for p, v in zip(params, TRUE.values())):.1e}"
              f" (noiseless: {'ok' if all(math.isclose(result.params[p.label].item(), v, abs_tol=1e-6) for p, v in zip(params, TRUE.values())) else 'NOT recovered'})")

    # the first sequence's position: recorded, by the initial model, by the fitted one
    initial = diffmj.rollout(m, d, data.ctrl).sensordata[0, :, 0]
    fitted = diffmj.rollout(sysid.apply(m, params, result.x), d, data.ctrl).sensordata[0, :, 0]
    curves = {"recorded (MuJoCo C)": measured[0, :, 0], "initial model": initial.detach().numpy(),
              "fitted model": fitted.detach().numpy()}
    report.save_plot(args.out / "sysid_mass_damping.png", "system identification: mass, damping, gear",
                     {"0.5 |residual|^2": result.cost_history.numpy()}, "iteration", (np.arange(args.horizon) + 1) * 0.02,
                     curves)


if __name__ == "__main__":
    main()
