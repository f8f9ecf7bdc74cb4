"""rollout(): trajectories, checkpointed gradients equal to the full tape, batching, memory, finiteness."""

from __future__ import annotations

import mujoco
import pytest
import torch

import diffmj
from tests.conftest import BENCHMARK_MODELS, TOL, assert_close, mj_model, settled_state

INTEGRATORS = {"euler": 0, "rk4": 1, "implicitfast": 3}


def _setup(name: str, steps: int = 60, integrator: str | None = None, dtype=torch.float64):
    path = BENCHMARK_MODELS / f"{name}.xml"
    mjm = mujoco.MjModel.from_xml_path(str(path)) if path.exists() else mj_model(name)
    mjm.opt.iterations = min(mjm.opt.iterations, 20)
    if integrator:
        mjm.opt.integrator = INTEGRATORS[integrator]
    m = diffmj.put_model(mjm, dtype=dtype)
    return m, diffmj.put_data(m, settled_state(mjm, steps))


def _controls(m, horizon, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return 0.4 * torch.rand(horizon, m.nu, generator=gen, dtype=m.dtype) - 0.2


def test_rollout_equals_stepping():
    m, d = _setup("hopper")
    ctrl = _controls(m, 7)
    traj = diffmj.rollout(m, d, ctrl)
    assert traj.batch_size == torch.Size([7])
    state = d
    for t in range(7):
        state = diffmj.step(m, state.replace(ctrl=ctrl[t]))
        for name in ("qpos", "qvel", "qacc", "xpos", "efc_force", "time"):
            assert_close(f"{name}[{t}]", getattr(traj[t], name), getattr(state, name), 0.0)


def _gradients(m, d, ctrl, checkpoint):
    params = {
        "ctrl": ctrl,
        "qpos": d.qpos,
        "qvel": d.qvel,
        "body_mass": m.body_mass,
        "geom_friction": m.geom_friction,
    }
    params = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    model = m.replace(body_mass=params["body_mass"], geom_friction=params["geom_friction"])
    traj = diffmj.rollout(model, d.replace(qpos=params["qpos"], qvel=params["qvel"]), params["ctrl"], checkpoint=checkpoint)
    loss = (traj.qpos[:, :3] ** 2).sum() + traj.qvel[-1].sum() + traj.xpos[:, -1, 2].sum()
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True, materialize_grads=True)
    return dict(zip(params, grads))


@pytest.mark.parametrize(
    "name, integrator, horizon",
    [("hopper", "euler", 12), ("hopper", "rk4", 8), ("hopper", "implicitfast", 12), ("contacts", "euler", 6)],
)
def test_checkpointed_gradient_equals_full_tape(name, integrator, horizon):
    m, d = _setup(name, integrator=integrator)
    ctrl = _controls(m, horizon)
    full = _gradients(m, d, ctrl, None)
    for checkpoint in ("auto", 4):
        ours = _gradients(m, d, ctrl, checkpoint)
        for key in full:
            # contacts.xml has no actuators: its ctrl gradient is empty
            assert_close(f"{key} (checkpoint={checkpoint})", ours[key], full[key], TOL["batch"], empty_ok=True)


def test_rollout_composes_with_func_transforms():
    m, d = _setup("hopper")
    ctrl = _controls(m, 9)

    def loss(ctrl, checkpoint):
        return (diffmj.rollout(m, d, ctrl, checkpoint=checkpoint).qpos[:, 1] ** 2).sum()

    full = torch.func.grad(loss)(ctrl, None)
    assert_close("func.grad", torch.func.grad(loss)(ctrl, "auto"), full, TOL["batch"])
    _, vjp = torch.func.vjp(lambda c: loss(c, 3), ctrl)
    assert_close("func.vjp", vjp(torch.ones((), dtype=m.dtype))[0], full, TOL["batch"])
    batched = torch.vmap(torch.func.grad(loss), in_dims=(0, None))(torch.stack([ctrl, -ctrl]), "auto")
    assert_close("vmap(grad)", batched[0], full, TOL["batch"])
    assert_close("vmap(grad)", batched[1], torch.func.grad(loss)(-ctrl, None), TOL["batch"])


