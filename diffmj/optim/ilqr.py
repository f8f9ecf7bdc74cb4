"""iLQR on diffmj: exact transition Jacobians, Gauss-Newton costs, a tangent-space state.

One iteration (Tassa, Erez and Todorov 2012; as in MJPC's and trajax's iLQR):

1. linearise the dynamics along the nominal trajectory: A_t, B_t of every step from one
   batched ``diffmj.grad.transition_jacobians`` call (or MuJoCo C's ``mjd_transitionFD``),
   and the cost by ``cost_derivatives`` (Gauss-Newton);
2. backward pass: a Riccati recursion for the feedback gains K_t and the steps k_t, with
   Levenberg-Marquardt regularisation (Quu + mu I) raised until every Quu is positive definite;
3. forward pass: a line search over alphas, u_t = clip(u_t + alpha k_t + K_t dx_t) with dx_t the
   tangent deviation from the nominal state (``differentiate_pos`` for positions; ``diffmj.rollout_feedback``);
   the first alpha whose actual decrease is at least a small fraction of the predicted one is accepted. Its
   trials are rolled out all at once as one batch (MJPC's parallel line search) or one after another.

The state is the tangent vector of ``mjd_transitionFD``: dx = (dq, dqvel, dact), ns = 2 nv + na.

Control limits (``actuator_ctrlrange`` of ctrl-limited actuators) are handled the way the
box-QP of Tassa et al. 2014 ends: a control at its bound whose gradient points outward is
held there (its rows of k and K are zero) and the others are solved for with it fixed; the
forward pass clamps. A clamped control has zero derivative in MuJoCo's dynamics too (B_t's
column is zero beyond the range), so the plan's value function is that of the clamped system.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, NamedTuple, Sequence

import mujoco
import numpy as np
import torch
from torch import Tensor

from diffmj import BackwardMode, Data, Model, State, get_state, grad, rollout, rollout_feedback
from diffmj.rollout import CompileArg
from diffmj.optim.cost import Cost, CostDerivatives, cost_derivatives, trajectory_cost
from diffmj.optim.batch import over_initial_states
from diffmj.optim.mujoco_c import rollout_feedback_mujoco
from diffmj.optim.validate import check_start, ctrl_bounds


class ILQRResult(NamedTuple):
    """What ``ilqr`` returns (with leading batch dimensions S for a batch of initial states, as
    ``diffmj.optim.batch`` describes).

    ctrl [T, nu]: the plan. trajectory: Data [T], the Data after each step (as ``diffmj.rollout``).
    gains [T, nu, ns]: feedback K_t for the returned plan, u = ctrl_t + K_t dx_t with dx_t the tangent
    deviation of the state before step t from the plan's: the last backward pass's (at the plan when it
    converged; after ``max_iterations`` the gains its last forward pass was rolled out with, as MJPC's iLQG
    keeps them, and converged is False even if one more linearisation would have found it so). cost: [] the
    plan's total cost.
    cost_history [iterations + 1]: the total cost before the first and after each iteration.
    iterations: forward passes run. converged: stopped by the tolerance (not by max_iterations or
    by the regularisation growing past its maximum). regularization: the final mu. wall_time: seconds.
    """

    ctrl: Tensor
    trajectory: Data
    gains: Tensor
    cost: Tensor
    cost_history: Tensor
    iterations: int
    converged: bool
    regularization: float
    wall_time: float


class IterationInfo(NamedTuple):
    """Passed to ``ilqr``'s callback after each iteration (alpha is 0.0 when no step was accepted)."""

    iteration: int
    cost: float
    alpha: float
    regularization: float
    wall_time: float


class BackwardPass(NamedTuple):
    """k [T, nu], K [T, nu, ns] and the predicted decrease's terms: cost(alpha) - cost ~ alpha
    expected[0] + alpha^2 expected[1]. ok: False when some Quu + mu I was not positive definite."""

    k: Tensor
    K: Tensor
    expected: tuple[float, float]
    ok: bool


