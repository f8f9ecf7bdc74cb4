"""Where a compiled step's run time goes: a torch.profiler trace of ``nsteps`` compiled steps.

    python benchmarks/profile_step.py --model ../shared/models/humanoid.xml --batch-size 1024 \\
        --iterations 100 --ls-iterations 50 --nsteps 10 --out benchmarks/results/profile_humanoid_1024.json

The step is ``torch.compile(diffmj.step, fullgraph=True)`` with Inductor on batched Data (unbatched
for B=1), from the states ``step_throughput.py`` starts from, compiled with Inductor's per-kernel
profiler records (``cpp.enable_kernel_profile``, an option of this compile only). After the compile
and one untimed step, ``nsteps`` steps run under the profiler. The report splits the wall time of
those steps into Inductor's generated C++ kernels, ATen operators called from the compiled code
(extern kernels and fallbacks: matmuls, factorisations, ...) and the rest (the Python wrapper that
launches them, the solver's ``while_loop`` driving its body from Python, allocation), and lists
the kernels and operators by self time (calls per step: with early exit, how often the solver's loop
body ran).

``--device cuda`` profiles the GPU as well: the report adds the GPU's busy time per step (its kernels'
summed time), the kernel launches and host synchronisations per step, and lists the GPU kernels by time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import diffmj

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from diffmj_bench import initial_data  # noqa: E402


def kind(name: str) -> str:
    """The category of a profiler event: Inductor kernel, ATen operator, or other."""
    if name.startswith(("cpp_fused", "cpp_kernel", "graph_")):
        return "inductor kernel"
    if name.startswith("aten::"):
        return "aten operator"
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    parser.add_argument("--iterations", type=int)
    parser.add_argument("--ls-iterations", type=int)
    parser.add_argument("--tolerance", type=float)
    parser.add_argument("--nsteps", type=int, default=10)
    parser.add_argument("--top", type=int, default=20, help="kernels and operators listed")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    parser.add_argument("--out", type=Path, help="JSON output")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    solver = {f: getattr(args, f) for f in harness.SOLVER_FIELDS if getattr(args, f) is not None}
    mjm = harness.load_model(args.model, solver)
    m = diffmj.put_model(mjm, dtype=getattr(torch, args.dtype), device=args.device)
    on_gpu = m.device.type == "cuda"
    d = initial_data(m, mjm, args.batch_size)
    step = torch.compile(diffmj.step, fullgraph=True, options={"cpp.enable_kernel_profile": True})
    start = time.perf_counter()
    for _ in range(2):  # the second call may compile again on the first one's outputs
        d = step(m, d)
    compile_s = time.perf_counter() - start

    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]) as prof:
        start = time.perf_counter()
        for _ in range(args.nsteps):
            d = step(m, d)
        if on_gpu:
            torch.cuda.synchronize(m.device)
        wall_s = time.perf_counter() - start

    # self time per event name; profiler times are microseconds
    self_us: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    gpu_us: dict[str, float] = defaultdict(float)  # GPU kernels' time, by kernel
    for e in prof.key_averages():
        self_us[e.key] += e.self_cpu_time_total
        calls[e.key] += e.count
        if e.self_device_time_total > 0:
            gpu_us[e.key] += e.self_device_time_total
    by_kind: dict[str, float] = defaultdict(float)
    for name, us in self_us.items():
        by_kind[kind(name)] += us
    step_ms = 1e3 * wall_s / args.nsteps
    kernel_ms = {k: by_kind[k] / 1e3 / args.nsteps for k in ("inductor kernel", "aten operator")}
    shares = kernel_ms | {"rest (wrapper, loop driver, allocation)": step_ms - sum(kernel_ms.values())}
    top = sorted(self_us, key=self_us.get, reverse=True)[:args.top]

    print(f"{args.model.name} B={args.batch_size} {args.dtype}, solver {harness.solver_settings(mjm)}")
    print(f"compile {compile_s:.1f} s; {step_ms:.2f} ms per step ({args.batch_size * 1e3 / step_ms:.0f} steps/s)")
    for k, ms in shares.items():
        print(f"  {k:42s} {ms:9.3f} ms  {100 * ms / step_ms:5.1f} %")
    gpu = {}
    if on_gpu:
        gpu_ms = sum(gpu_us.values()) / 1e3 / args.nsteps
        per_step = {what: sum(calls[n] for n in names) / args.nsteps for what, names in (
            ("kernel launches", ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")),
            ("host synchronisations", ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")),
            ("device-to-host copies (aten::_local_scalar_dense)", ("aten::_local_scalar_dense",)))}
        gpu = {"gpu_busy_ms_per_step": gpu_ms, **{f"{what} per step": n for what, n in per_step.items()},
               "top_gpu_kernels": [{"name": n, "ms_per_step": gpu_us[n] / 1e3 / args.nsteps,
                                    "calls_per_step": calls[n] / args.nsteps}
                                   for n in sorted(gpu_us, key=gpu_us.get, reverse=True)[:args.top]]}
        print(f"GPU busy {gpu_ms:.3f} ms per step ({100 * gpu_ms / step_ms:.1f} % of the wall time); "
              + "; ".join(f"{n:.0f} {what}" for what, n in per_step.items()) + " per step")
        print("\n| GPU ms per step | calls per step | kernel |\n|---:|---:|---|")
        for k in gpu["top_gpu_kernels"]:
            print(f"| {k['ms_per_step']:.3f} | {k['calls_per_step']:.0f} | `{k['name'][:80]}` |")
    print("\n| self ms per step | calls per step | kind | name |\n|---:|---:|---|---|")
    for name in top:
        print(f"| {self_us[name] / 1e3 / args.nsteps:.3f} | {calls[name] / args.nsteps:.0f} | {kind(name)} | "
              f"`{name[:80]}` |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "model": str(args.model), "batch_size": args.batch_size, "dtype": args.dtype,
            "solver": harness.solver_settings(mjm), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "compile_s": compile_s, "step_ms": step_ms,
            "device": str(m.device), "shares_ms": shares, **gpu,
            "top": [{"name": n, "self_ms_per_step": self_us[n] / 1e3 / args.nsteps,
                     "calls_per_step": calls[n] / args.nsteps, "kind": kind(n)} for n in top],
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
