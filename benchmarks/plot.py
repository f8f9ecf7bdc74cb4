"""Plot a step_throughput.py result: steps per second against batch size, one panel per model.

    python benchmarks/plot.py                                   # results/step_throughput.json
    python benchmarks/plot.py results.json --out results.png
    python benchmarks/plot.py a.json b.json --out both.png       # the records of several runs

Of several runs' records for the same model, backend and batch size, the last
file's is plotted (a re-run replaces what it re-measured).

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
    latest = {(r["model"], r["backend"], r["batch_size"]): r
              for result in results for r in result["records"] if "steps_per_second" in r}
    records = list(latest.values())
    models = sorted({r["model"] for r in records})
    if not models:
        sys.exit(f"{' '.join(map(str, args.json))}: no measured throughput to plot")
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
    out = args.out or args.json[0].with_suffix(".png")
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
