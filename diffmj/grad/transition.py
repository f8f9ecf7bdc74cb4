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

from diffmj.forward import resolve_backward_mode, step
from diffmj.grad.solution import from_solution, reuses_solution
from diffmj.state import differentiate_pos, integrate_pos
from diffmj.types import BackwardMode, Data, Model
from diffmj.workarounds import elementwise


def transition(d: Data, nominal: Tensor, mode: BackwardMode):
    """The step from unbatched d as a function f(model, dx [2nv+na], ctrl [nu]) -> (the next state as a
    tangent from the position ``nominal`` [nq] [2nv+na], sensordata [nsensordata]), dx perturbing d's state:
    what A, B, C, D differentiate. The model is an argument so that derivatives w.r.t. its tensors can be
    taken too (``diffmj.optim.sysid``)."""

    def f(m: Model, dx: Tensor, ctrl: Tensor):
        nv = m.nv
        one = torch.ones((), dtype=m.dtype, device=m.device)
        dq, dv, da = dx[:nv], dx[nv : 2 * nv], dx[2 * nv :]
        perturbed = d.replace(qpos=integrate_pos(m, d.qpos, dq, one), qvel=d.qvel + dv, act=d.act + da, ctrl=ctrl)
        out = step(m, perturbed, backward_mode=mode)
        x_next = torch.cat((differentiate_pos(m, nominal, out.qpos), out.qvel, out.act))
        return x_next, out.sensordata

    return f


def _jacobians(m: Model, d: Data, stepped: Data, mode: BackwardMode) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(A, B, C, D) of the step from unbatched d, whose result is ``stepped`` (its qpos and qacc_warmstart,
    the step's qacc, are read)."""
    nominal = stepped.qpos.detach()
    if reuses_solution(m, mode):  # differentiate from the solution: no solver iterations under jacrev
        m, d = from_solution(m), d.replace(qacc_warmstart=stepped.qacc_warmstart.detach())
    x0 = torch.zeros(2 * m.nv + m.na, dtype=m.dtype, device=m.device)
    f = transition(d, nominal, mode)
    (A, B), (C, D) = torch.func.jacrev(lambda dx, ctrl: f(m, dx, ctrl), argnums=(0, 1))(x0, d.ctrl)
    return A, B, C, D


def transition_jacobians(
    m: Model, d: Data, *, backward_mode: BackwardMode | None = None, stepped: Data | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(A, B, C, D) of one step from d: [2nv+na, 2nv+na], [2nv+na, nu], [nsensordata, 2nv+na],
    [nsensordata, nu]. A batched Data gives batched Jacobians [*batch, ...]: the batch is stepped
    as one explicit batch, then differentiated per element (mapped as the step's stages are:
    workarounds.elementwise).

    backward_mode: how the step's constraint solver is differentiated; None uses the model's.
    With the implicit adjoint (not RK4), the differentiated step starts from the solution of the
    step taken first and runs no solver iterations (``diffmj.grad.solution``).

    stepped: the Data after the step from d, batched as d, where the caller has it (the next entries of
    a rollout, diffmj's or MuJoCo C's with the warm start recorded: ``diffmj.optim.rollout_feedback_mujoco``):
    its qpos and qacc_warmstart (the step's qacc) are read and the step is not taken again. The Jacobians
    are then those at that solution: MuJoCo C's agrees with diffmj's to the solver's tolerance.

    To compile it with inductor, pass ``options={"reorder_for_peak_memory": False}``: torch 2.13's
    reordering for peak memory miscompiles the batched Jacobians (README, "Gradient costs").
    """
    mode = resolve_backward_mode(m, backward_mode)
    if stepped is not None and (not isinstance(stepped, Data) or stepped.batch_size != d.batch_size):
        raise ValueError(f"stepped must be a Data of d's batch {tuple(d.batch_size)}")
    if not d.batch_dims:
        return _jacobians(m, d, step(m, d, backward_mode=mode) if stepped is None else stepped, mode)
    flat = d.reshape(-1)
    stepped = step(m, flat, backward_mode=mode) if stepped is None else stepped.reshape(-1)
    jacobians = elementwise(lambda d, stepped: _jacobians(m, d, stepped, mode), True)(flat, stepped)
    return tuple(x.reshape(*d.batch_size, *x.shape[1:]) for x in jacobians)
