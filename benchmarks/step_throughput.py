"""Steps per second of diffmj and its anchors, by model and batch size, in one run.

    python benchmarks/step_throughput.py                       # defaults below
    python benchmarks/step_throughput.py --models tests/models/chain.xml \\
        --batch-sizes 1 64 --nsteps 100 --dtype float32 --out /tmp/bench.json

Each side runs in a subprocess (a *runner*, see ``harness.py``) on the same
XML with the same solver settings, and reports total simulated steps per wall
second (B * nsteps / median seconds of a few timed repeats, after a warm-up):

- diffmj eager: ``diffmj.step`` on batched Data;
- diffmj compiled: ``torch.compile(diffmj.step, fullgraph=True)`` on batched
  Data (the explicit batch: solver loops stop once the whole batch has
  converged), one fresh process per batch size; compile time cold (empty
  TORCHINDUCTOR_CACHE_DIR) and warm (a second process on the cache the first
  one filled);
- diffmj compiled vmap: ``torch.compile(torch.vmap(diffmj.step, in_dims=(None, 0)),
  fullgraph=True)``, the per-element step under vmap (solver loops run their full
  count); the same for B=1;
- MuJoCo C: ``mujoco.rollout`` on a thread pool, and an ``mj_step`` loop for B=1;
- MJX (JAX, CPU) and mujoco_torch, each in its own venv made by
  ``setup_anchors.py``; an anchor that is not set up is recorded as such.

Models that ``diffmj.put_model`` refuses (NotImplementedError) are skipped with
their reason. A side that fails for a model records the reason instead of a
number. The run prints a markdown table and writes JSON with the machine,
versions and settings.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import mujoco
import torch

import diffmj
import harness

REPO = harness.BENCH_DIR.parent
DEFAULT_MODELS = ("tests/models/chain.xml", "tests/models/actuators.xml")
DEFAULT_OUT = harness.BENCH_DIR / "results" / "step_throughput.json"

# column order and labels of the table
BACKENDS = {
    "mujoco_c_loop": "MuJoCo C mj_step",
    "mujoco_c_rollout": "MuJoCo C rollout",
    "mjx_jit": "MJX jit",
    "mujoco_torch_eager": "mujoco_torch eager",
    "mujoco_torch_compiled": "mujoco_torch compiled",
    "diffmj_eager": "diffmj eager",
    "diffmj_compiled_vmap": "diffmj compiled vmap",
    "diffmj_compiled": "diffmj compiled",
}
SINGLE_WORLD_ONLY = {"mujoco_c_loop"}


@dataclass(frozen=True)
class Runner:
    """How to run one side: which python runs which script, producing which backends.

    ``process_per_batch_size``: a fresh process for each batch size, so every
    compile starts cold and a hang costs one number. ``warm_compile``: after
    each cold process, compile once more in a new process on its cache.
    """

    name: str
    script: Path
    backends: tuple[str, ...]
    extra_args: tuple[str, ...] = ()
    anchor: harness.AnchorEnv | None = None
    takes_device: bool = False  # runs where --device says (else on the CPU)
    process_per_batch_size: bool = False
    warm_compile: bool = False

    @property
    def python(self) -> Path:
        return self.anchor.python if self.anchor else Path(sys.executable)


RUNNERS = {
    "mujoco_c": Runner("mujoco_c", harness.BENCH_DIR / "anchors" / "mujoco_c_bench.py",
                       ("mujoco_c_rollout", "mujoco_c_loop")),
    "mjx": Runner("mjx", harness.BENCH_DIR / "anchors" / "mjx_bench.py", ("mjx_jit",),
                  anchor=harness.ANCHOR_ENVS["mjx"], takes_device=True, process_per_batch_size=True),
    "mujoco_torch_eager": Runner("mujoco_torch_eager", harness.BENCH_DIR / "anchors" / "mujoco_torch_bench.py",
                                 ("mujoco_torch_eager",), ("--variants", "eager"),
                                 harness.ANCHOR_ENVS["mujoco_torch"]),
    "mujoco_torch_compiled": Runner("mujoco_torch_compiled", harness.BENCH_DIR / "anchors" / "mujoco_torch_bench.py",
                                    ("mujoco_torch_compiled",), ("--variants", "compiled"),
                                    harness.ANCHOR_ENVS["mujoco_torch"], process_per_batch_size=True),
    "diffmj_eager": Runner("diffmj_eager", harness.BENCH_DIR / "diffmj_bench.py", ("diffmj_eager",),
                           ("--variant", "eager"), takes_device=True),
    "diffmj_compiled": Runner("diffmj_compiled", harness.BENCH_DIR / "diffmj_bench.py", ("diffmj_compiled",),
                              ("--variant", "compiled"), takes_device=True, process_per_batch_size=True,
                              warm_compile=True),
    "diffmj_compiled_vmap": Runner("diffmj_compiled_vmap", harness.BENCH_DIR / "diffmj_bench.py",
                                   ("diffmj_compiled_vmap",), ("--variant", "compiled_vmap"), takes_device=True,
                                   process_per_batch_size=True, warm_compile=True),
}


class RunnerFailed(Exception):
    """A runner that printed no result: its reason stands in for every number it owed."""


@dataclass
class Run:
    """Everything one benchmark run collects."""

    args: argparse.Namespace
    records: list[dict] = field(default_factory=list)
    runners: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    solver: dict = field(default_factory=dict)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def solver_for(mjm: mujoco.MjModel, args: argparse.Namespace) -> dict[str, float]:
    """The solver settings every runner gets: the command line's, else the XML's."""
    return {f: getattr(args, f) if getattr(args, f) is not None else getattr(mjm.opt, f)
            for f in harness.SOLVER_FIELDS}


def runner_command(runner: Runner, model: Path, batch_sizes: list[int], solver: dict,
                   args: argparse.Namespace) -> list[str]:
    return [
        str(runner.python), str(runner.script),
        "--model", str(model),
        "--batch-sizes", *map(str, batch_sizes),
        "--nsteps", str(args.nsteps),
        "--repeats", str(args.repeats),
        "--dtype", args.dtype,
        "--iterations", str(int(solver["iterations"])),
        "--ls-iterations", str(int(solver["ls_iterations"])),
        "--tolerance", repr(float(solver["tolerance"])),
        *runner.extra_args,
        *(("--device", args.device) if runner.takes_device else ()),
    ]


def call_runner(command: list[str], timeout: float, env: dict | None = None) -> dict:
    """Run one runner subprocess and return its payload, or raise RunnerFailed with the reason."""
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})}, cwd=REPO)
    except subprocess.TimeoutExpired:
        raise RunnerFailed(f"timed out after {timeout:.0f} s") from None
    try:
        return harness.parse_emitted(proc.stdout)
    except ValueError:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise RunnerFailed(f"exit code {proc.returncode}: {lines[-1] if lines else 'no output'}") from None


def error_records(runner: Runner, batch_sizes: list[int], reason: str) -> list[dict]:
    return [{"backend": backend, "batch_size": b, "error": reason}
            for backend in runner.backends for b in batch_sizes
            if backend not in SINGLE_WORLD_ONLY or b == 1]


def run_batch_sizes(run: Run, runner: Runner, model: Path, batch_sizes: list[int],
                    cache: str, extra: tuple[str, ...] = ()) -> list[dict]:
    """Records of one runner process over ``batch_sizes`` (error records if it fails).

    ``cache`` is the process's TORCHINDUCTOR_CACHE_DIR.
    """
    command = runner_command(runner, model, batch_sizes, run.solver[model.name], run.args) + list(extra)
    start = time.perf_counter()
    try:
        payload = call_runner(command, run.args.timeout, {"TORCHINDUCTOR_CACHE_DIR": cache})
    except RunnerFailed as e:
        log(f"  {runner.name} B={batch_sizes}: failed ({e})")
        return error_records(runner, batch_sizes, str(e))
    log(f"  {runner.name} B={batch_sizes}: {time.perf_counter() - start:.0f} s")
    run.runners.setdefault(runner.name, {"versions": payload["versions"], "solver": {}})
    run.runners[runner.name]["solver"][model.name] = payload["solver"]
    return payload["records"]


def run_runner(run: Run, runner: Runner, model: Path, batch_sizes: list[int]) -> list[dict]:
    """Records of one side on one model; every process starts on an empty inductor cache.

    A record's ``compile`` entry becomes ``{"cold": ...}``, plus ``"warm"`` for
    a runner with ``warm_compile`` at the batch sizes in --warm-compile-batch-sizes.
    """
    groups = [[b] for b in batch_sizes] if runner.process_per_batch_size else [batch_sizes]
    records = []
    for group in groups:
        with tempfile.TemporaryDirectory(prefix="bench-inductor-") as cache:
            cold = run_batch_sizes(run, runner, model, group, cache)
            for record in cold:
                if "compile" not in record:
                    continue
                record["compile"] = {"cold": record["compile"]}
                if runner.warm_compile and record["batch_size"] in run.args.warm_compile_batch_sizes:
                    (warm,) = run_batch_sizes(run, runner, model, [record["batch_size"]], cache, ("--compile-only",))
                    record["compile"]["warm"] = warm.get("compile", {"error": warm.get("error")})
        records += cold
    return records


def run_model(run: Run, model: Path) -> None:
    """All selected runners on one model (skipped, with its reason, when diffmj refuses it)."""
    mjm = mujoco.MjModel.from_xml_path(str(model))
    try:
        diffmj.put_model(mjm)
    except NotImplementedError as e:
        run.skipped[model.name] = f"diffmj does not support it yet: {e}"
        log(f"skipping {model}: diffmj does not support it yet ({e})")
        return
    run.solver[model.name] = solver_for(mjm, run.args)
    log(f"{model} (nq={mjm.nq}, nv={mjm.nv}, nu={mjm.nu}), solver {run.solver[model.name]}")
    for name in run.args.runners:
        runner = RUNNERS[name]
        if runner.anchor and not runner.python.exists():
            reason = f"not set up: run `python benchmarks/setup_anchors.py {runner.anchor.name}`"
            log(f"  {name}: {reason}")
            records = error_records(runner, run.args.batch_sizes, reason)
        else:
            batch_sizes = {"diffmj_compiled": run.args.compiled_batch_sizes,
                           "diffmj_compiled_vmap": run.args.compiled_batch_sizes,
                           "mjx": run.args.mjx_batch_sizes}.get(name, run.args.batch_sizes)
            records = run_runner(run, runner, model, batch_sizes)
        run.records += [{"model": model.name, **r} for r in records]


def solver_mismatches(run: Run) -> list[str]:
    """Where a runner's MuJoCo read other solver settings for a model than the first runner's did."""
    found = []
    for model in run.solver:
        seen = [(name, r["solver"][model]) for name, r in run.runners.items() if model in r["solver"]]
        found += [f"{model}: {name} has {settings}, {seen[0][0]} has {seen[0][1]}"
                  for name, settings in seen[1:] if settings != seen[0][1]]
    return found


def git_state() -> dict:
    def git(*cmd: str) -> str:
        out = subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True)
        return out.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--", "diffmj"))}


def machine_info() -> dict:
    cpu = platform.processor()
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "mujoco": mujoco.__version__,
        "diffmj": str(Path(diffmj.__file__).parent),
        "git": git_state(),
        "load_average_start": os.getloadavg(),
    }


def fmt_rate(record: dict | None) -> str:
    if record is None:
        return ""
    if "error" in record:
        return "error"
    rate = record["steps_per_second"]
    return f"{rate / 1e6:.2f}M" if rate >= 1e6 else f"{rate / 1e3:.1f}k" if rate >= 1e3 else f"{rate:.1f}"


def markdown(result: dict) -> str:
    """Tables of throughput and compile time, and the reasons of the failures."""
    records = result["records"]
    keys = sorted({(r["model"], r["batch_size"]) for r in records}, key=lambda k: (k[0], k[1]))
    present = [b for b in BACKENDS if any(r["backend"] == b for r in records)]
    index = {(r["model"], r["batch_size"], r["backend"]): r for r in records}
    settings = result["settings"]
    lines = [f"Steps per second ({settings['dtype']}, {settings.get('device', 'cpu')}, {settings['nsteps']} steps, "
             f"median of {settings['repeats']})", "",
             "| model | B | " + " | ".join(BACKENDS[b] for b in present) + " |",
             "|---|---:|" + "---:|" * len(present)]
    for model, b in keys:
        cells = [fmt_rate(index.get((model, b, backend))) for backend in present]
        lines.append(f"| {model} | {b} | " + " | ".join(cells) + " |")

    compiled = [r for r in records if "compile" in r]
    if compiled:
        lines += ["", "Compile time: seconds of the calls until the step runs without compiling "
                  "(graphs compiled); cold: empty cache, warm: a new process on the cache the cold one filled; "
                  "vs eager: largest difference of qpos, qvel, act, qacc, sensordata after those calls", "",
                  "| model | B | backend | cold | warm | vs eager |", "|---|---:|---|---:|---:|---:|"]
        for r in compiled:
            cells = [f"{c['total_s']:.1f} ({c['graphs']})" if c and "total_s" in c else ""
                     for c in (r["compile"]["cold"], r["compile"].get("warm"))]
            cells.append(f"{r['max_abs_diff_vs_eager']:.0e}" if "max_abs_diff_vs_eager" in r else "")
            lines.append(f"| {r['model']} | {r['batch_size']} | {BACKENDS[r['backend']]} | {' | '.join(cells)} |")

    errors = [r for r in records if "error" in r]
    if errors:
        lines += ["", "Failures:"]
        lines += [f"- {r['model']} B={r['batch_size']} {BACKENDS[r['backend']]}: {r['error']}" for r in errors]
    lines += [f"- skipped {m}: {why}" for m, why in result["skipped"].items()]
    return "\n".join(lines)


def write_json(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(path)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", type=Path, default=[REPO / m for m in DEFAULT_MODELS],
                        help="MJCF files (default: %(default)s)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 1024])
    parser.add_argument("--compiled-batch-sizes", type=int, nargs="+",
                        help="batch sizes for diffmj compiled (default: --batch-sizes); "
                             "each costs a cold and a warm compile")
    parser.add_argument("--mjx-batch-sizes", type=int, nargs="+",
                        help="batch sizes for MJX (default: --batch-sizes); jax 0.10.2 hangs at B=1024 on "
                             "halfcheetah and walker2d here")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where diffmj and MJX run (MuJoCo C and mujoco_torch: on the CPU)")
    parser.add_argument("--nsteps", type=int, default=100, help="steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats; the median is reported")
    parser.add_argument("--iterations", type=int, help="solver iterations (default: the XML's)")
    parser.add_argument("--ls-iterations", type=int, help="line-search iterations (default: the XML's)")
    parser.add_argument("--tolerance", type=float, help="solver tolerance (default: the XML's)")
    parser.add_argument("--runners", nargs="+", choices=list(RUNNERS), default=list(RUNNERS),
                        help="sides to run (default: all)")
    parser.add_argument("--warm-compile-batch-sizes", type=int, nargs="*",
                        help="batch sizes at which diffmj is compiled a second time, on the warm cache "
                             "(default: --compiled-batch-sizes; none if given without a value)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed to one runner process")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output (default: %(default)s)")
    args = parser.parse_args()
    args.compiled_batch_sizes = args.compiled_batch_sizes or args.batch_sizes
    args.mjx_batch_sizes = args.mjx_batch_sizes or args.batch_sizes
    if args.warm_compile_batch_sizes is None:
        args.warm_compile_batch_sizes = args.compiled_batch_sizes
    args.models = [m.resolve() for m in args.models]
    return args


def result_json(run: Run, machine: dict, start: float) -> dict:
    """The JSON document of the run so far."""
    args = run.args
    return {
        "benchmark": "step_throughput",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "machine": machine | {"load_average_now": os.getloadavg()},
        "settings": {k: v for k, v in vars(args).items() if k not in ("models", "out")}
        | {"models": [str(m) for m in args.models]},
        "solver": run.solver,
        "solver_mismatches": solver_mismatches(run),
        "initial_state": "qpos0, qvel = 0.1 * standard normal (seed 0) per world, ctrl = 0",
        "anchor_envs": {a.name: {"requirements": a.requirements, "note": a.note}
                        for a in harness.ANCHOR_ENVS.values()},
        "runners": run.runners,
        "skipped": run.skipped,
        "records": run.records,
    }


def main() -> None:
    args = parse_args()
    run = Run(args)
    start = time.perf_counter()
    machine = machine_info()
    for model in args.models:
        run_model(run, model)
        write_json(result_json(run, machine, start), args.out)  # a cut-short run keeps what it measured
    result = result_json(run, machine, start)
    for mismatch in result["solver_mismatches"]:
        log(f"warning: solver settings differ: {mismatch}")
    print(markdown(result))
    log(f"wrote {args.out} ({result['wall_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
