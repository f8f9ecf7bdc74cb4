"""Passive forces: joint and tendon springs, dampers, gravity compensation (mj_passive)."""

from __future__ import annotations

import torch
from torch import Tensor

from diffmj import math, workarounds
from diffmj.smooth import apply_ft
from diffmj.types import Data, DisableBit, Model


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
    """Gravity compensation of bodies with ``gravcomp`` [nv]; applied at each body's com."""
    bodies = m.tree.gravcomp_body
    if not bodies.shape[0] or m.opt.disabled(DisableBit.GRAVITY):
        return torch.zeros_like(d.qvel)
    weight = (m.body_mass[bodies] * m.body_gravcomp[bodies])[:, None]
    force = -m.opt.gravity * weight
    return apply_ft(m, d, force, torch.zeros_like(force), d.xipos[bodies], bodies)


def passive(m: Model, d: Data) -> Data:
    """qfrc_spring, qfrc_damper, qfrc_gravcomp and their sum qfrc_passive."""
    zero = torch.zeros_like(d.qvel)
    spring_off = m.opt.disabled(DisableBit.SPRING)
    damper_off = m.opt.disabled(DisableBit.DAMPER)
    if spring_off and damper_off:
        return d.replace(qfrc_spring=zero, qfrc_damper=zero, qfrc_gravcomp=zero, qfrc_passive=zero)
    spring = zero if spring_off else spring_force(m, d)
    damper = zero if damper_off else damper_force(m, d)
    gravcomp = gravcomp_force(m, d)
    to_passive = torch.ones_like(zero).index_fill(0, m.actuator_plan.actgravcomp_dof, 0.0)
    return d.replace(
        qfrc_spring=spring,
        qfrc_damper=damper,
        qfrc_gravcomp=gravcomp,
        qfrc_passive=spring + damper + gravcomp * to_passive,
    )
