"""Anchor runner: MJX (JAX implementation) on the CPU, in the venv ``setup_anchors.py mjx`` makes;
``--device cuda`` runs it on the GPU (JAX_PLATFORMS=cuda).

B>1: ``jax.jit(jax.vmap(mjx.step, in_axes=(None, 0)))``; B=1: ``jax.jit(mjx.step)``.
Each step is one call from Python, as for diffmj. float64 turns on
``jax_enable_x64``.

MJX runs on one core: jax 0.10.2 hangs for good here (every thread parked on
a futex, in ``block_until_ready``) in the vmapped step at B=1024 both with
XLA's multithreaded Eigen (its default) and with the batch sharded over two
host devices, so Eigen is single-threaded (``--xla_cpu_multi_thread_eigen=false``)
and there is one device; so set, it runs B=1024 on ant, humanoid and hopper but
still hangs on halfcheetah and walker2d.

The record's compile entry times the first two calls: the second compiles
again, as its input is the first call's output.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402

WARMUP_CALLS = 2


def configure_jax(dtype: str, device: str = "cpu"):
    """Import JAX on ``device`` (the CPU single-threaded, see above) with the precision of ``dtype``."""
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()
    os.environ["JAX_PLATFORMS"] = device
    import jax

    jax.config.update("jax_enable_x64", dtype == "float64")
    return jax


def bench(jax, mjx, mjm, batch_size: int, args: argparse.Namespace) -> dict:
    """Throughput of the jitted (vmapped) step, and the time of its compiling calls."""
    import jax.numpy as jnp

    mx = mjx.put_model(mjm, impl="jax")
    qvel = jnp.asarray(harness.initial_qvel(mjm, batch_size))
    d_init = mjx.make_data(mx, impl="jax")
    if batch_size == 1:
        d0 = d_init.replace(qvel=qvel[0])
        step = jax.jit(mjx.step)
    else:
        d0 = jax.vmap(lambda v: d_init.replace(qvel=v))(qvel)
        step = jax.jit(jax.vmap(mjx.step, in_axes=(None, 0)))

    def run() -> None:
        d = d0
        for _ in range(args.nsteps):
            d = step(mx, d)
        jax.block_until_ready(d)

    d, calls = d0, []
    for _ in range(WARMUP_CALLS):
        d, seconds = harness.timed(lambda: jax.block_until_ready(step(mx, d)))
        calls.append(seconds)
    compile_record = {"calls_s": calls, "total_s": sum(calls), "graphs": step._cache_size()}
    record = harness.measure(run, batch_size, args.nsteps, args.repeats)
    return {**record, "compile": compile_record, "dtype": args.dtype}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_runner_args(parser)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="JAX platform")
    args = parser.parse_args()
    jax = configure_jax(args.dtype, args.device)
    import mujoco
    from mujoco import mjx

    mjm = harness.load_model(args.model, harness.solver_overrides(args))
    records = [
        {"backend": "mjx_jit", "batch_size": b, **harness.guarded(lambda: bench(jax, mjx, mjm, b, args))}
        for b in args.batch_sizes
    ]
    from importlib.metadata import version

    versions = {"jax": jax.__version__, "jaxlib": version("jaxlib"), "mujoco": mujoco.__version__,
                "mujoco_mjx": version("mujoco-mjx"), "xla_flags": os.environ["XLA_FLAGS"],
                "device": str(jax.devices()[0].device_kind)}
    harness.emit(records, versions, harness.solver_settings(mjm))


if __name__ == "__main__":
    main()
