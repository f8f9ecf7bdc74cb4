"""forward() and step(): MuJoCo's pipeline and integrators (engine_forward.c).

``forward`` computes every derived quantity of a state; ``step`` also
advances it with the model's integrator (Euler with implicit joint damping,
RK4, implicit, implicitfast). Both are pure and accept batched Data.

A batch (leading dimensions of d, flattened to one) is stepped as an explicit
batch, not under one ``torch.vmap`` of the whole step: the stages before and
after the constraint solver (and between RK4's stages) run under
``torch.vmap``, and the solver's loops run over the whole batch (solver.
solve_qacc's ``batched``), so that compiled they are while_loops stopping once
every element has converged; torch 2.13's while_loop has no vmap rule, and a
vmapped step's loops run their full count (``scan``). Every stage is written
for one element and runs unchanged unbatched, under an outer torch.vmap, or
mapped by ``_each`` here.
"""

from __future__ import annotations

import functools

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from diffmj import math
from diffmj.actuation import actuation, actuator_force_vel, next_activation
from diffmj.collision.driver import collision
from diffmj.constraint import make_constraint, reference_constraint
from diffmj.passive import fluid_force_vel, passive
from diffmj.adjoint import solve_implicit
from diffmj.noslip import noslip
from diffmj.sensor import sensor_acc, sensor_pos, sensor_vel
from diffmj.smooth import (
    apply_ft,
    com_pos,
    com_vel,
    crb,
    factor_m,
    kinematics,
    rne,
    solve_m,
    tendon,
    transmission,
)
from diffmj.solver import solve
from diffmj.state import integrate_pos
from diffmj.types import BackwardMode, Data, DisableBit, IntegratorType, Model
from diffmj.workarounds import bounded_loop, canonical_layout, derivative_requested, elementwise, literal


def fwd_position(m: Model, d: Data) -> Data:
    """Position-dependent quantities: frames, inertia, contacts, constraint rows, transmissions."""
    d = kinematics(m, d)
    d = com_pos(m, d)
    d = tendon(m, d)
    d = crb(m, d)
    d = factor_m(m, d)
    d = collision(m, d)
    d = make_constraint(m, d)
    return transmission(m, d)


def fwd_velocity(m: Model, d: Data) -> Data:
    """Velocity-dependent quantities: tendon / actuator velocities, passive and bias forces."""
    actuator_velocity = d.actuator_moment @ d.qvel
    if m.opt.disabled(DisableBit.ACTUATION):
        actuator_velocity = torch.zeros_like(actuator_velocity)
    d = d.replace(ten_velocity=d.ten_J @ d.qvel, actuator_velocity=actuator_velocity)
    d = com_vel(m, d)
    d = passive(m, d)
    d = reference_constraint(m, d)
    return d.replace(qfrc_bias=rne(m, d))


def xfrc_accumulate(m: Model, d: Data) -> Tensor:
    """Generalised force of the Cartesian wrenches xfrc_applied, applied at each body's com. [nv]"""
    xfrc = d.xfrc_applied
    return apply_ft(m, d, xfrc[:, :3], xfrc[:, 3:], d.xipos)


def fwd_acceleration(m: Model, d: Data) -> Data:
    """Sum of smooth forces and the unconstrained acceleration qacc_smooth."""
    qfrc_smooth = d.qfrc_passive - d.qfrc_bias + d.qfrc_applied + d.qfrc_actuator
    qfrc_smooth = qfrc_smooth + xfrc_accumulate(m, d)
    return d.replace(qfrc_smooth=qfrc_smooth, qacc_smooth=solve_m(m, d, qfrc_smooth))


def _each(stage, batched: bool):
    """stage(m, d, *args) of one Data, over a batch [B] of d and args where batched."""

    def over_batch(m: Model, *args):
        return elementwise(stage, batched, (None,) + (0,) * len(args))(m, *args)

    return over_batch