def backward_pass(A: Tensor, B: Tensor, derivatives, regularization: float,
                  ctrl: Tensor | None = None, lower: Tensor | None = None, upper: Tensor | None = None) -> BackwardPass:
    """The Riccati recursion of iLQR on linearised dynamics dx' = A_t dx + B_t du.

    A [T, ns, ns], B [T, ns, nu]; derivatives: a ``CostDerivatives`` with time [T+1] (unbatched);
    regularization: mu >= 0 added to Quu. ctrl [T, nu] with lower / upper [nu] (-inf / inf where
    unlimited): controls at a bound whose gradient points outward are held there (zero rows of k, K).
    """
    horizon, ns, nu = B.shape
    eye = torch.eye(nu, dtype=B.dtype, device=B.device)
    # each step's Q is the cost's plus the value's pulled back through [A_t B_t]: one [ns + nu] block
    # matrix, so a step costs two products for the Hessian and one for the gradient
    AB = torch.cat((A, B), -1)  # [T, ns, ns + nu]
    cost_grad = torch.cat((derivatives.grad_x[:horizon], derivatives.grad_u), -1)
    cost_hess = torch.cat((torch.cat((derivatives.hess_xx[:horizon], derivatives.hess_ux.mT), -1),
                           torch.cat((derivatives.hess_ux, derivatives.hess_uu), -1)), -2)
    # a step with a control at a bound solves with some controls held; the others need no mask
    if ctrl is None:
        bounded = [False] * horizon
    else:
        at_lower, at_upper = ctrl <= lower, ctrl >= upper
        bounded = (at_lower | at_upper).any(-1).tolist()
    Vx, Vxx = derivatives.grad_x[horizon], derivatives.hess_xx[horizon]
    gains, linear, quadratic = [], [], []
    for t in reversed(range(horizon)):
        q = cost_grad[t] + AB[t].mT @ Vx
        Q = cost_hess[t] + AB[t].mT @ Vxx @ AB[t]
        Qx, Qu = q[:ns], q[ns:]
        Qxx, Qux, Quu = Q[:ns, :ns], Q[ns:, :ns], Q[ns:, ns:]
        system, rhs = Quu + regularization * eye, torch.cat((Qu[:, None], Qux), 1)
        if bounded[t]:
            free = ~((at_lower[t] & (Qu > 0)) | (at_upper[t] & (Qu < 0)))
            # held controls: identity rows and zero right-hand sides, so their k and K come out zero
            system = torch.where(free[:, None] & free[None, :], system, eye)
            rhs = rhs * free[:, None]
        factor, info = torch.linalg.cholesky_ex(system)
        if info.item() != 0:
            return BackwardPass(B.new_zeros(horizon, nu), B.new_zeros(horizon, nu, ns), (0.0, 0.0), False)
        solution = -torch.cholesky_solve(rhs, factor)  # [nu, 1 + ns]: k_t, K_t
        gains.append(solution)
        k, K = solution[:, 0], solution[:, 1:]
        Quu_k = Quu @ k
        linear.append(k @ Qu)
        quadratic.append(0.5 * k @ Quu_k)
        Vx = Qx + K.mT @ (Quu_k + Qu) + Qux.mT @ k
        Vxx = Qxx + K.mT @ (Quu @ K + Qux) + Qux.mT @ K
        Vxx = 0.5 * (Vxx + Vxx.mT)
    solutions = torch.stack(gains[::-1])
    return BackwardPass(solutions[..., 0], solutions[..., 1:],
                        (torch.stack(linear).sum().item(), torch.stack(quadratic).sum().item()), True)


