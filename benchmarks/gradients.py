"""Gradient costs: one-step VJP vs forward, transition Jacobians vs mjd_transitionFD,
checkpointed rollout memory and time, compiled against eager rollouts (forward and gradient), a 1000-step
humanoid control gradient vs MJX, and the memory of full and lean (``observe=``) rollouts and of their
gradients, checkpointed or not.

Run from the repository root in diffmj's venv (MJX part needs
``python benchmarks/setup_anchors.py mjx``):

    python benchmarks/gradients.py                       # everything, writes benchmarks/results/gradients.json
    python benchmarks/gradients.py --parts vjp jacobians # a subset
    python benchmarks/gradients.py --parts memory --out benchmarks/results/memory.json

Every number is a median of repeats after a warm-up, on the models' own
solver settings unless stated. Speed is measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mujoco
import numpy as np
import torch
import torch.utils._pytree as pytree

import diffmj
from diffmj.rollout import compile_options

BENCH = Path(__file__).resolve().parent
MODELS = BENCH.parent / "models"
sys.path.insert(0, str(BENCH))
import harness  # noqa: E402


def _settled(mjm: mujoco.MjModel, steps: int = 400) -> mujoco.MjData:
    """A state with contacts: ``steps`` steps from qpos0 with small random controls (400: hopper 2 contacts,
    humanoid 5; after 100, the default before 2026-11-25, the hopper had none)."""
    rng = np.random.default_rng(0)
    mjd = mujoco.MjData(mjm)
    for _ in range(steps):
        mjd.ctrl[:] = 0.3 * rng.uniform(-1, 1, mjm.nu)
        mujoco.mj_step(mjm, mjd)
    return mjd


def _median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_vjp(name: str, repeats: int) -> dict:
    """Time of one step (recording the tape) and of its backward pass to (qpos, qvel, ctrl), eager, B=1."""
    mjm = mujoco.MjModel.from_xml_path(str(MODELS / f"{name}.xml"))
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, _settled(mjm))
    ctrl = d.ctrl.clone().requires_grad_(True)
    qvel = d.qvel.clone().requires_grad_(True)
    qpos = d.qpos.clone().requires_grad_(True)  # the full state: kinematics and collision are differentiated too

    def forward():
        return diffmj.step(m, d.replace(ctrl=ctrl, qpos=qpos, qvel=qvel))

    def forward_no_grad():
        with torch.no_grad():
            forward()

    out = forward()
    loss = (out.qvel**2).sum() + out.qpos.sum()

    def backward():
        torch.autograd.grad(loss, (ctrl, qpos, qvel), retain_graph=True)

    t_inference = _median_time(forward_no_grad, repeats)
    t_forward = _median_time(forward, repeats)
    t_backward = _median_time(backward, repeats)
    return {
        "model": name,
        "forward_no_grad_ms": 1e3 * t_inference,
        "forward_ms": 1e3 * t_forward,
        "backward_ms": 1e3 * t_backward,
        "backward_over_forward": t_backward / t_forward,
        "solver": {"iterations": mjm.opt.iterations, "ls_iterations": mjm.opt.ls_iterations},
    }


def bench_jacobians(name: str, batch: int, repeats: int, timeout: float) -> dict:
    """Transition Jacobians per second of a batch of ``batch`` copies of a settled state: diffmj eager and
    compiled (Inductor, ``torch.compile(transition_jacobians, fullgraph=True)``; first call apart),
    mjd_transitionFD (centred, 2 threads) and MJX's jacfwd (anchors/mjx_jacobian_bench.py)."""
    mjm = mujoco.MjModel.from_xml_path(str(MODELS / f"{name}.xml"))
    mjd = _settled(mjm)
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, mjd)
    datas = torch.stack([d] * batch)
    eager = diffmj.grad.transition_jacobians(m, datas)
    t_diffmj = _median_time(lambda: diffmj.grad.transition_jacobians(m, datas), repeats)
    compiled_fn = torch.compile(diffmj.grad.transition_jacobians, fullgraph=True)
    start = time.perf_counter()
    compiled = compiled_fn(m, datas)
    compile_s = time.perf_counter() - start
    t_compiled = _median_time(lambda: compiled_fn(m, datas), repeats)
    compiled_diff = max(float(((c - e).abs() / (1 + e.abs())).max()) for c, e in zip(compiled, eager) if e.numel())

    nx = 2 * mjm.nv + mjm.na
    per_thread = [mujoco.MjData(mjm) for _ in range(2)]
    for data in per_thread:
        mujoco.mj_copyData(data, mjm, mjd)

    def fd_block(data, count):
        A, B = np.zeros((nx, nx)), np.zeros((nx, mjm.nu))
        C, D = np.zeros((mjm.nsensordata, nx)), np.zeros((mjm.nsensordata, mjm.nu))
        for _ in range(count):
            mujoco.mjd_transitionFD(mjm, data, 1e-6, 1, A, B, C, D)

    pool = concurrent.futures.ThreadPoolExecutor(2)

    def fd_batch():
        list(pool.map(fd_block, per_thread, [batch // 2, batch - batch // 2]))

    t_fd = _median_time(fd_batch, repeats)
    pool.shutdown()
    return {
        "model": name,
        "batch": batch,
        "solver": {"iterations": mjm.opt.iterations, "ls_iterations": mjm.opt.ls_iterations},
        "diffmj_jacobians_per_s": batch / t_diffmj,
        "diffmj_compiled_jacobians_per_s": batch / t_compiled,
        "diffmj_compiled_first_call_s": compile_s,
        "diffmj_compiled_max_rel_diff_vs_eager": compiled_diff,
        "mujoco_fd_jacobians_per_s": batch / t_fd,
        "mujoco_fd_threads": 2,
        "mjx": _mjx_jacobians(mjm, mjd, name, batch, repeats, timeout),
        "note": "mjd_transitionFD (centered) releases the GIL, so 2 Python threads run in parallel",
    }


def _mjx_jacobians(mjm: mujoco.MjModel, mjd: mujoco.MjData, name: str, batch: int, repeats: int,
                   timeout: float) -> dict:
    """MJX's jacfwd Jacobians of the same state, in the MJX venv (anchors/mjx_jacobian_bench.py)."""
    env = harness.ANCHOR_ENVS["mjx"]
    if not env.python.exists():
        return {"error": "MJX venv missing: python benchmarks/setup_anchors.py mjx"}
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state.npz"
        np.savez(state, qpos=mjd.qpos, qvel=mjd.qvel, act=mjd.act, ctrl=mjd.ctrl, qacc_warmstart=mjd.qacc_warmstart)
        cmd = [str(env.python), str(BENCH / "anchors" / "mjx_jacobian_bench.py"), "--model", str(MODELS / f"{name}.xml"),
               "--state", str(state), "--batch", str(batch), "--repeats", str(repeats)]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timeout after {timeout} s"}
    try:
        return harness.parse_emitted(out.stdout)["records"][0]
    except ValueError:
        return {"error": (out.stderr or out.stdout)[-2000:]}


def bench_rollout(name: str, horizons: list[int], time_horizons: list[int]) -> list[dict]:
    """Bytes saved for backward and backward time of a rollout: checkpointed vs full tape."""
    mjm = mujoco.MjModel.from_xml_path(str(MODELS / f"{name}.xml"))
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, _settled(mjm))
    records = []
    for horizon in horizons:
        ctrl = (0.1 * torch.randn(horizon, m.nu, dtype=m.dtype, generator=torch.Generator().manual_seed(0)))
        record = {"model": name, "T": horizon}
        for label, checkpoint in (("checkpointed", "auto"), ("full_tape", None)):
            c = ctrl.clone().requires_grad_(True)
            holder = {}

            def run():
                holder["traj"] = diffmj.rollout(m, d, c, checkpoint=checkpoint)

            record[f"{label}_saved_MB"] = diffmj.grad.saved_tensor_bytes(run) / 2**20
            if horizon in time_horizons:
                loss = (holder["traj"].qpos[:, :3] ** 2).sum()
                start = time.perf_counter()
                loss.backward()
                record[f"{label}_backward_s"] = time.perf_counter() - start
            del holder
        if "checkpointed_backward_s" in record:
            record["backward_ratio"] = record["checkpointed_backward_s"] / record["full_tape_backward_s"]
        records.append(record)
        print(json.dumps(record), flush=True)
    return records


LEAN = ("qpos", "qvel", "act", "sensordata")  # what mujoco.rollout keeps: the state and the sensors


def _rollout_setup(name: str, horizon: int) -> tuple[diffmj.Model, diffmj.Data, torch.Tensor]:
    """The model, a settled state with contacts and small random controls [horizon, nu] (float64)."""
    mjm = mujoco.MjModel.from_xml_path(str(MODELS / f"{name}.xml"))
    m = diffmj.put_model(mjm)
    ctrl = 0.1 * torch.randn(horizon, m.nu, dtype=m.dtype, generator=torch.Generator().manual_seed(0))
    return m, diffmj.put_data(m, _settled(mjm)), ctrl


def _tree_bytes(tree) -> int:
    return sum(leaf.numel() * leaf.element_size() for leaf in pytree.tree_leaves(tree)
               if isinstance(leaf, torch.Tensor))


def _gradient_peak(name: str, horizon: int, checkpoint: str | None, lean: bool) -> dict:
    """In a fresh process (so that the peak is this gradient's): the growth of the peak resident memory
    (``ru_maxrss``) over forward and backward of a rollout's gradient w.r.t. its controls, and the bytes
    autograd saved for backward."""
    torch.set_num_threads(1)
    m, d, ctrl = _rollout_setup(name, horizon)
    diffmj.step(m, d)  # first-call allocations out of the measured peak
    ctrl.requires_grad_(True)
    holder = {}

    def run():
        holder["out"] = diffmj.rollout(m, d, ctrl, checkpoint=checkpoint, observe=LEAN if lean else None)

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    saved = diffmj.grad.saved_tensor_bytes(run)
    qpos = holder["out"]["qpos"] if lean else holder["out"].qpos
    (qpos[:, :3] ** 2).sum().backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"saved_MB": saved / 2**20, "peak_rss_growth_MB": (peak - before) / 2**10}


def bench_memory(name: str, horizon: int) -> dict:
    """Bytes per step and trajectory of a rollout's outputs, every Data field vs ``observe=LEAN``, and the
    memory of the gradient of a T-step rollout (full tape vs checkpointed, full vs lean outputs)."""
    m, d, ctrl = _rollout_setup(name, horizon)
    with torch.no_grad():
        full = _tree_bytes(diffmj.rollout(m, d, ctrl[:2])) // 2
        lean = _tree_bytes(diffmj.rollout(m, d, ctrl[:2], observe=LEAN)) // 2
    record = {"model": name, "T": horizon, "dtype": str(m.dtype), "full_data_bytes_per_step": full,
              "lean_bytes_per_step": lean, "lean_fields": list(LEAN), "gradient": {}}
    spawn = multiprocessing.get_context("spawn")  # a fresh process per peak
    for checkpoint in ("auto", None):
        for outputs in ("full", "lean"):
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
                peak = pool.submit(_gradient_peak, name, horizon, checkpoint, outputs == "lean").result()
            record["gradient"][f"{'checkpointed' if checkpoint else 'full_tape'}_{outputs}"] = peak
    print(json.dumps(record), flush=True)
    return record


def bench_compiled_rollout(name: str, horizons: list[int], repeats: int, backend: str) -> list[dict]:
    """Eager against compiled (``rollout(..., compile=)``: each step one graph) rollouts from a settled state:
    the forward pass without grad, and the gradient of a loss on qpos and qvel w.r.t. the controls
    (checkpointed, "auto"); medians of timed repeats after the first call, whose extra time is the compile."""
    mjm = mujoco.MjModel.from_xml_path(str(MODELS / f"{name}.xml"))
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, _settled(mjm))
    records = []
    for horizon in horizons:
        ctrl = 0.1 * torch.randn(horizon, m.nu, dtype=m.dtype, generator=torch.Generator().manual_seed(0))

        def forward(compile):
            with torch.no_grad():
                return diffmj.rollout(m, d, ctrl, observe=("qpos", "qvel"), compile=compile)["qpos"]

        def gradient(compile):
            c = ctrl.clone().requires_grad_(True)
            traj = diffmj.rollout(m, d, c, observe=("qpos", "qvel"), compile=compile)
            loss = (traj["qpos"][:, :3] ** 2).sum() + 1e-3 * (traj["qvel"] ** 2).sum()
            return torch.autograd.grad(loss, c)[0]

        record = {"model": name, "T": horizon, "backend": backend,
                  "solver": {"iterations": mjm.opt.iterations, "ls_iterations": mjm.opt.ls_iterations}}
        results = {}
        for label, compile in (("eager", False), ("compiled", {"backend": backend})):
            for part, fn in (("forward", forward), ("gradient", gradient)):
                times = []
                for _ in range(1 + repeats):
                    start = time.perf_counter()
                    results[label, part] = fn(compile)
                    times.append(time.perf_counter() - start)
                record[f"{label}_{part}_first_call_s"] = times[0]
                record[f"{label}_{part}_s"] = statistics.median(times[1:])
        for part in ("forward", "gradient"):
            record[f"{part}_speedup"] = record[f"eager_{part}_s"] / record[f"compiled_{part}_s"]
            ours, eager = results["compiled", part], results["eager", part]
            record[f"{part}_max_rel_diff"] = float(((ours - eager).abs() / (1 + eager.abs())).max())
        records.append(record)
        print(json.dumps(record), flush=True)
    return records


