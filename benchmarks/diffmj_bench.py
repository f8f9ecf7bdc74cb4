"""Runner: diffmj eager or compiled (``step_throughput.py`` starts it in a subprocess).

eager: ``diffmj.step`` on batched Data (diffmj's explicit batch).
compiled: ``torch.compile(diffmj.step, fullgraph=True)`` on batched Data: the explicit batch, whose
solver loops stop once every element has converged.
compiled_vmap: ``torch.compile(torch.vmap(diffmj.step, in_dims=(None, 0)), fullgraph=True)``: the
per-element step under vmap, whose solver loops run their full count (``scan``).

For B=1 all run on unbatched Data, the compiled ones as ``torch.compile(diffmj.step, fullgraph=True)``.
The compiled ones skip Dynamo's guards on library globals, as diffmj's own compiled rollouts do
(``options={"guard_filter_fn": diffmj.library_guard_filter(fn)}``; ``--all-guards``: keep them).
``--device cuda`` runs them on the GPU (each timed call ends with ``torch.cuda.synchronize``).

A compiled run takes one batch size, so that its compile starts from a fresh
process; ``step_throughput.py`` points TORCHINDUCTOR_CACHE_DIR at an empty
directory for the cold compile and runs ``--compile-only`` again on the same
directory for the warm one. The compile time is that of the first two calls
(the second sees the first's output, so a stride or aliasing guard that fails
compiles again there); the record says how many graphs were compiled, and how
far the compiled steps' state lies from eager's after those two calls.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mujoco
import torch

import diffmj

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

WARMUP_CALLS = 2
COMPARED_FIELDS = ("qpos", "qvel", "act", "qacc", "sensordata")


def initial_data(m: diffmj.Model, mjm: mujoco.MjModel, batch_size: int) -> diffmj.Data:
    """Data of the batch's initial worlds; unbatched for B=1."""
    qvel = torch.as_tensor(harness.initial_qvel(mjm, batch_size), dtype=m.dtype, device=m.device)
    if batch_size == 1:
        return diffmj.make_data(m).replace(qvel=qvel[0])
    return diffmj.make_data(m, batch_shape=(batch_size,)).replace(qvel=qvel)


def synchronized(m: diffmj.Model, fn):
    """``fn``, returning once the device has finished the work it queued (a GPU runs asynchronously)."""
    def run(*args):
        out = fn(*args)
        if m.device.type == "cuda":
            torch.cuda.synchronize(m.device)
        return out

    return run


def stepper(m: diffmj.Model, step, d0: diffmj.Data, nsteps: int):
    """A function running ``nsteps`` steps of ``step`` from ``d0``, returning when they are done."""
    def run() -> None:
        d = d0
        for _ in range(nsteps):
            d = step(m, d)

    return synchronized(m, run)


def bench_eager(m: diffmj.Model, mjm: mujoco.MjModel, batch_size: int, args: argparse.Namespace) -> dict:
    d0 = initial_data(m, mjm, batch_size)
    return harness.measure(stepper(m, diffmj.step, d0, args.nsteps), batch_size, args.nsteps, args.repeats)


def bench_compiled(m: diffmj.Model, mjm: mujoco.MjModel, batch_size: int, args: argparse.Namespace) -> dict:
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    vmapped = args.variant == "compiled_vmap" and batch_size > 1
    fn = torch.vmap(diffmj.step, in_dims=(None, 0)) if vmapped else diffmj.step
    options = None if args.all_guards else {"guard_filter_fn": diffmj.library_guard_filter(fn)}
    compiled = torch.compile(fn, fullgraph=True, options=options)
    d = d0 = initial_data(m, mjm, batch_size)
    calls = []
    for _ in range(WARMUP_CALLS):
        d, seconds = harness.timed(lambda: synchronized(m, compiled)(m, d))
        calls.append(seconds)
    record = {
        "guards": "all" if args.all_guards else "library globals skipped",
        "compile": {
            "calls_s": calls,
            "total_s": sum(calls),
            "graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
        }
    }
    if not args.compile_only:
        eager = d0
        for _ in range(WARMUP_CALLS):
            eager = diffmj.step(m, eager)
        record["max_abs_diff_vs_eager"] = max(
            (getattr(d, name) - getattr(eager, name)).abs().max().item() if getattr(d, name).numel() else 0.0
            for name in COMPARED_FIELDS
        )
        record.update(harness.measure(stepper(m, compiled, d0, args.nsteps), batch_size, args.nsteps, args.repeats))
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_runner_args(parser)
    parser.add_argument("--variant", choices=("eager", "compiled", "compiled_vmap"), required=True)
    parser.add_argument("--compile-only", action="store_true",
                        help="compiled: stop after the compiling calls (warm-cache measurement)")
    parser.add_argument("--device", default="cpu", help="torch device of the Model and Data (cpu, cuda)")
    parser.add_argument("--all-guards", action="store_true",
                        help="compiled: check every Dynamo guard at every call (no guard_filter_fn)")
    args = parser.parse_args()
    if args.variant != "eager" and len(args.batch_sizes) != 1:
        parser.error("a compiled run takes one batch size (each compile starts from a fresh process)")

    mjm = harness.load_model(args.model, harness.solver_overrides(args))
    m = diffmj.put_model(mjm, dtype=getattr(torch, args.dtype), device=args.device)
    bench = bench_eager if args.variant == "eager" else bench_compiled
    records = [
        {"backend": f"diffmj_{args.variant}", "batch_size": b, "dtype": args.dtype,
         **harness.guarded(lambda: bench(m, mjm, b, args))}
        for b in args.batch_sizes
    ]
    versions = {"torch": torch.__version__, "mujoco": mujoco.__version__,
                "torch_threads": torch.get_num_threads(), "device": str(m.device),
                "device_name": torch.cuda.get_device_name(m.device) if m.device.type == "cuda" else None}
    harness.emit(records, versions, harness.solver_settings(mjm))


if __name__ == "__main__":
    main()