def fwd_constraint(m: Model, d: Data, mode: BackwardMode, batched: bool = False) -> Data:
    """Constrained acceleration from the constraint solver; qacc_smooth without constraint rows.

    mode chooses how gradients pass through the solver (the result is the same). With
    opt.noslip_iterations, MuJoCo's noslip sweeps then post-process the friction forces.
    batched: d is a batch [B], solved as one (solver.solve_qacc's explicit batch).
    """
    if m.constraint_plan.nefc:
        d = solve_implicit(m, d, batched) if mode == BackwardMode.IMPLICIT else solve(m, d, batched)
        return _each(noslip, batched)(m, d) if m.opt.noslip_iterations else d
    # a copy: fields must not alias (torch.compile would recompile on aliased inputs)
    return d.replace(qacc=d.qacc_smooth.clone(), qfrc_constraint=torch.zeros_like(d.qacc_smooth))


def _smooth(m: Model, d: Data, sensors: bool) -> Data:
    """The stages before the constraint solver, of one Data."""
    d = fwd_position(m, d)
    if sensors:
        d = sensor_pos(m, d)
    d = fwd_velocity(m, d)
    if sensors:
        d = sensor_vel(m, d)
    d = actuation(m, d)
    return fwd_acceleration(m, d)


def run_forward(m: Model, d: Data, mode: BackwardMode, sensors: bool = True, batched: bool = False) -> Data:
    """forward() of one Data, or of a batch [B] where batched, unchecked (for diffmj.grad and rollout).

    mj_forwardSkip without skipped stages; ``sensors=False`` leaves sensordata as it was.
    """
    d = _each(functools.partial(_smooth, sensors=sensors), batched)(m, d)
    d = fwd_constraint(m, d, mode, batched)
    return _each(sensor_acc, batched)(m, d) if sensors else d


def _advance(m: Model, d: Data, act_dot: Tensor, qacc: Tensor, qvel: Tensor | None = None) -> Data:
    """Advance act, qvel, qpos and time by one timestep (mj_advance)."""
    dt = m.opt.timestep
    act = d.act
    if m.na and not m.opt.disabled(DisableBit.ACTUATION):
        act = next_activation(m, d.act, act_dot * m.actuator_plan.enabled[m.actuator_plan.act_actuator])
    new_qvel = d.qvel + dt * qacc
    qpos = integrate_pos(m, d.qpos, new_qvel if qvel is None else qvel, dt)
    return d.replace(act=act, qvel=new_qvel, qpos=qpos, time=d.time + dt, qacc_warmstart=d.qacc.clone())


def _euler(m: Model, d: Data) -> Data:
    """Semi-implicit Euler; joint damping implicit unless eulerdamp is disabled (mj_Euler).

    With any dof damping MuJoCo solves (M + h B) qacc' = qfrc_smooth + qfrc_constraint, and
    otherwise takes qacc as it is. The two differ from M qacc = qfrc_smooth + qfrc_constraint
    when the constraint solver stopped before the optimum (iteration limit, line search), so
    the right-hand side is the forces, not M qacc.
    """
    qacc = d.qacc
    if not (m.opt.disabled(DisableBit.EULERDAMP) or m.opt.disabled(DisableBit.DAMPER)):
        h = m.opt.timestep
        damped = d.qM + torch.diag_embed(h * m.dof_damping)
        qfrc = d.qfrc_smooth + d.qfrc_constraint
        implicit = torch.cholesky_solve(qfrc[:, None], math.cholesky(damped))[:, 0]
        qacc = torch.where((m.dof_damping > 0).any(), implicit, qacc)
    return _advance(m, d, d.act_dot, qacc)


# Butcher tableau of the classic RK4: stage j+1 starts from the step's state offset by
# _RK4_C[j] h along stage j's rates alone (the matrix has one entry per row), and
# the step combines the stages' rates with weights _RK4_B
_RK4_C = (0.5, 0.5, 1.0)
_RK4_B = (1.0 / 6.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 6.0)


