"""Plot a step_throughput.py result: steps per second against batch size, one panel per model.

    python benchmarks/plot.py                                   # results/step_throughput.json
    python benchmarks/plot.py results.json --out results.png

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
    parser.add_argument("json", nargs="?", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--out", type=Path, help="PNG path (default: the JSON's, with .png)")
    args = parser.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot.py needs matplotlib, which diffmj does not depend on: pip install matplotlib")

    result = json.loads(args.json.read_text())
    records = [r for r in result["records"] if "steps_per_second" in r]
    models = sorted({r["model"] for r in records})
    if not models:
        sys.exit(f"{args.json} has no measured throughput to plot")
    fig, axes = plt.subplots(1, len(models), figsize=(max(7.0, 5.5 * len(models)), 5.0), squeeze=False)
    for ax, model in zip(axes[0], models):
        for backend, label in LABELS.items():
            points = sorted((r["batch_size"], r["steps_per_second"]) for r in records
                            if r["model"] == model and r["backend"] == backend)
            if points:
                ax.plot(*zip(*points), marker="o", label=label)
        ax.set(xscale="log", yscale="log", title=model, xlabel="batch size B",
               ylabel="simulated steps / second")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize="small")
    machine = result["machine"]
    fig.suptitle(f"diffmj step throughput, {result['settings']['dtype']}, {result['date'][:10]}\n"
                 f"{machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}", fontsize="medium")
    fig.tight_layout()
    out = args.out or args.json.with_suffix(".png")
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
