"""rollout() and rollout_policy(): many steps, open loop or under a policy, with checkpointed gradients."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from diffmj.forward import check_data, resolve_backward_mode
from diffmj.grad.checkpoint import Control, Observe, checkpointed_rollout, open_loop, run_steps
from diffmj.state import get_state
from diffmj.types import BackwardMode, Data, Model, State

ObserveArg = Sequence[str] | Callable[[Model, Data], Any] | None


def rollout(
    m: Model,
    d: Data,
    ctrl: Tensor,
    *,
    checkpoint: int | str | None = "auto",
    backward_mode: BackwardMode | None = None,
    observe: ObserveArg = None,
) -> Any:
    """Step d through the controls ctrl [..., T, nu]; the trajectory as a Data of batch [..., T].

    ``traj[t]`` (``traj.qpos[..., t, :]``, ...) is the Data after step t + 1.
    Leading batch dimensions of d and ctrl broadcast (a batch of initial states,
    of control sequences, or both) and are mapped with ``torch.vmap``.

    observe: what to keep of each step, instead of every Data field: Data field names (e.g.
    ``("qpos", "qvel", "act", "sensordata")``, as ``mujoco.rollout`` keeps state and sensordata) give a
    dict of those fields [..., T, ...]; a function ``observe(m, d)`` of the Data after each step returning
    a pytree of tensors (a dict, a tuple, one tensor; e.g. ``get_state`` or a running cost) gives that
    pytree with leaves [..., T, ...]. Gradients and checkpointing are unchanged; memory for the outputs
    is what observe returns.

    checkpoint: steps per recomputed segment in the backward pass; "auto" uses
    about sqrt(T) (O(sqrt(T)) memory, one extra forward pass), None keeps the
    full autograd tape (O(T) memory). The gradient is the same either way.
    backward_mode: how gradients pass through each step's constraint solver; None uses
    the model's.
    """
    check_data(m, d)
    if ctrl.shape[-1] != m.nu:
        raise ValueError(f"ctrl has {ctrl.shape[-1]} controls per step, the model needs {m.nu}")
    if ctrl.dim() < 2:
        raise ValueError(f"ctrl must be [..., T, nu], got shape {tuple(ctrl.shape)}")
    if ctrl.dtype != m.dtype:
        raise ValueError(f"ctrl is {ctrl.dtype} but the model is {m.dtype}")
    batch = torch.broadcast_shapes(d.batch_size, ctrl.shape[:-2])
    ctrl = ctrl.expand(*batch, *ctrl.shape[-2:])
    return _rollout(m, d, open_loop, (ctrl,), len(batch), ctrl.shape[-2], checkpoint, backward_mode, observe)


def rollout_policy(
    m: Model,
    d: Data,
    policy: Callable[[Any, Tensor], Tensor],
    params: Any,
    steps: int,
    *,
    checkpoint: int | str | None = "auto",
    backward_mode: BackwardMode | None = None,
    observe: ObserveArg = None,
) -> Any:
    """Step d ``steps`` times in closed loop: ctrl_t = policy(params, x_t) [nu], x_t = ``get_state(m, d_t,
    State.PHYSICS)`` [nq + nv + na] the state before step t. Returns what ``rollout`` returns.

    params: a pytree of tensors (e.g. ``dict(net.named_parameters())`` with ``policy = lambda p, x:
    torch.func.functional_call(net, p, (x,))``), shared by every batch element; gradients flow to it, to
    the model's parameters and to d's state, through checkpointed segments as in ``rollout`` (so
    ``loss.backward()`` fills ``net``'s ``.grad``, and ``torch.func.grad`` over params works). A batch of
    initial states (leading dimensions of d) is mapped with ``torch.vmap``: policy sees one state [ns].
    """
    check_data(m, d)
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    leaves, spec = pytree.tree_flatten(params)
    if not all(isinstance(leaf, Tensor) for leaf in leaves):
        raise ValueError("params must be a pytree of tensors (e.g. dict(net.named_parameters()))")

    def control(flat: tuple[Tensor, ...], t: int, m: Model, d: Data) -> Tensor:
        ctrl = policy(pytree.tree_unflatten(list(flat), spec), get_state(m, d, State.PHYSICS))
        if ctrl.shape != (m.nu,) or ctrl.dtype != m.dtype:
            raise ValueError(f"policy must return ctrl [nu={m.nu}] of {m.dtype}, got {tuple(ctrl.shape)} "
                             f"of {ctrl.dtype}")
        return ctrl

    return _rollout(m, d, control, tuple(leaves), 0, steps, checkpoint, backward_mode, observe)


def _rollout(m: Model, d: Data, control: Control, params: tuple[Tensor, ...], batched_params: int, horizon: int,
             checkpoint: int | str | None, backward_mode: BackwardMode | None, observe: ObserveArg) -> Any:
    """What rollout and rollout_policy share. The first ``batched_params`` dimensions of every param are
    batch dimensions, as d's (0: params shared by the batch)."""
    mode = resolve_backward_mode(m, backward_mode)
    observe = _observer(observe)
    if checkpoint == "auto":
        segment = max(1, round(math.sqrt(horizon)))
    elif checkpoint is None:
        segment = None
    else:
        segment = int(checkpoint)
        if segment < 1:
            raise ValueError(f"checkpoint must be a positive number of steps, 'auto' or None, got {checkpoint}")

    def single(d: Data, params: tuple[Tensor, ...]) -> Any:
        if segment is None or segment >= horizon or not torch.is_grad_enabled() or torch.compiler.is_compiling():
            return run_steps(m, d, control, params, range(horizon), mode, observe)[0]
        return checkpointed_rollout(m, d, control, params, horizon, segment, mode, observe)

    batch = d.batch_size if not batched_params else params[0].shape[:batched_params]
    if not batch:
        return single(d, params)
    size = batch.numel()  # not -1 in the reshapes: nu may be 0
    d = d.expand(batch).reshape(size)
    params = tuple(p.reshape(size, *p.shape[batched_params:]) for p in params) if batched_params else params
    traj = torch.vmap(single, in_dims=(0, 0 if batched_params else None))(d, params)
    if observe is None:
        return traj.reshape(*batch, horizon)
    return pytree.tree_map(lambda leaf: leaf.reshape(*batch, *leaf.shape[1:]), traj)


def _observer(observe: ObserveArg) -> Observe:
    """rollout's ``observe`` as a function (None: keep the Data)."""
    if observe is None or callable(observe):
        return observe
    if isinstance(observe, str) or not all(isinstance(name, str) for name in observe):
        raise ValueError(f"observe must be a sequence of Data field names or a function (m, d) -> tensors, "
                         f"got {observe!r}")
    fields = {f.name for f in dataclasses.fields(Data)}
    unknown = [name for name in observe if name not in fields]
    if unknown:
        raise ValueError(f"observe names fields Data does not have: {unknown}")
    names = tuple(observe)
    return lambda m, d: {name: getattr(d, name) for name in names}