def test_batched_rollout():
    m, d = _setup("hopper")
    ctrl = _controls(m, 5)
    datas = torch.stack([d, diffmj.step(m, d)])
    traj = diffmj.rollout(m, datas, torch.stack([ctrl, 2 * ctrl]))
    assert traj.batch_size == torch.Size([2, 5])
    assert_close("batch element", traj[1].qpos, diffmj.rollout(m, datas[1], 2 * ctrl).qpos, TOL["batch"])
    shared = diffmj.rollout(m, datas, ctrl)  # one control sequence for both states
    assert_close("broadcast ctrl", shared[0].qvel, diffmj.rollout(m, d, ctrl).qvel, TOL["batch"])

    def final_height(mass):
        return diffmj.rollout(m.replace(body_mass=mass), d, ctrl).qpos[-1, 1]

    masses = m.body_mass * torch.tensor([[0.9], [1.1]], dtype=m.dtype)
    heights = torch.vmap(final_height)(masses)
    assert_close("vmap over model parameters", heights[1], final_height(masses[1]), TOL["batch"])


def test_observed_rollout_equals_the_full_trajectory():
    """observe= keeps only some fields (by name, or a function of each step's Data), batched or not; values
    and gradients (full tape and checkpointed) equal those taken from the full trajectory."""
    m, d = _setup("hopper")
    ctrl = _controls(m, 10)
    datas = torch.stack([d, diffmj.step(m, d)])
    full = diffmj.rollout(m, datas, ctrl)
    kept = diffmj.rollout(m, datas, ctrl, observe=("qpos", "xpos"))
    assert set(kept) == {"qpos", "xpos"} and kept["qpos"].shape == (2, 10, m.nq)
    assert_close("qpos", kept["qpos"], full.qpos, 0.0)
    assert_close("xpos", kept["xpos"], full.xpos, 0.0)
    state = diffmj.rollout(m, d, ctrl, observe=lambda m, d: diffmj.get_state(m, d, diffmj.State.PHYSICS))
    assert_close("get_state", state, diffmj.get_state(m, full[0], diffmj.State.PHYSICS), 0.0)

    def height_loss(observe, checkpoint):
        def loss(ctrl, mass):
            traj = diffmj.rollout(m.replace(body_mass=mass), d, ctrl, checkpoint=checkpoint, observe=observe)
            qpos, qvel = (traj.qpos, traj.qvel) if observe is None else (traj["qpos"], traj["qvel"])
            return (qpos[:, 1] ** 2).sum() + qvel[-1].sum()
        return torch.func.grad(loss, argnums=(0, 1))(ctrl, m.body_mass)

    expected = height_loss(None, None)
    for checkpoint in (None, 3, "auto"):
        for key, got, want in zip(("ctrl", "body_mass"), height_loss(("qpos", "qvel"), checkpoint), expected):
            assert_close(f"{key} gradient (checkpoint={checkpoint})", got, want, TOL["batch"])


def test_observed_rollout_keeps_only_what_it_observes():
    m, d = _setup("hopper")
    ctrl = _controls(m, 16)
    full = diffmj.rollout(m, d, ctrl)
    kept = diffmj.rollout(m, d, ctrl, observe=("qpos", "qvel", "act", "sensordata"))

    def nbytes(tree):
        return sum(t.numel() * t.element_size() for t in torch.utils._pytree.tree_leaves(tree))

    assert nbytes(kept) == 16 * 8 * (m.nq + m.nv + m.na + m.nsensordata)
    assert nbytes(full) > 20 * nbytes(kept)
    with pytest.raises(ValueError, match="does not have"):
        diffmj.rollout(m, d, ctrl, observe=("qpos", "qfoo"))
    with pytest.raises(ValueError, match="sequence of Data field names"):
        diffmj.rollout(m, d, ctrl, observe="qpos")


def _linear_policy(params, x):
    return torch.tanh(params["K"] @ x + params["b"])