def _dexpinv_coefficient(t: Tensor) -> Tensor:
    """(1 - (t/2) cot(t/2)) / t^2 of SO(3)'s inverse dexp; its series 1/12 + t^2/720 near 0."""
    small = t < 1e-3
    ts = torch.where(small, 1.0, t)
    exact = (1 - 0.5 * ts / torch.tan(0.5 * ts)) / (ts * ts)
    return torch.where(small, 1 / 12 + t * t / 720, exact)


def _rk4_position_velocity(m: Model, theta: Tensor, qvel: Tensor) -> Tensor:
    """Stage velocity mapped to the Lie algebra of each quaternion (Runge-Kutta-Munthe-Kaas).

    For ball and free-joint rotations at the stage offset theta (a rotation vector),
    the algebra velocity is dexp^-1(theta) w = w + theta x w / 2 + c(|theta|) theta x (theta x w),
    which makes RK4 fourth order on orientations, as in MuJoCo 4. Other dofs pass through.
    """
    adr = m.tree.rotation_dofadr
    if not adr.shape[0]:
        return qvel
    th = math.gather_blocks(theta, adr, 3)
    w = math.gather_blocks(qvel, adr, 3)
    c1 = math.cross(th, w)
    k = w + 0.5 * c1 + math.cross(th, c1) * _dexpinv_coefficient(math.safe_norm(th))[:, None]
    index = adr[:, None] + torch.arange(3, device=adr.device)
    return qvel.index_copy(0, index.reshape(-1), k.reshape(-1))