@torch.no_grad()
def _forward_pass(m: Model, cost: Cost, d0: Data, ctrl: Tensor, nominal: Data | None, K: Tensor | None,
                  lower: Tensor, upper: Tensor, mode: BackwardMode | None, compile: CompileArg,
                  mj_model: mujoco.MjModel | None) -> tuple[Data, Tensor, Tensor]:
    """Roll out u_t = clip(ctrl_t + K_t dx_t) from d0, dx_t the deviation from the nominal states [T+1] (open loop
    where K is None), for ctrl [..., T, nu] (a batch of trials: one explicit batch), in diffmj or, given mj_model,
    in MuJoCo C: the states [..., T+1], the controls applied [..., T, nu] and the total costs [...]."""
    if mj_model is not None:
        traj = rollout_feedback_mujoco(mj_model, m, d0, ctrl, K, None if K is None else nominal[:-1],
                                       ctrl_range=(lower, upper))
    elif K is None:
        traj = rollout(m, d0, torch.clamp(ctrl, lower, upper), checkpoint=None, backward_mode=mode, compile=compile)
    else:
        traj = rollout_feedback(m, d0, ctrl, K, nominal[:-1], ctrl_range=(lower, upper), checkpoint=None,
                                backward_mode=mode, compile=compile)
    batch = traj.batch_size[:-1]
    states = torch.cat((d0.expand(*batch, 1), traj), -1)
    return states, traj.ctrl, trajectory_cost(m, cost, states, traj.ctrl).sum(-1)


def _trials(m: Model, cost: Cost, d0: Data, plan: Tensor, step: BackwardPass, nominal: Data, alphas: Sequence[float],
            lower: Tensor, upper: Tensor, mode: BackwardMode | None, compile: CompileArg, mj_model: mujoco.MjModel | None,
            line_search: str) -> Iterator[tuple[float, tuple[Data, Tensor, Tensor]]]:
    """The line search's forward passes from plan along step, (alpha, (states, controls, cost)) in the order of
    alphas: each rolled out when asked for (sequential, and always in MuJoCo C, where a batch gains nothing), or
    all at once as one batch (parallel)."""
    if line_search == "sequential" or mj_model is not None:
        for alpha in alphas:
            yield alpha, _forward_pass(m, cost, d0, plan + alpha * step.k, nominal, step.K, lower, upper, mode,
                                       compile, mj_model)
        return
    sizes = torch.tensor(alphas, dtype=plan.dtype, device=plan.device)
    states, applied, costs = _forward_pass(m, cost, d0, plan + sizes[:, None, None] * step.k, nominal, step.K,
                                           lower, upper, mode, compile, mj_model)
    for i, alpha in enumerate(alphas):
        yield alpha, (states[i], applied[i], costs[i])


