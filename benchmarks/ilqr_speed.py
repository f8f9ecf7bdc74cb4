"""iLQR's seconds per iteration: eager with the sequential line search, eager with the parallel one, compiled,
and with the forward passes in MuJoCo C (exact Jacobians, then mjd_transitionFD's).

    python benchmarks/ilqr_speed.py                       # cart-pole (120 steps) and hopper (60 steps), 3 iterations
    python benchmarks/ilqr_speed.py --tasks hopper --iterations 5

The tasks are benchmarks/planners.py's open-loop problems (same start, same initial plan, same horizon).
Each mode runs ``optim.ilqr`` for ``--iterations`` iterations; an iteration's time is the difference
between consecutive callbacks (linearisation, backward pass and line search), the first iteration's
including nothing else (the initial rollout comes before it and is reported on its own). The compiled mode
runs twice in the process: the first call's extra time over the second is the compile (``compile_s``); the
second call is the one timed. Every mode's plan is compared with the first mode's (the eager sequential one):
on the same Jacobians their line searches accept the same alphas, so the plans agree to roundoff;
mjd_transitionFD's Jacobians differ from the exact ones by their truncation error.

Writes ``benchmarks/results/ilqr_speed.json`` (after every run) and prints a markdown table
(``--table PATH``: the table of an existing result).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

from diffmj import optim

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
from planners import load, setups, steps  # noqa: E402
from step_throughput import machine_info  # noqa: E402

# mode -> (line search, compiled, forward passes in MuJoCo C, mjd_transitionFD Jacobians)
MODES = {"eager sequential": ("sequential", False, False, False), "eager parallel": ("parallel", False, False, False),
         "compiled parallel": ("parallel", True, False, False),
         "MuJoCo C rollouts": ("sequential", False, True, False),
         "MuJoCo C rollouts, mjd_transitionFD": ("sequential", False, True, True)}


def run(task: str, mode: str, iterations: int) -> tuple[dict, torch.Tensor]:
    """One iLQR run of the mode on the task: its record and its plan."""
    setup = setups()[task]
    mj_model, m, d = load(setup)
    horizon = steps(setup.duration, setup.timestep)
    ctrl = torch.full((horizon, m.nu), setup.push, dtype=m.dtype)
    line_search, compiled, in_c, fd = MODES[mode]

    def plan() -> tuple[optim.ILQRResult, list[float], float]:
        marks: list[float] = []
        start = time.perf_counter()
        result = optim.ilqr(m, d, ctrl, setup.task.cost, max_iterations=iterations, line_search=line_search,
                            compile=compiled, mj_model=mj_model if in_c else None, fd_model=mj_model if fd else None,
                            callback=lambda info: marks.append(time.perf_counter() - start))
        return result, marks, time.perf_counter() - start

    compile_s = None
    if compiled:
        first_wall = plan()[2]
    result, marks, wall = plan()
    if compiled:
        compile_s = first_wall - wall
    per_iteration = [after - before for before, after in zip(marks, marks[1:])]
    record = {"task": task, "mode": mode, "horizon": horizon, "iterations": int(result.iterations), "wall_s": wall,
              "compile_s": compile_s, "first_iteration_with_initial_rollout_s": marks[0] if marks else None,
              "iteration_s": per_iteration,
              "mean_iteration_s": sum(per_iteration) / len(per_iteration) if per_iteration else None,
              "cost": result.cost_history.tolist()}
    return record, result.ctrl


def markdown(result: dict) -> str:
    """The table of a result."""
    lines = ["| task | mode | horizon | s per iteration | compile s | plan difference from the first mode |",
             "|---|---|---:|---:|---:|---:|"]
    for r in result["runs"]:
        compile_s = "-" if r["compile_s"] is None else f"{r['compile_s']:.0f}"
        lines.append(f"| {r['task']} | {r['mode']} | {r['horizon']} | {r['mean_iteration_s']:.2f} | {compile_s} "
                     f"| {r['plan_difference_from_first_mode']:.1e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["cartpole", "hopper"], choices=list(setups()))
    parser.add_argument("--modes", nargs="+", default=[m for m in MODES if m != "compiled parallel"], choices=list(MODES),
                        help="(the compiled mode compiles for minutes: name it to run it)")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "ilqr_speed.json")
    parser.add_argument("--table", type=Path, help="print the table of an existing result and exit")
    args = parser.parse_args()
    if args.table:
        print(markdown(json.loads(args.table.read_text())))
        return
    torch.set_num_threads(args.threads)
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": machine_info() | {"load_average_start": os.getloadavg()},
              "settings": vars(args) | {"out": str(args.out), "table": None}, "runs": []}
    for task in args.tasks:
        reference = None
        for mode in args.modes:
            record, plan = run(task, mode, args.iterations)
            reference = plan if reference is None else reference
            record["plan_difference_from_first_mode"] = (plan - reference).abs().max().item()
            result["runs"].append(record)
            result["machine"]["load_average_end"] = os.getloadavg()
            args.out.write_text(json.dumps(result, indent=1))
            print(f"{task} {mode}: {record['mean_iteration_s']:.2f} s per iteration, compile {record['compile_s']}, "
                  f"plan difference {record['plan_difference_from_first_mode']:.1e}", flush=True)
    print(markdown(result))

if __name__ == "__main__":
    main()
