"""Anchor runner: MuJoCo C, batched with ``mujoco.rollout`` and, for B=1, a plain ``mj_step`` loop.

Runs in diffmj's environment (MuJoCo is a dependency of diffmj). MuJoCo
always computes in float64, whatever ``--dtype`` says. ``rollout`` runs the
batch on a persistent pool of ``--threads`` threads, one MjData per thread,
and writes every step's state into a preallocated array.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mujoco
import numpy as np
from mujoco import rollout

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402


def initial_states(mjm: mujoco.MjModel, batch_size: int) -> np.ndarray:
    """Full physics states of the batch's initial worlds (``harness.initial_qvel``). [B, nstate]"""
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    mjd = mujoco.MjData(mjm)
    states = np.empty((batch_size, mujoco.mj_stateSize(mjm, spec)))
    for state, qvel in zip(states, harness.initial_qvel(mjm, batch_size)):
        mjd.qvel[:] = qvel
        mujoco.mj_getState(mjm, mjd, state, spec)
    return states


def bench_rollout(mjm: mujoco.MjModel, batch_size: int, args: argparse.Namespace) -> dict:
    """Throughput of ``Rollout.rollout`` over the whole batch for ``nsteps`` steps."""
    state0 = initial_states(mjm, batch_size)
    out = np.empty((batch_size, args.nsteps, state0.shape[1]))
    datas = [mujoco.MjData(mjm) for _ in range(args.threads)]
    with rollout.Rollout(nthread=args.threads) as pool:
        def run() -> None:
            pool.rollout(mjm, datas, state0, nstep=args.nsteps, state=out)

        record = harness.measure(run, batch_size, args.nsteps, args.repeats)
    return {**record, "threads": args.threads, "dtype": "float64"}


def bench_loop(mjm: mujoco.MjModel, args: argparse.Namespace) -> dict:
    """Throughput of ``mj_step`` called from Python on one MjData."""
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    state0 = initial_states(mjm, 1)[0]
    mjd = mujoco.MjData(mjm)

    def run() -> None:
        mujoco.mj_setState(mjm, mjd, state0, spec)
        for _ in range(args.nsteps):
            mujoco.mj_step(mjm, mjd)

    return {**harness.measure(run, 1, args.nsteps, args.repeats), "threads": 1, "dtype": "float64"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    harness.add_runner_args(parser)
    parser.add_argument("--threads", type=int, default=2, help="rollout threads")
    args = parser.parse_args()
    mjm = harness.load_model(args.model, harness.solver_overrides(args))
    records = []
    for b in args.batch_sizes:
        records.append({"backend": "mujoco_c_rollout", "batch_size": b,
                        **harness.guarded(lambda: bench_rollout(mjm, b, args))})
        if b == 1:
            records.append({"backend": "mujoco_c_loop", "batch_size": 1,
                            **harness.guarded(lambda: bench_loop(mjm, args))})
    harness.emit(records, {"mujoco": mujoco.__version__, "numpy": np.__version__},
                 harness.solver_settings(mjm))


if __name__ == "__main__":
    main()