def _jacobians_fd(mjm: mujoco.MjModel, m: Model, states: Data, ctrl: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """A [T, ns, ns], B [T, ns, nu] from MuJoCo C's mjd_transitionFD (centred differences) at each step.

    Each step starts from its state, warm start and inputs (``State.INTEGRATION``), converted for all
    steps at once (indexing the Data and copying it field by field per step cost 2.6 ms a step, 0.27 s of
    a 100-step acrobot plan, against microseconds for the differences themselves)."""
    mjd = mujoco.MjData(mjm)
    ns = 2 * mjm.nv + mjm.na
    A = np.zeros((ctrl.shape[0], ns, ns))
    B = np.zeros((ctrl.shape[0], ns, mjm.nu))
    starts = get_state(m, states[:-1].replace(ctrl=ctrl), State.INTEGRATION).detach().to("cpu", torch.float64).numpy()
    for t, start in enumerate(starts):
        mujoco.mj_setState(mjm, mjd, start, int(State.INTEGRATION))
        mujoco.mjd_transitionFD(mjm, mjd, eps, True, A[t], B[t], None, None)
    return (torch.as_tensor(A, device=ctrl.device).to(ctrl.dtype), torch.as_tensor(B, device=ctrl.device).to(ctrl.dtype))


@over_initial_states
def ilqr(
    m: Model,
    d: Data,
    ctrl: Tensor,
    cost: Cost,
    *,
    max_iterations: int = 50,
    tolerance: float = 1e-6,
    regularization: float = 1.0,
    regularization_min: float = 1e-6,
    regularization_max: float = 1e10,
    regularization_factor: float = 2.0,
    alphas: Sequence[float] = tuple(0.5**i for i in range(10)),
    min_decrease: float = 1e-4,
    fd_model: mujoco.MjModel | None = None,
    fd_eps: float = 1e-6,
    mj_model: mujoco.MjModel | None = None,
    backward_mode: BackwardMode | None = None,
    callback: Callable[[IterationInfo], None] | None = None,
    line_search: str = "parallel",
    compile: CompileArg = False,
) -> ILQRResult:
    """Minimise ``cost`` over the controls from the state d by iLQR, starting from ctrl [T, nu].

    d: the initial state (model dtype); with leading batch dimensions S, each element is planned on its own
    (a loop, ``diffmj.optim.batch``; the callback sees each element's iterations in turn) from ctrl
    [T, nu] or [*S, T, nu], and every field of the result gains S. Stops (converged) when the predicted
    decrease of a full step or the decrease of an accepted one is below ``tolerance * (1 + |cost|)``
    (the gains are then those of the final plan), otherwise after ``max_iterations`` forward passes (the
    plan is not linearised again after the last one: ``max_iterations=1``, MPC's setting, costs one
    linearisation), or when the regularisation exceeds ``regularization_max``.

    regularization*: mu starts at ``regularization`` (1, MJPC's start; from 0 the hopper's stand-up took
    steps of 1/32 to 1/256 for 15 iterations and ended at cost 756 against 219 from 1, the cart-pole's
    swing-up at 1687 against 1547) and follows MJPC's schedule of Tassa et al.'s Levenberg-Marquardt
    factor (delta, times ``regularization_factor`` or divided by it, mu multiplied by delta) after
    each iteration: lowered after a step whose decrease is at least half the predicted one or whose
    alpha is above 0.3, raised after a rejected one, a surprise below 0.1 or an alpha below 0.06; mu
    below ``regularization_min`` drops to 0. 0 makes the first step the unregularised Newton step
    (LQR's solution on a linear-quadratic problem).
    alphas: step sizes tried in order; accepted when the decrease is at least ``min_decrease``
    times the predicted one. fd_model: linearise with MuJoCo C's ``mjd_transitionFD`` (centred,
    ``fd_eps``) on this MjModel (the one m was made from) instead of diffmj's exact Jacobians.
    mj_model: run the forward passes in MuJoCo C on this MjModel (the one m was made from; the same
    physics, a rounding apart: ``rollout_feedback_mujoco``; the line search's trials one at a time until one
    is accepted, as "sequential") instead of diffmj; the Jacobians are still diffmj's (or fd_model's). The returned
    trajectory then holds the states and controls only (other fields are d's, as the sampling planners').
    backward_mode: how ``transition_jacobians`` differentiates the constraint solver.
    line_search: "parallel" rolls out the trials of every alpha at once (one explicit batch, as MJPC's iLQG
    does), "sequential" one after another until one is accepted; both accept the first alpha in order that
    passes the test, so they give the same plan (to roundoff: a batched step's matmuls may round differently).
    compile: run each forward pass's step (feedback law, clamp and step; all alphas at once in parallel) as
    a compiled graph (True, or a dict of ``torch.compile``'s keyword arguments, as ``diffmj.rollout``'s); the
    loop over time stays in Python, so compile time does not grow with T, and later calls with the same model
    and shapes reuse the graph (not with mj_model). ``wall_time`` includes the first call's compile. The Jacobians stay eager (one
    vmapped call over the steps): compiled step by step they were slower on the cart-pole (1.3 s against 0.33 s
    for 120 steps: ~10 ms overhead per call) and did not finish compiling through the hopper's contacts in an hour.
    """
    start = time.perf_counter()
    check_start(m, d, ctrl, "ctrl")
    if max_iterations < 0 or not alphas or regularization < 0 or regularization_factor <= 1:
        raise ValueError("need max_iterations >= 0, some alphas, regularization >= 0 and regularization_factor > 1")
    if fd_model is not None and (fd_model.nv, fd_model.nq, fd_model.na, fd_model.nu) != (m.nv, m.nq, m.na, m.nu):
        raise ValueError("fd_model's sizes (nv, nq, na, nu) differ from the model's")
    if mj_model is not None and compile:
        raise ValueError("compile compiles diffmj's forward passes: mj_model runs them in MuJoCo C; give one of them")
    if line_search not in ("parallel", "sequential"):
        raise ValueError(f"line_search must be 'parallel' or 'sequential', got {line_search!r}")

    lower, upper = ctrl_bounds(m)

    d = d.detach()
    states, plan, total = _forward_pass(m, cost, d, ctrl.detach(), None, None, lower, upper, backward_mode, compile,
                                        mj_model)
    history = [total.item()]
    mu, delta = regularization, 1.0
    converged, stalled, derivatives, iterations, result = False, False, None, 0, None
    while True:
        if derivatives is None and iterations == max_iterations and result is not None and not stalled:
            # no forward pass left: keep the last backward pass's gains, which the plan was rolled out with (as
            # MJPC's iLQG does), rather than linearise the new plan only to test convergence (half of an MPC step)
            break
        if derivatives is None:  # the nominal changed: linearise again
            if fd_model is None:
                # the rollout's next states carry each step's solution: no step is solved again
                A, B, _, _ = grad.transition_jacobians(m, states[:-1].replace(ctrl=plan), backward_mode=backward_mode,
                                                       stepped=states[1:])
            else:
                A, B = _jacobians_fd(fd_model, m, states, plan, fd_eps)
            derivatives = cost_derivatives(m, cost, states, plan)
            A, B, derivatives = A.detach(), B.detach(), CostDerivatives(*(x.detach() for x in derivatives))
        result = backward_pass(A, B, derivatives, mu, plan, lower, upper)
        if not result.ok:
            delta = max(regularization_factor, delta * regularization_factor)
            mu = max(regularization_min, mu * delta)
            if mu > regularization_max:
                break
            continue
        predicted = -(result.expected[0] + result.expected[1])
        if stalled or predicted < tolerance * (1 + abs(history[-1])):
            converged = True
            break
        if iterations == max_iterations:
            break
        iterations += 1
        accepted = 0.0
        for alpha, (trial_states, trial_plan, trial) in _trials(m, cost, d, plan, result, states, alphas, lower, upper,
                                                                backward_mode, compile, mj_model, line_search):
            expected = -(alpha * result.expected[0] + alpha**2 * result.expected[1])
            if torch.isfinite(trial) and history[-1] - trial.item() >= min_decrease * expected:
                states, plan, total, accepted = trial_states, trial_plan, trial, alpha
                derivatives = None
                break
        # MJPC's schedule (iLQGBackwardPass::UpdateRegularization): trust the model more after a long step or
        # one that decreased at least half as predicted, less after a failed, short or surprising one
        surprise = (history[-1] - total.item()) / expected if accepted else 0.0
        if accepted and (surprise > 0.5 or accepted > 0.3):
            delta = min(1 / regularization_factor, delta / regularization_factor)
            mu = mu * delta if mu * delta > regularization_min else 0.0
        elif not accepted or surprise < 0.1 or accepted < 0.06:
            delta = max(regularization_factor, delta * regularization_factor)
            mu = max(regularization_min, mu * delta)
        stalled = accepted and history[-1] - total.item() < tolerance * (1 + abs(history[-1]))
        history.append(total.item())
        if callback is not None:
            callback(IterationInfo(iterations, history[-1], accepted, mu, time.perf_counter() - start))
        if mu > regularization_max:
            break

    return ILQRResult(
        ctrl=plan,
        trajectory=states[1:],
        gains=result.K,
        cost=total,
        cost_history=torch.tensor(history, dtype=m.dtype, device=m.device),
        iterations=iterations,
        converged=converged,
        regularization=mu,
        wall_time=time.perf_counter() - start,
    )
