"""rollout(): many steps over a control sequence, with checkpointed gradients."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from diffmj.forward import check_data, resolve_backward_mode
from diffmj.grad.checkpoint import Observe, checkpointed_rollout, run_steps
from diffmj.types import BackwardMode, Data, Model


def rollout(
    m: Model,
    d: Data,
    ctrl: Tensor,
    *,
    checkpoint: int | str | None = "auto",
    backward_mode: BackwardMode | None = None,
    observe: Sequence[str] | Callable[[Model, Data], Any] | None = None,
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
    mode = resolve_backward_mode(m, backward_mode)
    observe = _observer(observe)
    if ctrl.shape[-1] != m.nu:
        raise ValueError(f"ctrl has {ctrl.shape[-1]} controls per step, the model needs {m.nu}")
    if ctrl.dim() < 2:
        raise ValueError(f"ctrl must be [..., T, nu], got shape {tuple(ctrl.shape)}")
    if ctrl.dtype != m.dtype:
        raise ValueError(f"ctrl is {ctrl.dtype} but the model is {m.dtype}")
    horizon = ctrl.shape[-2]
    if checkpoint == "auto":
        segment = max(1, round(math.sqrt(horizon)))
    elif checkpoint is None:
        segment = None
    else:
        segment = int(checkpoint)
        if segment < 1:
            raise ValueError(f"checkpoint must be a positive number of steps, 'auto' or None, got {checkpoint}")

    def single(d: Data, ctrl: Tensor) -> Data:
        if segment is None or segment >= horizon or not torch.is_grad_enabled() or torch.compiler.is_compiling():
            return run_steps(m, d, ctrl, mode, observe)[0]
        return checkpointed_rollout(m, d, ctrl, segment, mode, observe)

    batch = torch.broadcast_shapes(d.batch_size, ctrl.shape[:-2])
    if not batch:
        return single(d, ctrl)
    d = d.expand(batch).reshape(-1)
    ctrl = ctrl.expand(*batch, *ctrl.shape[-2:]).reshape(batch.numel(), *ctrl.shape[-2:])  # not -1: nu may be 0
    traj = torch.vmap(single)(d, ctrl)
    if observe is None:
        return traj.reshape(*batch, horizon)
    return pytree.tree_map(lambda leaf: leaf.reshape(*batch, *leaf.shape[1:]), traj)


def _observer(observe: Sequence[str] | Callable[[Model, Data], Any] | None) -> Observe:
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