def test_policy_rollout_equals_stepping_and_its_gradients_the_full_tape():
    """rollout_policy: ctrl_t = policy(params, state before step t); values equal a hand-written loop; the
    gradient w.r.t. the policy's weights, the model and the initial state is the same checkpointed or not,
    by .backward() on an nn.Module's parameters and by torch.func.grad; a batch of states equals each alone."""
    m, d = _setup("hopper")
    gen = torch.Generator().manual_seed(1)
    ns = m.nq + m.nv + m.na
    params = {"K": 0.1 * torch.randn(m.nu, ns, generator=gen, dtype=m.dtype),
              "b": 0.1 * torch.randn(m.nu, generator=gen, dtype=m.dtype)}
    traj = diffmj.rollout_policy(m, d, _linear_policy, params, 9)
    state = d
    for t in range(9):
        ctrl = _linear_policy(params, diffmj.get_state(m, state, diffmj.State.PHYSICS))
        state = diffmj.step(m, state.replace(ctrl=ctrl))
        assert_close(f"qpos[{t}]", traj.qpos[t], state.qpos, 0.0)
        assert_close(f"ctrl[{t}]", traj.ctrl[t], ctrl, 0.0)

    def loss(params, mass, qvel, checkpoint):
        out = diffmj.rollout_policy(m.replace(body_mass=mass), d.replace(qvel=qvel), _linear_policy, params, 9,
                                    checkpoint=checkpoint, observe=("qpos",))
        return (out["qpos"][:, 1] ** 2).sum() + out["qpos"][-1, 0]

    args = (params, m.body_mass, d.qvel)
    full = torch.func.grad(loss, argnums=(0, 1, 2))(*args, None)
    for checkpoint in (2, "auto"):
        ours = torch.func.grad(loss, argnums=(0, 1, 2))(*args, checkpoint)
        for name, got, want in zip(("K", "b", "body_mass", "qvel"), (*ours[0].values(), *ours[1:]),
                                   (*full[0].values(), *full[1:])):
            assert_close(f"{name} (checkpoint={checkpoint})", got, want, TOL["batch"])
    net = torch.nn.Linear(ns, m.nu, dtype=m.dtype)
    with torch.no_grad():
        net.weight.copy_(params["K"])
        net.bias.copy_(params["b"])
    out = diffmj.rollout_policy(m, d, lambda p, x: torch.tanh(torch.func.functional_call(net, p, (x,))),
                                dict(net.named_parameters()), 9)
    ((out.qpos[:, 1] ** 2).sum() + out.qpos[-1, 0]).backward()
    assert_close("nn.Linear weight .grad", net.weight.grad, full[0]["K"], TOL["batch"])
    assert_close("nn.Linear bias .grad", net.bias.grad, full[0]["b"], TOL["batch"])
    datas = torch.stack([d, diffmj.step(m, d)])
    batched = diffmj.rollout_policy(m, datas, _linear_policy, params, 5)
    assert batched.batch_size == torch.Size([2, 5])
    assert_close("batch element", batched.qvel[1], diffmj.rollout_policy(m, datas[1], _linear_policy, params, 5).qvel,
                 TOL["batch"])
    with pytest.raises(ValueError, match="pytree of tensors"):
        diffmj.rollout_policy(m, d, _linear_policy, {"K": 1.0}, 3)
    with pytest.raises(ValueError, match="policy must return"):
        diffmj.rollout_policy(m, d, lambda p, x: x, params, 3)


def test_checkpoint_memory_grows_like_sqrt_horizon():
    m, d = _setup("hopper")
    saved = {}
    for horizon in (16, 64):
        ctrl = _controls(m, horizon).requires_grad_(True)
        for checkpoint in ("auto", None):
            saved[horizon, checkpoint] = diffmj.grad.saved_tensor_bytes(
                lambda: diffmj.rollout(m, d, ctrl, checkpoint=checkpoint))
    full_growth = saved[64, None] / saved[16, None]
    checkpoint_growth = saved[64, "auto"] / saved[16, "auto"]
    assert full_growth > 3.5, f"full tape grew {full_growth:.2f}x for 4x the horizon"
    assert checkpoint_growth < 2.5, f"checkpointed rollout saved {checkpoint_growth:.2f}x for 4x the horizon"
    assert saved[64, "auto"] < saved[64, None] / 4


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name, horizon", [("hopper", 40), ("humanoid", 25)])
def test_long_horizon_gradient_is_finite(name, horizon, dtype):
    m, d = _setup(name, dtype=dtype)
    ctrl = _controls(m, horizon).requires_grad_(True)
    traj = diffmj.rollout(m, d, ctrl)
    (traj.qpos[:, :3] ** 2).sum().backward()
    assert torch.isfinite(ctrl.grad).all() and ctrl.grad.abs().sum() > 0


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["hopper", "humanoid"])
def test_thousand_step_gradient_is_finite(name, dtype):
    m, d = _setup(name, dtype=dtype)
    ctrl = _controls(m, 1000).requires_grad_(True)
    traj = diffmj.rollout(m, d, ctrl)
    (traj.qpos[:, :3] ** 2).sum().backward()
    assert torch.isfinite(ctrl.grad).all() and ctrl.grad.abs().sum() > 0


