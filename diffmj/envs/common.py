"""What the torchrl and Gymnasium environments share: observation, reward, termination, reset and stepping.

These use diffmj only (no torchrl, no Gymnasium); each function is pure and differentiable in the Data and
the action, and maps over any leading batch dimensions of the Data.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from diffmj.forward import forward, step
from diffmj.io import make_data
from diffmj.state import differentiate_pos, integrate_pos
from diffmj.types import Data, Model

# observe(m, d) -> [*batch, n_obs]: what a policy sees of the Data
Observe = Callable[[Model, Data], Tensor]
# reward(m, d, action) -> [*batch]: the reward of the step that applied action [*batch, nu] and ended in d
Reward = Callable[[Model, Data, Tensor], Tensor]
# terminated(m, d) -> bool [*batch]: whether d ends the episode (a terminal state, not a time limit)
Terminated = Callable[[Model, Data], Tensor]


def state_observation(m: Model, d: Data) -> Tensor:
    """The default observation: qpos, qvel, act and sensordata concatenated, in that order.
    [*batch, nq + nv + na + nsensordata]"""
    return torch.cat((d.qpos, d.qvel, d.act, d.sensordata), -1)


def regulation_reward(m: Model, d: Data, action: Tensor) -> Tensor:
    """The default reward: minus a quadratic cost of the distance from qpos0 (as a velocity: quaternions
    on their manifold), the velocity and the action, -(|qpos - qpos0|^2 + 0.1 |qvel|^2 + 0.01 |action|^2).
    [*batch]"""
    offset = differentiate_pos(m, m.qpos0, d.qpos)
    return -(offset.square().sum(-1) + 0.1 * d.qvel.square().sum(-1) + 0.01 * action.square().sum(-1))


def never_terminated(m: Model, d: Data) -> Tensor:
    """The default termination: none (episodes end by a time limit only). bool [*batch]"""
    return torch.zeros(d.batch_size, dtype=torch.bool, device=m.device)


def initial_data(m: Model, qpos_noise: Tensor, qvel_noise: Tensor) -> Data:
    """Data at qpos0 moved by qpos_noise [*batch, nv] (integrate_pos over unit time: quaternions stay
    unit), with velocity qvel_noise [*batch, nv], after ``forward`` (sensordata as at the start of an
    episode). Batch shape: qpos_noise's leading dimensions."""
    if qpos_noise.shape != qvel_noise.shape or qpos_noise.shape[-1:] != (m.nv,):
        raise ValueError(f"qpos_noise and qvel_noise must both be [*batch, nv={m.nv}], got "
                         f"{tuple(qpos_noise.shape)} and {tuple(qvel_noise.shape)}")
    d = make_data(m, qpos_noise.shape[:-1])
    d = d.replace(qpos=integrate_pos(m, d.qpos, qpos_noise, 1.0), qvel=qvel_noise)
    return forward(m, d)


def random_initial_data(m: Model, batch: tuple[int, ...], scale: float, generator: torch.Generator) -> Data:
    """``initial_data`` [*batch] with both noises uniform in [-scale, scale], drawn from generator (on the
    model's device) as one [2, *batch, nv] tensor: what the torchrl environments' resets draw."""
    noise = torch.rand((2, *batch, m.nv), generator=generator, dtype=m.dtype, device=m.device)
    noise = scale * (2 * noise - 1)
    return initial_data(m, noise[0], noise[1])


def advance(m: Model, d: Data, action: Tensor, frame_skip: int) -> Data:
    """d after ``frame_skip`` steps with ctrl = action [*batch, nu] held throughout."""
    if action.shape != d.ctrl.shape or action.dtype != m.dtype:
        raise ValueError(f"action must be {tuple(d.ctrl.shape)} of {m.dtype}, got {tuple(action.shape)} of "
                         f"{action.dtype}")
    d = d.replace(ctrl=action)
    for _ in range(frame_skip):
        d = step(m, d)
    return d


def check_options(frame_skip: int, reset_noise_scale: float) -> None:
    """A ValueError unless frame_skip is a positive integer and reset_noise_scale non-negative."""
    if not isinstance(frame_skip, int) or frame_skip < 1:
        raise ValueError(f"frame_skip must be a positive integer, got {frame_skip!r}")
    if not reset_noise_scale >= 0:
        raise ValueError(f"reset_noise_scale must be non-negative, got {reset_noise_scale}")


def select_worlds(keep: Tensor, old: Data, new: Data) -> Data:
    """old's worlds where keep [*batch] (bool) is set, new's elsewhere (a partial reset)."""
    def pick(old_value: Tensor, new_value: Tensor) -> Tensor:
        return torch.where(keep.reshape(*keep.shape, *[1] * (old_value.dim() - keep.dim())), old_value, new_value)

    return pytree.tree_map(pick, old, new)
