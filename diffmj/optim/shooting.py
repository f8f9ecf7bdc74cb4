"""Gradient shooting: trajectory optimisation by a ``torch.optim`` optimiser on the gradient of the total cost.

The decision variables are knots [K, nu] spread over T steps (``spline_ctrl``, as the sampling planners'
knots; K = T: the controls themselves). The objective is ``trajectory_cost`` summed over the rollout from
d, and its gradient is reverse-mode autodiff through ``diffmj.rollout``: checkpointed (O(sqrt T) memory,
one extra forward pass) and through each step's constraint solver by the implicit adjoint (contacts
included), exact for the discrete dynamics.

Control limits (``actuator_ctrlrange`` of ctrl-limited actuators) are kept by projection: after each
optimiser step the knots are clamped to the range, and the cost is evaluated at the clamped controls
(a cubic spline may overshoot its knots). This is the objective MuJoCo itself defines, since it clamps
ctrl in every step: beyond a bound the gradient is zero. Without the projection a knot pushed past a
bound would sit on that flat region for good; with it the knot stays on the bound, where the one-sided
gradient can pull it back. A reparameterisation (u = tanh(z) scaled to the range) would reach a bound
only asymptotically and shrink the gradient near it, while bang-bang optima, common in control, lie on
the bounds.

L-BFGS (``torch.optim.LBFGS``, best with ``line_search_fn="strong_wolfe"``) gets the closure it needs;
its line search runs on the clamped cost along its unconstrained direction, and the step is projected
afterwards. With no bound active (what it is for: smooth, unconstrained problems) this is plain L-BFGS;
with active bounds its curvature pairs see the projection's effect only through the gradients.
"""

from __future__ import annotations

import time
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from diffmj import BackwardMode, Data, Model, rollout
from diffmj.optim.batch import split_initial_states, stack_results
from diffmj.optim.cost import Cost, trajectory_cost
from diffmj.optim.spline import SPLINES, spline_ctrl
from diffmj.optim.validate import check_start, ctrl_bounds


class ShootingResult(NamedTuple):
    """What ``gradient_shooting`` returns (with leading batch dimensions S for a batch of initial states,
    as ``diffmj.optim.batch`` describes).

    ctrl [T, nu]: the plan's controls (clamped). knots [K, nu]: the plan's knots. trajectory: Data [T], the
    Data after each step of the plan (as ``diffmj.rollout``). cost: [] the plan's total cost. cost_history
    [iterations + 1]: the cost before the first and after each iteration. iterations: optimiser steps run.
    converged: the projected gradient's largest entry at the plan is at most ``tolerance``. wall_time: seconds.
    """

    ctrl: Tensor
    knots: Tensor
    trajectory: Data
    cost: Tensor
    cost_history: Tensor
    iterations: int
    converged: bool
    wall_time: float


class ShootingInfo(NamedTuple):
    """Passed to ``gradient_shooting``'s callback after each iteration: cost [*S] and gradient [*S] (the
    projected gradient's largest magnitude, the convergence test's quantity) of every element's current
    plan ([] for one initial state; elements that stopped keep their final values)."""

    iteration: int
    cost: Tensor
    gradient: Tensor
    wall_time: float


class _Evaluation(NamedTuple):
    """One element's cost [] and gradient [K, nu] at knots [K, nu], with the plan's ctrl [T, nu] and trajectory [T]."""

    knots: Tensor
    cost: Tensor
    grad: Tensor
    ctrl: Tensor
    trajectory: Data


def adam(params: list[Tensor]) -> torch.optim.Optimizer:
    """The default optimiser: Adam with lr 0.05, in control units per iteration (a step moves each knot by
    about lr, whatever the cost's scale)."""
    return torch.optim.Adam(params, lr=0.05)


def _projected_gradient(knots: Tensor, grad: Tensor, lower: Tensor, upper: Tensor) -> Tensor:
    """The largest magnitude of the gradient with the entries that push a knot on a bound outward dropped."""
    outward = ((knots <= lower) & (grad > 0)) | ((knots >= upper) & (grad < 0))
    return torch.where(outward, 0, grad).abs().max()


