"""Passive forces: joint and tendon springs, dampers, gravity compensation and fluid forces (mj_passive).

Fluid forces follow MuJoCo's two models (engine_passive.c): the inertia-box model for bodies
(a box with the body's mass and inertia: viscous Stokes drag and quadratic drag), and the
ellipsoid model for the geoms of bodies that have ``fluidshape`` (added mass, blunt / slender
drag, angular drag, Kutta and Magnus lift, with the geom_fluid coefficients). Each element
(box body or ellipsoid geom) computes a wrench in its own frame from its velocity relative
to the wind there.
"""

from __future__ import annotations

import math as pymath

import torch
from torch import Tensor

from diffmj import math, workarounds
from diffmj.smooth import apply_ft, jac
from diffmj.types import Data, DisableBit, IntegratorType, Model


def spring_force(m: Model, d: Data) -> Tensor:
    """Joint and tendon spring forces [nv]."""
    tree = m.tree
    qpos, qpos_spring = d.qpos, m.qpos_spring
    frc = torch.zeros_like(d.qvel)

    k = m.jnt_stiffness[tree.scalar_jnt]
    x = qpos[tree.scalar_qposadr] - qpos_spring[tree.scalar_qposadr]
    frc = workarounds.add_at_distinct(frc, tree.scalar_dofadr, -k * x)

    def rotational(jnt: Tensor, qadr: Tensor, dofadr: Tensor, frc: Tensor) -> Tensor:
        quat = math.quat_normalize(math.gather_blocks(qpos, qadr, 4))
        dif = math.quat_sub(quat, math.gather_blocks(qpos_spring, qadr, 4))
        return workarounds.add_blocks(frc, dofadr, -m.jnt_stiffness[jnt][:, None] * dif)

    if tree.ball_jnt.shape[0]:
        frc = rotational(tree.ball_jnt, tree.ball_qposadr, tree.ball_dofadr, frc)
    if tree.free_jnt.shape[0]:
        dif = math.gather_blocks(qpos, tree.free_qposadr, 3) - math.gather_blocks(qpos_spring, tree.free_qposadr, 3)
        frc = workarounds.add_blocks(frc, tree.free_dofadr, -m.jnt_stiffness[tree.free_jnt][:, None] * dif)
        frc = rotational(tree.free_jnt, tree.free_qposadr + 3, tree.free_dofadr + 3, frc)

    if m.ntendon:
        length = d.ten_length
        lower, upper = m.tendon_lengthspring[:, 0], m.tendon_lengthspring[:, 1]
        x = torch.where(length > upper, length - upper, torch.where(length < lower, length - lower, 0.0))
        frc = frc + (-m.tendon_stiffness * x) @ d.ten_J
    return frc


def damper_force(m: Model, d: Data) -> Tensor:
    """Joint and tendon damping forces [nv]."""
    frc = -m.dof_damping * d.qvel
    if m.ntendon:
        frc = frc + (-m.tendon_damping * d.ten_velocity) @ d.ten_J
    return frc


def gravcomp_force(m: Model, d: Data) -> Tensor:
    """Gravity compensation [nv]: each body's ``gravcomp`` share of its weight, applied at its com."""
    bodies = m.tree.gravcomp_body
    if not bodies.shape[0] or m.opt.disabled(DisableBit.GRAVITY):
        return torch.zeros_like(d.qvel)
    weight = (m.body_mass[bodies] * m.body_gravcomp[bodies])[:, None]
    force = -m.opt.gravity * weight
    return apply_ft(m, d, force, torch.zeros_like(force), d.xipos[bodies], bodies)


def _box_local_force(lvel: Tensor, box: Tensor, density: Tensor, viscosity: Tensor) -> Tensor:
    """Inertia-box model: wrench [..., 6] (torque, force) in the body's inertial frame.

    lvel [..., 6] angular and linear velocity relative to the wind, box [..., 3] the box's
    full sides; as MuJoCo, each term is on only for a positive density / viscosity.
    """
    ang, lin = lvel[..., :3], lvel[..., 3:]
    viscosity = torch.where(viscosity > 0, viscosity, 0.0)
    density = torch.where(density > 0, density, 0.0)
    diam = box.sum(-1, keepdim=True) / 3.0  # diameter of the equivalent sphere
    box4 = box * box * box * box
    torque = -pymath.pi * diam * diam * diam * viscosity * ang
    torque = torque - density * box * (box4.roll(-1, -1) + box4.roll(-2, -1)) * ang.abs() * ang / 64.0
    force = -3.0 * pymath.pi * diam * viscosity * lin
    force = force - 0.5 * density * box.roll(-1, -1) * box.roll(-2, -1) * lin.abs() * lin
    return torch.cat((torque, force), -1)


