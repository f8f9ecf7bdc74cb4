"""Newton and CG solvers for MuJoCo's convex constraint problem (engine_solver.c).

The problem: minimise over qacc

    0.5 (qacc - qacc_smooth)' M (qacc - qacc_smooth) + s(J qacc - aref)

where s is the sum of the row costs of equality (quadratic), frictionloss
(Huber), limit and pyramidal contact (one-sided quadratic) and elliptic
contact (distance to the friction cone) constraints. Both solvers start from
MuJoCo's warm start, search along Newton (H = M + J'DJ + cone terms) or
Hager-Zhang conjugate-gradient directions, and stop with MuJoCo's tests
(improvement, gradient, Newton decrement). As in MuJoCo, each constraint
island (the kinematic trees that active rows link, ``islands``) is solved on
its own, with its own line search, iteration count and tests scaled by 1 /
trace of its M; dofs in no island keep qacc_smooth. With islands disabled
(mjDSBL_ISLAND) one island holds everything.

The line search is MuJoCo's (PrimalSearch), for both cone types: Newton steps
on the 1-D cost's slope, then a bracket, stopping at |slope| < gtol or after
``opt.ls_iterations`` evaluations. It is the only one: a model that truncates
the solver (few iterations or line-search evaluations, as MJX-era models do)
ends where MuJoCo's path ends, so only MuJoCo's search reproduces its steps.
An exact minimiser along the line would reach the same optimum when converged,
but it is not needed there either: gradients of a converged solve come from
the implicit adjoint at the optimum (residual, hessian_factor), which no line
search enters.

Loops have a fixed maximum length (``opt.iterations``, ``opt.ls_iterations``);
a converged element is frozen with ``torch.where`` so a vmapped batch gives
exactly what each element gives alone. An eager call stops as soon as every
element has converged, with the same result; under torch.compile the loop body
is traced once (workarounds.bounded_loop) and an unbatched call stops early too.

A batch can be solved two ways with the same code. Under an outer torch.vmap
(torch.vmap(diffmj.step)) every function here sees one element, and compiled
loops run their full count (torch 2.13's while_loop has no vmap rule, so
bounded_loop takes scan). With an explicit batch (solve_qacc's ``batched``, what
diffmj.step does with batched Data) the loops run over the batch, a compiled
while_loop stopping once every element is done, and the pieces between them are
mapped over it with torch.vmap (workarounds.elementwise): the start
(_solve_start), the halves of an iteration around its line search
(_iteration_start, _iteration_finish) and one line-search step
(_line_search_step). Each piece takes the batch's tensors it reads as arguments
(the Inputs as input_dims lays them out): torch.vmap would see a closed-over
batch whole. Unbatched, the same pieces run unmapped.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import Tensor

from diffmj import math
from diffmj.types import ConstraintState, Data, DisableBit, Model, SolverType
from diffmj.workarounds import bounded_loop, elementwise


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
    equality: Tensor | None  # [nefc] bool; None: no equality rows
    friction: Tensor | None  # [nefc] bool, frictionloss rows; None: none
    cones: tuple  # per elliptic contact group: (rows [k, dim], mu [k], friction [k, dim - 1])
    island_dofs: Tensor  # [K, nv] 1 where the dof is in island k (islands())
    island_rows: Tensor  # [K, nefc] 1 where the row is in island k


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


def _by_kind(p: Problem, equality, frictionloss, one_sided) -> tuple:
    """Each row's values from its kind's function: equality, frictionloss, or else one-sided (limits and
    contacts). Each function is called without arguments and returns a tuple of values over the rows
    (one_sided's tensors give the layout, the others broadcast to it). Equality and frictionloss are not
    evaluated (nor traced) for a model without such rows."""
    values = one_sided()
    for rows, kind in ((p.friction, frictionloss), (p.equality, equality)):
        if rows is not None:
            values = tuple(torch.where(rows, new, old) for new, old in zip(kind(), values))
    return values


def _frictionloss_update(jar: Tensor, force: Tensor, cost: Tensor, R: Tensor, floss: Tensor) -> tuple:
    """(force, state, cost) of frictionloss rows: Huber, linear beyond |jar| >= R floss, force and cost
    (a quadratic row's) inside."""
    rf = R * floss
    neg, pos = jar <= -rf, jar >= rf
    state = torch.where(
        neg, ConstraintState.LINEARNEG, torch.where(pos, ConstraintState.LINEARPOS, ConstraintState.QUADRATIC))
    return (torch.where(neg, floss, torch.where(pos, -floss, force)), state,
            torch.where(neg, -0.5 * rf * floss - floss * jar, torch.where(pos, -0.5 * rf * floss + floss * jar, cost)))


def _one_sided_update(jar: Tensor, force: Tensor, cost: Tensor) -> tuple:
    """(force, state, cost) of limit and contact rows: a quadratic row's force and cost where violated
    (jar < 0), else none."""
    violated = jar < 0
    state = torch.where(violated, ConstraintState.QUADRATIC, ConstraintState.SATISFIED)
    return torch.where(violated, force, 0.0), state, torch.where(violated, cost, 0.0)


def constraint_update(p: Problem, jar: Tensor, with_hessian: bool = False) -> Update:
    """Forces, states and cost of every row at residual jar = J qacc - aref."""
    D = p.D
    quadratic = (-D * jar, int(ConstraintState.QUADRATIC), 0.5 * D * jar * jar)  # (force, state, cost)
    force, state, cost = _by_kind(
        p, lambda: quadratic, lambda: _frictionloss_update(jar, quadratic[0], quadratic[2], p.R, p.frictionloss),
        lambda: _one_sided_update(jar, quadratic[0], quadratic[2]))

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


class ConeLine(NamedTuple):
    """One elliptic cone group along the search (PrimalPrepare), in the rescaled coordinates
    U = jar * (mu, friction), V = Jv * (mu, friction) of MuJoCo's circular cone. Each [k]."""

    U0: Tensor  # normal component of U
    V0: Tensor  # normal component of V
    UU: Tensor  # |tangential U|^2
    UV: Tensor  # tangential U . V
    VV: Tensor  # |tangential V|^2
    Dm: Tensor  # D0 / (mu^2 (1 + mu^2)): the cone zone's stiffness
    mu: Tensor
    # the bottom zone's cost 0.5 sum D x^2 is q0 + q1 alpha + q2 alpha^2 (three tensors: scan refuses aliases)
    q0: Tensor
    q1: Tensor
    q2: Tensor
    active: Tensor  # bool
    island: Tensor  # [K, k] 1 where the cone is in island k


class Line(NamedTuple):
    """The cost along one search direction, prepared once per line search (PrimalPrepare); each
    island k has its own line, of step alpha[k]."""

    jar: Tensor  # [nefc] J qacc - aref at alpha = 0
    Jv: Tensor  # [nefc] J search
    scalar: Tensor  # [nefc] bool: active rows outside elliptic cones
    gauss1: Tensor  # [K] the island's Gauss cost changes by gauss1 alpha + gauss2 alpha^2
    gauss2: Tensor  # [K]
    cones: tuple  # per elliptic cone group: ConeLine


class LinePoint(NamedTuple):
    """One evaluation of the line cost (mjPrimalPnt) of each island; fields [..., K] like alpha."""

    alpha: Tensor
    cost: Tensor  # cost(alpha) - cost(0)
    slope: Tensor  # d cost / d alpha
    curvature: Tensor  # d2 cost / d alpha2, MINVAL where not positive (as MuJoCo)


def _total_cost(p: Problem, qacc: Tensor, jar: Tensor) -> Tensor:
    gauss = 0.5 * ((p.M @ qacc - p.qfrc_smooth) * (qacc - p.qacc_smooth)).sum(-1)
    return gauss + constraint_update(p, jar).cost


def _pick(condition: Tensor, a: LinePoint, b: LinePoint) -> LinePoint:
    """a where condition holds, else b, field by field."""
    return LinePoint(*(torch.where(condition, x, y) for x, y in zip(a, b)))


def _prepare_line(p: Problem, qacc: Tensor, jar: Tensor, search: Tensor) -> Line:
    Jv = p.J @ search
    gauss1 = p.island_dofs @ (search * (p.M @ qacc - p.qfrc_smooth))
    gauss2 = 0.5 * (p.island_dofs @ (search * (p.M @ search)))
    # a copy: under an explicit batch a vmapped piece returning p.active gives a view of the batch's, and the
    # line search's while_loop refuses inputs that alias one another
    scalar = p.active.clone()
    cones = []
    for rows, mu, friction in p.cones:
        scalar = scalar.index_fill(0, rows.reshape(-1), False)
        scale = torch.cat((mu[:, None], friction), -1)
        U, V = jar[rows] * scale, Jv[rows] * scale
        D = p.D[rows]
        cones.append(ConeLine(
            U0=U[:, 0], V0=V[:, 0], UU=(U[:, 1:] ** 2).sum(-1), UV=(U[:, 1:] * V[:, 1:]).sum(-1),
            VV=(V[:, 1:] ** 2).sum(-1), Dm=D[:, 0] / (mu * mu * (1 + mu * mu)), mu=mu,
            q0=0.5 * (jar[rows] * D * jar[rows]).sum(-1), q1=(Jv[rows] * D * jar[rows]).sum(-1),
            q2=0.5 * (Jv[rows] * D * Jv[rows]).sum(-1),
            active=p.active[rows[:, 0]], island=p.island_rows[:, rows[:, 0]]))
    return Line(jar, Jv, scalar, gauss1, gauss2, tuple(cones))


def _cone_zone(N: Tensor, Tsqr: Tensor, mu: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(top, bottom, T) of a cone at normal N and squared tangential Tsqr (the middle zone is neither)."""
    tangent = Tsqr > 0
    T = torch.where(tangent, torch.sqrt(torch.where(tangent, Tsqr, 1.0)), 0.0)
    top = torch.where(tangent, N >= mu * T, N >= 0)
    bottom = ~top & torch.where(tangent, mu * N + T <= 0, N < 0)
    return top, bottom, T


def _cone_point(c: ConeLine, alpha: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(cost change, slope, curvature) of each cone [..., k] at its step alpha [..., k] (ellipticCostDif).

    Each pair of zones has its own closed form: where both ends lie in the same zone the
    change is computed directly, free of the cancellation of two costs.
    """
    q0, q1, q2 = c.q0, c.q1, c.q2
    top0, bottom0, T0 = _cone_zone(c.U0, c.UU, c.mu)
    N = c.U0 + alpha * c.V0
    Tsqr = c.UU + alpha * (2 * c.UV + alpha * c.VV)
    top, bottom, T = _cone_zone(N, Tsqr, c.mu)
    middle = ~top & ~bottom
    r0, r = c.U0 - c.mu * T0, N - c.mu * T
    dq = alpha * (alpha * q2 + q1)
    both_middle = ~top0 & ~bottom0 & middle
    dr = alpha * c.V0 - c.mu * alpha * (2 * c.UV + alpha * c.VV) / torch.where(both_middle, T + T0, 1.0)
    from_top = torch.where(top, 0.0, torch.where(bottom, dq + q0, 0.5 * c.Dm * r * r))
    from_bottom = torch.where(top, -q0, torch.where(bottom, dq, dq - 0.5 * c.Dm * (c.mu * N + T) ** 2))
    from_middle = torch.where(
        top, -0.5 * c.Dm * r0 * r0,
        torch.where(bottom, dq + 0.5 * c.Dm * (c.mu * c.U0 + T0) ** 2, 0.5 * c.Dm * dr * (2 * r0 + dr)))
    cost = torch.where(top0, from_top, torch.where(bottom0, from_bottom, from_middle))

    T_safe = torch.where(middle, T, 1.0)
    N1 = c.V0
    T1 = (c.UV + alpha * c.VV) / T_safe
    T2 = c.VV / T_safe - (c.UV + alpha * c.VV) * T1 / (T_safe * T_safe)
    slope = torch.where(bottom, 2 * alpha * q2 + q1, torch.where(middle, c.Dm * r * (N1 - c.mu * T1), 0.0))
    curvature = torch.where(
        bottom, 2 * q2, torch.where(middle, c.Dm * ((N1 - c.mu * T1) ** 2 - r * c.mu * T2), 0.0))
    return tuple(torch.where(c.active, x, 0.0) for x in (cost, slope, curvature))


def _frictionloss_line(x: Tensor, jar: Tensor, Jv: Tensor, D: Tensor, R: Tensor, floss: Tensor,
                       curvature: Tensor) -> tuple:
    """(cost change, slope, curvature) of frictionloss rows from jar to x = jar + a Jv: Huber, in zones
    -1 (x <= -R floss), 0 (quadratic: a quadratic row's curvature) and +1 (x >= R floss)."""
    rf = R * floss

    def zone(v):
        return torch.where(v <= -rf, -1, torch.where(v >= rf, 1, 0))

    def huber(v, z):
        return torch.where(z == 0, 0.5 * D * v * v, floss * (-0.5 * rf + z * v))

    z0, z = zone(jar), zone(x)
    change = torch.where(
        z0 == z, torch.where(z == 0, 0.5 * D * (x - jar) * (x + jar), z * floss * (x - jar)), huber(x, z) - huber(jar, z0))
    return change, torch.where(z == 0, D * x * Jv, z * floss * Jv), torch.where(z == 0, curvature, 0.0)


def _one_sided_line(x: Tensor, jar: Tensor, q0: Tensor, quadratic: tuple) -> tuple:
    """(cost change, slope, curvature) of limit and scalar contact rows from jar to x: the cost goes from
    cost0 (q0, a quadratic row's cost, where jar < 0, else 0) to a quadratic row's cost where x < 0, else
    to 0; slope and curvature are a quadratic row's (``quadratic``) where x < 0, else 0."""
    cost0 = torch.where(jar < 0, q0, 0.0)
    change, slope, curvature = quadratic
    violated = x < 0
    return (torch.where(violated, q0 - cost0 + change, -cost0), torch.where(violated, slope, 0.0),
            torch.where(violated, curvature, 0.0))


def _line_point(p: Problem, line: Line, alpha: Tensor) -> LinePoint:
    """The line cost of each island at its alpha [..., K] (PrimalEval): its change from alpha = 0 and two
    derivatives, [..., K] each."""
    a = alpha @ p.island_rows  # [..., nefc] each row's step: its island's
    jar, Jv, D = line.jar, line.Jv, p.D
    x = jar + a * Jv
    q0, q1, q2 = 0.5 * jar * D * jar, Jv * D * jar, 0.5 * Jv * D * Jv  # a row's quadratic in a
    quadratic = (a * (a * q2 + q1), 2 * a * q2 + q1, 2 * q2)  # (cost change, slope, curvature)
    change, slope, curvature = _by_kind(
        p, lambda: quadratic, lambda: _frictionloss_line(x, jar, Jv, D, p.R, p.frictionloss, quadratic[2]),
        lambda: _one_sided_line(x, jar, q0, quadratic))
    rows_to_islands = p.island_rows.transpose(-1, -2)
    cost, slope, curvature = (torch.where(line.scalar, v, 0.0) @ rows_to_islands for v in (change, slope, curvature))
    for (rows, _, _), cone in zip(p.cones, line.cones):
        parts = _cone_point(cone, a[..., rows[:, 0]])
        cost, slope, curvature = (total + part @ cone.island.transpose(-1, -2)
                                  for total, part in zip((cost, slope, curvature), parts))
    cost = cost + alpha * alpha * line.gauss2 + alpha * line.gauss1
    slope = slope + 2 * alpha * line.gauss2 + line.gauss1
    curvature = curvature + 2 * line.gauss2
    return LinePoint(alpha, cost, slope, torch.where(curvature > 0, curvature, math.MINVAL))


def _no_step(like: Tensor) -> LinePoint:
    """alpha = 0 (what MuJoCo returns when no point improves), with curvature 1 so that a Newton step
    from it is finite: a finished island's values still pass through the masked evaluations, whose
    per-island sums (matmuls) would spread a NaN to every island. Four tensors: scan refuses aliased carries."""
    zero = (like * 0.0 for _ in range(3))  # laid out like ``like``: see _line_search's carry
    return LinePoint(*zero, like * 0.0 + 1.0)


def _newton(point: LinePoint) -> Tensor:
    """The step of a Newton iteration on the slope from point."""
    return point.alpha - point.slope / point.curvature


def _update_bracket(end: LinePoint, candidates: tuple[LinePoint, ...]) -> tuple[LinePoint, Tensor]:
    """(end moved to each candidate in turn whose slope has end's sign and is closer to 0, whether it moved)."""
    moved = torch.zeros_like(end.slope, dtype=torch.bool)
    for c in candidates:
        closer = ((end.slope < 0) & (c.slope < 0) & (end.slope < c.slope)) | (
            (end.slope > 0) & (c.slope > 0) & (end.slope > c.slope))
        end, moved = _pick(closer, c, end), moved | closer
    return end, moved


def _line_search_start(p: Problem, qacc: Tensor, jar: Tensor, search: Tensor, gtol: Tensor,
                       snorm: Tensor) -> tuple[tuple, tuple]:
    """MuJoCo's line search (PrimalSearch) along ``search``: its constants (line, forward, gtol) and the
    carry of its loop (_line_search_step), whose fields 3:7 hold the point it stops at.

    A Newton step from alpha = 0; while the slope keeps its sign (and |slope| >= gtol), Newton
    steps onward; then a bracket [p1, p2] around the sign change, narrowed by each end's
    Newton point and the midpoint. It stops at the first point with |slope| < gtol (in the
    bracket: the cheapest such point), or when ``ls_iterations`` evaluations are spent, with
    the point MuJoCo returns then: the last Newton point while still one-sided, the cheaper
    improving end of the bracket (alpha = 0 if neither improves), or the midpoint when the
    bracket cannot move. Every evaluation counts, as MuJoCo counts them. Each island searches
    its own line (gtol, snorm and the result: [K]), as MuJoCo solves each island on its own.
    Every evaluation spends the budget, so max(ls_iterations - 1, 1) steps reach a result.
    """
    line = _prepare_line(p, qacc, jar, search)
    p0 = _line_point(p, line, torch.zeros_like(gtol))
    p1 = _line_point(p, line, _newton(p0))
    tiny = snorm < math.MINVAL
    done = tiny | ((p1.slope.abs() < gtol) & ((p1.alpha == 0) | (p1.cost < 0)))
    p1 = _pick(tiny, _no_step(gtol), p1)  # a finished search's result is kept in p1
    forward = p1.slope < 0  # the direction of the first step: towards larger alpha
    # carries computed from gtol and done, not made by zeros_like: under compiled vmap a carry made
    # afresh may be laid out otherwise than the body's outputs where it has a size-1 dimension (one
    # island), which the while_loop that inductor lowers scan to refuses
    bracketing = done & ~done
    evaluations = (gtol * 0.0).long() + 2
    carry = (done, bracketing, evaluations, *p1, *p0, *_no_step(gtol), *_no_step(gtol))  # p*_next: set when bracketing
    return (line, forward, gtol), carry


def _line_search_step(p: Problem, ls_iterations: int, consts: tuple, carry: tuple) -> tuple:
    """One evaluation (two when narrowing a bracket) of the line search started by _line_search_start."""
    line, forward, gtol = consts
    done, bracketing, evaluations = carry[:3]
    p1, p2, p1_next, p2_next = (LinePoint(*carry[3 + 4 * i: 7 + 4 * i]) for i in range(4))
    budget = evaluations < ls_iterations
    # one evaluation: the Newton point from p1 (one-sided) or the bracket's midpoint
    trial = _line_point(p, line, torch.where(bracketing, 0.5 * (p1.alpha + p2.alpha), _newton(p1)))

    # one-sided: step on while the slope keeps its sign, else start the bracket from p1
    descending = torch.where(forward, p1.slope <= -gtol, p1.slope >= gtol)
    onward = ~done & ~bracketing & descending & budget
    opening = ~done & ~bracketing & ~onward & budget
    found = onward & (trial.slope.abs() < gtol) & (trial.cost < 0)
    finished = found | (~done & ~bracketing & ~budget)  # out of evaluations: the last Newton point

    # bracketed: the cheapest of the candidates with a small slope, else narrow the bracket
    narrowing = ~done & bracketing & budget
    candidates = (p1_next, p2_next, trial)
    best, small = _no_step(gtol), torch.zeros_like(done)
    for c in candidates:
        take = (c.slope.abs() < gtol) & (~small | (c.cost < best.cost))
        best, small = _pick(take, c, best), small | take
    new_p1, moved1 = _update_bracket(p1, candidates)
    new_p2, moved2 = _update_bracket(p2, candidates)
    next_points = _line_point(p, line, torch.stack((_newton(new_p1), _newton(new_p2))))
    converged = narrowing & small
    stuck = narrowing & ~small & ~moved1 & ~moved2  # rounding stops the bracket: the midpoint
    moving = narrowing & ~small
    p1_better = (p1.cost <= p2.cost) & (p1.cost < 0)
    exhausted = ~done & bracketing & ~budget
    spent_end = _pick(p1_better, p1, _pick((p2.cost <= p1.cost) & (p2.cost < 0), p2, _no_step(gtol)))

    result = _pick(converged, best, _pick(stuck, trial, spent_end))
    p1_out = _pick(onward, trial, _pick(converged | stuck | exhausted, result, _pick(moving, new_p1, p1)))
    p2_out = _pick(onward, p1, _pick(moving, new_p2, p2))
    p1_next_out = _pick(opening, trial, _pick(moving & moved1, _index(next_points, 0), p1_next))
    p2_next_out = _pick(opening, p1, _pick(moving & moved2, _index(next_points, 1), p2_next))
    evaluations = evaluations + (onward | opening | narrowing).long() + (moving & moved1).long() + (
        moving & moved2).long()
    done = done | finished | converged | stuck | exhausted
    return (done, bracketing | opening, evaluations, *p1_out, *p2_out, *p1_next_out, *p2_next_out)


def _index(point: LinePoint, i: int) -> LinePoint:
    """The i-th of a point evaluated at several alphas [n, K]."""
    return LinePoint(*(x[i] for x in point))


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
    island_dofs: Tensor  # [K, nv] islands(): 1 where the dof is in island k
    island_rows: Tensor  # [K, nefc] 1 where the row is in island k


def islands(m: Model, d: Data) -> tuple[Tensor, Tensor]:
    """MuJoCo's constraint islands (mj_island) as masks: (dofs [K, nv], rows [K, nefc]).

    Kinematic trees that active rows link are one island; island k holds the trees whose
    lowest-numbered linked tree is k (K = ntree slots, empty ones hold nothing). Dofs of
    trees without constraints belong to no island: MuJoCo leaves them at qacc_smooth. With
    islands disabled (mjDSBL_ISLAND), one island holds every dof and row.
    """
    plan = m.constraint_plan
    dtype = d.efc_J.dtype
    if not plan.islands:
        return (torch.ones((1, d.efc_J.shape[-1]), dtype=dtype, device=m.device),
                torch.ones((1, plan.nefc), dtype=dtype, device=m.device))
    from_J = ((d.efc_J != 0).to(dtype) @ plan.dof_tree) > 0
    touches = torch.where(plan.efc_tree_from_J[:, None], from_J, plan.efc_tree > 0) & d.efc_active[:, None]
    touches = touches.to(dtype)  # [nefc, ntree]
    linked = (touches.transpose(-1, -2) @ touches) > 0  # [ntree, ntree]; the diagonal: constrained trees
    ntree = linked.shape[-1]
    reach = linked
    for _ in range(max(ntree - 1, 1).bit_length()):  # transitive closure by squaring: paths up to ntree - 1
        reach = (reach.to(dtype) @ reach.to(dtype)) > 0
    tree = torch.arange(ntree, device=m.device)
    lowest = torch.where(reach, tree, ntree).amin(-1)  # each tree's island: its lowest linked tree
    member = ((lowest == tree[:, None]) & torch.diagonal(linked, dim1=-2, dim2=-1)).to(dtype)  # [K, ntree]
    return member @ plan.dof_tree.transpose(-1, -2), ((member @ touches.transpose(-1, -2)) > 0).to(dtype)


def _elliptic_groups(m: Model) -> list:
    plan = m.constraint_plan
    return [g for g in plan.contacts if plan.elliptic and g.dim > 1]


def input_dims(ncone_groups: int) -> Inputs:
    """torch.vmap's in_dims (out_dims) of a batch of Inputs with ncone_groups elliptic groups: the
    model's cone rows and tolerances are shared by the batch, everything else has it first."""
    shared = {"cone_rows": None, "tolerance": None, "ls_tolerance": None}
    return Inputs(*(shared.get(field, 0) for field in Inputs._fields))


def _inputs(m: Model, d: Data) -> Inputs:
    groups = _elliptic_groups(m)
    island_dofs, island_rows = islands(m, d)
    return Inputs(
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
        tolerance=m.opt.tolerance,
        ls_tolerance=m.opt.ls_tolerance,
        island_dofs=island_dofs,
        island_rows=island_rows,
    )


def settings_and_inputs(m: Model, d: Data, batched: bool = False) -> tuple[Settings, Inputs]:
    """The solve of Data d (batched: of a batch [B], Inputs laid out as input_dims says): static
    settings and tensor inputs."""
    plan, opt = m.constraint_plan, m.opt
    settings = Settings(
        newton=opt.solver == SolverType.NEWTON,
        iterations=opt.iterations,
        ls_iterations=opt.ls_iterations,
        early_exit=m.early_exit,
        warmstart=not opt.disabled(DisableBit.WARMSTART),
        ne=plan.ne,
        nf=plan.nf,
    )
    dims = input_dims(len(_elliptic_groups(m)))
    return settings, elementwise(_inputs, batched, (None, 0), dims)(m, d)


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
        equality=rows < settings.ne if settings.ne else None,
        friction=(rows >= settings.ne) & (rows < settings.ne + settings.nf) if settings.nf else None,
        cones=cones,
        island_dofs=x.island_dofs,
        island_rows=x.island_rows,
    )


def _warmstart(settings: Settings, p: Problem, qacc_warmstart: Tensor) -> Tensor:
    """qacc_warmstart if its cost beats qacc_smooth's (MuJoCo's warmstart), else qacc_smooth; qacc_smooth
    at dofs in no island."""
    if not settings.warmstart:
        return p.qacc_smooth
    cost_ws = _total_cost(p, qacc_warmstart, p.J @ qacc_warmstart - p.aref)
    cost_smooth = constraint_update(p, p.J @ p.qacc_smooth - p.aref).cost
    qacc = torch.where(cost_ws > cost_smooth, p.qacc_smooth, qacc_warmstart)
    return torch.where(p.island_dofs.sum(0) > 0, qacc, p.qacc_smooth)  # dofs in no island: unconstrained


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


def _dot(p: Problem, a: Tensor, b: Tensor) -> Tensor:
    """a . b over each island's dofs. [K]"""
    return p.island_dofs @ (a * b)


def _norm(p: Problem, a: Tensor) -> Tensor:
    return math.safe_sqrt(_dot(p, a, a))


def _evaluate(p: Problem, newton: bool, qacc: Tensor) -> tuple[Tensor, Tensor, Update]:
    """(jar, cost gradient, constraint update) at qacc."""
    jar = p.J @ qacc - p.aref
    upd = constraint_update(p, jar, with_hessian=newton)
    grad = p.M @ qacc - p.qfrc_smooth - p.J.transpose(-1, -2) @ upd.force
    return jar, grad, upd


def _direction(p: Problem, newton: bool, upd: Update, grad: Tensor) -> Tensor:
    """The preconditioned gradient: H^-1 grad (Newton) or M^-1 grad (CG)."""
    chol = math.cholesky(_hessian(p, upd)) if newton else p.M_chol
    return torch.cholesky_solve(grad[:, None], chol)[:, 0]


def _solve_start(settings: Settings, x: Inputs) -> tuple[Tensor, tuple]:
    """(scale [K]: 1 / trace of each island's M, the iterations' carry) at the warm start."""
    p, newton, tol = problem(settings, x), settings.newton, x.tolerance
    inertia = p.island_dofs @ torch.diagonal(p.M, dim1=-2, dim2=-1)
    empty = inertia == 0  # an island slot without dofs: nothing to solve
    scale = 1 / torch.where(empty, 1.0, inertia)
    qacc = _warmstart(settings, p, x.qacc_warmstart)
    jar, grad, upd = _evaluate(p, newton, qacc)
    mgrad_m = torch.cholesky_solve(grad[:, None], p.M_chol)[:, 0]
    gap_ok = torch.clamp(0.5 * scale * _dot(p, grad, mgrad_m), min=0) < tol
    grad_ok = scale * _norm(p, grad) < tol
    done = gap_ok & grad_ok if newton else gap_ok
    mgrad = _direction(p, newton, upd, grad)
    if newton:
        done = done | (grad_ok & (torch.clamp(0.5 * scale * _dot(p, grad, mgrad), min=0) < tol))
    return scale, (done | empty, qacc, jar, grad, mgrad, -mgrad)


def _iteration_start(settings: Settings, x: Inputs, scale: Tensor, carry: tuple) -> tuple[tuple, tuple]:
    """The first half of an iteration: the line search's constants and carry (_line_search_start)."""
    p = problem(settings, x)
    _, qacc, jar, _, _, search = carry
    snorm = _norm(p, search)
    gtol = x.tolerance * x.ls_tolerance * snorm / scale
    return _line_search_start(p, qacc, jar, search, gtol, snorm)


def _iteration_finish(settings: Settings, x: Inputs, scale: Tensor, carry: tuple, ls_carry: tuple) -> tuple:
    """The second half of an iteration: the step to the line search's point, the new direction and tests."""
    p, newton, tol = problem(settings, x), settings.newton, x.tolerance
    done, qacc, jar, grad, mgrad, search = carry
    step = LinePoint(*ls_carry[3:7])
    stalled = step.alpha == 0  # MuJoCo stops an island when its line search returns no step
    keep = done | stalled
    alpha = torch.where(keep, 0.0, step.alpha)
    new_qacc = qacc + (alpha @ p.island_dofs) * search
    new_jar, new_grad, new_upd = _evaluate(p, newton, new_qacc)
    new_mgrad = _direction(p, newton, new_upd, new_grad)
    if newton:
        new_search = -new_mgrad
    else:
        new_search = _hager_zhang(p, search, grad, mgrad, new_grad, new_mgrad)
    improved = -scale * step.cost
    converged = ((improved > 0) & (improved < tol)) | (scale * _norm(p, new_grad) < tol)
    if newton:
        converged = converged | (torch.clamp(0.5 * scale * _dot(p, new_grad, new_mgrad), min=0) < tol)
    # dofs and rows of islands that move (rows in no island are inactive: either value serves)
    moves = ((~keep).to(qacc.dtype) @ p.island_dofs) > 0
    rows_move = ((~keep).to(qacc.dtype) @ p.island_rows) > 0
    return (
        keep | converged,
        torch.where(moves, new_qacc, qacc),
        torch.where(rows_move, new_jar, jar),
        torch.where(moves, new_grad, grad),
        torch.where(moves, new_mgrad, mgrad),
        torch.where(moves, new_search, search),
    )


def solve_qacc(settings: Settings, x: Inputs, unroll: bool = False, batched: bool = False) -> Tensor:
    """The constrained acceleration: MuJoCo's Newton or CG iterations from the warm start. [nv]

    Each island (islands()) is solved on its own, as MuJoCo solves them: its own line search,
    stopping tests scaled by 1 / trace of its M, and iteration count. The Newton and CG
    directions need no splitting: M and J'DJ couple no two islands.

    unroll: the iterations are to be differentiated through (BackwardMode.UNROLL), so they run
    as a Python loop even under torch.compile (see workarounds.bounded_loop).

    batched: x holds a batch [B, ...] (as batched_inputs lays it out) and the result is [B, nv].
    The loops (iterations, and each iteration's line search) run over the whole batch, until every
    element is done, and the pieces between them (start, the halves of an iteration, one line-search
    step) are mapped over the batch with torch.vmap; unbatched, the same pieces run as they are.
    """
    dims = input_dims(len(x.cone_rows))

    def each(piece, *dims_after_x):
        """piece(settings, x, *args) of one element, over the batch where batched."""
        return elementwise(functools.partial(piece, settings), batched, (dims, *dims_after_x))

    def line_search_step(x, consts, ls_carry):
        return _line_search_step(problem(settings, x), settings.ls_iterations, consts, ls_carry)

    scale, carry = each(_solve_start)(x)

    def iterate(carry):
        consts, ls_carry = each(_iteration_start, 0, 0)(x, scale, carry)
        step = elementwise(line_search_step, batched, (dims, 0, 0))
        ls_carry = bounded_loop(lambda c: step(x, consts, c), ls_carry, max(settings.ls_iterations - 1, 1),
                                unroll, settings.early_exit)
        return each(_iteration_finish, 0, 0, 0)(x, scale, carry, ls_carry)

    return bounded_loop(iterate, carry, settings.iterations, unroll, settings.early_exit)[1]


def _finish(settings: Settings, x: Inputs, qacc: Tensor, d: Data) -> Data:
    p = problem(settings, x)
    upd = constraint_update(p, p.J @ qacc - p.aref)
    return d.replace(
        qacc=qacc,
        qfrc_constraint=p.J.transpose(-1, -2) @ upd.force,
        efc_force=upd.force,
        efc_state=upd.state,
    )


def finish(settings: Settings, x: Inputs, qacc: Tensor, d: Data, batched: bool = False) -> Data:
    """Data with the solution: qacc, and the forces and states of the rows at qacc (batched: of a batch)."""
    dims = input_dims(len(x.cone_rows))
    return elementwise(functools.partial(_finish, settings), batched, (dims, 0, 0))(x, qacc, d)


def solve(m: Model, d: Data, batched: bool = False) -> Data:
    """Solve for qacc, differentiating through the iterations (BackwardMode.UNROLL)."""
    settings, inputs = settings_and_inputs(m, d, batched)
    return finish(settings, inputs, solve_qacc(settings, inputs, unroll=True, batched=batched), d, batched)


def _hager_zhang(p: Problem, search: Tensor, grad: Tensor, mgrad: Tensor, new_grad: Tensor,
                 new_mgrad: Tensor) -> Tensor:
    """Conjugate direction with MuJoCo's Hager-Zhang beta (one per island), restarting when conjugacy
    is lost."""
    y = new_grad - grad
    My = new_mgrad - mgrad
    d_dot_y = _dot(p, search, y)
    ok = d_dot_y >= math.MINVAL
    dy = torch.where(ok, d_dot_y, 1.0)
    beta_hz = (_dot(p, y, new_mgrad) - 2 * (_dot(p, y, My) / dy) * _dot(p, search, new_grad)) / dy
    eta_k = -1.0 / torch.clamp(_norm(p, search) * torch.clamp(_norm(p, new_grad), max=0.01), min=math.MINVAL)
    beta = torch.where(ok, torch.maximum(eta_k, beta_hz), 0.0)
    return -new_mgrad + (beta @ p.island_dofs) * search
