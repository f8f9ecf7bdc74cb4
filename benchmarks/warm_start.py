"""Warm start of a compiled step: a new process, the same caches (issue #14 point 1).

For each model and batch size four fresh processes run, one after the other, each timing the
compile (or load) and the first step:

1. ``precompiled`` cold: ``diffmj.precompiled(step, (m, d), cache_dir)`` compiles and saves;
2. ``precompiled`` warm: the same call in a new process loads what 1 saved;
3. ``torch.compile`` cold: ``torch.compile(step, fullgraph=True)``;
4. ``torch.compile`` warm: the same in a new process, on 3's inductor cache (what a user gets
   without ``precompiled``: Dynamo and AOTAutograd trace again, the kernels come from the cache).

1-2 share one inductor cache (``TORCHINDUCTOR_CACHE_DIR``) and 3-4 another, both empty at the
start. ``step`` is ``diffmj.step`` of one Data (B=1) or of a batch of B (the explicit batch).
Times exclude the process's imports and model loading; ``process_s`` is the child's
whole run. Every child checks its step against eager (largest difference of qpos, qvel).

    python benchmarks/warm_start.py --models models/hopper.xml --batch-sizes 1 64 \\
        --out benchmarks/results/warm_start.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

REPO = harness.BENCH_DIR.parent

_CHILD = r"""
import json, sys, time
import mujoco, numpy as np, torch
import diffmj
sys.path.insert(0, {bench!r})
import harness

model, batch, mode, cache_dir, solver = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
torch.set_num_threads(1)
mjm = harness.load_model(model, solver)
m = diffmj.put_model(mjm)
d = diffmj.make_data(m)
qvel = torch.as_tensor(harness.initial_qvel(mjm, batch))
step, d = diffmj.step, (d.replace(qvel=qvel[0]) if batch == 1 else torch.stack([d] * batch).replace(qvel=qvel))
start = time.perf_counter()
fn = torch.compile(step, fullgraph=True) if mode == "torch_compile" else diffmj.precompiled(step, (m, d), cache_dir)
out = fn(m, d)
seconds = time.perf_counter() - start
eager = step(m, d)
err = max(float((out.qpos - eager.qpos).abs().max()), float((out.qvel - eager.qvel).abs().max()))
print("RESULT " + json.dumps(dict(seconds=seconds, max_diff_vs_eager=err, solver=harness.solver_settings(mjm))))
"""


def run_child(model: str, batch: int, mode: str, inductor_cache: str, cache_dir: str, solver: dict,
              timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), TORCHINDUCTOR_CACHE_DIR=inductor_cache)
    child = _CHILD.format(bench=str(harness.BENCH_DIR))
    args = [sys.executable, "-c", child, model, str(batch), mode, cache_dir, json.dumps(solver)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(error=f"timeout {timeout:.0f} s")
    process = time.perf_counter() - start
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT "):]), process_s=process)
    return dict(error=harness.reason(RuntimeError(proc.stderr.strip()[-2000:])))


def torch_version() -> str:
    return subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                          text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=[str(REPO / "tests" / "models" / "contacts.xml")])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 64])
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--iterations", type=int, help="solver iterations (default: the model's)")
    parser.add_argument("--ls-iterations", type=int, help="line-search iterations (default: the model's)")
    parser.add_argument("--tolerance", type=float, help="solver tolerance (default: the model's)")
    args = parser.parse_args()
    solver = {f: getattr(args, f) for f in harness.SOLVER_FIELDS if getattr(args, f) is not None}
    records = []
    print("| model | B | precompiled cold s | precompiled warm s | torch.compile cold s | torch.compile warm s "
          "| precompiled warm, whole process s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for model in args.models:
        for batch in args.batch_sizes:
            runs = {}
            for mode in ("precompiled", "torch_compile"):
                with tempfile.TemporaryDirectory() as inductor_cache, tempfile.TemporaryDirectory() as cache_dir:
                    for start in ("cold", "warm"):
                        runs[f"{mode}_{start}"] = run_child(model, batch, mode, inductor_cache, cache_dir, solver,
                                                            args.timeout)
            records.append(dict(model=Path(model).name, batch=batch, load_average=os.getloadavg(), **runs))
            cells = [f"{runs[k]['seconds']:.1f}" if "seconds" in runs[k] else runs[k]["error"][:60] for k in runs]
            process = runs["precompiled_warm"].get("process_s", float("nan"))
            print(f"| {Path(model).name} | {batch} | {' | '.join(cells)} | {process:.1f} |", flush=True)
            if args.out:  # after every row: an interrupted run keeps what it measured
                args.out.write_text(json.dumps(dict(torch=torch_version(), solver=solver, records=records), indent=1))


if __name__ == "__main__":
    main()
