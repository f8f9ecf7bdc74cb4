"""Mesh-plane collision cost per pair, by mesh size: diffmj's pair function vs MuJoCo C's mj_collision.

Run from the repository root in diffmj's venv:

    python benchmarks/mesh_collision.py     # writes benchmarks/results/mesh_collision.json

Each mesh is a point cloud on a sphere (every vertex on the convex hull, so
the hull has as many vertices as the mesh), sunk 5 mm into a plane (the
contact count is recorded). diffmj runs ``plane_mesh`` on B copies
of the pair in one call (eager, and ``torch.compile(fullgraph=True)``);
MuJoCo C runs ``mj_collision`` on a model holding that one pair. The cost per
pair is the median call time over B. Float64, CPU, one thread each.
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
from diffmj.collision.common import GeomPose, MeshPose
from diffmj.collision.mesh import mesh_shape, plane_mesh

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import harness  # noqa: E402


def _model(nvert: int) -> mujoco.MjModel:
    points = np.random.default_rng(0).standard_normal((nvert, 3))
    points = 0.1 * points / np.linalg.norm(points, axis=1, keepdims=True)
    xml = f"""<mujoco><asset><mesh name="m" vertex="{' '.join(map(str, points.ravel()))}"/></asset>
      <worldbody><geom type="plane" size="1 1 .1"/>
        <body pos="0 0 .095" euler="3 -2 1"><freejoint/><geom type="mesh" mesh="m"/></body></worldbody></mujoco>"""
    return mujoco.MjModel.from_xml_string(xml)


def _inputs(mjm: mujoco.MjModel, batch: int):
    """(plane, mesh, margin) of the model's one pair, repeated ``batch`` times."""
    m = diffmj.put_model(mjm)
    mjd = mujoco.MjData(mjm)
    mujoco.mj_forward(mjm, mjd)
    d = diffmj.put_data(m, mjd)
    rep = lambda x: x.expand(batch, *x.shape[1:]).contiguous()  # noqa: E731
    pose = [GeomPose(*(rep(x[[g]]) for x in (d.geom_xpos, d.geom_xmat, m.geom_size))) for g in (0, 1)]
    shape = mesh_shape(m.collision_plan.meshes, m.collision_plan.geom_mesh[[1] * batch])
    return pose[0], MeshPose(pose[1], shape), torch.zeros(batch, dtype=torch.float64), mjd.ncon


def run(sizes: list[int], batches: list[int], repeats: int) -> list[dict]:
    torch.set_num_threads(1)
    records = []
    for nvert in sizes:
        mjm = _model(nvert)
        mjd = mujoco.MjData(mjm)
        mujoco.mj_forward(mjm, mjd)
        calls = 1000
        mj = harness.measure(lambda: [mujoco.mj_collision(mjm, mjd) for _ in range(calls)], 1, calls, repeats)
        record = {"nvert": nvert, "hull_vertices": int(mjm.mesh_graph[0]), "mujoco_contacts": int(mjd.ncon),
                  "mujoco_c_us_per_pair": 1e6 / mj["steps_per_second"], "diffmj": []}
        compiled = torch.compile(plane_mesh, fullgraph=True)
        for batch in batches:
            args = _inputs(mjm, batch)[:3]
            eager = harness.measure(lambda: plane_mesh(*args), batch, 1, repeats)
            comp = harness.measure(lambda: compiled(*args), batch, 1, repeats)
            record["diffmj"].append({"pairs": batch, "eager_us_per_pair": 1e6 / eager["steps_per_second"],
                                     "compiled_us_per_pair": 1e6 / comp["steps_per_second"]})
        records.append(record)
    return records


def table(records: list[dict]) -> str:
    rows = ["| mesh vertices | MuJoCo C mj_collision (µs/pair) | pairs per call | diffmj eager (µs/pair) "
            "| diffmj compiled (µs/pair) |", "|---|---|---|---|---|"]
    for r in records:
        for k, b in enumerate(r["diffmj"]):
            first = (f"{r['nvert']}", f"{r['mujoco_c_us_per_pair']:.2f}") if k == 0 else ("", "")
            rows.append(f"| {first[0]} | {first[1]} | {b['pairs']} | {b['eager_us_per_pair']:.1f} "
                        f"| {b['compiled_us_per_pair']:.1f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 4000])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=str(BENCH / "results" / "mesh_collision.json"))
    args = parser.parse_args()
    records = run(args.sizes, args.batches, args.repeats)
    versions = {"torch": torch.__version__, "mujoco": mujoco.__version__, "python": platform.python_version(),
                "machine": platform.machine()}
    load = os.getloadavg()  # the machine's load over the last 1, 5 and 15 minutes, at the end of the run
    Path(args.out).write_text(json.dumps({"versions": versions, "load_average": load, "records": records},
                                         indent=1) + "\n")
    print(table(records))


if __name__ == "__main__":
    main()
