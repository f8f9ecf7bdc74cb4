"""MuJoCo's noslip post-processor of the constraint forces (mj_solNoSlip in engine_solver.c).

After the main solver, ``opt.noslip_iterations`` projected Gauss-Seidel sweeps
minimise the dual cost 0.5 f' A f + f' b (A = J M^-1 J', without the
regulariser R: the friction forces no longer give way) over the frictional
forces only, the normal forces held at the main solver's:

* frictionloss rows: clamped to [-frictionloss, frictionloss];
* pyramidal contacts: each pair of opposite pyramid edges, their sum fixed;
* elliptic contacts: all the tangential (torsional, rolling) rows of a
  contact at once, inside the friction ellipsoid of its normal force (a QCQP).

A row block's update is kept only if it lowers the cost. The sweeps stop after
the first whose scaled improvement is below ``opt.noslip_tolerance``; then
qacc = qacc_smooth + M^-1 J' f and qfrc_constraint = J' f, and efc_state is
the dual state of the forces (mj_dualFinish), as MuJoCo reports them.

The sweep is MuJoCo's: sequential over blocks (frictionloss rows in row order,
then contacts in the order of MuJoCo's d.contact), each seeing the forces the
ones before it set, so a sweep unrolls into a fixed sequence of small updates of
one force vector. A (nefc x nefc) is never formed: a block reads its residual
from M^-1 J' f, carried along and updated with each block's change (memory and
time per block O(nv), as for the main solver's rows). Rows a step does not instantiate (``efc_active`` false) keep
force 0. The sweeps run in ``workarounds.bounded_loop`` (traced once under
torch.compile, stopping when converged); a vmapped batch freezes each element
once its own improvement passes the test, so it gives what each element gives
alone. As in MuJoCo, each constraint island (``solver.islands``) stops after its
own first sweep whose improvement passes the test.

Gradients flow through the unrolled sweeps (the operations as executed,
including the QCQP's Newton iterations), and through the main solver's forces,
qacc_smooth, J, M and aref into them by the model's backward mode. Where a
derivative may be requested the sweeps run as a Python loop (under compile: one
graph that grows with ``noslip_iterations``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffmj import math
from diffmj.enums import ConeType, ConstraintState
from diffmj.smooth import solve_m
from diffmj.solver import islands
from diffmj.types import Data, Model
from diffmj.workarounds import all_true, bounded_loop, derivative_requested, literal

_QCQP_ITERATIONS = 20  # mju_QCQP's Newton iterations on the multiplier
_SMALL = 1e-10  # MuJoCo's thresholds in extractBlock, costChange and mju_QCQP


def _blocks(half: Tensor, R: Tensor, spans: list[tuple[int, int]]) -> list[Tensor]:
    """Diagonal blocks [n, n] of A = half' half at the rows (start, n) of ``spans``, each diagonal
    (A + R) - R clamped at 1e-10 (extractBlock); the blocks of one size computed together."""
    out: list = [None] * len(spans)
    for n in sorted({n for _, n in spans}):
        which = [k for k, (_, size) in enumerate(spans) if size == n]
        rows = literal([[spans[k][0] + i for i in range(n)] for k in which], device=half.device)  # [b, n]
        columns = half[:, rows].permute(1, 0, 2)  # [b, nv, n]
        block = columns.transpose(-1, -2) @ columns
        diag = torch.clamp((torch.diagonal(block, dim1=-2, dim2=-1) + R[rows]) - R[rows], min=_SMALL)
        block = torch.where(torch.eye(n, dtype=torch.bool, device=half.device), torch.diag_embed(diag), block)
        for j, k in enumerate(which):  # copies: the sweep's while_loop refuses inputs that are views of one tensor
            out[k] = block[j].clone()
    return out


def _cost_change(Ac: Tensor, new: Tensor, old: Tensor, res: Tensor) -> tuple[Tensor, Tensor]:
    """(forces, cost change) of a block update; an update raising the cost is undone (costChange)."""
    delta = new - old
    change = 0.5 * (delta * (Ac @ delta)).sum(-1) + (delta * res).sum(-1)
    worse = change > _SMALL
    return torch.where(worse, old, new), torch.where(worse, 0.0, change)


def _pyramid_pair(Ac: Tensor, bc: Tensor, old: Tensor) -> Tensor:
    """Forces of two opposite pyramid edges minimising the block cost, their sum fixed. [2]"""
    mid = 0.5 * (old[0] + old[1])
    K1 = Ac[0, 0] + Ac[1, 1] - Ac[0, 1] - Ac[1, 0]
    K0 = mid * (Ac[0, 0] - Ac[1, 1]) + bc[0] - bc[1]
    degenerate = K1 < math.MINVAL
    y = torch.clamp(-K0 / torch.where(degenerate, 1.0, K1), min=-mid, max=mid)
    y = torch.where(degenerate, 0.0, y)
    return torch.stack((mid + y, mid - y))


def _qcqp(Ac: Tensor, bc: Tensor, friction: Tensor, normal: Tensor, skip: Tensor, unroll: bool) -> Tensor:
    """min 0.5 v'Ac v + bc'v subject to sum (v_j / friction_j)^2 <= normal^2 (mju_QCQP2/3/QCQP). [n]

    Newton's method on the multiplier la of the scaled problem, with MuJoCo's tests: a
    (near-)singular A + la I gives 0; a solution on the constraint is put on the ellipsoid.
    skip: the answer is not used (its iterations need not run). unroll: as for bounded_loop.
    """
    n = bc.shape[-1]
    b = bc * friction
    A = Ac * friction[:, None] * friction[None, :]
    eye = torch.eye(n, dtype=A.dtype, device=A.device)
    r2 = normal * normal

    def iterate(carry):
        done, singular, la, v = carry
        chol, info = torch.linalg.cholesky_ex(A + la * eye)
        pivots = torch.diagonal(chol) ** 2
        # mju_QCQP2 / 3 test det(A + la I) < 1e-10, mju_QCQP each Cholesky pivot
        small = pivots.prod(-1) < _SMALL if n <= 3 else (pivots < _SMALL).any(-1)
        fails = (info != 0) | small
        chol = torch.where(fails, eye, chol)
        new_v = -torch.cholesky_solve(b[:, None], chol)[:, 0]
        val = (new_v * new_v).sum(-1) - r2
        deriv = -2.0 * (new_v * torch.cholesky_solve(new_v[:, None], chol)[:, 0]).sum(-1)
        step = -val / torch.where(deriv == 0, -1.0, deriv)
        stops = fails | (val < _SMALL) | (step < _SMALL)
        live = ~done
        return (
            done | stops,
            singular | (live & fails),
            torch.where(live & ~stops, la + step, la),
            torch.where(live & ~fails, new_v, v),
        )

    zero = torch.zeros_like(normal)
    carry = (skip, torch.zeros_like(skip), zero, torch.zeros_like(b))
    _, singular, la, v = bounded_loop(iterate, carry, _QCQP_ITERATIONS, unroll)
    v = v * friction
    # on the constraint (la > 0): onto the ellipsoid, in case the Newton iterations stopped short
    s = (v * v / (friction * friction)).sum(-1)
    v = torch.where(la != 0, v * torch.sqrt(r2 / torch.clamp(s, min=math.MINVAL)), v)
    return torch.where(singular, 0.0, v)


def _dual_state(m: Model, d: Data, force: Tensor) -> Tensor:
    """efc_state of the forces as MuJoCo's dual solvers report it (dualState). [nefc] long"""
    plan = m.constraint_plan
    rows = torch.arange(plan.nefc, device=force.device)
    floss = d.efc_frictionloss
    friction = (rows >= plan.ne) & (rows < plan.ne + plan.nf)
    S, Q = ConstraintState.SATISFIED, ConstraintState.QUADRATIC
    state = torch.where(force > 0, int(Q), int(S))
    state = torch.where(friction, torch.where(force <= -floss, int(ConstraintState.LINEARPOS),
                                              torch.where(force >= floss, int(ConstraintState.LINEARNEG), int(Q))),
                        state)
    state = torch.where(rows < plan.ne, int(Q), state)
    if plan.elliptic:
        for group in plan.contacts:
            if group.dim == 1:
                continue
            cone_rows = group.row[:, None] + torch.arange(group.dim, device=force.device)
            f = force[cone_rows]
            mu = d.contact.friction[group.slot, 0] * torch.sqrt(d.efc_R[group.row + 1] / d.efc_R[group.row])
            normal = f[:, 0] / mu
            tangent = math.safe_norm(f[:, 1:] / d.contact.friction[group.slot, : group.dim - 1])
            cone = torch.where(mu * normal >= tangent, int(S),
                               torch.where(normal + mu * tangent <= 0, int(Q), int(ConstraintState.CONE)))
            state = state.index_copy(0, cone_rows.reshape(-1), cone[:, None].expand(-1, group.dim).reshape(-1))
    return torch.where(d.efc_active, state, int(S))


