"""rollout(compile=...) and rollout_policy(compile=...): each step one compiled graph, the loop over time in
Python; values and gradients (w.r.t. controls, a model parameter, the initial state, a policy's weights)
equal eager's, checkpointed or not, batched or not; the graphs compiled do not grow with the horizon.

The default tests compile with aot_eager (the graphs inductor would get, run by ATen: eager's bits, to
TOL["batch"]) on a small contact model; inductor's are slow."""

from __future__ import annotations

import types

import mujoco
import pytest
import torch
import torch.utils._pytree as pytree
from torch._dynamo.testing import CompileCounterWithBackend

import diffmj
from tests.conftest import BENCHMARK_MODELS, TOL, assert_close


@pytest.fixture(scope="module")
def counter():
    """The module's aot_eager backend: its tests share Dynamo's cache (the backend is part of a graph's key)."""
    torch._dynamo.reset()
    return CompileCounterWithBackend("aot_eager")


def _controls(m, horizon, batch=()):
    gen = torch.Generator().manual_seed(0)
    return 0.4 * torch.rand(*batch, horizon, m.nu, generator=gen, dtype=m.dtype) - 0.2


def _trajectory(m, d, ctrl, **kwargs):
    """A rollout whose ctrl, body_mass and initial qvel require grad, and those three."""
    wrt = {"ctrl": ctrl, "body_mass": m.body_mass, "qvel": d.qvel}
    wrt = {name: value.clone().requires_grad_(True) for name, value in wrt.items()}
    traj = diffmj.rollout(m.replace(body_mass=wrt["body_mass"]), d.replace(qvel=wrt["qvel"]), wrt["ctrl"], **kwargs)
    return traj, wrt


def _run(m, d, ctrl, **kwargs):
    """The trajectory of a rollout and the gradient of a loss on it w.r.t. ctrl, body_mass and the initial qvel."""
    traj, wrt = _trajectory(m, d, ctrl, **kwargs)
    loss = (traj.qpos**2).sum() + traj.qvel[..., -1, :].sum() + traj.efc_force.sum()
    return traj, dict(zip(wrt, torch.autograd.grad(loss, list(wrt.values()))))


def _assert_trajectories_equal(name, actual, expected, tol):
    """Every field of two trajectories (Data), named by its path; equal infinities (empty contact slots) match."""
    paths, leaves = zip(*pytree.tree_flatten_with_path(expected)[0])
    for path, got, want in zip(paths, pytree.tree_leaves(actual), leaves):
        if want.is_floating_point():
            same_inf = torch.isinf(want) & (got == want)
            got, want = got.masked_fill(same_inf, 0.0), want.masked_fill(same_inf, 0.0)
        assert_close(f"{name} {pytree.keystr(path)}", got, want, tol, empty_ok=True)


def _compare(m, d, ctrl, backend, tol, largest=False, **kwargs):
    """Compiled (backend) against eager; largest: gradients relative to their largest entry (assert_close)."""
    traj, grads = _run(m, d, ctrl, compile={"backend": backend}, **kwargs)
    eager_traj, eager_grads = _run(m, d, ctrl, **kwargs)
    _assert_trajectories_equal(f"{kwargs}", traj, eager_traj, tol)
    for name, grad in eager_grads.items():
        assert_close(f"d loss / d {name} ({kwargs})", grads[name], grad, tol, largest=largest)


@pytest.mark.slow
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
def test_compiled_rollout_equals_eager(arm_on_box, counter, batched):
    """Values and gradients through contacts equal eager's, with the full tape and checkpointed; a longer
    rollout and one without grad run the graphs the first ones compiled (no recompiles over time steps)."""
    m, d = arm_on_box
    ctrl = _controls(m, 6)
    if batched:  # two initial states, two control sequences: the compiled step is one vmap over both
        d = torch.stack([d, diffmj.step(m, d)])
        ctrl = torch.stack([ctrl, -ctrl])
    before = counter.frame_count
    for checkpoint in (None, 2):
        _compare(m, d, ctrl, counter, TOL["batch"], checkpoint=checkpoint)
    compiled = counter.frame_count
    # two graphs, with grad and without (checkpointed segments' forward pass), fewer if an earlier test compiled them
    assert compiled - before <= 2, f"{compiled - before} frames compiled for two rollouts of 6 steps"
    longer = torch.cat([ctrl, ctrl], -2)
    _compare(m, d, longer, counter, TOL["batch"], checkpoint=3)
    with torch.no_grad():
        diffmj.rollout(m.replace(body_mass=m.body_mass.clone().requires_grad_(True)), d, longer,
                       compile={"backend": counter})
    assert counter.frame_count == compiled, f"{counter.frame_count - compiled} recompiles after the first rollouts"


