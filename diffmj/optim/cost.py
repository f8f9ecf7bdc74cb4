"""MJPC-style costs: weighted norms of residuals, running and terminal, with Gauss-Newton derivatives.

A ``Term`` is ``weight * norm(residual(m, d))``: the residual maps one Data (its
state and ``ctrl``) to a vector [n], the norm maps that vector to a scalar. A
``Cost`` sums running terms over the states x_0 .. x_{T-1} with the controls
u_0 .. u_{T-1} and terminal terms at x_T (no time-step scaling: a running cost
is counted once per step).

Derivatives are taken in the tangent space of ``transition_jacobians``: the
state perturbation is dx = (dq, dqvel, dact) of size 2 nv + na, with
qpos = integrate_pos(qpos, dq, 1). The Gauss-Newton Hessian keeps the norm's
curvature and drops the residual's: with J = d r / d(dx, u),

    gradient = sum_i w_i J_i' g_i(r_i),   Hessian ~ sum_i w_i J_i' H_i(r_i) J_i,

exact when every residual is affine in (dx, u), positive semi-definite always.

Norms follow MJPC's ``mjpc/norm.cc`` (p > 0 is the smoothing scale):

    Quadratic   0.5 r'r
    L2          sqrt(r'r + p^2) - p                 (the Euclidean norm, smoothed at 0)
    SmoothAbs   sum_j sqrt(r_j^2 + p^2) - p         (the 1-norm, smoothed)
    Cosh        sum_j p^2 (cosh(r_j / p) - 1)       (quadratic near 0, exponential beyond p)
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from diffmj import Data, Model, forward, integrate_pos


class _Norm:
    """A norm: ``norm(r)`` [...] from r [..., n]; ``derivatives(r)`` adds g [..., n] and H [..., n, n]."""

    def __call__(self, r: Tensor) -> Tensor:
        raise NotImplementedError

    def derivatives(self, r: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError


def _positive(name: str, p: float) -> None:
    if not p > 0:
        raise ValueError(f"{name}: the smoothing parameter p must be positive, got {p}")


@dataclasses.dataclass(frozen=True)
class Quadratic(_Norm):
    """0.5 r'r (MJPC's kQuadratic)."""

    def __call__(self, r: Tensor) -> Tensor:
        return 0.5 * (r * r).sum(-1)

    def derivatives(self, r: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        eye = torch.eye(r.shape[-1], dtype=r.dtype, device=r.device)
        return self(r), r, eye.expand(*r.shape, r.shape[-1])


@dataclasses.dataclass(frozen=True)
class L2(_Norm):
    """sqrt(r'r + p^2) - p (MJPC's kL2): the Euclidean norm, smooth at r = 0 for p > 0."""

    p: float = 0.1

    def __post_init__(self):
        _positive("L2", self.p)

    def __call__(self, r: Tensor) -> Tensor:
        return torch.sqrt((r * r).sum(-1) + self.p**2) - self.p

    def derivatives(self, r: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        s = torch.sqrt((r * r).sum(-1, keepdim=True) + self.p**2)
        g = r / s
        eye = torch.eye(r.shape[-1], dtype=r.dtype, device=r.device)
        hessian = (eye - g[..., :, None] * g[..., None, :]) / s[..., None]
        return s[..., 0] - self.p, g, hessian


@dataclasses.dataclass(frozen=True)
class SmoothAbs(_Norm):
    """sum_j sqrt(r_j^2 + p^2) - p (MJPC's kSmoothAbsLoss): the 1-norm, smooth for p > 0."""

    p: float = 0.1

    def __post_init__(self):
        _positive("SmoothAbs", self.p)

    def __call__(self, r: Tensor) -> Tensor:
        return (torch.sqrt(r * r + self.p**2) - self.p).sum(-1)

    def derivatives(self, r: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        s = torch.sqrt(r * r + self.p**2)
        # d/dr (r / s) = p^2 / s^3
        return (s - self.p).sum(-1), r / s, torch.diag_embed(self.p**2 / s**3)


@dataclasses.dataclass(frozen=True)
class Cosh(_Norm):
    """sum_j p^2 (cosh(r_j / p) - 1) (MJPC's kCosh): 0.5 r'r near 0, growing exponentially beyond p."""

    p: float = 1.0

    def __post_init__(self):
        _positive("Cosh", self.p)

    def __call__(self, r: Tensor) -> Tensor:
        return (self.p**2 * (torch.cosh(r / self.p) - 1)).sum(-1)

    def derivatives(self, r: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = r / self.p
        return (self.p**2 * (torch.cosh(x) - 1)).sum(-1), self.p * torch.sinh(x), torch.diag_embed(torch.cosh(x))


Residual = Callable[[Model, Data], Tensor]


@dataclasses.dataclass(frozen=True)
class Term:
    """weight * norm(residual(m, d)).

    residual(m, d) receives one unbatched Data (the cost maps it over time and
    batch with ``torch.vmap``) and returns a vector [n]; it may read the state
    (qpos, qvel, act), ``ctrl``, and, for a ``Cost(forward=True)``, every field
    ``diffmj.forward`` computes (site_xpos, sensordata, ...).
    """

    residual: Residual
    weight: float | Tensor = 1.0
    norm: _Norm = Quadratic()

    def __post_init__(self):
        if not callable(self.residual):
            raise ValueError(f"Term.residual must be a function (m, d) -> [n], got {type(self.residual).__name__}")
        if not isinstance(self.norm, _Norm):
            raise ValueError(f"Term.norm must be Quadratic(), L2(p), SmoothAbs(p) or Cosh(p), got {self.norm!r}")


@dataclasses.dataclass(frozen=True)
class Cost:
    """sum_t sum_running w norm(r(x_t, u_t)) + sum_terminal w norm(r(x_T)).

    forward: run ``diffmj.forward`` on each state before its residuals, so that
    derived fields (positions of sites, sensors, contacts) match the state, as
    MJPC's residuals (sensors) do; off, residuals may read only the state and ctrl.
    """

    running: tuple[Term, ...]
    terminal: tuple[Term, ...] = ()
    forward: bool = False

    def __post_init__(self):
        for name in ("running", "terminal"):
            terms = tuple(getattr(self, name))
            if not all(isinstance(t, Term) for t in terms):
                raise ValueError(f"Cost.{name} must be a sequence of Term")
            object.__setattr__(self, name, terms)


class CostDerivatives(NamedTuple):
    """Per-step cost and its Gauss-Newton derivatives in the tangent space (ns = 2 nv + na).

    value [..., T+1] (the terminal cost last); grad_x [..., T+1, ns]; grad_u [..., T, nu];
    hess_xx [..., T+1, ns, ns]; hess_uu [..., T, nu, nu]; hess_ux [..., T, nu, ns].
    """

    value: Tensor
    grad_x: Tensor
    grad_u: Tensor
    hess_xx: Tensor
    hess_uu: Tensor
    hess_ux: Tensor


def _check(m: Model, cost: Cost, states: Data, ctrl: Tensor) -> tuple[int, ...]:
    """The leading batch shape of states [..., T+1] and ctrl [..., T, nu]; ValueError when they disagree."""
    if not isinstance(cost, Cost):
        raise ValueError(f"cost must be a diffmj.optim.Cost, got {type(cost).__name__}")
    if not isinstance(states, Data) or not states.batch_dims:
        raise ValueError("states must be a Data with batch shape [..., T+1]")
    if not isinstance(ctrl, Tensor) or ctrl.dim() < 2 or ctrl.shape[-1] != m.nu:
        shape = tuple(ctrl.shape) if isinstance(ctrl, Tensor) else type(ctrl).__name__
        raise ValueError(f"ctrl must be a tensor [..., T, nu={m.nu}], got {shape}")
    if tuple(states.batch_size) != (*ctrl.shape[:-2], ctrl.shape[-2] + 1):
        raise ValueError(f"states have batch shape {tuple(states.batch_size)}, ctrl {tuple(ctrl.shape)} needs "
                         f"{(*ctrl.shape[:-2], ctrl.shape[-2] + 1)} (T controls, T + 1 states)")
    if ctrl.dtype != m.dtype or states.qpos.dtype != m.dtype:
        raise ValueError(f"ctrl is {ctrl.dtype} and states are {states.qpos.dtype}, the model is {m.dtype}")
    return tuple(ctrl.shape[:-2])


def _at(m: Model, cost: Cost, d: Data, dx: Tensor, u: Tensor) -> Data:
    """One Data moved by the tangent perturbation dx [ns] with controls u [nu] (and forward if asked)."""
    nv = m.nv
    d = d.replace(qpos=integrate_pos(m, d.qpos, dx[:nv], 1.0), qvel=d.qvel + dx[nv : 2 * nv],
                  act=d.act + dx[2 * nv :], ctrl=u)
    return forward(m, d) if cost.forward else d


def _total(m: Model, terms: tuple[Term, ...], d: Data) -> Tensor:
    total = d.qpos.new_zeros(())
    for term in terms:
        total = total + term.weight * term.norm(term.residual(m, d))
    return total


def running_cost(m: Model, cost: Cost, d: Data) -> Tensor:
    """The running cost of each Data in d at its own ``ctrl`` [*batch]: trajectory_cost's value of a step
    before the last, for one state. Maps over d's batch dimensions; differentiable. Its negative is a
    reward (``diffmj.envs``' ``reward(m, d, action)``, where d's ctrl is the action) and it can be
    rollout's ``observe=`` (the cost of every step, without keeping the states)."""
    if not isinstance(cost, Cost):
        raise ValueError(f"cost must be a diffmj.optim.Cost, got {type(cost).__name__}")

    def one(d: Data) -> Tensor:
        return _total(m, cost.running, forward(m, d) if cost.forward else d)

    if not d.batch_dims:
        return one(d)
    return torch.vmap(one)(d.reshape(-1)).reshape(d.batch_size)


def trajectory_cost(m: Model, cost: Cost, states: Data, ctrl: Tensor) -> Tensor:
    """The cost of each step, [..., T+1]: running at (states[..., t], ctrl[..., t]), terminal at states[..., T].

    states: Data [..., T+1] (x_0 and the T states after it, e.g. ``torch.cat((d[None], rollout(m, d, ctrl)))``);
    ctrl: [..., T, nu]. Differentiable in the states, the controls, the weights and the model.
    """
    batch = _check(m, cost, states, ctrl)
    horizon = ctrl.shape[-2]
    zero = torch.zeros(2 * m.nv + m.na, dtype=m.dtype, device=m.device)

    def running(d: Data, u: Tensor) -> Tensor:
        return _total(m, cost.running, _at(m, cost, d, zero, u))

    def terminal(d: Data) -> Tensor:
        return _total(m, cost.terminal, _at(m, cost, d, zero, d.ctrl))

    run = torch.vmap(running)(states[..., :horizon].reshape(-1), ctrl.reshape(-1, m.nu))
    end = torch.vmap(terminal)(states[..., horizon].reshape(-1))
    return torch.cat((run.reshape(*batch, horizon), end.reshape(*batch, 1)), -1)


def _gauss_newton(m: Model, cost: Cost, terms: tuple[Term, ...], d: Data, u: Tensor, with_u: bool):
    """Value, gradient [ns + nu] and Gauss-Newton Hessian [ns + nu, ns + nu] at one (d, u)."""
    ns = 2 * m.nv + m.na
    # the point of linearisation: no state perturbation, the controls u
    z = torch.cat((u.new_zeros(ns), u))
    if not terms:
        return z.new_zeros(()), z, z.new_zeros(ns + m.nu, ns + m.nu)

    def residuals(z: Tensor) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
        point = _at(m, cost, d, z[:ns], z[ns:] if with_u else u)
        r = tuple(term.residual(m, point) for term in terms)
        return r, r

    jacobians, values = torch.func.jacrev(residuals, has_aux=True)(z)
    value, grad, hess = z.new_zeros(()), z.new_zeros(ns + m.nu), z.new_zeros(ns + m.nu, ns + m.nu)
    for term, r, jac in zip(terms, values, jacobians):
        v, g, h = term.norm.derivatives(r)
        value = value + term.weight * v
        grad = grad + term.weight * (jac.mT @ g)
        hess = hess + term.weight * (jac.mT @ h @ jac)
    return value, grad, hess


def cost_derivatives(m: Model, cost: Cost, states: Data, ctrl: Tensor) -> CostDerivatives:
    """The cost of each step with its gradient and Gauss-Newton Hessian w.r.t. (dx, u); shapes in
    ``CostDerivatives``. states: Data [..., T+1]; ctrl: [..., T, nu]. Residual Jacobians come from
    reverse-mode autodiff, one vmapped call over every step.
    """
    batch = _check(m, cost, states, ctrl)
    horizon, ns, nu = ctrl.shape[-2], 2 * m.nv + m.na, m.nu
    flat = states[..., :horizon].reshape(-1)
    value, grad, hess = torch.vmap(lambda d, u: _gauss_newton(m, cost, cost.running, d, u, True))(
        flat, ctrl.reshape(-1, nu))
    end = states[..., horizon].reshape(-1)
    end_value, end_grad, end_hess = torch.vmap(lambda d: _gauss_newton(m, cost, cost.terminal, d, d.ctrl, False))(end)

    def steps(x: Tensor, n: int) -> Tensor:
        return x.reshape(*batch, n, *x.shape[1:])

    return CostDerivatives(
        value=torch.cat((steps(value, horizon), steps(end_value, 1)), -1),
        grad_x=torch.cat((steps(grad[:, :ns], horizon), steps(end_grad[:, :ns], 1)), -2),
        grad_u=steps(grad[:, ns:], horizon),
        hess_xx=torch.cat((steps(hess[:, :ns, :ns], horizon), steps(end_hess[:, :ns, :ns], 1)), -3),
        hess_uu=steps(hess[:, ns:, ns:], horizon),
        hess_ux=steps(hess[:, ns:, :ns], horizon),
    )