def _island_scales(m: Model, d: Data) -> tuple[Tensor, Tensor]:
    """(island of each row [nefc] long, improvement scale of each island [K]), the solver's islands.

    With islands (MuJoCo's default) an island's scale is 1 / the trace of its block of M;
    with ``island`` disabled every row is in island 0, scaled by 1 / (meaninertia nv).
    """
    dofs, rows = islands(m, d)  # [K, nv], [K, nefc]
    if not m.constraint_plan.islands:
        scale = (1 / (m.stat_meaninertia * max(1, m.nv))).reshape(1).to(d.efc_J.dtype)
        return torch.zeros(rows.shape[-1], dtype=torch.long, device=m.device), scale
    inertia = dofs @ torch.diagonal(d.qM)
    scale = torch.where(inertia > 0, 1 / torch.where(inertia > 0, inertia, 1.0), 0.0)
    return rows.argmax(0), scale


def noslip(m: Model, d: Data) -> Data:
    """Data with the noslip solver's forces, qacc, qfrc_constraint and efc_state (mj_solNoSlip).

    Each constraint island (MuJoCo's default; one island for all rows when ``opt.disableflags``
    has ``island``) stops after its own first sweep whose improvement is below the tolerance.
    """
    plan, opt = m.constraint_plan, m.opt
    elliptic = opt.cone == ConeType.ELLIPTIC
    J, R, active, floss = d.efc_J, d.efc_R, d.efc_active, d.efc_frictionloss
    # A = J M^-1 J' = half' half is never formed ([nefc, nefc]): a row's residual b + A f is
    # b + J (M^-1 J' f), with M^-1 J' f carried and updated as the forces change
    half = torch.linalg.solve_triangular(d.qLD, J.transpose(-1, -2), upper=False)  # L^-1 J', M = L L'
    minv_jt = torch.linalg.solve_triangular(d.qLD.transpose(-1, -2), half, upper=True)  # M^-1 J' [nv, nefc]
    b = J @ d.qacc_smooth - d.efc_aref
    # 1 / diag(A), with MuJoCo's (AR - R) and its floor (ARdiaginv)
    diag_inv = 1 / torch.clamp(((half * half).sum(0) + R) - R, min=math.MINVAL)
    island, scale = _island_scales(m, d)
    row_island = island[:, None] == torch.arange(scale.shape[-1], device=island.device)  # [nefc, ntree]

    # one sweep's contact updates in MuJoCo's order: (first row, rows, the contact's first row, slot), and A's block
    if elliptic:
        blocks = [(row + 1, dim - 1, row, slot) for row, slot, dim in plan.frictional_contacts]
    else:  # each pair of opposite pyramid edges
        blocks = [(edge, 2, row, slot) for row, slot, dim in plan.frictional_contacts
                  for edge in range(row, row + 2 * (dim - 1), 2)]
    block_A = _blocks(half, R, [(start, n) for start, n, _, _ in blocks])
    unroll = derivative_requested((J, R, half, b, d.efc_force))  # differentiated: Python loops

    def sweep(carry):
        _, island_done, first, force, acc = carry  # acc = M^-1 J' force
        live = active & ~island_done[island]  # rows that still move
        # MuJoCo's first sweep counts the regulariser's cost the main solver's forces carried
        improvement = torch.where(first, (row_island * (0.5 * force * force * R)[:, None]).sum(0), 0.0)
        for i in range(plan.ne, plan.ne + plan.nf):
            res = b[i] + J[i] @ acc
            new = torch.clamp(force[i] - res * diag_inv[i], min=-floss[i], max=floss[i])
            delta = torch.where(live[i], new - force[i], 0.0)
            improvement = improvement - (0.5 * delta * delta / diag_inv[i] + delta * res) * row_island[i]
            force = torch.cat((force[:i], (force[i] + delta)[None], force[i + 1:]))
            acc = acc + minv_jt[:, i] * delta
        for (start, n, row, slot), Ac in zip(blocks, block_A):
            if all_true(~live[row]):  # eager only: an empty or converged contact's update changes nothing
                continue
            res = b[start:start + n] + J[start:start + n] @ acc
            old = force[start:start + n]
            bc = res - Ac @ old  # the block's linear term without its own forces
            if elliptic:
                unloaded = force[row] < math.MINVAL
                new = _qcqp(Ac, bc, d.contact.friction[slot, :n], force[row], unloaded | ~live[row], unroll)
                new = torch.where(unloaded, 0.0, new)
            else:
                new = _pyramid_pair(Ac, bc, old)
            new, change = _cost_change(Ac, new, old, res)
            new = torch.where(live[row], new, old)
            force = torch.cat((force[:start], new, force[start + n:]))
            acc = acc + minv_jt[:, start:start + n] @ (new - old)
            improvement = improvement - torch.where(live[row], change, 0.0) * row_island[row]
        island_done = island_done | (scale * improvement < opt.noslip_tolerance)
        return island_done.all(), island_done, torch.zeros_like(first), force, acc

    no = torch.zeros_like(active[0])
    start = (no, torch.zeros_like(row_island[0]), ~no, d.efc_force, minv_jt @ d.efc_force)
    force = bounded_loop(sweep, start, opt.noslip_iterations, unroll,
                         early_exit=m.early_exit)[3]
    qfrc_constraint = J.transpose(-1, -2) @ force
    return d.replace(
        efc_force=force,
        efc_state=_dual_state(m, d, force),
        qfrc_constraint=qfrc_constraint,
        qacc=d.qacc_smooth + solve_m(m, d, qfrc_constraint),
    )