def _linear_policy(params, x):
    return torch.tanh(params["K"] @ x + params["b"])


@pytest.mark.slow
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
def test_compiled_policy_rollout_equals_eager(arm_on_box, counter, batched):
    """rollout_policy: the policy runs inside each compiled step; values and gradients w.r.t. its weights, a
    model parameter and the initial state equal eager's, checkpointed; for a batch of initial states too."""
    m, d = arm_on_box
    if batched:
        d = torch.stack([d, diffmj.step(m, d)])
    gen = torch.Generator().manual_seed(1)
    ns = m.nq + m.nv + m.na
    params = {"K": 0.1 * torch.randn(m.nu, ns, generator=gen, dtype=m.dtype),
              "b": 0.1 * torch.randn(m.nu, generator=gen, dtype=m.dtype)}

    def run(compile):
        wrt = {"params": params, "body_mass": m.body_mass, "qvel": d.qvel}
        wrt = pytree.tree_map(lambda t: t.clone().requires_grad_(True), wrt)
        traj = diffmj.rollout_policy(m.replace(body_mass=wrt["body_mass"]), d.replace(qvel=wrt["qvel"]),
                                     _linear_policy, wrt["params"], 6, observe=("qpos", "ctrl"), compile=compile)
        loss = (traj["qpos"] ** 2).sum() + traj["ctrl"].sum()
        leaves, spec = pytree.tree_flatten(wrt)
        return traj, pytree.tree_unflatten(list(torch.autograd.grad(loss, leaves)), spec)

    (traj, grads), (eager_traj, eager_grads) = run({"backend": counter}), run(False)
    for name in ("qpos", "ctrl"):
        assert_close(name, traj[name], eager_traj[name], TOL["batch"])
    for (path, want), got in zip(pytree.tree_flatten_with_path(eager_grads)[0], pytree.tree_leaves(grads)):
        assert_close(f"d loss / d {pytree.keystr(path)}", got, want, TOL["batch"])


def test_compiled_rollout_checkpoint_memory_grows_like_sqrt_horizon(arm_on_box, counter):
    """Compiled, a checkpointed rollout still saves O(sqrt(T)) for backward (4x the horizon: ~2x the bytes).
    Two graphs (a step with grad, and without for the checkpointed segments' first pass), each traced once:
    0-dim float64 inputs (opt.timestep, time) would make Dynamo trace the first twice (workarounds.ScalarInputs)."""
    m, d = arm_on_box
    before = counter.frame_count
    saved = {}
    for horizon in (16, 64):
        for checkpoint in ("auto", None):
            saved[horizon, checkpoint] = diffmj.grad.saved_tensor_bytes(
                lambda: _trajectory(m, d, _controls(m, horizon), checkpoint=checkpoint, compile={"backend": counter}))
    assert saved[64, None] / saved[16, None] > 3.5
    assert saved[64, "auto"] / saved[16, "auto"] < 2.5
    assert saved[64, "auto"] < saved[64, None] / 4
    assert counter.frame_count - before <= 2  # fewer where an earlier test compiled them


def test_library_guard_filter_skips_only_library_globals():
    """Guards on diffmj's, torch's and tensordict's globals and on builtins are skipped; those on arguments,
    closures, any other module's globals, and globals Dynamo names in another form are kept."""
    skipped = ["G['__import_diffmj_dot_math'].MINVAL", "dict(G['__import_diffmj_dot_solver'].Line.__dict__)",
               "G['__import_torch_dot_utils_dot__pytree'].SUPPORTED_NODES", "G['__import_tensordict_dot_base'].x",
               "G['__builtins_dict___0']['len']", "G['pytree'].tree_map"]
    kept = ["G['__import___main__'].GAIN", "G['__import_tests_dot_test_x'].GAIN", "G['__import_diffmjx'].GAIN",
            "G['___unnamed_scope_1407_c0']", "G['_1406_c0'].Tensor", "G['_private'].x"]
    entries = [types.SimpleNamespace(name=name, is_global=True) for name in skipped + kept]
    entries.append(types.SimpleNamespace(name="G['__import_diffmj_dot_math'].MINVAL", is_global=False))
    keep = diffmj.library_guard_filter(diffmj.rollout)(entries)
    assert keep == [False] * len(skipped) + [True] * (len(kept) + 1)
    # a bare name is a global of the compiled function's own module: skipped only for a library's function
    assert diffmj.library_guard_filter(_global_gain_policy)(entries[5:6]) == [True]


