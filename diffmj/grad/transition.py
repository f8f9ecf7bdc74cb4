"""Transition Jacobians of one step by automatic differentiation (mjd_transitionFD's convention).

The state is x = (dq, qvel, act) of size 2 nv + na, with position perturbations
dq in the tangent space: a perturbed state has qpos = integrate_pos(qpos, dq, 1)
(quaternions stay on the manifold) and the next position is measured by
differentiate_pos from the unperturbed next position. Then

    A = d x_next / d x,   B = d x_next / d ctrl,
    C = d sensordata / d x,   D = d sensordata / d ctrl,

with the shapes of ``mujoco.mjd_transitionFD``, computed exactly through the
solver's implicit adjoint rather than by finite differences.
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffmj.forward import step
from diffmj.state import differentiate_pos, integrate_pos
from diffmj.types import BackwardMode, Data, Model


def _transition(m: Model, d: Data, mode: BackwardMode | None):
    """The step as a function of (state perturbation, ctrl) -> (next-state tangent, sensordata)."""
    nv, na = m.nv, m.na
    one = torch.ones((), dtype=m.dtype, device=m.device)
    nominal = step(m, d, backward_mode=mode).qpos.detach()

    def f(dx: Tensor, ctrl: Tensor):
        dq, dv, da = dx[:nv], dx[nv : 2 * nv], dx[2 * nv :]
        perturbed = d.replace(qpos=integrate_pos(m, d.qpos, dq, one), qvel=d.qvel + dv, act=d.act + da, ctrl=ctrl)
        out = step(m, perturbed, backward_mode=mode)
        x_next = torch.cat((differentiate_pos(m, nominal, out.qpos), out.qvel, out.act))
        return x_next, out.sensordata

    return f, torch.zeros(2 * nv + na, dtype=m.dtype, device=m.device)


def transition_jacobians(
    m: Model, d: Data, *, backward_mode: BackwardMode | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(A, B, C, D) of one step from d: [2nv+na, 2nv+na], [2nv+na, nu], [nsensordata, 2nv+na],
    [nsensordata, nu]. A batched Data gives batched Jacobians (torch.vmap).

    backward_mode: how the step's constraint solver is differentiated; None uses the model's.
    """
    if d.batch_dims:
        flat = d.reshape(-1)
        jacobians = torch.vmap(lambda d: transition_jacobians(m, d, backward_mode=backward_mode))(flat)
        return tuple(x.reshape(*d.batch_size, *x.shape[1:]) for x in jacobians)
    f, x0 = _transition(m, d, backward_mode)
    (A, B), (C, D) = torch.func.jacrev(f, argnums=(0, 1))(x0, d.ctrl)
    return A, B, C, D
