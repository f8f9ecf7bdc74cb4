"""Mesh collision cost per pair, by mesh size: diffmj's pair function vs MuJoCo C's mj_collision.

Run from the repository root in diffmj's venv:

    python benchmarks/mesh_collision.py                 # mesh-plane -> benchmarks/results/mesh_collision.json
    python benchmarks/mesh_collision.py --pair mesh     # mesh-mesh -> benchmarks/results/mesh_collision_mesh.json
    python benchmarks/mesh_collision.py --pair box      # box-mesh -> benchmarks/results/mesh_collision_box.json
    python benchmarks/mesh_collision.py --pair capsule  # capsule-mesh -> benchmarks/results/mesh_collision_capsule.json
    python benchmarks/mesh_collision.py --pair ellipsoid  # ellipsoid-mesh -> .../mesh_collision_ellipsoid.json
    python benchmarks/mesh_collision.py --pair cylinder  # cylinder-mesh -> .../mesh_collision_cylinder.json

Each mesh is a point cloud on a sphere (every vertex on the convex hull, so
the hull has as many vertices as the mesh), sunk 5 mm into a plane, into a
box, into a lying capsule, into an ellipsoid, into a cylinder's cap, or into a
second copy of itself (the contact count is recorded). diffmj runs its pair function
(``plane_mesh``, ``box_mesh``, ``capsule_mesh``, ``ellipsoid_mesh``, ``cylinder_mesh``, ``mesh_mesh``) on B
copies of the pair in one call (eager, and ``torch.compile(fullgraph=True)``);
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
from diffmj.collision.mesh_convex import capsule_mesh, cylinder_mesh, ellipsoid_mesh
from diffmj.collision.polytope import box_mesh, mesh_mesh

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import harness  # noqa: E402


# the geom the mesh collides with (geom 0), its top face at z = 0, and the pair function
FIRST = {"plane": ('<geom type="plane" size="1 1 .1"/>', plane_mesh),
         "box": ('<geom type="box" size=".2 .2 .1" pos="0 0 -.1"/>', box_mesh),
         "capsule": ('<geom type="capsule" size=".05 .2" pos="0 0 -.05" euler="0 90 0"/>', capsule_mesh),
         "ellipsoid": ('<geom type="ellipsoid" size=".2 .15 .1" pos="0 0 -.1"/>', ellipsoid_mesh),
         "cylinder": ('<geom type="cylinder" size=".2 .05" pos="0 0 -.05"/>', cylinder_mesh),
         "mesh": ('<geom type="mesh" mesh="m" pos="0 0 -.1" euler="1 2 3"/>', mesh_mesh)}


def _model(nvert: int, pair: str) -> mujoco.MjModel:
    points = np.random.default_rng(0).standard_normal((nvert, 3))
    points = 0.1 * points / np.linalg.norm(points, axis=1, keepdims=True)
    xml = f"""<mujoco><asset><mesh name="m" vertex="{' '.join(map(str, points.ravel()))}"/></asset>
      <worldbody>{FIRST[pair][0]}
        <body pos="0 0 .095" euler="3 -2 1"><freejoint/><geom type="mesh" mesh="m"/></body></worldbody></mujoco>"""
    return mujoco.MjModel.from_xml_string(xml)


def _inputs(mjm: mujoco.MjModel, batch: int):
    """(geom 0, mesh, margin) of the model's one pair, repeated ``batch`` times."""
    m = diffmj.put_model(mjm)
    mjd = mujoco.MjData(mjm)
    mujoco.mj_forward(mjm, mjd)
    d = diffmj.put_data(m, mjd)
    rep = lambda x: x.expand(batch, *x.shape[1:]).contiguous()  # noqa: E731
    pose = [GeomPose(*(rep(x[[g]]) for x in (d.geom_xpos, d.geom_xmat, m.geom_size))) for g in (0, 1)]
    shape = [mesh_shape(m.collision_plan.meshes, m.collision_plan.geom_mesh[[g] * batch]) for g in (0, 1)]
    first = MeshPose(pose[0], shape[0]) if mjm.geom_type[0] == mujoco.mjtGeom.mjGEOM_MESH else pose[0]
    return first, MeshPose(pose[1], shape[1]), torch.zeros(batch, dtype=torch.float64), mjd.ncon


