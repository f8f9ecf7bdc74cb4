"""Newton and CG solvers for MuJoCo's convex constraint problem (engine_solver.c).

The problem: minimise over qacc

    0.5 (qacc - qacc_smooth)' M (qacc - qacc_smooth) + s(J qacc - aref)

where s is the sum of the row costs of equality (quadratic), frictionloss
(Huber), limit and pyramidal contact (one-sided quadratic) and elliptic
contact (distance to the friction cone) constraints. Both solvers start from
MuJoCo's warm start, take exact line searches along Newton (H = M + J'DJ +
cone terms) or Hager-Zhang conjugate-gradient directions, and stop with
MuJoCo's tests (improvement, gradient, Newton decrement).

Loops have a fixed maximum length (``opt.iterations``, ``opt.ls_iterations``);
a converged element is frozen with ``torch.where`` so a vmapped batch gives
exactly what each element gives alone. An eager call stops as soon as every
element has converged, with the same result; under torch.compile the loop body
is traced once (workarounds.bounded_loop) and an unbatched call stops early too.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from diffmj import math
from diffmj.types import ConstraintState, Data, DisableBit, Model, SolverType
from diffmj.workarounds import bounded_loop


class Problem(NamedTuple):
    """Inputs of the constrained problem (constant during the solve)."""

    M: Tensor  # [nv, nv]
    M_chol: Tensor  # [nv, nv]
    qfrc_smooth: Tensor  # [nv]
    qacc_smooth: Tensor  # [nv]
    J: Tensor  # [nefc, nv]
    aref: Tensor  # [nefc]
    D: Tensor  # [nefc]
    R: Tensor  # [nefc]
    frictionloss: Tensor  # [nefc]
    active: Tensor  # [nefc] bool
    equality: Tensor  # [nefc] bool
    friction: Tensor  # [nefc] bool
    cones: tuple  # per elliptic contact group: (rows [k, dim], mu [k], friction [k, dim - 1])


class Update(NamedTuple):
    """Constraint forces and states at one qacc (mj_constraintUpdate)."""

    force: Tensor  # [nefc]
    state: Tensor  # [nefc] int
    cost: Tensor  # [] constraint cost (without the Gauss term)
    quadratic: Tensor  # [nefc] D where a row contributes D to the Hessian, else 0
    cone_hessians: tuple  # per cone group: [k, dim, dim] (zero outside the cone state)
    cone_cost: Tensor  # [] part of the cost from elliptic cones


def _cone(jar_rows: Tensor, mu: Tensor, friction: Tensor):
    """Elliptic cone quantities of rows [k, dim]: U (rescaled jar), N, T and the zones."""
    U = torch.cat(((jar_rows[:, 0] * mu)[:, None], jar_rows[:, 1:] * friction), -1)
    N = U[:, 0]
    T = math.safe_norm(U[:, 1:])
    top = (N >= mu * T) | ((T <= 0) & (N >= 0))
    bottom = ~top & ((mu * N + T <= 0) | ((T <= 0) & (N < 0)))
    middle = ~top & ~bottom
    return U, N, T, top, bottom, middle


def constraint_update(p: Problem, jar: Tensor, with_hessian: bool = False) -> Update:
    """Forces, states and cost of every row at residual jar = J qacc - aref."""
    D, R, floss = p.D, p.R, p.frictionloss
    quad_cost = 0.5 * D * jar * jar
    force = -D * jar

    # frictionloss rows: Huber cost
    rf = R * floss
    neg, pos = jar <= -rf, jar >= rf
    huber = torch.where(neg, -0.5 * rf * floss - floss * jar, torch.where(pos, -0.5 * rf * floss + floss * jar, quad_cost))
    fri_force = torch.where(neg, floss, torch.where(pos, -floss, force))
    fri_state = torch.where(
        neg, ConstraintState.LINEARNEG, torch.where(pos, ConstraintState.LINEARPOS, ConstraintState.QUADRATIC))

    # limits and contacts: one-sided
    violated = jar < 0
    one_sided = torch.where(violated, ConstraintState.QUADRATIC, ConstraintState.SATISFIED)
    state = torch.where(p.equality, ConstraintState.QUADRATIC, torch.where(p.friction, fri_state, one_sided))
    force = torch.where(p.equality, force, torch.where(p.friction, fri_force, torch.where(violated, force, 0.0)))
    cost = torch.where(p.equality, quad_cost, torch.where(p.friction, huber, torch.where(violated, quad_cost, 0.0)))

    hessians = []
    cone_cost = torch.zeros_like(jar[..., 0])
    for rows, mu, friction in p.cones:
        dim = rows.shape[1]
        jr = jar[rows]
        d0 = D[rows[:, 0]]
        U, N, T, top, bottom, middle = _cone(jr, mu, friction)
        Dm = d0 / (mu * mu * (1 + mu * mu))
        NmT = N - mu * T
        scale_row = torch.cat((mu[:, None], friction), -1)  # dU / djar
        T_safe = torch.where(T > 0, T, 1.0)
        f0 = -Dm * NmT * mu
        f_rest = -f0[:, None] / T_safe[:, None] * U[:, 1:] * friction
        cone_force = torch.cat((f0[:, None], f_rest), -1)
        bottom_force = -D[rows] * jr
        group_force = torch.where(top[:, None], 0.0, torch.where(bottom[:, None], bottom_force, cone_force))
        group_cost = torch.where(top, 0.0, torch.where(bottom, (0.5 * D[rows] * jr * jr).sum(-1), 0.5 * Dm * NmT * NmT))
        group_state = torch.where(
            top, ConstraintState.SATISFIED, torch.where(bottom, ConstraintState.QUADRATIC, ConstraintState.CONE))
        cone_cost = cone_cost + torch.where(p.active[rows[:, 0]], group_cost, 0.0).sum(-1)
        flat = rows.reshape(-1)
        force = force.index_copy(0, flat, group_force.reshape(-1))
        state = state.index_copy(0, flat, group_state[:, None].expand(-1, dim).reshape(-1))
        # the cone's cost is carried by its first row
        cost = cost.index_copy(0, flat, torch.cat((group_cost[:, None], torch.zeros_like(jr[:, 1:])), -1).reshape(-1))
        if with_hessian:
            # H = Dm * diag(scale) [[1, -mu/T U'], [.., mu N / T^3 U U' + (mu^2 - mu N / T) I]] diag(scale)
            u = U[:, 1:]
            first = torch.cat((torch.ones_like(mu)[:, None], -(mu / T_safe)[:, None] * u), -1)
            block = (mu * N / T_safe**3)[:, None, None] * u[:, :, None] * u[:, None, :]
            block = block + (mu * mu - mu * N / T_safe)[:, None, None] * torch.eye(dim - 1, dtype=jar.dtype, device=jar.device)
            H = torch.cat((first[:, None, :], torch.cat((first[:, 1:, None], block), -1)), 1)
            H = Dm[:, None, None] * scale_row[:, :, None] * H * scale_row[:, None, :]
            in_cone = middle & p.active[rows[:, 0]]
            hessians.append(torch.where(in_cone[:, None, None], H, 0.0))

    active = p.active
    force = torch.where(active, force, 0.0)
    state = torch.where(active, state, ConstraintState.SATISFIED)
    cost = torch.where(active, cost, 0.0).sum(-1)
    # int(): under torch.compile (2.13) a tensor compared with an IntEnum member is a plain False
    quadratic = torch.where(state == int(ConstraintState.QUADRATIC), D, 0.0)
    return Update(force, state, cost, quadratic, tuple(hessians), cone_cost)


def _hessian(p: Problem, upd: Update) -> Tensor:
    """Newton Hessian H = M + J' D_quadratic J + sum over cones J_c' H_c J_c. [nv, nv]"""
    H = p.M + p.J.transpose(-1, -2) @ (upd.quadratic[:, None] * p.J)
    for (rows, _, _), hc in zip(p.cones, upd.cone_hessians):
        Jc = p.J[rows]  # [k, dim, nv]
        H = H + (Jc.transpose(-1, -2) @ hc @ Jc).sum(0)
    return H


class LineEval(NamedTuple):
    deriv: Tensor
    deriv2: Tensor


def _line_eval(p: Problem, jar: Tensor, Jv: Tensor, quad_gauss: Tensor, alpha: Tensor) -> LineEval:
    """First and second derivatives of the cost along the search direction at step alpha."""
    x = jar + alpha * Jv
    upd = constraint_update(p, x)
    # d/dalpha of the row costs: -force . Jv; second derivative from the quadratic rows
    deriv = -(upd.force * Jv).sum(-1) + 2 * alpha * quad_gauss[2] + quad_gauss[1]
    deriv2 = (upd.quadratic * Jv * Jv).sum(-1) + 2 * quad_gauss[2]
    for rows, mu, friction in p.cones:
        U, N, T, _, _, middle = _cone(x[rows], mu, friction)
        V = torch.cat(((Jv[rows[:, 0]] * mu)[:, None], Jv[rows[:, 1:]] * friction), -1)
        Dm = p.D[rows[:, 0]] / (mu * mu * (1 + mu * mu))
        T_safe = torch.where(T > 0, T, 1.0)
        N1 = V[:, 0]
        T1 = (U[:, 1:] * V[:, 1:]).sum(-1) / T_safe
        T2 = (V[:, 1:] * V[:, 1:]).sum(-1) / T_safe - T1 * T1 / T_safe
        d2 = Dm * ((N1 - mu * T1) ** 2 + (N - mu * T) * (-mu * T2))
        deriv2 = deriv2 + torch.where(middle & p.active[rows[:, 0]], d2, 0.0).sum(-1)
    return LineEval(deriv, torch.clamp(deriv2, min=math.MINVAL))


def _total_cost(p: Problem, qacc: Tensor, jar: Tensor) -> Tensor:
    gauss = 0.5 * ((p.M @ qacc - p.qfrc_smooth) * (qacc - p.qacc_smooth)).sum(-1)
    return gauss + constraint_update(p, jar).cost


def _gauss_quadratic(p: Problem, qacc: Tensor, search: Tensor) -> Tensor:
    """Coefficients (0, q1, q2) of the Gauss cost along the search: q1 alpha + q2 alpha^2 (+ const)."""
    q1 = (search * (p.M @ qacc - p.qfrc_smooth)).sum(-1)
    q2 = 0.5 * (search * (p.M @ search)).sum(-1)
    return torch.stack((torch.zeros_like(q1), q1, q2))


def _line_search(p: Problem, qacc: Tensor, jar: Tensor, search: Tensor, gtol: Tensor, iterations: int, unroll: bool,
                 early_exit: bool):
    """Exact line search along ``search``; returns (alpha, cost improvement).

    Without elliptic cones the 1-D cost is a convex piecewise quadratic: its
    minimiser is found exactly, without iterating, from the derivative at the
    breakpoints. Elliptic cones make it non-quadratic; there ``iterations``
    safeguarded Newton steps (MuJoCo's ls_iterations) stop at |derivative| < gtol.
    """
    Jv = p.J @ search
    quad_gauss = _gauss_quadratic(p, qacc, search)
    if p.cones:
        alpha = _newton_search(p, jar, Jv, quad_gauss, gtol, iterations, unroll, early_exit)
    else:
        alpha = _breakpoint_search(p, jar, Jv, quad_gauss)
    improvement = -_cost_change(p, jar, Jv, quad_gauss, alpha)
    alpha = torch.where(improvement > 0, alpha, 0.0)
    return alpha, torch.where(improvement > 0, improvement, 0.0)


def _cost_change(p: Problem, jar: Tensor, Jv: Tensor, quad_gauss: Tensor, alpha: Tensor) -> Tensor:
    """cost(alpha) - cost(0) along the search, free of cancellation where a row keeps its state.

    Near the optimum the change is far smaller than the cost itself; like
    MuJoCo's line search, rows that stay quadratic (or linear) contribute their
    change in closed form instead of a difference of two large numbers.
    """
    step = alpha * Jv
    x1 = jar + step
    quad_change = p.D * step * (jar + 0.5 * step)
    rf = p.R * p.frictionloss
    # one-sided rows (limits, contacts)
    q0, q1 = jar < 0, x1 < 0
    one_sided = torch.where(q0 & q1, quad_change, torch.where(q1, 0.5 * p.D * x1 * x1, torch.where(q0, -0.5 * p.D * jar * jar, 0.0)))

    # frictionloss rows: Huber
    def zone(x):
        return torch.where(x <= -rf, -1, torch.where(x >= rf, 1, 0))

    def huber(x):
        z = zone(x)
        return torch.where(z == 0, 0.5 * p.D * x * x, p.frictionloss * (-0.5 * rf + z * x))

    z0, z1 = zone(jar), zone(x1)
    same = z0 == z1
    friction = torch.where(same & (z0 == 0), quad_change, torch.where(same, z0 * p.frictionloss * step, huber(x1) - huber(jar)))
    change = torch.where(p.equality, quad_change, torch.where(p.friction, friction, one_sided))
    change = torch.where(p.active, change, 0.0)
    if p.cones:
        cone_rows = torch.cat([rows.reshape(-1) for rows, _, _ in p.cones])
        change = change.index_fill(0, cone_rows, 0.0)
        change_cones = constraint_update(p, x1).cone_cost - constraint_update(p, jar).cone_cost
    else:
        change_cones = 0.0
    return change.sum(-1) + change_cones + alpha * quad_gauss[1] + alpha * alpha * quad_gauss[2]


def _newton_search(
    p: Problem, jar: Tensor, Jv: Tensor, quad_gauss: Tensor, gtol: Tensor, iterations: int, unroll: bool,
    early_exit: bool,
) -> Tensor:
    """Newton steps on the derivative, kept inside the bracket [lo, hi] where it changes sign."""
    lo = torch.zeros_like(gtol)
    hi = torch.full_like(gtol, torch.inf)
    first = _line_eval(p, jar, Jv, quad_gauss, lo)
    alpha = -first.deriv / first.deriv2
    done = torch.zeros_like(gtol, dtype=torch.bool)

    def iterate(carry):
        done, lo, hi, alpha = carry
        ev = _line_eval(p, jar, Jv, quad_gauss, alpha)
        done = done | (ev.deriv.abs() < gtol)
        lo = torch.where(done | (ev.deriv >= 0), lo, alpha)
        hi = torch.where(done | (ev.deriv < 0), hi, alpha)
        newton = alpha - ev.deriv / ev.deriv2
        inside = (newton > lo) & (newton < hi)
        bisect = torch.where(torch.isinf(hi), newton, 0.5 * (lo + torch.where(torch.isinf(hi), lo, hi)))
        new_alpha = torch.where(inside, newton, bisect)
        done = done | (new_alpha == alpha)  # converged to rounding
        return done, lo, hi, torch.where(done, alpha, new_alpha)

    return bounded_loop(iterate, (done, lo, hi, alpha), max(iterations - 1, 1), unroll, early_exit)[3]


def _row_slopes(p: Problem, jar: Tensor, Jv: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """Each (cone-free) row's cost derivative along the search, const + coef * alpha, in the zone x lies in.

    jar, Jv: [nefc]; x: [..., nefc] the rows' values at the probe. Returns (const, coef) [..., nefc].
    """
    rf = p.R * p.frictionloss
    quadratic = torch.where(p.equality, True, torch.where(p.friction, (x > -rf) & (x < rf), x < 0)) & p.active
    linear = p.friction & p.active & ~quadratic
    const = torch.where(quadratic, p.D * jar * Jv, torch.where(linear, torch.sign(x) * p.frictionloss * Jv, 0.0))
    coef = torch.where(quadratic, p.D * Jv * Jv, 0.0)
    return const, coef


def _breakpoint_search(p: Problem, jar: Tensor, Jv: Tensor, quad_gauss: Tensor) -> Tensor:
    """Exact minimiser of a convex piecewise-quadratic 1-D cost, in O(nefc log nefc).

    The derivative is continuous and piecewise linear with kinks where a row
    changes zone (x = 0 for limits and contacts, x = +-R f for frictionloss).
    Sort the kinks ahead and sweep them with running sums of how each crossing
    changes the derivative's coefficients; the minimiser is the root of the
    piece that ends at the first kink where the derivative turns non-negative.
    That piece's coefficients are then summed afresh, free of the running sums'
    rounding.
    """
    moving = p.active & (Jv != 0)
    Jv_safe = torch.where(moving, Jv, 1.0)
    rf = p.R * p.frictionloss
    one_sided = ~p.equality & ~p.friction
    quad_const, quad_coef = p.D * jar * Jv, p.D * Jv * Jv  # slope of a row in its quadratic zone
    linear = p.frictionloss * Jv  # slope of a frictionloss row above +R f
    kinks = torch.cat((
        torch.where(moving & one_sided, -jar / Jv_safe, -1.0),
        torch.where(moving & p.friction, (rf - jar) / Jv_safe, -1.0),
        torch.where(moving & p.friction, (-rf - jar) / Jv_safe, -1.0),
    ))
    # change of the slope's (const, coef) as x passes the kink upwards; sign(Jv) says which way it passes
    up = torch.sign(Jv).repeat(3)
    d_const = up * torch.cat((-quad_const, linear - quad_const, quad_const + linear))
    d_coef = up * torch.cat((-quad_coef, -quad_coef, quad_coef))
    ahead = kinks > 0
    kinks, order = torch.sort(torch.where(ahead, kinks, torch.inf))
    d_const = torch.where(ahead, d_const, 0.0).gather(-1, order)
    d_coef = torch.where(ahead, d_coef, 0.0).gather(-1, order)
    finite = torch.isfinite(kinks)

    # piece j runs from kink j-1 (or 0) to kink j (or infinity): [n + 1]
    starts = torch.cat((torch.zeros_like(kinks[:1]), torch.where(finite, kinks, 0.0)))
    first_probe = torch.where(finite[0], 0.5 * kinks[0], 1.0)
    const0, coef0 = _row_slopes(p, jar, Jv, jar + first_probe * Jv)
    const = const0.sum(-1) + quad_gauss[1] + torch.cat((torch.zeros_like(kinks[:1]), torch.cumsum(d_const, -1)))
    coef = coef0.sum(-1) + 2 * quad_gauss[2] + torch.cat((torch.zeros_like(kinks[:1]), torch.cumsum(d_coef, -1)))
    # derivative at each kink, from the piece that ends there (it is continuous)
    at_kink = const[:-1] + coef[:-1] * starts[1:]
    turns = finite & (at_kink >= 0)
    stop = torch.where(turns.any(-1), turns.long().argmax(-1), finite.long().sum(-1))
    a0 = starts.gather(-1, stop[None])[0]
    a1 = kinks.gather(-1, torch.clamp(stop, max=kinks.shape[-1] - 1)[None])[0]
    mid = torch.where(stop < finite.long().sum(-1), 0.5 * (a0 + a1), a0 + 1)
    piece_const, piece_coef = _row_slopes(p, jar, Jv, jar + mid * Jv)
    curvature = torch.clamp(piece_coef.sum(-1) + 2 * quad_gauss[2], min=math.MINVAL)
    alpha = -(piece_const.sum(-1) + quad_gauss[1]) / curvature
    # not a descent direction: the derivative at 0 is already non-negative
    return torch.where(const0.sum(-1) + quad_gauss[1] >= 0, 0.0, alpha)


class Settings(NamedTuple):
    """Static configuration of one solve."""

    newton: bool
    iterations: int
    ls_iterations: int
    early_exit: bool  # stop iterating once converged (Model.early_exit)
    warmstart: bool
    ne: int
    nf: int


class Inputs(NamedTuple):
    """Everything the solve reads, as tensors (what its gradient flows to)."""

    M: Tensor  # [nv, nv]
    M_chol: Tensor  # [nv, nv] Cholesky factor of M
    qfrc_smooth: Tensor  # [nv]
    qacc_smooth: Tensor  # [nv]
    qacc_warmstart: Tensor  # [nv]
    J: Tensor  # [nefc, nv]
    aref: Tensor  # [nefc]
    D: Tensor  # [nefc]
    R: Tensor  # [nefc]
    frictionloss: Tensor  # [nefc]
    active: Tensor  # [nefc] bool
    cone_rows: tuple  # per elliptic contact group: [k, dim] rows
    cone_friction: tuple  # per elliptic contact group: [k, 5] contact friction
    tolerance: Tensor  # []
    ls_tolerance: Tensor  # []
    meaninertia: Tensor  # []


def settings_and_inputs(m: Model, d: Data) -> tuple[Settings, Inputs]:
    """The solve of Data d: static settings and tensor inputs."""
    plan, opt = m.constraint_plan, m.opt
    groups = [g for g in plan.contacts if plan.elliptic and g.dim > 1]
    settings = Settings(
        newton=opt.solver == SolverType.NEWTON,
        iterations=opt.iterations,
        ls_iterations=opt.ls_iterations,
        early_exit=m.early_exit,
        warmstart=not opt.disabled(DisableBit.WARMSTART),
        ne=plan.ne,
        nf=plan.nf,
    )
    inputs = Inputs(
        M=d.qM,
        M_chol=d.qLD,
        qfrc_smooth=d.qfrc_smooth,
        qacc_smooth=d.qacc_smooth,
        qacc_warmstart=d.qacc_warmstart,
        J=d.efc_J,
        aref=d.efc_aref,
        D=d.efc_D,
        R=d.efc_R,
        frictionloss=d.efc_frictionloss,
        active=d.efc_active,
        cone_rows=tuple(g.row[:, None] + torch.arange(g.dim, device=m.device) for g in groups),
        cone_friction=tuple(d.contact.friction[g.slot] for g in groups),
        tolerance=opt.tolerance,
        ls_tolerance=opt.ls_tolerance,
        meaninertia=m.stat_meaninertia,
    )
    return settings, inputs


def problem(settings: Settings, x: Inputs) -> Problem:
    """The problem's data in the form the cost functions use."""
    rows = torch.arange(x.D.shape[-1], device=x.D.device)
    cones = tuple(
        (
            r,
            # friction of the regularised cone: friction[0] * sqrt(R[1] / R[0]) (contact.mu)
            f[:, 0] * torch.sqrt(x.R[r[:, 1]] / x.R[r[:, 0]]),
            f[:, : r.shape[1] - 1],
        )
        for r, f in zip(x.cone_rows, x.cone_friction)
    )
    return Problem(
        M=x.M,
        M_chol=x.M_chol,
        qfrc_smooth=x.qfrc_smooth,
        qacc_smooth=x.qacc_smooth,
        J=x.J,
        aref=x.aref,
        D=x.D,
        R=x.R,
        frictionloss=x.frictionloss,
        active=x.active,
        equality=rows < settings.ne,
        friction=(rows >= settings.ne) & (rows < settings.ne + settings.nf),
        cones=cones,
    )


def _warmstart(settings: Settings, p: Problem, qacc_warmstart: Tensor) -> Tensor:
    """qacc_warmstart if its cost beats qacc_smooth's (MuJoCo's warmstart), else qacc_smooth."""
    if not settings.warmstart:
        return p.qacc_smooth
    cost_ws = _total_cost(p, qacc_warmstart, p.J @ qacc_warmstart - p.aref)
    cost_smooth = constraint_update(p, p.J @ p.qacc_smooth - p.aref).cost
    return torch.where(cost_ws > cost_smooth, p.qacc_smooth, qacc_warmstart)


def residual(settings: Settings, x: Inputs, qacc: Tensor) -> Tensor:
    """Gradient of the cost, M qacc - qfrc_smooth - J' force: zero at the solution. [nv]"""
    p = problem(settings, x)
    force = constraint_update(p, p.J @ qacc - p.aref).force
    return p.M @ qacc - p.qfrc_smooth - p.J.transpose(-1, -2) @ force


def hessian_factor(settings: Settings, x: Inputs, qacc: Tensor) -> Tensor:
    """Cholesky factor of the Newton Hessian M + J' D J (+ cone terms) at qacc. [nv, nv]"""
    p = problem(settings, x)
    upd = constraint_update(p, p.J @ qacc - p.aref, with_hessian=True)
    return math.cholesky(_hessian(p, upd))


def solve_qacc(settings: Settings, x: Inputs, unroll: bool = False) -> Tensor:
    """The constrained acceleration: MuJoCo's Newton or CG iterations from the warm start. [nv]

    unroll: the iterations are to be differentiated through (BackwardMode.UNROLL), so they run
    as a Python loop even under torch.compile (see workarounds.bounded_loop).
    """
    p = problem(settings, x)
    newton = settings.newton
    tol = x.tolerance
    scale = 1 / (x.meaninertia * max(1, p.M.shape[-1]))

    def evaluate(qacc):
        jar = p.J @ qacc - p.aref
        upd = constraint_update(p, jar, with_hessian=newton)
        grad = p.M @ qacc - p.qfrc_smooth - p.J.transpose(-1, -2) @ upd.force
        return jar, grad, upd

    def direction(upd, grad):
        chol = math.cholesky(_hessian(p, upd)) if newton else p.M_chol
        return torch.cholesky_solve(grad[:, None], chol)[:, 0]

    qacc = _warmstart(settings, p, x.qacc_warmstart)
    jar, grad, upd = evaluate(qacc)
    mgrad_m = torch.cholesky_solve(grad[:, None], p.M_chol)[:, 0]
    gap_ok = torch.clamp(0.5 * scale * (grad * mgrad_m).sum(-1), min=0) < tol
    grad_ok = scale * math.safe_norm(grad) < tol
    done = gap_ok & grad_ok if newton else gap_ok
    mgrad = direction(upd, grad)
    if newton:
        done = done | (grad_ok & (torch.clamp(0.5 * scale * (grad * mgrad).sum(-1), min=0) < tol))

    def iterate(carry):
        done, qacc, jar, grad, mgrad, search = carry
        snorm = math.safe_norm(search)
        gtol = tol * x.ls_tolerance * snorm / scale
        alpha, improvement = _line_search(p, qacc, jar, search, gtol, settings.ls_iterations, unroll,
                                          settings.early_exit)
        stalled = (alpha == 0) | (snorm < math.MINVAL)
        new_qacc = qacc + alpha * search
        new_jar, new_grad, new_upd = evaluate(new_qacc)
        new_mgrad = direction(new_upd, new_grad)
        new_search = -new_mgrad if newton else _hager_zhang(search, grad, mgrad, new_grad, new_mgrad)
        improved = scale * improvement
        converged = ((improved > 0) & (improved < tol)) | (scale * math.safe_norm(new_grad) < tol)
        if newton:
            converged = converged | (torch.clamp(0.5 * scale * (new_grad * new_mgrad).sum(-1), min=0) < tol)
        keep = done | stalled
        return (
            keep | converged,
            torch.where(keep, qacc, new_qacc),
            torch.where(keep, jar, new_jar),
            torch.where(keep, grad, new_grad),
            torch.where(keep, mgrad, new_mgrad),
            torch.where(keep, search, new_search),
        )

    carry = (done, qacc, jar, grad, mgrad, -mgrad)
    return bounded_loop(iterate, carry, settings.iterations, unroll, settings.early_exit)[1]


def finish(settings: Settings, x: Inputs, qacc: Tensor, d: Data) -> Data:
    """Data with the solution: qacc, and the forces and states of the rows at qacc."""
    p = problem(settings, x)
    upd = constraint_update(p, p.J @ qacc - p.aref)
    return d.replace(
        qacc=qacc,
        qfrc_constraint=p.J.transpose(-1, -2) @ upd.force,
        efc_force=upd.force,
        efc_state=upd.state,
    )


def solve(m: Model, d: Data) -> Data:
    """Solve for qacc, differentiating through the iterations (BackwardMode.UNROLL)."""
    settings, inputs = settings_and_inputs(m, d)
    return finish(settings, inputs, solve_qacc(settings, inputs, unroll=True), d)


def _hager_zhang(search: Tensor, grad: Tensor, mgrad: Tensor, new_grad: Tensor, new_mgrad: Tensor) -> Tensor:
    """Conjugate direction with MuJoCo's Hager-Zhang beta, restarting when conjugacy is lost."""
    y = new_grad - grad
    My = new_mgrad - mgrad
    d_dot_y = (search * y).sum(-1)
    ok = d_dot_y >= math.MINVAL
    dy = torch.where(ok, d_dot_y, 1.0)
    beta_hz = ((y * new_mgrad).sum(-1) - 2 * ((y * My).sum(-1) / dy) * (search * new_grad).sum(-1)) / dy
    eta_k = -1.0 / torch.clamp(math.safe_norm(search) * torch.clamp(math.safe_norm(new_grad), max=0.01), min=math.MINVAL)
    beta = torch.where(ok, torch.maximum(eta_k, beta_hz), 0.0)
    return -new_mgrad + beta * search
