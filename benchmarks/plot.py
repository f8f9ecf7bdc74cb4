"""Plot a benchmark's result: step_throughput.py's steps per second against batch size, one panel per
model; planners.py's cost against wall time, one panel per task; or sysid.py's final error against wall
time, one panel per problem.

    python benchmarks/plot.py                                   # results/step_throughput.json
    python benchmarks/plot.py results.json --out results.png
    python benchmarks/plot.py a.json b.json --out both.png       # the records of several runs
    python benchmarks/plot.py benchmarks/results/planners.json   # -> planners.png
    python benchmarks/plot.py benchmarks/results/sysid.json      # -> sysid.png

Of several step_throughput runs' records for the same model, backend and batch size, the last
file's is plotted (a re-run replaces what it re-measured). planners.py's and sysid.py's results are
plotted alone.

Needs matplotlib, which is not a dependency of diffmj: install it into any
environment (``pip install matplotlib``); this script reads only the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "step_throughput.json"
LABELS = {
    "mujoco_c_loop": "MuJoCo C mj_step",
    "mujoco_c_rollout": "MuJoCo C rollout",
    "mjx_jit": "MJX jit (CPU)",
    "mujoco_torch_eager": "mujoco_torch eager",
    "mujoco_torch_compiled": "mujoco_torch compiled",
    "diffmj_eager": "diffmj eager",
    "diffmj_compiled_vmap": "diffmj compiled vmap",
    "diffmj_compiled": "diffmj compiled",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", nargs="*", type=Path, default=[DEFAULT_JSON])
    parser.add_argument("--out", type=Path, help="PNG path (default: the first JSON's, with .png)")
    args = parser.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot.py needs matplotlib, which diffmj does not depend on: pip install matplotlib")

    results = [json.loads(path.read_text()) for path in args.json]
    if "open_loop" in results[0] or "problems" in results[0]:
        if len(results) > 1:
            sys.exit("a planners.py or sysid.py result is plotted alone")
        fig = (plot_planners if "open_loop" in results[0] else plot_sysid)(plt, results[0])
    else:
        fig = plot_throughput(plt, results)
    out = args.out or args.json[0].with_suffix(".png")
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def plot_throughput(plt, results: list[dict]):
    """Steps per second against batch size, one panel per model: the figure."""
    latest = {(r["model"], r["backend"], r["batch_size"]): r
              for result in results for r in result["records"] if "steps_per_second" in r}
    records = list(latest.values())
    models = sorted({r["model"] for r in records})
    if not models:
        sys.exit("no measured throughput to plot")
    ncols = min(3, len(models))
    nrows = -(-len(models) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(7.0, 5.5 * ncols), 5.0 * nrows), squeeze=False)
    for ax in axes.flat[len(models):]:
        ax.set_visible(False)
    for ax, model in zip(axes.flat, models):
        for backend, label in LABELS.items():
            points = sorted((r["batch_size"], r["steps_per_second"]) for r in records
                            if r["model"] == model and r["backend"] == backend)
            if points:
                ax.plot(*zip(*points), marker="o", label=label)
        ax.set(xscale="log", yscale="log", title=model, xlabel="batch size B",
               ylabel="simulated steps / second")
        ax.grid(True, which="both", alpha=0.3)
    handles = {}  # label -> line, over all panels: a backend may be missing from some
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles[label] = handle
    labels = [label for label in LABELS.values() if label in handles]
    fig.legend([handles[label] for label in labels], labels, loc="lower center", ncol=len(labels), fontsize="small")
    machine = results[0]["machine"]
    dates = sorted({result["date"][:10] for result in results})
    dtypes = sorted({result["settings"]["dtype"] for result in results})
    fig.suptitle(f"diffmj step throughput, {', '.join(dtypes)}, {', '.join(dates)}\n"
                 f"{machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}", fontsize="medium")
    fig.tight_layout(rect=(0, 0.04, 1, 1))  # room for the legend below the panels
    return fig


def plot_planners(plt, result: dict):
    """Each open-loop planner's cost against wall time, one panel per task (log-log): the figure."""
    tasks = list(dict.fromkeys(r["task"] for r in result["open_loop"]))
    if not tasks:
        sys.exit("no open-loop record to plot")
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4.5), squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        for r in result["open_loop"]:
            if r["task"] == task:
                times, costs = zip(*r["trace"])
                # the first point is the initial plan at t = 0, which a log axis cannot show: at 1 ms
                ax.plot([max(t, 1e-3) for t in times], costs, marker=".", label=r["planner"])
        horizon = next(r for r in result["open_loop"] if r["task"] == task)["horizon"]
        ax.set(xscale="log", yscale="log", title=f"{task} ({horizon} steps, open loop)", xlabel="wall time (s)",
               ylabel="total cost")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    machine = result["machine"]
    fig.suptitle(f"diffmj planners, {result['date'][:10]}, {machine['cpu']}, {machine['cores']} cores "
                 f"(load average {machine['load_average_start'][0]:.1f} at the start)", fontsize="medium")
    fig.tight_layout()
    return fig


def plot_sysid(plt, result: dict):
    """Each method's largest relative parameter error against its wall time, one panel per problem
    (log-log; compiled fits at their wall time including the compile), the errors of its iterates on the way
    (``trace``) as a line: the figure."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    problems = result["problems"]
    ncols = min(2, len(problems))
    nrows = -(-len(problems) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.0 * ncols, 4.5 * nrows), squeeze=False)
    for ax in axes.flat[len(problems):]:
        ax.set_visible(False)
    markers = dict(zip(("mujoco_sysid", "mujoco_sysid_no_resample", "diffmj_fit", "diffmj_fit_mujoco",
                        "diffmj_fit_compiled", "minimize_exact", "minimize_exact_mujoco"), "osDP^v<"))
    for ax, (name, problem) in zip(axes.flat, problems.items()):
        for method, r in problem["methods"].items():
            if "error" in r:
                continue
            # an exact fit's error is roundoff: drawn at 1e-16 at least, where a log axis can show it
            (final,) = ax.plot(r["wall_s"], max(r["max_relative_error"], 1e-16), marker=markers.get(method, "x"),
                               linestyle="none", markersize=8, label=method)
            if r.get("trace"):
                times, errors = zip(*r["trace"])
                ax.plot(times, [max(e, 1e-16) for e in errors], drawstyle="steps-post", color=final.get_color(),
                        alpha=0.5, linewidth=1)
        ax.set(xscale="log", yscale="log", xlabel="wall time (s)", ylabel="largest relative parameter error",
               title=f"{name} ({len(problem['true'])} parameters, {problem['chunks']} chunks)")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # labels within a decade too
        ax.xaxis.set_major_formatter(FuncFormatter(lambda t, _: f"{t:g}"))  # seconds, not powers of ten
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="x-small")
    machine = result["machine"]
    fig.suptitle(f"system identification: diffmj against mujoco.sysid, same data, start and bounds\n"
                 f"{machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}, "
                 f"mujoco {machine['mujoco']}", fontsize="medium")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    main()