def _ellipsoid_local_force(
    lvel: Tensor, size: Tensor, coef: Tensor, density: Tensor, viscosity: Tensor
) -> Tensor:
    """Ellipsoid model: wrench [..., 6] (torque, force) in the geom's frame (mj_addedMassForces +
    mj_viscousForces), before the interaction coefficient scales it.

    lvel [..., 6] velocity relative to the wind, size [..., 3] semi-axes, coef [..., 11]:
    geom_fluid without its interaction coefficient.
    """
    ang, lin = lvel[..., :3], lvel[..., 3:]
    blunt, slender, ang_drag, kutta, magnus = coef[..., :5].unbind(-1)
    virtual_mass, virtual_inertia = coef[..., 5:8], coef[..., 8:11]

    # added mass: the fluid moving with the body (its acceleration term is left out, as in MuJoCo)
    lin_mom = density * virtual_mass * lin
    ang_mom = density * virtual_inertia * ang
    torque = math.cross(lin_mom, lin) + math.cross(ang_mom, ang)
    force = math.cross(lin_mom, ang)

    volume = 4.0 / 3.0 * pymath.pi * size.prod(-1)
    d_max, d_min = size.amax(-1), size.amin(-1)
    d_mid = size.sum(-1) - d_max - d_min
    area_max = pymath.pi * d_max * d_mid
    magnus_force = math.cross(ang, lin) * (magnus * density * volume)[..., None]

    # area projected along the velocity, and the cosine between the velocity and its normal
    sq = (size.roll(-1, -1) * size.roll(-2, -1)) ** 2
    proj_denom = (sq * sq * lin * lin).sum(-1)
    proj_num = (sq * lin * lin).sum(-1)
    area_proj = pymath.pi * math.safe_sqrt(proj_denom / proj_num.clamp_min(math.MINVAL))
    speed = math.safe_norm(lin)
    # not clamped at mjMINVAL, as MuJoCo 4.0.0 computes it (a thin plate's |v| proj_denom is far below it);
    # 0 at rest, where the circulation is 0 anyway
    cos_denom = speed * proj_denom
    cos_alpha = torch.where(cos_denom > 0, proj_num / torch.where(cos_denom > 0, cos_denom, 1.0), 0.0)
    circulation = math.cross(sq * lin, lin) * (kutta * density * cos_alpha * area_proj)[..., None]
    kutta_force = math.cross(circulation, lin)

    # Stokes drag of the equivalent sphere plus quadratic drag
    sphere_diam = 2.0 / 3.0 * size.sum(-1)
    moment_max = 8.0 / 15.0 * pymath.pi * d_mid * d_max**4
    side = torch.maximum(size.roll(-1, -1), size.roll(-2, -1))
    moment = 8.0 / 15.0 * pymath.pi * size * side**4
    mom_visc = ang * (ang_drag[..., None] * moment + slender[..., None] * (moment_max[..., None] - moment))
    drag_lin = viscosity * 3.0 * pymath.pi * sphere_diam + density * speed * (
        area_proj * blunt + slender * (area_max - area_proj))
    drag_ang = viscosity * pymath.pi * sphere_diam**3 + density * math.safe_norm(mom_visc)
    torque = torque - drag_ang[..., None] * ang
    force = force + magnus_force + kutta_force - drag_lin[..., None] * lin
    return torch.cat((torque, force), -1)