def gradient_shooting(
    m: Model,
    d: Data,
    nominal: Tensor,
    cost: Cost,
    *,
    optimizer: Callable[[list[Tensor]], torch.optim.Optimizer] = adam,
    iterations: int = 100,
    horizon: int | None = None,
    spline: str = "zero",
    tolerance: float = 1e-6,
    checkpoint: int | str | None = "auto",
    backward_mode: BackwardMode | None = None,
    callback: Callable[[ShootingInfo], None] | None = None,
) -> ShootingResult:
    """Minimise ``cost`` over the knots from the state d by gradient steps of ``optimizer``, from ``nominal``.

    m, d: the model and the initial Data (model dtype). nominal: knots [K, nu] spread over ``horizon``
    steps (default K: one knot per step), interpolated by ``spline`` ("zero", "linear", "cubic"); clamped
    to the control range first. optimizer: a factory ``params -> torch.optim.Optimizer`` (default
    ``adam``; e.g. ``lambda p: torch.optim.LBFGS(p, line_search_fn="strong_wolfe")``). An iteration is
    one ``optimizer.step(closure)`` (for L-BFGS up to its ``max_iter`` inner iterations; its ``max_eval``,
    1.25 max_iter by default, caps the line search's trials: below max_iter=4 it cannot backtrack) and
    the projection. Stops after ``iterations``, when the projected gradient's largest entry is at most
    ``tolerance`` (converged), when a step leaves the plan unchanged (e.g. L-BFGS's own tolerances), when
    the cost is not finite, or when a step makes the knots non-finite: the plan is then the one before it
    (L-BFGS's strong-Wolfe search divides by zero where every knot lies past its bound, since the clamped
    cost is flat there: on the acrobot its knots reached 1e4 for a range of 1, then NaN). checkpoint,
    backward_mode: as ``diffmj.rollout``. callback: called with a ``ShootingInfo`` after each iteration.

    A batch of initial states d [*S] (nominal [K, nu] or [*S, K, nu]) gives independent plans: every
    element has its own optimiser (the factory is called once per element, so L-BFGS's curvature pairs
    and line search, or Adam's moments, never mix elements) and its own stop; the costs and gradients of
    the elements still running come from one vmapped rollout per iteration (L-BFGS's line-search trials
    from rollouts of that element alone). The plans equal a loop over the elements up to rounding.
    """
    start = time.perf_counter()
    if not isinstance(d, Data):
        raise ValueError(f"d must be a diffmj.Data, got {type(d).__name__}")
    batch, states, plans = split_initial_states(d.detach(), nominal)
    for state, plan in zip(states, plans):
        check_start(m, state, plan, "nominal knots")
    if not isinstance(cost, Cost):
        raise ValueError(f"cost must be a diffmj.optim.Cost, got {type(cost).__name__}")
    if spline not in SPLINES:
        raise ValueError(f"spline must be one of {SPLINES}, got {spline!r}")
    if iterations < 0 or not tolerance >= 0:
        raise ValueError(f"need iterations >= 0 and tolerance >= 0, got {iterations} and {tolerance}")
    horizon = nominal.shape[-2] if horizon is None else horizon
    if horizon < 1:
        raise ValueError(f"horizon must be at least one step, got {horizon}")
    lower, upper = ctrl_bounds(m)
    knots = [plan.detach().clamp(lower, upper).requires_grad_() for plan in plans]
    optimizers = [optimizer([k]) for k in knots]
    if not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
        raise ValueError("optimizer must be a function params -> torch.optim.Optimizer")
    evaluations: list[_Evaluation] = [None] * len(knots)

    def evaluate(elements: list[int]) -> None:
        """Cost and gradient of the elements' current knots: one rollout, batched over two or more."""
        with torch.enable_grad():
            if len(elements) == 1:
                state, plan = states[elements[0]], knots[elements[0]]
            else:
                state, plan = torch.stack([states[i] for i in elements]), torch.stack([knots[i] for i in elements])
            ctrl = spline_ctrl(plan, horizon, spline).clamp(lower, upper)
            trajectory = rollout(m, state, ctrl, checkpoint=checkpoint, backward_mode=backward_mode)
            path = torch.cat((state.unsqueeze(-1), trajectory), state.batch_dims)
            totals = trajectory_cost(m, cost, path, ctrl).sum(-1)
            grads = torch.autograd.grad(totals.sum(), [knots[i] for i in elements])
        if len(elements) == 1:
            totals, ctrl, trajectory = totals[None], ctrl[None], trajectory[None]
        for j, i in enumerate(elements):
            evaluations[i] = _Evaluation(knots[i].detach().clone(), totals[j].detach(), grads[j], ctrl[j].detach(),
                                         trajectory[j].detach())

    def stale(i: int) -> bool:
        return not torch.equal(evaluations[i].knots, knots[i].detach())

    def closure(i: int) -> Callable[[], Tensor]:
        def cost_and_gradient() -> Tensor:
            if stale(i):  # a line-search trial
                evaluate([i])
            knots[i].grad = evaluations[i].grad.clone()
            return evaluations[i].cost

        return cost_and_gradient

    def gradient(i: int) -> Tensor:
        return _projected_gradient(evaluations[i].knots, evaluations[i].grad, lower, upper)

    running = list(range(len(knots)))
    evaluate(running)
    history = [[e.cost] for e in evaluations]
    moved = [True] * len(knots)
    for iteration in range(1, iterations + 1):
        running = [i for i in running
                   if moved[i] and torch.isfinite(evaluations[i].cost) and gradient(i) > tolerance]
        if not running:
            break
        for i in running:
            before = knots[i].detach().clone()
            optimizers[i].step(closure(i))
            with torch.no_grad():
                if not torch.isfinite(knots[i]).all():
                    knots[i].copy_(before)
                knots[i].clamp_(lower, upper)
            moved[i] = not torch.equal(before, knots[i].detach())
        # an optimiser's last trial may already be its new point (L-BFGS): evaluate the others, together
        outdated = [i for i in running if stale(i)]
        if outdated:
            evaluate(outdated)
        for i in running:
            history[i].append(evaluations[i].cost)
        if callback is not None:
            callback(ShootingInfo(iteration, torch.stack([e.cost for e in evaluations]).reshape(batch),
                                  torch.stack([gradient(i) for i in range(len(knots))]).reshape(batch),
                                  time.perf_counter() - start))

    results = [ShootingResult(ctrl=e.ctrl, knots=e.knots, trajectory=e.trajectory, cost=e.cost,
                              cost_history=torch.stack(h), iterations=len(h) - 1,
                              converged=bool(gradient(i) <= tolerance), wall_time=0.0)
               for i, (e, h) in enumerate(zip(evaluations, history))]
    if not batch:
        return results[0]._replace(wall_time=time.perf_counter() - start)
    return stack_results(results, batch, time.perf_counter() - start)
