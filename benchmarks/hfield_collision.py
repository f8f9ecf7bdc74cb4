"""Heightfield collision cost per pair, by geom type: diffmj's pair function vs MuJoCo C's mj_collision.

Run from the repository root in diffmj's venv:

    python benchmarks/hfield_collision.py    # -> benchmarks/results/hfield_collision.json

A bumpy hfield (21 x 21 points over 1 m x 1 m: 5 cm cells, seeded random
elevations up to 5 cm) and one geom of each type (about 10 cm across, margin
1 mm) resting 1 cm into it, so that several prisms of several cells touch it
(the contact count is recorded). diffmj runs its pair function
(``hfield.collider``) on B copies of the pair in one call, eager; MuJoCo C
runs ``mj_collision`` on a model holding that one pair. The cost per pair is
the median call time over B. Float64, CPU, one thread each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import mujoco
import numpy as np
import torch

import diffmj
from diffmj.collision.common import GeomPose, HFieldPose, MeshPose
from diffmj.collision.hfield import collider, hfield_shape
from diffmj.collision.mesh import mesh_shape
from diffmj.enums import GeomType

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import harness  # noqa: E402

GEOMS = {
    "sphere": '<geom type="sphere" size=".05"/>',
    "capsule": '<geom type="capsule" size=".03 .05" euler="80 10 0"/>',
    "ellipsoid": '<geom type="ellipsoid" size=".06 .05 .04"/>',
    "cylinder": '<geom type="cylinder" size=".04 .04" euler="5 -3 0"/>',
    "box": '<geom type="box" size=".05 .04 .03" euler="5 -3 0"/>',
    "mesh": '<geom type="mesh" mesh="rock"/>',
}


def _model(kind: str) -> mujoco.MjModel:
    rng = np.random.default_rng(0)
    rock = rng.standard_normal((30, 3))
    rock = 0.05 * rock / np.linalg.norm(rock, axis=1, keepdims=True)
    xml = f"""<mujoco><option><flag gravity="disable"/></option><default><geom margin=".0005"/></default>
      <asset><hfield name="t" nrow="21" ncol="21" size=".5 .5 .05 .05"
                     elevation="{' '.join(map(str, rng.uniform(0, 1, 441)))}"/>
        <mesh name="rock" vertex="{' '.join(map(str, rock.ravel()))}"/></asset>
      <worldbody><geom type="hfield" hfield="t"/>
        <body pos=".03 .02 .1"><freejoint/>{GEOMS[kind]}</body></worldbody></mujoco>"""
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    mujoco.mj_kinematics(mjm, mjd)
    # lower the geom until it is 1 cm into the terrain (its deepest contact)
    for _ in range(60):
        mujoco.mj_collision(mjm, mjd)
        if mjd.ncon and mjd.contact.dist[:mjd.ncon].min() < -0.01:
            break
        mjd.qpos[2] -= 0.002
        mujoco.mj_kinematics(mjm, mjd)
    mjm.qpos0[:] = mjd.qpos
    return mjm


def _inputs(mjm: mujoco.MjModel, batch: int):
    """(hfield, geom, margin) of the model's one pair, repeated ``batch`` times; MuJoCo's contact count."""
    m = diffmj.put_model(mjm)
    mjd = mujoco.MjData(mjm)
    mujoco.mj_forward(mjm, mjd)
    d = diffmj.put_data(m, mjd)
    plan = m.collision_plan
    rep = lambda x: x.expand(batch, *x.shape[1:]).contiguous()  # noqa: E731
    ground, geom = (GeomPose(*(rep(x[[g]]) for x in (d.geom_xpos, d.geom_xmat, m.geom_size))) for g in (0, 1))
    ground = HFieldPose(ground, hfield_shape(plan.hfields, plan.geom_hfield[[0] * batch], plan.groups[0].cells))
    if mjm.geom_type[1] == GeomType.MESH:
        geom = MeshPose(geom, mesh_shape(plan.meshes, plan.geom_mesh[[1] * batch]))
    margin = torch.full((batch,), float(mjm.geom_margin[:2].sum()), dtype=torch.float64)
    return (ground, geom, margin), mjd.ncon, len(plan.groups[0].cells)


def run(kinds: list[str], batches: list[int], repeats: int) -> list[dict]:
    torch.set_num_threads(1)
    records = []
    for kind in kinds:
        mjm = _model(kind)
        mjd = mujoco.MjData(mjm)
        mujoco.mj_forward(mjm, mjd)
        calls = 1000
        mj = harness.measure(lambda: [mujoco.mj_collision(mjm, mjd) for _ in range(calls)], 1, calls, repeats)
        fn = collider(GeomType[kind.upper()])
        record = {"geom": kind, "mujoco_c_us_per_pair": 1e6 / mj["steps_per_second"], "diffmj": []}
        for batch in batches:
            args, ncon, ncell = _inputs(mjm, batch)
            eager = harness.measure(lambda: fn(*args), batch, 1, repeats)
            record.update(mujoco_contacts=int(ncon), candidate_cells=ncell)
            record["diffmj"].append({"pairs": batch, "eager_us_per_pair": 1e6 / eager["steps_per_second"]})
        records.append(record)
    return records


def table(records: list[dict]) -> str:
    """One row per geom and batch size."""
    head = ("| geom | candidate cells | MuJoCo contacts | MuJoCo C mj_collision (µs/pair) | pairs per call "
            "| diffmj eager (µs/pair) |\n|---|---|---|---|---|---|")
    return "\n".join([head] + [f"| {r['geom']} | {r['candidate_cells']} | {r['mujoco_contacts']} | "
                                f"{r['mujoco_c_us_per_pair']:.2f} | {b['pairs']} | {b['eager_us_per_pair']:.0f} |"
                                for r in records for b in r["diffmj"]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--geoms", nargs="+", choices=list(GEOMS), default=list(GEOMS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(BENCH / "results" / "hfield_collision.json"))
    args = parser.parse_args()
    records = run(args.geoms, args.batches, args.repeats)
    versions = {"torch": torch.__version__, "mujoco": mujoco.__version__, "python": platform.python_version(),
                "machine": platform.machine()}
    load = os.getloadavg()  # the machine's load over the last 1, 5 and 15 minutes, at the end of the run
    Path(args.out).write_text(json.dumps({"versions": versions, "load_average": load, "records": records},
                                         indent=1) + "\n")
    print(table(records))


if __name__ == "__main__":
    main()