def bench_humanoid_gradient(horizon: int, backend: str) -> dict:
    """Gradient of a T-step humanoid loss w.r.t. the controls: diffmj eager and compiled (``rollout(...,
    compile=)``: one graph per step, its backward another), checkpointed; the compiled side's first call
    (compile included) and second call are timed apart, and its gradient compared with eager's. With
    inductor also: the same graphs on the full tape, and inductor's Python wrapper instead of rollout's
    default C++ one (its own compile)."""
    mjm = mujoco.MjModel.from_xml_path(str(MODELS / "humanoid.xml"))
    m = diffmj.put_model(mjm)
    d = diffmj.make_data(m)

    def gradient(compile, checkpoint="auto") -> tuple[torch.Tensor, float, float]:
        ctrl = torch.zeros(horizon, m.nu, dtype=m.dtype, requires_grad=True)
        start = time.perf_counter()
        traj = diffmj.rollout(m, d, ctrl, observe=("qpos", "qvel"), compile=compile, checkpoint=checkpoint)
        loss = traj["qpos"][-1, 2] + (traj["qvel"] ** 2).sum() * 1e-3
        forward_s = time.perf_counter() - start
        loss.backward()
        return ctrl.grad, forward_s, time.perf_counter() - start

    eager, forward_s, total_s = gradient(False)
    record = {"model": "humanoid", "T": horizon, "diffmj_forward_s": forward_s, "diffmj_total_s": total_s,
              "grad_finite": bool(torch.isfinite(eager).all()),
              "solver": {"iterations": mjm.opt.iterations, "ls_iterations": mjm.opt.ls_iterations}}

    def compiled_record(compile: dict, checkpoint="auto") -> dict:
        _, _, first_s = gradient(compile, checkpoint)
        grad, forward_s, total_s = gradient(compile, checkpoint)
        return {"backend": backend, "options": compile_options(compile), "checkpoint": checkpoint,
                "first_call_s": first_s, "forward_s": forward_s, "total_s": total_s,
                "grad_finite": bool(torch.isfinite(grad).all()),
                "max_rel_diff_vs_eager": float(((grad - eager).abs() / (1 + eager.abs())).max())}

    record["compiled"] = compiled_record({"backend": backend})
    if backend == "inductor":
        record["compiled_variants"] = [
            {"label": "full tape", **compiled_record({"backend": backend}, checkpoint=None)},
            {"label": "Python wrapper", **compiled_record({"backend": backend, "options": {"cpp_wrapper": False}})},
        ]
    return record


