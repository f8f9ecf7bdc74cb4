"""Where torch.compile's time goes: per compile phase and per pipeline stage (issue #14).

Each measurement compiles one function: the whole ``diffmj.step`` (or
``forward``) or one stage of ``forward.py`` alone, fed the Data that the stages
before it produce eagerly. Inductor compiles run in a fresh process each with an
empty TORCHINDUCTOR_CACHE_DIR (as compile_time.py does); aot_eager, which has no
cache, compiles the stages one after another in one process. It reports

* wall seconds of the first (compiling) call and the CPU seconds of the process
  and its children over it (CPU time is steadier than wall time on a loaded machine;
  ``--compile-threads 1`` keeps inductor's C++ compiles in child processes of this one);
* the graph sizes: nodes of Dynamo's FX graph (call_function / call_method, counting
  the bodies of while_loop / scan), and of the ATen graph AOTAutograd hands the
  backend (backend ``aot_eager`` only);
* how many times Dynamo started its analysis (``compile_attempt_*``: 2 when it restarts);
* with inductor, the phases from ``torch._dynamo.utils.compilation_time_metrics``: Dynamo's
  bytecode tracing, AOTAutograd (functionalisation and decomposition to ATen),
  inductor's lowering and code generation, and the C++ compile of its kernels.

    python benchmarks/compile_stages.py                               # contacts.xml and hopper, every stage
    python benchmarks/compile_stages.py --models models/hopper.xml --stages step collision
    python benchmarks/compile_stages.py --backends aot_eager           # graph sizes only, faster
    python benchmarks/compile_stages.py --env TENSORIFY_PYTHON_SCALARS=0 # a setting's effect

The model is settled for 300 MuJoCo steps so contacts are active; ``--iterations``
sets opt.iterations with tolerance 0, as in compile_time.py.
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
MODELS = [REPO / "tests" / "models" / "contacts.xml", REPO / "models" / "hopper.xml"]
# forward.py's stages in the order run_forward runs them, then the integrator
STAGES = [
    "kinematics", "com_pos", "tendon", "crb", "factor_m", "collision", "make_constraint", "transmission",
    "sensor_pos", "fwd_velocity", "sensor_vel", "actuation", "fwd_acceleration", "fwd_constraint", "sensor_acc",
    "integrate",
]

# run in the child process: compiles each of the comma-separated stages, one JSON line each
_CHILD = r"""
import json, resource, sys, time
import mujoco, torch
import diffmj
from diffmj import actuation, constraint, sensor, smooth
from diffmj.forward import (fwd_acceleration, fwd_constraint, fwd_velocity, run_forward, integrate,
                            run_step)
from diffmj.collision.driver import collision
from torch._dynamo.utils import compilation_time_metrics

model, stages, backend, iterations, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(1)
torch._inductor.config.compile_threads = threads
mjm = mujoco.MjModel.from_xml_path(model)
if iterations:
    mjm.opt.iterations, mjm.opt.tolerance = iterations, 0.0
mjd = mujoco.MjData(mjm)
for _ in range(300):
    mujoco.mj_step(mjm, mjd)
m = diffmj.put_model(mjm)
mode = m.backward_mode
pipeline = {
    "kinematics": smooth.kinematics, "com_pos": smooth.com_pos, "tendon": smooth.tendon, "crb": smooth.crb,
    "factor_m": smooth.factor_m, "collision": collision, "make_constraint": constraint.make_constraint,
    "transmission": smooth.transmission, "sensor_pos": sensor.sensor_pos, "fwd_velocity": fwd_velocity,
    "sensor_vel": sensor.sensor_vel, "actuation": actuation.actuation, "fwd_acceleration": fwd_acceleration,
    "fwd_constraint": lambda m, d: fwd_constraint(m, d, mode), "sensor_acc": sensor.sensor_acc,
    "integrate": lambda m, d: integrate(m, d, mode),
}
whole = {"step": lambda m, d: run_step(m, d, mode),
         "forward": lambda m, d: run_forward(m, d, mode)}


def stage_and_input(stage):
    d = diffmj.put_data(m, mjd)
    if stage in whole:
        return whole[stage], d
    for name, f in pipeline.items():  # the stage's input: what the stages before it make
        if name == stage:
            return f, d
        d = f(m, d)


def count(gm):
    # the graph's ops and those of its subgraphs (while_loop / scan bodies)
    return sum(1 for mod in gm.modules() for n in mod.graph.nodes if n.op in ("call_function", "call_method"))


def cpu():
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


for stage in stages.split(","):
    fn, d = stage_and_input(stage)
    sizes = {}

    def counting_backend(gm, example_inputs):
        sizes["dynamo_nodes"] = count(gm)  # the last attempt's graph (Dynamo may restart its analysis)
        if backend == "inductor":
            from torch._inductor.compile_fx import compile_fx
            return compile_fx(gm, example_inputs)
        from torch._dynamo.backends.common import aot_autograd

        def fw(g, _):
            sizes["aten_nodes"] = count(g)
            return g.forward
        return aot_autograd(fw_compiler=fw)(gm, example_inputs)

    torch._dynamo.reset()
    compilation_time_metrics.clear()
    compiled = torch.compile(fn, fullgraph=True, backend=counting_backend)
    cpu0, start = cpu(), time.perf_counter()
    out = compiled(m, d)
    wall, cpu_s = time.perf_counter() - start, cpu() - cpu0
    eager = fn(m, d)
    diff = max((float((a - b).abs().max()) if a.is_floating_point() and a.numel() else 0.0)
               for a, b in zip(out.values(True, True), eager.values(True, True)))
    phases = {k: sum(v) for k, v in compilation_time_metrics.items()}
    print("RESULT " + json.dumps(dict(
        stage=stage, wall_s=wall, cpu_s=cpu_s, max_diff_vs_eager=diff, phases=phases,
        cxx_files=len(compilation_time_metrics.get("compile_file", [])),
        dynamo_attempts=sum(1 for k in compilation_time_metrics if k.startswith("compile_attempt_")), **sizes)),
        flush=True)