def run(pair: str, sizes: list[int], batches: list[int], repeats: int, compile_: bool) -> list[dict]:
    torch.set_num_threads(1)
    fn = FIRST[pair][1]
    records = []
    for nvert in sizes:
        mjm = _model(nvert, pair)
        mjd = mujoco.MjData(mjm)
        mujoco.mj_forward(mjm, mjd)
        calls = 1000
        mj = harness.measure(lambda: [mujoco.mj_collision(mjm, mjd) for _ in range(calls)], 1, calls, repeats)
        record = {"nvert": nvert, "hull_vertices": int(mjm.mesh_graph[0]), "mujoco_contacts": int(mjd.ncon),
                  "mujoco_c_us_per_pair": 1e6 / mj["steps_per_second"], "diffmj": []}
        compiled = torch.compile(fn, fullgraph=True)
        for batch in batches:
            args = _inputs(mjm, batch)[:3]
            eager = harness.measure(lambda: fn(*args), batch, 1, repeats)
            compile_seconds = harness.timed(lambda: compiled(*args))[1] if compile_ else None
            comp = harness.measure(lambda: compiled(*args), batch, 1, repeats) if compile_ else None
            record["diffmj"].append({"pairs": batch, "eager_us_per_pair": 1e6 / eager["steps_per_second"],
                                     "compiled_us_per_pair": comp and 1e6 / comp["steps_per_second"],
                                     "compile_seconds": compile_seconds})
        records.append(record)
    return records


def table(records: list[dict]) -> str:
    rows = ["| mesh vertices | MuJoCo C mj_collision (µs/pair) | pairs per call | diffmj eager (µs/pair) "
            "| diffmj compiled (µs/pair) |", "|---|---|---|---|---|"]
    for r in records:
        for k, b in enumerate(r["diffmj"]):
            first = (f"{r['nvert']}", f"{r['mujoco_c_us_per_pair']:.2f}") if k == 0 else ("", "")
            compiled = "not run" if b["compiled_us_per_pair"] is None else f"{b['compiled_us_per_pair']:.1f}"
            rows.append(f"| {first[0]} | {first[1]} | {b['pairs']} | {b['eager_us_per_pair']:.1f} | {compiled} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=list(FIRST), default="plane", help="what the mesh collides with")
    parser.add_argument("--sizes", type=int, nargs="+", help="mesh vertex counts (default: 100 1000 4000 "
                        "against a plane or box, 50 200 1000 4000 against a mesh)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-compile", action="store_true", help="eager only (compiling the polytope pairs "
                        "takes minutes; the first compiled call's time is recorded as compile_seconds)")
    parser.add_argument("--out", help="default: results/mesh_collision.json, mesh_collision_<pair>.json for the others")
    args = parser.parse_args()
    sizes = args.sizes or ([50, 200, 1000, 4000] if args.pair == "mesh" else [100, 1000, 4000])
    out = args.out or str(BENCH / "results" / ("mesh_collision.json" if args.pair == "plane"
                                               else f"mesh_collision_{args.pair}.json"))
    records = run(args.pair, sizes, args.batches, args.repeats, not args.no_compile)
    versions = {"torch": torch.__version__, "mujoco": mujoco.__version__, "python": platform.python_version(),
                "machine": platform.machine()}
    load = os.getloadavg()  # the machine's load over the last 1, 5 and 15 minutes, at the end of the run
    Path(out).write_text(json.dumps({"pair": args.pair, "versions": versions, "load_average": load,
                                     "records": records},
                                         indent=1) + "\n")
    print(table(records))


if __name__ == "__main__":
    main()
