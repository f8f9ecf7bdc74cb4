"""Cold compile time of diffmj.step against the solver's iteration count (DESIGN.md §5).

Each measurement runs in a fresh process with an empty TORCHINDUCTOR_CACHE_DIR,
so no cache hides the compile. Compile time is the wall time of the first call
of ``torch.compile(diffmj.step, fullgraph=True)`` (unbatched) or
``torch.compile(torch.vmap(diffmj.step, in_dims=(None, 0)), fullgraph=True)``
(vmapped, B worlds); the second call's time (warm) is printed beside it.

    python benchmarks/compile_time.py                      # this checkout
    python benchmarks/compile_time.py --repo /tmp/before   # another checkout, e.g. before a change
    python benchmarks/compile_time.py --json               # also write results/compile_time.json

The model is tests/models/contacts.xml (Newton, pyramidal cones, tolerance 0
so every iteration runs), settled for 300 MuJoCo steps so contacts are active.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
MODEL = REPO / "tests" / "models" / "contacts.xml"

# run in the child process: one compile, one JSON line
_CHILD = r"""
import json, sys, time
import mujoco, torch
import diffmj

model, iterations, batch, mode, backend = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
torch.set_num_threads(1)
mjm = mujoco.MjModel.from_xml_path(model)
mjm.opt.iterations, mjm.opt.tolerance = iterations, 0.0
mjd = mujoco.MjData(mjm)
for _ in range(300):
    mujoco.mj_step(mjm, mjd)
m = diffmj.put_model(mjm)
d = diffmj.put_data(m, mjd)
if mode == "vmap":
    d = torch.stack([d] * batch)
    fn = torch.compile(torch.vmap(diffmj.step, in_dims=(None, 0)), fullgraph=True, backend=backend)
else:
    fn = torch.compile(diffmj.step, fullgraph=True, backend=backend)
start = time.perf_counter()
out = fn(m, d)
cold = time.perf_counter() - start
start = time.perf_counter()
fn(m, out)
warm = time.perf_counter() - start
eager = diffmj.step(m, d)
err = float((out.qacc - eager.qacc).abs().max())
print("RESULT " + json.dumps(dict(mode=mode, iterations=iterations, batch=batch, backend=backend,
                                  cold_s=cold, warm_s=warm, max_qacc_diff_vs_eager=err,
                                  active_rows=int(eager.efc_active.sum()),
                                  diffmj=diffmj.__file__)))
"""


def measure(repo: Path, mode: str, iterations: int, batch: int, backend: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, PYTHONPATH=str(repo), TORCHINDUCTOR_CACHE_DIR=cache)
        args = [sys.executable, "-c", _CHILD, str(MODEL), str(iterations), str(batch), mode, backend]
        try:
            proc = subprocess.run(args, env=env, cwd=repo, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return dict(mode=mode, iterations=iterations, batch=batch, backend=backend, error=f"timeout {timeout:.0f} s")
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return dict(mode=mode, iterations=iterations, batch=batch, backend=backend, error=proc.stderr.strip()[-2000:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=REPO, help="checkout whose diffmj is imported")
    parser.add_argument("--iterations", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--modes", nargs="+", default=["unbatched", "vmap"], choices=["unbatched", "vmap"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per measurement")
    parser.add_argument("--label", default="", help="name of this checkout in the table and the JSON")
    parser.add_argument("--json", action="store_true", help="write results/compile_time.json (merged by label)")
    args = parser.parse_args()

    label = args.label or str(args.repo)
    print("| checkout | mode | iterations | cold compile s | warm call s | max |qacc - eager| |")
    print("|---|---|---|---|---|---|")
    records = []
    for mode in args.modes:
        for iterations in args.iterations:
            r = measure(args.repo.resolve(), mode, iterations, args.batch, args.backend, args.timeout)
            r["label"] = label
            records.append(r)
            name = mode if mode == "unbatched" else f"vmap B={args.batch}"
            if "error" in r:
                print(f"| {label} | {name} | {iterations} | failed: {r['error'].splitlines()[-1]} | | |", flush=True)
            else:
                print(f"| {label} | {name} | {iterations} | {r['cold_s']:.1f} | {r['warm_s']:.4f} "
                      f"| {r['max_qacc_diff_vs_eager']:.1e} |", flush=True)
    if args.json:
        path = BENCH_DIR / "results" / "compile_time.json"
        old = json.loads(path.read_text()) if path.exists() else []
        keep = [r for r in old if r.get("label") != label]
        path.write_text(json.dumps(keep + records, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
