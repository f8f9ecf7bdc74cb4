"""Anchor runner: MJX's jax.grad of a T-step rollout loss w.r.t. the controls, on the CPU.

MJX reverse-differentiates its constraint solver only with ``opt.iterations = 1``
(its multi-iteration solve is a ``jax.lax.while_loop``); the humanoid model
already uses iterations=1, ls_iterations=4, which both sides run. The rollout
is a ``jax.lax.scan`` under ``jax.jit``; the first call (compile) and the
second (timed) are reported separately.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402
from mjx_bench import configure_jax  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--horizon", type=int, default=1000)
    args = parser.parse_args()
    jax = configure_jax("float64")
    import jax.numpy as jnp
    from mujoco import mjx

    mjm = harness.load_model(args.model)
    mx = mjx.put_model(mjm, impl="jax")
    d0 = mjx.make_data(mx, impl="jax")

    def loss(ctrl):
        def body(d, u):
            d = mjx.step(mx, d.replace(ctrl=u))
            return d, (d.qpos, d.qvel)

        _, (qpos, qvel) = jax.lax.scan(body, d0, ctrl)
        return qpos[-1, 2] + 1e-3 * jnp.sum(qvel**2)

    grad = jax.jit(jax.grad(loss))
    ctrl = jnp.zeros((args.horizon, mjm.nu))
    start = time.perf_counter()
    g = jax.block_until_ready(grad(ctrl))
    first = time.perf_counter() - start
    start = time.perf_counter()
    g = jax.block_until_ready(grad(ctrl + 0.0))
    second = time.perf_counter() - start
    record = {
        "T": args.horizon,
        "first_call_s": first,
        "timed_call_s": second,
        "grad_finite": bool(jnp.isfinite(g).all()),
        "settings": harness.solver_settings(mjm),
        "note": "MJX needs iterations=1 to reverse-differentiate its solver",
    }
    harness.emit([record], {"jax": jax.__version__}, harness.solver_settings(mjm))


if __name__ == "__main__":
    main()
