"""dm_control's quadruped on rough hfield terrain: diffmj's step and sensors against MuJoCo C's.

Run from the repository root in diffmj's venv, given dm_control's suite
folder (``census_models.sh`` gathers it):

    python benchmarks/hfield_quadruped.py /tmp/census/models/dm_control/dm_control/suite/quadruped.xml

The model collides as published (its eye cylinders against the terrain
among its pairs), except that the floor plane is turned off (non-colliding,
invisible to the rangefinders) so that the hfield is the ground, and the
middle 40 x 40 grid points get seeded random elevations up to 15 cm (dm_control's escape task
writes its bumps into ``hfield_data`` the same way). From a drop, with random
controls, each MuJoCo step is compared with one diffmj step from the same
state (qpos, qvel) and, every 8 steps, mj_forward's sensordata (20
rangefinders against the terrain among them) with diffmj's.
"""

from __future__ import annotations

import argparse
import time

import mujoco
import numpy as np

import diffmj


def terrain_quadruped(path: str) -> mujoco.MjModel:
    mjm = mujoco.MjModel.from_xml_path(path)
    floor = mujoco.mj_name2id(mjm, mujoco.mjtObj.mjOBJ_GEOM, "floor")
    mjm.geom_contype[floor] = mjm.geom_conaffinity[floor] = 0
    mjm.geom_rgba[floor, 3] = 0
    n = mjm.hfield_nrow[0]
    data = np.zeros((n, mjm.hfield_ncol[0]))
    c = n // 2
    data[c - 20:c + 20, c - 20:c + 20] = np.random.default_rng(0).uniform(0, 0.03, (40, 40))
    mjm.hfield_data[:] = data.ravel()
    return mjm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="dm_control/suite/quadruped.xml")
    parser.add_argument("--steps", type=int, default=80)
    args = parser.parse_args()
    mjm = terrain_quadruped(args.path)
    m = diffmj.put_model(mjm)
    mjd = mujoco.MjData(mjm)
    mjd.qpos[2] = 0.7
    terrain = mujoco.mj_name2id(mjm, mujoco.mjtObj.mjOBJ_GEOM, "terrain")
    ranges = mjm.sensor_adr[mjm.sensor_type == mujoco.mjtSensor.mjSENS_RANGEFINDER]
    rng = np.random.default_rng(1)
    worst = dict.fromkeys(("qpos", "qvel", "sensordata"), 0.0)
    most, hits, seconds = 0, 0, []
    for k in range(args.steps):
        mjd.ctrl[:] = rng.uniform(-1, 1, mjm.nu)
        mujoco.mj_forward(mjm, mjd)
        d = diffmj.put_data(m, mjd)
        if k % 8 == 0:
            sensordata = diffmj.forward(m, d).sensordata.numpy()
            worst["sensordata"] = max(worst["sensordata"], float(np.abs(sensordata - mjd.sensordata).max()))
            hits = max(hits, int((mjd.sensordata[ranges] >= 0).sum()))
        start = time.perf_counter()
        out = diffmj.step(m, d)
        seconds.append(time.perf_counter() - start)
        mujoco.mj_step(mjm, mjd)
        most = max(most, sum(terrain in c.geom for c in mjd.contact[:mjd.ncon]))
        for name in ("qpos", "qvel"):
            worst[name] = max(worst[name], float(np.abs(getattr(out, name).numpy() - getattr(mjd, name)).max()))
    print(f"contact slots {m.collision_plan.ncon}, most terrain contacts {most}, rangefinders hitting {hits} "
          f"of {len(ranges)}, median eager step {np.median(seconds):.2f} s")
    print("worst absolute error of one step / sensordata:", {k: f"{v:.1e}" for k, v in worst.items()})


if __name__ == "__main__":
    main()
