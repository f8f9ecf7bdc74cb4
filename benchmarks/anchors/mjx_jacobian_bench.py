"""Anchor runner: MJX's transition Jacobians by ``jax.jacfwd`` of one step, on the CPU.

The batch is ``--batch`` copies of the state in ``--state`` (an .npz of qpos, qvel, act, ctrl,
qacc_warmstart written by ``gradients.py --parts jacobians``: the state diffmj and mjd_transitionFD
differentiate). ``jax.jit(jax.vmap(jax.jacfwd(f, argnums=(0, 1))))`` with f(x, ctrl) -> x_next,
x = (qpos, qvel, act): MJX has no tangent-space state, so for a model with quaternions the Jacobian
is (nq + nv + na) square rather than mjd_transitionFD's (2 nv + na), the same work up to that
size. Forward mode goes through MJX's solver ``while_loop`` (reverse mode does not). The first
call (compile) and the median of ``--repeats`` later calls are reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402
from mjx_bench import configure_jax  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--state", required=True, help=".npz of qpos, qvel, act, ctrl, qacc_warmstart")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    jax = configure_jax("float64")
    import jax.numpy as jnp
    from mujoco import mjx

    mjm = harness.load_model(args.model)
    mx = mjx.put_model(mjm, impl="jax")
    state = dict(np.load(args.state))
    nq, nv = mjm.nq, mjm.nv
    d0 = mjx.make_data(mx, impl="jax").replace(qacc_warmstart=jnp.asarray(state["qacc_warmstart"]))

    def f(x, ctrl):
        d = d0.replace(qpos=x[:nq], qvel=x[nq:nq + nv], act=x[nq + nv:], ctrl=ctrl)
        d = mjx.step(mx, d)
        return jnp.concatenate((d.qpos, d.qvel, d.act))

    x = jnp.concatenate([jnp.asarray(state[k]) for k in ("qpos", "qvel", "act")])
    xs = jnp.broadcast_to(x, (args.batch, *x.shape))
    ctrls = jnp.broadcast_to(jnp.asarray(state["ctrl"]), (args.batch, mjm.nu))
    jacobians = jax.jit(jax.vmap(jax.jacfwd(f, argnums=(0, 1))))
    start = time.perf_counter()
    jax.block_until_ready(jacobians(xs, ctrls))
    first = time.perf_counter() - start
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        A, B = jax.block_until_ready(jacobians(xs, ctrls))
        times.append(time.perf_counter() - start)
    record = {
        "batch": args.batch,
        "first_call_s": first,
        "seconds_median": statistics.median(times),
        "jacobians_per_s": args.batch / statistics.median(times),
        "shape_A": list(A.shape[1:]),
        "finite": bool(jnp.isfinite(A).all() and jnp.isfinite(B).all()),
    }
    harness.emit([record], {"jax": jax.__version__}, harness.solver_settings(mjm))


if __name__ == "__main__":
    main()
