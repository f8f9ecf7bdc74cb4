"""Anchor runner: mujoco_torch (MJX ported to PyTorch), in the venv ``setup_anchors.py mujoco_torch`` makes.

eager: ``torch.vmap(mujoco_torch.step, in_dims=(None, 0))``; B=1 calls
``mujoco_torch.step`` on unbatched Data. compiled: the same wrapped in
``torch.compile(..., fullgraph=True)``; its record gives the time of the
warm-up calls, which compile (``step_throughput.py`` gives the process an
empty TORCHINDUCTOR_CACHE_DIR).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mujoco
import torch

import mujoco_torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402

WARMUP_CALLS = 2


def initial_data(mjm: mujoco.MjModel, batch_size: int, dtype: torch.dtype):
    """Data of the batch's initial worlds; unbatched for B=1."""
    qvel = torch.as_tensor(harness.initial_qvel(mjm, batch_size), dtype=dtype)
    d = mujoco_torch.device_put(mujoco.MjData(mjm), dtype=dtype)
    if batch_size == 1:
        d.qvel = qvel[0]
        return d
    batched = d.expand(batch_size).clone()
    batched.qvel = qvel
    return batched


def bench(mjm: mujoco.MjModel, batch_size: int, compiled: bool, args: argparse.Namespace) -> dict:
    dtype = getattr(torch, args.dtype)
    mx = mujoco_torch.device_put(mjm, dtype=dtype)
    d0 = initial_data(mjm, batch_size, dtype)
    step = mujoco_torch.step if batch_size == 1 else torch.vmap(mujoco_torch.step, in_dims=(None, 0))
    record = {"dtype": args.dtype}
    if compiled:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        step = torch.compile(step, fullgraph=True)
        d, calls = d0, []
        for _ in range(WARMUP_CALLS):
            d, seconds = harness.timed(lambda: step(mx, d))
            calls.append(seconds)
        record["compile"] = {"calls_s": calls, "total_s": sum(calls),
                             "graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"])}

    def run() -> None:
        d = d0
        for _ in range(args.nsteps):
            d = step(mx, d)

    return {**record, **harness.measure(run, batch_size, args.nsteps, args.repeats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_runner_args(parser)
    parser.add_argument("--variants", nargs="+", choices=("eager", "compiled"), default=["eager", "compiled"])
    args = parser.parse_args()
    mjm = harness.load_model(args.model, harness.solver_overrides(args))
    records = [
        {"backend": f"mujoco_torch_{variant}", "batch_size": b,
         **harness.guarded(lambda: bench(mjm, b, variant == "compiled", args))}
        for variant in args.variants
        for b in args.batch_sizes
    ]
    from importlib.metadata import version

    versions = {"mujoco_torch": version("mujoco-torch"), "torch": torch.__version__,
                "mujoco": mujoco.__version__, "torch_threads": torch.get_num_threads()}
    harness.emit(records, versions, harness.solver_settings(mjm))


if __name__ == "__main__":
    main()