"""


def measure(repo: Path, model: Path, stages: list[str], backend: str, iterations: int, threads: int,
            timeout: float, settings: dict[str, str]) -> list[dict]:
    """Compiles of ``stages`` one after another in a fresh process with an empty inductor cache,
    with the environment variables ``settings``: one record per stage."""
    common = dict(model=model.name, backend=backend, iterations=iterations, compile_threads=threads, settings=settings)
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, PYTHONPATH=str(repo), TORCHINDUCTOR_CACHE_DIR=cache, **settings)
        args = [sys.executable, "-c", _CHILD, str(model), ",".join(stages), backend, str(iterations), str(threads)]
        try:
            # cwd=repo: `python -c` puts the working directory first on sys.path
            proc = subprocess.run(args, env=env, cwd=repo, capture_output=True, text=True, timeout=timeout)
            stdout, error = proc.stdout, proc.stderr.strip()[-2000:]
        except subprocess.TimeoutExpired as timeout_error:
            stdout, error = timeout_error.stdout or "", f"timeout {timeout:.0f} s"
    done = [dict(common, **json.loads(line[len("RESULT "):])) for line in str(stdout).splitlines()
            if line.startswith("RESULT ")]
    failed = [dict(common, stage=stage, error=error) for stage in stages[len(done):]]
    return done + failed


# compilation_time_metrics keys enclosing each phase; each encloses the next
PHASE_KEYS = {"dynamo": "_compile.compile_inner", "aot": "create_aot_dispatcher_function",
              "inductor": "compile_fx_inner", "cxx": "compile_file"}


def phase_seconds(record: dict) -> dict:
    """Wall seconds of each phase without the phases nested in it (a key absent in a run counts 0)."""
    total = [record.get("phases", {}).get(key, 0.0) for key in PHASE_KEYS.values()] + [0.0]
    return {name: total[i] - total[i + 1] for i, name in enumerate(PHASE_KEYS)}


def table_row(r: dict) -> str:
    """One markdown row of a record."""
    head = f"| {r['model']} | {r['stage']} | {r['backend']} "
    if "error" in r:
        return head + f"| failed: {r['error'].splitlines()[-1] if r['error'] else '?'} |"
    inductor = r["backend"] == "inductor"
    p = phase_seconds(r) if inductor else {}
    cells = [f"{r['wall_s']:.1f}", f"{r['cpu_s']:.1f}"]
    cells += [f"{p[k]:.1f}" if p else "" for k in ("dynamo", "aot", "inductor", "cxx")]
    cells += [str(r["cxx_files"]) if inductor else "", str(r["dynamo_attempts"]), str(r.get("dynamo_nodes", "")),
              str(r.get("aten_nodes", "")), f"{r['max_diff_vs_eager']:.1e}"]
    return head + "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=REPO, help="checkout whose diffmj is imported")
    parser.add_argument("--models", type=Path, nargs="+", default=MODELS)
    parser.add_argument("--stages", nargs="+", default=["step", "forward", *STAGES], choices=["step", "forward", *STAGES])
    parser.add_argument("--backends", nargs="+", default=["aot_eager", "inductor"], choices=["aot_eager", "inductor"])
    parser.add_argument("--iterations", type=int, default=1, help="opt.iterations (tolerance 0); 0: the model's own")
    parser.add_argument("--compile-threads", type=int, default=1, help="torch._inductor.config.compile_threads")
    parser.add_argument("--env", nargs="*", default=[], metavar="NAME=VALUE",
                        help="environment of the compiling process, e.g. TENSORIFY_PYTHON_SCALARS=0")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per measurement")
    parser.add_argument("--label", default="", help="name of this checkout in the JSON")
    parser.add_argument("--out", type=Path, help="write the records as JSON (appended to an existing list)")
    args = parser.parse_args()
    settings = dict(item.split("=", 1) for item in args.env)

    print("| model | stage | backend | wall s | cpu s | dynamo s | aot s | inductor s | c++ s | C++ files "
          "| Dynamo attempts | Dynamo ops | ATen ops | max diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    records = []
    for model in args.models:
        for backend in args.backends:
            # inductor: a fresh process (and cache) per stage; aot_eager has no cache: one process
            batches = [[stage] for stage in args.stages] if backend == "inductor" else [args.stages]
            for stages in batches:
                for r in measure(args.repo.resolve(), model.resolve(), stages, backend, args.iterations,
                                 args.compile_threads, args.timeout, settings):
                    r["label"] = args.label or str(args.repo)
                    records.append(r)
                    print(table_row(r), flush=True)
    if args.out:
        old = json.loads(args.out.read_text()) if args.out.exists() else []
        args.out.write_text(json.dumps(old + records, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