def bench_mjx_gradient(horizon: int, timeout: float) -> dict:
    """The same gradient with MJX's jax.grad, in the MJX venv (see anchors/mjx_grad_bench.py)."""
    env = harness.ANCHOR_ENVS["mjx"]
    if not env.python.exists():
        return {"error": "MJX venv missing: python benchmarks/setup_anchors.py mjx"}
    cmd = [str(env.python), str(BENCH / "anchors" / "mjx_grad_bench.py"), "--model", str(MODELS / "humanoid.xml"),
           "--horizon", str(horizon)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout} s"}
    try:
        return harness.parse_emitted(out.stdout)
    except ValueError:
        return {"error": (out.stderr or out.stdout)[-2000:]}


def markdown(results: dict) -> str:
    """The README tables of a result."""
    lines = []
    if "vjp" in results:
        lines += ["| model | solver iterations | forward (no tape) ms | forward (tape) ms | backward ms | backward / forward |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['solver']['iterations']} | {r['forward_no_grad_ms']:.1f} | {r['forward_ms']:.1f} "
                  f"| {r['backward_ms']:.1f} | {r['backward_over_forward']:.2f} |" for r in results["vjp"]]
        lines.append("")
    if "jacobians" in results:
        lines += ["| model | batch | diffmj eager /s | diffmj compiled /s (first call s) | `mjd_transitionFD` "
                  "(2 threads) /s | MJX `jacfwd` /s (first call s) |", "|---|---|---|---|---|---|"]
        for r in results["jacobians"]:
            compiled = (f"{r['diffmj_compiled_jacobians_per_s']:.0f} ({r['diffmj_compiled_first_call_s']:.0f})"
                        if "diffmj_compiled_jacobians_per_s" in r else "-")
            mjx = r.get("mjx", {"error": "not run"})
            mjx = (f"{mjx['jacobians_per_s']:.0f} ({mjx['first_call_s']:.0f})" if "jacobians_per_s" in mjx
                   else mjx["error"].splitlines()[-1][:60])
            lines.append(f"| {r['model']} | {r['batch']} | {r['diffmj_jacobians_per_s']:.0f} | {compiled} "
                         f"| {r['mujoco_fd_jacobians_per_s']:.0f} | {mjx} |")
        lines.append("")
    if "rollout" in results:
        lines += ["| T | checkpointed saved MB | full tape saved MB | checkpointed backward s | full tape backward s | ratio |",
                  "|---|---|---|---|---|---|"]
        for r in results["rollout"]:
            times = [f"{r[k]:.1f}" if k in r else "-" for k in ("checkpointed_backward_s", "full_tape_backward_s")]
            ratio = f"{r['backward_ratio']:.2f}" if "backward_ratio" in r else "-"
            lines.append(f"| {r['T']} | {r['checkpointed_saved_MB']:.1f} | {r['full_tape_saved_MB']:.1f} "
                         f"| {times[0]} | {times[1]} | {ratio} |")
        lines.append("")
    if "memory" in results:
        runs = ("full_tape_full", "full_tape_lean", "checkpointed_full", "checkpointed_lean")
        lines += ["| model | bytes / step, every Data field | bytes / step, qpos qvel act sensordata | T | "
                  + " | ".join(run.replace("_", " ") for run in runs) + " |", "|---|---|---|---|---|---|---|---|"]
        for r in results["memory"]:
            cells = [f"{g['saved_MB']:.1f} ({g['peak_rss_growth_MB']:.0f})" for g in (r["gradient"][k] for k in runs)]
            lines.append(f"| {r['model']} | {r['full_data_bytes_per_step']:,} | {r['lean_bytes_per_step']:,} "
                         f"| {r['T']} | {' | '.join(cells)} |")
    if "compiled_rollout" in results:
        lines += ["| model | T | backend | forward eager s | forward compiled s | gradient eager s | gradient compiled s "
                  "| compile s (forward, gradient) | max rel. diff. of the gradient |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in results["compiled_rollout"]:
            # the first call's extra time; under a second the graphs came from an earlier horizon's compile
            compile_s = [r[f"compiled_{part}_first_call_s"] - r[f"compiled_{part}_s"] for part in ("forward", "gradient")]
            compile_s = ["cached" if s < 1 else f"{s:.0f}" for s in compile_s]
            lines.append(f"| {r['model']} | {r['T']} | {r['backend']} | {r['eager_forward_s']:.2f} "
                         f"| {r['compiled_forward_s']:.2f} | {r['eager_gradient_s']:.2f} | {r['compiled_gradient_s']:.2f} "
                         f"| {compile_s[0]}, {compile_s[1]} | {r['gradient_max_rel_diff']:.1e} |")
        lines.append("")
    if "humanoid_gradient" in results:
        ours, mjx = results["humanoid_gradient"]["diffmj"], results["humanoid_gradient"]["mjx"]
        lines += ["| side | first call s (incl. compile) | gradient s | finite |", "|---|---|---|---|",
                  f"| diffmj eager, checkpointed | - | {ours['diffmj_total_s']:.1f} | {ours['grad_finite']} |"]
        if "compiled" in ours:
            c = ours["compiled"]
            lines.append(f"| diffmj `rollout(compile=)`, checkpointed ({c['backend']}; max rel. diff. vs eager "
                         f"{c['max_rel_diff_vs_eager']:.0e}) | {c['first_call_s']:.1f} | {c['total_s']:.2f} | "
                         f"{c['grad_finite']} |")
        for c in ours.get("compiled_variants", []):
            lines.append(f"| diffmj `rollout(compile=)`, {c['label']} ({c['backend']}; max rel. diff. vs eager "
                         f"{c['max_rel_diff_vs_eager']:.0e}) | {c['first_call_s']:.1f} | {c['total_s']:.2f} | "
                         f"{c['grad_finite']} |")
        if "records" in mjx:
            r = mjx["records"][0]
            lines.append(f"| MJX `jax.jit(jax.grad)` | {r['first_call_s']:.1f} | {r['timed_call_s']:.2f} | {r['grad_finite']} |")
        else:
            lines.append(f"| MJX | {mjx.get('error')} | | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["vjp", "jacobians", "rollout", "compiled", "humanoid"],
                        choices=["vjp", "jacobians", "rollout", "compiled", "humanoid", "memory"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads for diffmj")
    parser.add_argument("--horizons", type=int, nargs="+", default=[100, 400, 1600])
    parser.add_argument("--time-horizons", type=int, nargs="+", default=[100, 400])
    parser.add_argument("--grad-horizon", type=int, default=1000)
    parser.add_argument("--jacobian-models", nargs="+", default=["humanoid", "hopper"])
    parser.add_argument("--memory-horizon", type=int, default=100, help="T of the memory part's gradients")
    parser.add_argument("--compiled-model", default="hopper")
    parser.add_argument("--compiled-horizons", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--compiled-backend", default="inductor")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--out", default=str(BENCH / "results" / "gradients.json"))
    parser.add_argument("--table", metavar="JSON", help="only print the tables of an earlier result")
    args = parser.parse_args()
    if args.table:
        print(markdown(json.loads(Path(args.table).read_text())))
        return
    torch.set_num_threads(args.threads)

    results: dict = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": __import__("os").cpu_count(),
                    "torch": torch.__version__, "mujoco": mujoco.__version__, "torch_threads": args.threads,
                    "date": time.strftime("%Y-%m-%d %H:%M")},
    }
    if "vjp" in args.parts:
        results["vjp"] = [bench_vjp(n, args.repeats) for n in ("humanoid", "hopper")]
        print(json.dumps(results["vjp"], indent=1), flush=True)
    if "jacobians" in args.parts:
        results["jacobians"] = [bench_jacobians(n, 32, args.repeats, args.timeout) for n in args.jacobian_models]
        print(json.dumps(results["jacobians"], indent=1), flush=True)
    if "rollout" in args.parts:
        results["rollout"] = bench_rollout("humanoid", args.horizons, args.time_horizons)
    if "compiled" in args.parts:
        results["compiled_rollout"] = bench_compiled_rollout(args.compiled_model, args.compiled_horizons,
                                                             args.repeats, args.compiled_backend)
    if "humanoid" in args.parts:
        results["humanoid_gradient"] = {
            "diffmj": bench_humanoid_gradient(args.grad_horizon, args.compiled_backend),
            "mjx": bench_mjx_gradient(args.grad_horizon, args.timeout),
        }
        print(json.dumps(results["humanoid_gradient"], indent=1), flush=True)
    if "memory" in args.parts:
        results["memory"] = [bench_memory(n, args.memory_horizon) for n in ("ant", "humanoid")]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(markdown(results))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
