"""rollout(): many steps over a control sequence, with checkpointed gradients."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from diffmj.forward import check_data, resolve_backward_mode
from diffmj.grad.checkpoint import checkpointed_rollout, run_steps
from diffmj.types import BackwardMode, Data, Model


def rollout(
    m: Model,
    d: Data,
    ctrl: Tensor,
    *,
    checkpoint: int | str | None = "auto",
    backward_mode: BackwardMode | None = None,
) -> Data:
    """Step d through the controls ctrl [..., T, nu]; the trajectory as a Data of batch [..., T].

    ``traj[t]`` (``traj.qpos[..., t, :]``, ...) is the Data after step t + 1.
    Leading batch dimensions of d and ctrl broadcast (a batch of initial states,
    of control sequences, or both) and are mapped with ``torch.vmap``.

    checkpoint: steps per recomputed segment in the backward pass; "auto" uses
    about sqrt(T) (O(sqrt(T)) memory, one extra forward pass), None keeps the
    full autograd tape (O(T) memory). The gradient is the same either way.
    backward_mode: how gradients pass through each step's constraint solver; None uses
    the model's.
    """
    check_data(m, d)
    mode = resolve_backward_mode(m, backward_mode)
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
            return run_steps(m, d, ctrl, mode)[0]
        return checkpointed_rollout(m, d, ctrl, segment, mode)

    batch = torch.broadcast_shapes(d.batch_size, ctrl.shape[:-2])
    if not batch:
        return single(d, ctrl)
    d = d.expand(batch).reshape(-1)
    ctrl = ctrl.expand(*batch, *ctrl.shape[-2:]).reshape(batch.numel(), *ctrl.shape[-2:])  # not -1: nu may be 0
    traj = torch.vmap(single)(d, ctrl)
    return traj.reshape(*batch, horizon)
