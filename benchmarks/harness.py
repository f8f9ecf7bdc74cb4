"""Shared helpers of the step-throughput benchmark.

Every side of the comparison (diffmj, MuJoCo C, MJX, mujoco_torch) is a
*runner*: a script run in a subprocess, each in the Python environment it
needs, that takes the same command line (``add_runner_args``), builds the
model from the same XML with the same solver settings (``load_model``),
times with the same protocol (``measure``) and prints its records as one
JSON line (``emit``). ``step_throughput.py`` starts the runners, collects
their records and writes the table and the JSON.

This module is imported by runners in other virtual environments, so it uses
only the standard library, numpy and mujoco.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import mujoco
import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
VENVS_DIR = BENCH_DIR / ".venvs"
JSON_PREFIX = "BENCH_JSON "

# opt fields that every runner sets explicitly, so all sides solve alike
SOLVER_FIELDS = ("iterations", "ls_iterations", "tolerance")


@dataclass(frozen=True)
class AnchorEnv:
    """An anchor that runs in its own virtual environment under ``.venvs/``.

    ``requirements`` are pinned so that a run states exactly what it compared
    against; ``note`` says why the pins are what they are.
    """

    name: str
    script: str
    requirements: tuple[str, ...]
    note: str

    @property
    def venv(self) -> Path:
        return VENVS_DIR / self.name

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


ANCHOR_ENVS = {
    "mjx": AnchorEnv(
        name="mjx",
        script="anchors/mjx_bench.py",
        requirements=("mujoco==3.17.0", "mujoco-mjx==3.17.0", "jax==0.10.2", "jaxlib==0.10.2"),
        note="mujoco-mjx's version names the MuJoCo release it implements; none exists for MuJoCo 4",
    ),
    "mujoco_torch": AnchorEnv(
        name="mujoco_torch",
        script="anchors/mujoco_torch_bench.py",
        requirements=("torch==2.13.0", "mujoco-torch==0.2.0", "mujoco==3.7.0"),
        note="same torch as diffmj; mujoco-torch 0.2.0 reads mjENBL_MULTICCD and mjENBL_SLEEP, "
        "both present only in MuJoCo 3.5 to 3.7",
    ),
    "sysid": AnchorEnv(
        name="sysid",
        script="sysid.py",
        requirements=("torch==2.13.0", "mujoco[sysid]==4.0.0", "-e", str(BENCH_DIR.parent)),
        note="diffmj's torch and MuJoCo with the sysid extra (matplotlib, plotly, absl, ...), which diffmj's "
        "venv does not carry; diffmj itself installed editable, so one process runs both sides",
    ),
}


def add_runner_args(parser: argparse.ArgumentParser) -> None:
    """The command line every runner takes (``step_throughput.py`` passes it on)."""
    parser.add_argument("--model", required=True, help="MJCF file")
    parser.add_argument("--batch-sizes", type=int, nargs="+", required=True)
    parser.add_argument("--nsteps", type=int, required=True, help="steps per timed repeat")
    parser.add_argument("--repeats", type=int, required=True, help="timed repeats (median reported)")
    parser.add_argument("--dtype", choices=("float32", "float64"), required=True)
    parser.add_argument("--iterations", type=int, required=True)
    parser.add_argument("--ls-iterations", type=int, required=True)
    parser.add_argument("--tolerance", type=float, required=True)


def solver_overrides(args: argparse.Namespace) -> dict[str, float]:
    """The solver settings named on a runner's command line."""
    return {f: getattr(args, f) for f in SOLVER_FIELDS}


def load_model(path: str | os.PathLike, solver: dict[str, float] | None = None) -> mujoco.MjModel:
    """Compile ``path`` and set the solver fields of ``solver`` (``SOLVER_FIELDS``) on its options."""
    mjm = mujoco.MjModel.from_xml_path(os.fspath(path))
    for field, value in (solver or {}).items():
        setattr(mjm.opt, field, value)
    return mjm


def solver_settings(mjm: mujoco.MjModel) -> dict:
    """The options that decide what one step computes, as the runner's MuJoCo read them."""
    opt = mjm.opt
    return {
        "solver": mujoco.mjtSolver(opt.solver).name.removeprefix("mjSOL_"),
        "integrator": mujoco.mjtIntegrator(opt.integrator).name.removeprefix("mjINT_"),
        "timestep": float(opt.timestep),
        "iterations": int(opt.iterations),
        "ls_iterations": int(opt.ls_iterations),
        "tolerance": float(opt.tolerance),
    }


def initial_qvel(mjm: mujoco.MjModel, batch_size: int) -> np.ndarray:
    """The batch's initial joint velocities: small, fixed, different per world. [B, nv]

    Every runner starts from qpos0 with these velocities and zero controls.
    """
    return 0.1 * np.random.default_rng(0).standard_normal((batch_size, mjm.nv))


def measure(run: Callable[[], None], batch_size: int, nsteps: int, repeats: int) -> dict:
    """Time ``run`` (``nsteps`` steps of ``batch_size`` worlds, returning when they are done).

    One untimed call warms up, then ``repeats`` timed calls; throughput is
    total simulated steps per wall second of the median call.
    """
    run()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    return {
        "steps_per_second": batch_size * nsteps / median,
        "seconds_median": median,
        "seconds": seconds,
        "nsteps": nsteps,
    }


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    """``fn()`` and the wall seconds it took."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def reason(e: BaseException) -> str:
    """One line saying why ``e`` happened: its first line, and that of its innermost cause."""
    def line(x: BaseException) -> str:
        text = str(x).strip().splitlines()
        return f"{type(x).__name__}: {text[0] if text else ''}"[:400]

    root = e
    while (root.__cause__ or root.__context__) is not None:
        root = root.__cause__ or root.__context__
    return line(e) if root is e else f"{line(e)} (caused by {line(root)})"


def guarded(fn: Callable[[], dict]) -> dict:
    """``fn()``, or ``{"error": reason}`` when it raises, so one failure costs one number."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - any failure becomes a recorded reason
        traceback.print_exc(file=sys.stderr)
        return {"error": reason(e)}


def emit(records: list[dict], versions: dict, solver: dict | None = None) -> None:
    """Print a runner's output: one line, ``JSON_PREFIX`` then the JSON object."""
    payload = {"versions": versions, "solver": solver, "records": records}
    print(JSON_PREFIX + json.dumps(payload), flush=True)


def parse_emitted(stdout: str) -> dict:
    """The payload of the last ``emit`` line in a runner's stdout."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(JSON_PREFIX):
            return json.loads(line[len(JSON_PREFIX):])
    raise ValueError("the runner printed no result line")