def _fluid_elements(m: Model, d: Data) -> tuple[Tensor, tuple]:
    """The fluid elements (box bodies, then ellipsoid geoms): their Jacobians in their own frames
    [n, 6, nv] (angular rows, then linear), and per model (its elements' velocity relative to the
    wind in their frames [k, 6], the function of it that gives their wrenches [k, 6]).

    Products with qvel and wrenches are plain reductions, not contractions: vmapped, they sum
    in the same order as alone (a batched step equals each element's bit for bit).
    """
    plan = m.fluid_plan
    box_body, geom = plan.box_body, plan.geom
    body = torch.cat((box_body, m.tree.geom_bodyid[geom]))
    point = torch.cat((d.xipos[box_body], d.geom_xpos[geom]))
    rot_t = torch.cat((d.ximat[box_body], d.geom_xmat[geom])).transpose(-1, -2)
    jacp, jacr = jac(m, d, point, body)
    jac_local = torch.cat((rot_t @ jacr, rot_t @ jacp), -2)
    lvel = (jac_local * d.qvel).sum(-1)
    wind = rot_t @ m.opt.wind
    lvel = torch.cat((lvel[:, :3], lvel[:, 3:] - wind), -1)

    mass, inertia = m.body_mass[box_body][:, None], m.body_inertia[box_body]
    box = torch.sqrt((inertia.roll(-1, -1) + inertia.roll(-2, -1) - inertia).clamp_min(math.MINVAL) / mass * 6.0)
    size = m.geom_size[geom].gather(-1, plan.geom_semiaxis)
    size = torch.cat((size[:, :2], size[:, 2:] + plan.geom_capsule[:, None] * m.geom_size[geom, :1]), -1)
    nbox = box_body.shape[0]
    density, viscosity = m.opt.density, m.opt.viscosity
    return jac_local, (
        (lvel[:nbox], lambda v: _box_local_force(v, box, density, viscosity)),
        (lvel[nbox:], lambda v: _ellipsoid_local_force(v, size, m.geom_fluid[geom, 1:], density, viscosity)),
    )


def fluid_force(m: Model, d: Data) -> Tensor:
    """Fluid forces of both models (mj_fluid) [nv]; zero when the model has no fluid."""
    if not m.fluid_plan.enabled:
        return torch.zeros_like(d.qvel)
    jac_local, models = _fluid_elements(m, d)
    wrench = torch.cat([wrench_of(lvel) for lvel, wrench_of in models])
    scale = torch.cat((torch.ones_like(m.fluid_plan.box_body, dtype=m.dtype), m.geom_fluid[m.fluid_plan.geom, 0]))
    return (jac_local * (wrench * scale[:, None])[:, :, None]).sum((0, 1))


def fluid_force_vel(m: Model, d: Data) -> Tensor:
    """d qfrc_fluid / d qvel as MuJoCo's qDeriv holds it (mjd_passive_vel) [nv, nv].

    Per element J' B J, with B the exact 6x6 derivative of its local wrench; like MuJoCo, B leaves
    out the ellipsoid interaction coefficient (0 or 1 from MJCF), and implicitfast symmetrises
    the B of ellipsoid geoms not on a standalone free body.
    """
    if not m.fluid_plan.enabled:
        return torch.zeros_like(d.qM)
    jac_local, models = _fluid_elements(m, d)
    basis = torch.eye(6, dtype=m.dtype, device=m.device)
    blocks = []
    for lvel, wrench_of in models:
        # elements are independent: column k of every B is one jvp moving each element along e_k
        # (a loop, not a vmap over the basis, which inductor's forward-mode views do not take)
        lvel = lvel.clone()  # a primal with its own storage: the tangents must share its layout
        columns = [torch.func.jvp(wrench_of, (lvel,), (basis[k].expand_as(lvel).contiguous(),))[1] for k in range(6)]
        blocks.append(torch.stack(columns, -1))
    box_b, geom_b = blocks
    if m.opt.integrator == IntegratorType.IMPLICITFAST:
        symmetric = m.fluid_plan.geom_symmetric[:, None, None]
        geom_b = symmetric * 0.5 * (geom_b + geom_b.transpose(-1, -2)) + (1 - symmetric) * geom_b
    b = torch.cat((box_b, geom_b))
    return torch.einsum("nkv,nkl,nlw->vw", jac_local, b, jac_local)


def passive(m: Model, d: Data) -> Data:
    """qfrc_spring, qfrc_damper, qfrc_gravcomp, qfrc_fluid and the sum qfrc_passive."""
    zero = torch.zeros_like(d.qvel)
    spring_off = m.opt.disabled(DisableBit.SPRING)
    damper_off = m.opt.disabled(DisableBit.DAMPER)
    if spring_off and damper_off:
        return d.replace(qfrc_spring=zero, qfrc_damper=zero, qfrc_gravcomp=zero, qfrc_fluid=zero, qfrc_passive=zero)
    spring = zero if spring_off else spring_force(m, d)
    damper = zero if damper_off else damper_force(m, d)
    gravcomp = gravcomp_force(m, d)
    fluid = fluid_force(m, d)
    to_passive = torch.ones_like(zero).index_fill(0, m.actuator_plan.actgravcomp_dof, 0.0)
    return d.replace(
        qfrc_spring=spring,
        qfrc_damper=damper,
        qfrc_gravcomp=gravcomp,
        qfrc_fluid=fluid,
        qfrc_passive=spring + damper + fluid + gravcomp * to_passive,
    )