PENDULUM = """<mujoco><worldbody><body><joint name="hinge" axis="0 1 0"/>
<geom type="capsule" fromto="0 0 0 0 0 -1" size="0.05"/></body></worldbody>
<actuator><motor joint="hinge"/></actuator></mujoco>"""

GAIN = 1.0  # _global_gain_policy's: a user's global, which compiled steps must still guard


def _global_gain_policy(params, x):
    return GAIN * torch.tanh(params @ x)


def test_compiled_policy_recompiles_when_a_user_global_changes():
    """A compiled rollout skips the guards on library globals (diffmj.library_guard_filter), not those on
    the user's: a policy reading a module global gain is compiled again when the gain changes, equal to eager."""
    global GAIN
    m = diffmj.put_model(mujoco.MjModel.from_xml_string(PENDULUM))
    d = diffmj.make_data(m).replace(qpos=torch.tensor([0.5], dtype=m.dtype))
    params = torch.tensor([[1.0, 0.5]], dtype=m.dtype)
    counter = CompileCounterWithBackend("eager")
    qpos = {}
    for GAIN in (1.0, -3.0):
        compiled = diffmj.rollout_policy(m, d, _global_gain_policy, params, 5, observe=("qpos",),
                                         compile={"backend": counter})
        eager = diffmj.rollout_policy(m, d, _global_gain_policy, params, 5, observe=("qpos",))
        assert_close(f"qpos at gain {GAIN}", compiled["qpos"], eager["qpos"], TOL["batch"])
        qpos[GAIN] = compiled["qpos"]
    assert counter.frame_count == 2
    assert not torch.equal(qpos[1.0], qpos[-3.0])


def test_compile_argument_errors(arm_on_box):
    m, d = arm_on_box
    ctrl = _controls(m, 3)
    with pytest.raises(ValueError, match="compile must be"):
        diffmj.rollout(m, d, ctrl, compile="inductor")
    with pytest.raises(ValueError, match="torch.func transforms"):  # PyTorch cannot call a compiled function there
        torch.func.grad(lambda c: diffmj.rollout(m, d, c, compile=True).qpos.sum())(ctrl)


@pytest.mark.slow
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
def test_inductor_rollout_equals_eager(arm_on_box, batched):
    """inductor's kernels (rollout's default options), checkpointed: values and gradients equal eager's to
    TOL["compiled"]. With kernel fusion (torch 2.13's default max_fusion_size) the batched gradients w.r.t.
    body_mass and qvel were up to 62 % off (benchmarks/README.md, "Inductor miscompiles gradients of the
    batched rollout")."""
    m, d = arm_on_box
    ctrl = _controls(m, 6)
    if batched:
        d, ctrl = torch.stack([d, diffmj.step(m, d)]), torch.stack([ctrl, -ctrl])
    torch._dynamo.reset()
    # inductor rounds otherwise: d loss / d qvel[0] (0.13) sums terms of ~1e3 (the gradient's largest entry
    # 1.9e3), and eager's own value moves by up to 7.5e-13 when qvel changes by 1e-15 relative
    _compare(m, d, ctrl, "inductor", TOL["compiled"], largest=True, checkpoint=2)


@pytest.mark.slow
def test_inductor_humanoid_gradient_equals_eager():
    """Two compiled steps of the humanoid from its state after 347 steps from qpos0 (zero controls): values
    and gradients equal eager's. With inductor's C++ wrapper (rollout's default until 2026-12-04) the
    gradients at this state are 1.1e-3 (relative) off: one step alone is exact (benchmarks/README.md,
    "Inductor miscompiles gradients of the batched rollout")."""
    m = diffmj.put_model(mujoco.MjModel.from_xml_path(str(BENCHMARK_MODELS / "humanoid.xml")))
    with torch.no_grad():
        d = diffmj.rollout(m, diffmj.make_data(m), torch.zeros(347, m.nu, dtype=m.dtype))[-1]
    torch._dynamo.reset()
    _compare(m, d, torch.zeros(2, m.nu, dtype=m.dtype), "inductor", TOL["compiled"], largest=True, checkpoint=None)