def _rk4_rates(m: Model, d: Data, dpos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A stage's rates (position velocity, qacc, act_dot) of its forward()-filled Data d at offset dpos."""
    return _rk4_position_velocity(m, m.opt.timestep * dpos, d.qvel), d.qacc, d.act_dot


def _rk4_stage(m: Model, d: Data, rate: tuple[Tensor, Tensor, Tensor], c: Tensor) -> tuple[Data, Tensor]:
    """The state of the next stage, offset by c h along the last stage's rates, and its position offset."""
    h = m.opt.timestep
    dpos, dqacc, dact = (c * r for r in rate)
    stage = d.replace(qpos=integrate_pos(m, d.qpos, dpos, h), qvel=d.qvel + h * dqacc, act=d.act + h * dact,
                      time=d.time + c * h)
    return stage, dpos


def _rk4_combine(m: Model, d: Data, last: Data, rates: tuple[Tensor, Tensor, Tensor]) -> Data:
    """The step from d by the stages' weighted rates (summed), last the last stage's Data."""
    dpos, dqacc, dact = rates
    last = last.replace(qpos=d.qpos, qvel=d.qvel, act=d.act, time=d.time)
    # like MuJoCo 4, the step reports the Runge-Kutta average as qacc (the last
    # stage's qacc is kept as qacc_warmstart; other fields are the last stage's)
    return _advance(m, last, dact, dqacc, dpos).replace(qacc=dqacc)


def _rk4(m: Model, d: Data, mode: BackwardMode, batched: bool) -> Data:
    """4th-order Runge-Kutta over (qpos, qvel, act), Munthe-Kaas on rotations (mj_RungeKutta).

    The three later stages are one loop body (workarounds.bounded_loop), so that torch.compile
    traces one forward pass for them, not three; unrolled where a derivative may be asked for
    (2.13's loops have no autograd), which under torch.vmap is whenever grad mode is on.
    """
    rate = _each(_rk4_rates, batched)(m, d, torch.zeros_like(d.qvel))
    weighted = tuple(_RK4_B[0] * r for r in rate)
    coefficients = literal((_RK4_C, _RK4_B[1:]), m.dtype, m.device)  # [2, 3]
    leaves, spec = pytree.tree_flatten(d)

    def next_stage(carry: tuple) -> tuple:
        done, j, rate, weighted = carry[0], carry[1], carry[2:5], carry[5:8]  # carry[8:]: the last stage's Data
        c, b = torch.where(j == torch.arange(len(_RK4_C), device=j.device), coefficients, 0.0).sum(1)  # [:, j]
        stage, dpos = _each(_rk4_stage, batched)(m, d, rate, c.expand(d.time.shape))
        last = run_forward(m, stage, mode, sensors=False, batched=batched)  # like MuJoCo, stages skip sensors
        rate = _each(_rk4_rates, batched)(m, last, dpos)
        weighted = tuple(w + b * r for w, r in zip(weighted, rate))
        # copies: a compiled loop's outputs must not alias its inputs (fields forward() passes through: ctrl, ...)
        copy = Tensor.clone if torch.compiler.is_compiling() else (lambda t: t)
        return copy(done), j + 1, *rate, *weighted, *map(copy, pytree.tree_leaves(last))

    start = (torch.zeros((), dtype=torch.bool, device=m.device), torch.zeros((), dtype=torch.int64, device=m.device))
    unroll = derivative_requested(t for t in (*leaves, *pytree.tree_leaves(m)) if isinstance(t, Tensor))
    carry = bounded_loop(next_stage, (*start, *rate, *weighted, *leaves), len(_RK4_C), unroll, m.early_exit)
    return _each(_rk4_combine, batched)(m, d, pytree.tree_unflatten(carry[8:], spec), carry[5:8])


def qfrc_smooth_vel(m: Model, d: Data) -> Tensor:
    """d (qfrc_actuator + qfrc_passive) / d qvel, without the bias term (mjd_smooth_vel). [nv, nv]

    Fluid forces add their derivative as mjd_passive_vel does (fluid_force_vel).

    Like MuJoCo's qDeriv it keeps only entries between dofs on one kinematic chain
    (one an ancestor of the other): tendons and actuators coupling other dofs lose
    those couplings in the implicit solve.
    """
    deriv = torch.zeros_like(d.qM)
    if not (m.opt.disabled(DisableBit.SPRING) and m.opt.disabled(DisableBit.DAMPER)):
        deriv = deriv + fluid_force_vel(m, d)
    if not m.opt.disabled(DisableBit.DAMPER):
        deriv = deriv - torch.diag_embed(m.dof_damping)
        if m.ntendon:
            deriv = deriv - d.ten_J.transpose(-1, -2) @ (m.tendon_damping[:, None] * d.ten_J)
    if m.nu and not m.opt.disabled(DisableBit.ACTUATION):
        gain = actuator_force_vel(m, d)
        deriv = deriv + d.actuator_moment.transpose(-1, -2) @ (gain[:, None] * d.actuator_moment)
    return deriv * m.tree.dof_chain


def bias_vel(m: Model, d: Data) -> Tensor:
    """d qfrc_bias / d qvel [nv, nv], column j = (bias(qvel + e_j) - bias(qvel - e_j)) / 2: exact, as bias is
    quadratic in qvel (no forward-mode AD: torch 2.13's Dynamo fails on it under vmap)."""

    def bias(qvel: Tensor) -> Tensor:
        return rne(m, com_vel(m, d.replace(qvel=qvel)))

    def column(e: Tensor) -> Tensor:
        return (bias(d.qvel + e) - bias(d.qvel - e)) / 2

    return torch.vmap(column, out_dims=1)(torch.eye(m.nv, dtype=d.qvel.dtype, device=d.qvel.device))


def _implicit(m: Model, d: Data) -> Data:
    """Implicit-in-velocity integrators (mj_implicit).

    implicit: solve (M - h dF/dv) qacc' = qfrc with the full derivative (LU).
    implicitfast: drop the bias derivative and use Cholesky; standalone free bodies
    get their 6x6 block solved with the bias derivative included, as MuJoCo does.
    """
    h = m.opt.timestep
    qfrc = d.qfrc_smooth + d.qfrc_constraint
    deriv = qfrc_smooth_vel(m, d)
    if m.opt.integrator == IntegratorType.IMPLICIT:
        qacc = torch.linalg.solve(d.qM - h * (deriv - bias_vel(m, d)), qfrc)
        return _advance(m, d, d.act_dot, qacc)

    qh = d.qM - h * deriv
    qacc = torch.cholesky_solve(qfrc[:, None], math.cholesky(qh))[:, 0]
    blocks = m.tree.free_body_dofadr
    if blocks:
        bias = bias_vel(m, d)
        for adr in blocks:
            block = slice(adr, adr + 6)
            a = qh[block, block] + h * bias[block, block]
            qacc = torch.cat((qacc[:adr], torch.linalg.solve(a, qfrc[block]), qacc[adr + 6 :]))
    return _advance(m, d, d.act_dot, qacc)


def integrate(m: Model, d: Data, mode: BackwardMode, batched: bool = False) -> Data:
    """Advance a Data (batched: a batch [B]) that forward() has filled by a timestep of the model's integrator."""
    integrator = m.opt.integrator
    if integrator == IntegratorType.EULER:
        return _each(_euler, batched)(m, d)
    if integrator == IntegratorType.RK4:
        return _rk4(m, d, mode, batched)
    return _each(_implicit, batched)(m, d)


def run_step(m: Model, d: Data, mode: BackwardMode, batched: bool = False) -> Data:
    """step() of one Data, or of a batch [B] where batched, unchecked (for diffmj.grad and rollout)."""
    return integrate(m, run_forward(m, d, mode, batched=batched), mode, batched)


def resolve_backward_mode(m: Model, backward_mode: BackwardMode | None) -> BackwardMode:
    """The call's backward mode, or the model's when None; a clear error for anything else."""
    if backward_mode is None:
        return m.backward_mode
    try:
        return BackwardMode(backward_mode)
    except ValueError:
        names = ", ".join(repr(b.value) for b in BackwardMode)
        raise ValueError(f"backward_mode must be a diffmj.BackwardMode ({names}), got {backward_mode!r}") from None


def check_data(m: Model, d: Data) -> None:
    """Clear errors for data that does not fit the model (shapes, dtypes, devices)."""
    if not isinstance(d, Data):
        raise ValueError(f"expected diffmj.Data, got {type(d).__name__}")
    for name, size in (("qpos", m.nq), ("qvel", m.nv), ("ctrl", m.nu), ("act", m.na)):
        value = getattr(d, name)
        if value.shape[-1] != size:
            raise ValueError(f"d.{name} has length {value.shape[-1]}, the model needs {size}")
        if value.dtype != m.dtype:
            raise ValueError(f"d.{name} is {value.dtype} but the model is {m.dtype}; use d.to(dtype)")
        if value.device != m.device:
            raise ValueError(f"d.{name} is on {value.device} but the model is on {m.device}")


def _over_batch(fn, m: Model, d: Data) -> Data:
    """fn(m, d, batched) of d, its leading batch dimensions (if any) flattened into one explicit batch."""
    if not d.batch_dims:
        return canonical_layout(fn(m, d, False), d)
    flat = d.reshape(-1)
    return elementwise(canonical_layout, True)(fn(m, flat, True), flat).reshape(d.batch_size)


def forward(m: Model, d: Data, *, backward_mode: BackwardMode | None = None) -> Data:
    """All quantities derived from the state (mj_forward). Pure: returns a new Data.

    backward_mode: how gradients pass through the constraint solver in this call;
    None uses the model's (``put_model(..., backward_mode=...)``).
    """
    check_data(m, d)
    mode = resolve_backward_mode(m, backward_mode)
    return _over_batch(lambda m, d, batched: run_forward(m, d, mode, batched=batched), m, d)


def step(m: Model, d: Data, *, backward_mode: BackwardMode | None = None) -> Data:
    """Advance the simulation by one timestep (mj_step). Pure: returns a new Data.

    backward_mode: as for forward().
    """
    check_data(m, d)
    mode = resolve_backward_mode(m, backward_mode)
    return _over_batch(lambda m, d, batched: run_step(m, d, mode, batched), m, d)
