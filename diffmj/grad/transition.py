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

import math
from typing import Callable, NamedTuple

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from diffmj.forward import resolve_backward_mode, step
from diffmj.grad.solution import from_solution, reuses_solution
from diffmj.state import differentiate_pos, integrate_pos
from diffmj.types import BackwardMode, Data, IntegratorType, Model
from diffmj.workarounds import elementwise


class Transition(NamedTuple):
    """The step from an unbatched Data as a function of its state's tangent, split where its derivative is
    cheap to chain: ``step(m, dx, ctrl)`` runs the step and returns what the positions are integrated from
    (or the whole next state where they are not), ``state(m, dx, step's outputs)`` -> (the next state as a
    tangent [2nv+na], sensordata [nsensordata]). Called as ``f(m, dx, ctrl)`` it is the composition."""

    step: Callable[[Model, Tensor, Tensor], tuple[Tensor, ...]]
    state: Callable[[Model, Tensor, tuple[Tensor, ...]], tuple[Tensor, Tensor]]

    def __call__(self, m: Model, dx: Tensor, ctrl: Tensor) -> tuple[Tensor, Tensor]:
        return self.state(m, dx, self.step(m, dx, ctrl))


def transition(d: Data, nominal: Tensor, mode: BackwardMode) -> Transition:
    """The step from unbatched d as a function f(model, dx [2nv+na], ctrl [nu]) -> (the next state as a
    tangent from the position ``nominal`` [nq] [2nv+na], sensordata [nsensordata]), dx perturbing d's state:
    what A, B, C, D differentiate. The model is an argument so that derivatives w.r.t. its tensors can be
    taken too (``diffmj.optim.sysid``).

    Except under RK4, the next positions are d's (perturbed) integrated by one timestep of the next
    velocities (mj_advance), so ``Transition.step`` returns (qvel, act, sensordata) after the step and ``state``
    integrates the positions: reverse mode then maps the step's backward over nv + na state rows, not
    2 nv + na (``jacrev_chained``).
    """

    def perturbed_qpos(m: Model, dx: Tensor) -> Tensor:
        return integrate_pos(m, d.qpos, dx[: m.nv], torch.ones((), dtype=m.dtype, device=m.device))

    def stepped(m: Model, dx: Tensor, ctrl: Tensor) -> tuple[Tensor, ...]:
        nv = m.nv
        dv, da = dx[nv : 2 * nv], dx[2 * nv :]
        perturbed = d.replace(qpos=perturbed_qpos(m, dx), qvel=d.qvel + dv, act=d.act + da, ctrl=ctrl)
        out = step(m, perturbed, backward_mode=mode)
        if m.opt.integrator == IntegratorType.RK4:
            return torch.cat((differentiate_pos(m, nominal, out.qpos), out.qvel, out.act)), out.sensordata
        return out.qvel, out.act, out.sensordata

    def state(m: Model, dx: Tensor, outputs: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        if m.opt.integrator == IntegratorType.RK4:
            return outputs
        qvel, act, sensordata = outputs
        qpos = integrate_pos(m, perturbed_qpos(m, dx), qvel, m.opt.timestep)
        return torch.cat((differentiate_pos(m, nominal, qpos), qvel, act)), sensordata

    return Transition(stepped, state)


def _rows_by_output(f: Callable[..., tuple[Tensor, ...]], *primals) -> tuple[tuple[Tensor, ...], tuple[tuple, ...]]:
    """f's outputs, and ``torch.func.jacrev(f, argnums=(0, ..., len(primals) - 1))(*primals)`` for f returning
    a tuple of 1-D tensors: per output [k], per primal (a tensor or a pytree of them) its Jacobian
    [k, *leaf shape].

    jacrev maps one backward pass over the rows of all outputs at once, so every node of the tape runs
    once per row. Here each output's rows are mapped on their own, the other outputs' cotangents zero and
    unmapped: what only those depend on runs unbatched. A step's position and velocity sensors (read
    before the solver and the integration) then cost a fraction of the state's rows (mujoco.sysid's arm:
    10 state and 10 sensor rows, 0.80 -> 0.53 s per Jacobian of 950 steps).
    """
    outputs, vjp = torch.func.vjp(f, *primals)
    zeros = tuple(torch.zeros_like(o) for o in outputs)

    def rows(i: int) -> tuple:
        k = outputs[i].shape[0]
        if k == 0:  # vmap cannot map a dimension of size 0
            return pytree.tree_map(lambda p: p.new_zeros(0, *p.shape), primals)
        basis = torch.eye(k, dtype=outputs[i].dtype, device=outputs[i].device)
        return torch.vmap(lambda row: vjp(zeros[:i] + (row,) + zeros[i + 1 :]))(basis)

    return outputs, tuple(rows(i) for i in range(len(outputs)))


def jacrev_chained(inner: Callable[..., tuple[Tensor, ...]], outer: Callable[..., tuple[Tensor, ...]],
                   *primals) -> tuple[tuple, ...]:
    """The Jacobians of p -> outer(*p, inner(*p)) w.r.t. every primal, as ``torch.func.jacrev(..., argnums=(0,
    ..., len(primals) - 1))`` gives them: per output of outer [k], per primal its Jacobian [k, *leaf shape].
    Both return tuples of 1-D tensors. inner is the costly part: its backward is mapped over its own
    outputs' rows only (``_rows_by_output``); outer is cheap (jacrev), and the two are chained.
    """
    y, inner_jac = _rows_by_output(inner, *primals)
    n = len(primals)
    outer_jac = torch.func.jacrev(outer, argnums=tuple(range(n + 1)))(*primals, y)

    def chained(direct, through_y: tuple, k: int):
        # direct: d out / d primal k (that primal's pytree); through_y[j]: d out / d y_j [rows, len(y_j)]
        def leaf(direct_leaf: Tensor, *inner_leaves: Tensor) -> Tensor:
            size = math.prod(direct_leaf.shape[1:])
            total = direct_leaf.reshape(direct_leaf.shape[0], size)
            # contiguous: inner_leaf can be an expanded (stride 0) or diagonal view, and CPU bmm of such batched
            # operands multiplies matrix by matrix, copying each (the sysid arm's per-step Jacobians: 14 % longer)
            for g, inner_leaf in zip(through_y, inner_leaves):
                total = total + g @ inner_leaf.reshape(inner_leaf.shape[0], size).contiguous()
            return total.reshape(direct_leaf.shape)

        return pytree.tree_map(leaf, direct, *(inner_jac[j][k] for j in range(len(y))))

    return tuple(tuple(chained(out[k], out[n], k) for k in range(n)) for out in outer_jac)


def _jacobians(m: Model, d: Data, stepped: Data, mode: BackwardMode) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(A, B, C, D) of the step from unbatched d, whose result is ``stepped`` (its qpos and qacc_warmstart,
    the step's qacc, are read)."""
    nominal = stepped.qpos.detach()
    if reuses_solution(m, mode):  # differentiate from the solution: no solver iterations under jacrev
        m, d = from_solution(m), d.replace(qacc_warmstart=stepped.qacc_warmstart.detach())
    x0 = torch.zeros(2 * m.nv + m.na, dtype=m.dtype, device=m.device)
    f = transition(d, nominal, mode)
    (A, B), (C, D) = jacrev_chained(lambda dx, ctrl: f.step(m, dx, ctrl), lambda dx, ctrl, y: f.state(m, dx, y),
                                    x0, d.ctrl)
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