def test_bad_controls_raise_value_error():
    m, d = _setup("hopper")
    with pytest.raises(ValueError, match="controls per step"):
        diffmj.rollout(m, d, torch.zeros(5, m.nu + 1, dtype=m.dtype))
    with pytest.raises(ValueError, match=r"\[..., T, nu\]"):
        diffmj.rollout(m, d, torch.zeros(m.nu, dtype=m.dtype))
    with pytest.raises(ValueError, match="positive number of steps"):
        diffmj.rollout(m, d, torch.zeros(5, m.nu, dtype=m.dtype), checkpoint=0)


def test_feedback_rollout_equals_stepping_and_a_batch_each_element():
    """rollout_feedback: u_t = clamp(ctrl_t + K_t dx_t), dx_t the tangent deviation (differentiate_pos on the ant's
    free joint's quaternion) of the state before step t from the reference's; values equal a hand-written loop,
    the applied controls are clamped, and a batch of feedforward controls (shared gains and reference, as
    iLQR's line search steps them) equals each element alone."""
    m, d = _setup("ant")
    horizon = 6
    gen = torch.Generator().manual_seed(2)
    reference = torch.cat((d[None], diffmj.rollout(m, d, _controls(m, horizon, seed=1))[:-1]))
    ctrl = torch.stack([_controls(m, horizon, seed=2), _controls(m, horizon, seed=3)])
    gains = 2.0 * torch.randn(horizon, m.nu, 2 * m.nv + m.na, generator=gen, dtype=m.dtype)
    lower, upper = -0.3 * torch.ones(m.nu, dtype=m.dtype), 0.3 * torch.ones(m.nu, dtype=m.dtype)
    traj = diffmj.rollout_feedback(m, d, ctrl[0], gains, reference, ctrl_range=(lower, upper))
    state = d
    for t in range(horizon):
        dx = torch.cat((diffmj.differentiate_pos(m, reference.qpos[t], state.qpos), state.qvel - reference.qvel[t],
                        state.act - reference.act[t]))
        u = torch.minimum(torch.maximum(ctrl[0, t] + gains[t] @ dx, lower), upper)
        state = diffmj.step(m, state.replace(ctrl=u))
        assert_close(f"qpos[{t}]", traj.qpos[t], state.qpos, 0.0)
        assert_close(f"ctrl[{t}]", traj.ctrl[t], u, 0.0)
    assert (traj.ctrl.abs() == 0.3).any()  # the clamp is exercised
    batched = diffmj.rollout_feedback(m, d, ctrl, gains, reference, ctrl_range=(lower, upper))
    assert batched.batch_size == torch.Size([2, horizon])
    for i in range(2):
        alone = diffmj.rollout_feedback(m, d, ctrl[i], gains, reference, ctrl_range=(lower, upper))
        for name in ("qpos", "qvel", "ctrl"):
            assert_close(f"batch element {i} {name}", getattr(batched, name)[i], getattr(alone, name), TOL["batch"])
    with pytest.raises(ValueError, match="gains must be"):
        diffmj.rollout_feedback(m, d, ctrl, gains[1:], reference)
    with pytest.raises(ValueError, match="reference must be"):
        diffmj.rollout_feedback(m, d, ctrl, gains, reference[1:])
