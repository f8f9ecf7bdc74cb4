"""Actuation: activation dynamics, gains, biases, forces (mj_fwdActuation).

Supported: dynamics none / integrator / filter / filterexact, gain fixed /
affine, bias none / affine, control, activation and force clamping,
``actearly``, tendon and joint actuator force limits, actuator gravity
compensation. Everything else is refused in ``put_model``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffmj import math, workarounds
from diffmj.types import Data, DisableBit, Model

MAXVAL = 1e10  # mjMAXVAL: larger controls count as bad, like NaN


def clamp_ctrl(m: Model, ctrl: Tensor) -> Tensor:
    """Clamp controls to ctrlrange (unless disabled); zero all if any is NaN or huge."""
    plan = m.actuator_plan
    if not m.opt.disabled(DisableBit.CLAMPCTRL):
        lo, hi = m.actuator_ctrlrange[:, 0], m.actuator_ctrlrange[:, 1]
        ctrl = torch.where(plan.ctrllimited, torch.minimum(torch.maximum(ctrl, lo), hi), ctrl)
    bad = (torch.isnan(ctrl) | (ctrl.abs() > MAXVAL)).any(-1, keepdim=True)
    return torch.where(bad, 0.0, ctrl)


def next_activation(m: Model, act: Tensor, act_dot: Tensor) -> Tensor:
    """Activations after one timestep, clamped to actrange (mj_nextActivation). [na]"""
    plan = m.actuator_plan
    dt = m.opt.timestep
    tau = torch.clamp(m.actuator_dynprm[plan.act_actuator, 0], min=math.MINVAL)
    exact = act + act_dot * tau * (1 - torch.exp(-dt / tau))
    euler = act + act_dot * dt
    nxt = torch.where(plan.act_filterexact > 0, exact, euler)
    actrange = m.actuator_actrange[plan.act_actuator]
    clamped = torch.minimum(torch.maximum(nxt, actrange[:, 0]), actrange[:, 1])
    return torch.where(plan.act_limited, clamped, nxt)


def actuator_input(m: Model, d: Data, ctrl: Tensor, act_dot: Tensor) -> Tensor:
    """What multiplies the gain: ctrl, or the actuator's (next, if actearly) activation. [nu]"""
    plan = m.actuator_plan
    if not plan.any_act:
        return ctrl
    act = d.act
    if plan.any_actearly:
        act = torch.where(plan.actearly[plan.act_actuator], next_activation(m, d.act, act_dot), act)
    return torch.where(plan.has_act > 0, act[plan.act_index], ctrl)


def _gain_bias_force(m: Model, d: Data, ctrl: Tensor, act_dot: Tensor) -> Tensor:
    """gain * input + bias for every actuator, before force limits. [nu]"""
    plan = m.actuator_plan
    length, velocity = d.actuator_length, d.actuator_velocity
    gain, bias = m.actuator_gainprm, m.actuator_biasprm
    gain = gain[:, 0] + plan.gain_affine * (gain[:, 1] * length + gain[:, 2] * velocity)
    bias = plan.bias_affine * (bias[:, 0] + bias[:, 1] * length + bias[:, 2] * velocity)
    return (gain * actuator_input(m, d, ctrl, act_dot) + bias) * plan.enabled


def _tendon_totals(m: Model, force: Tensor) -> Tensor:
    """Total force of the actuators on each force-limited tendon, per such actuator. [k]"""
    plan = m.actuator_plan
    acts, tendons = plan.tendon_frclimited_act, plan.tendon_frclimited_id
    total = workarounds.sum_at(m.ntendon, tendons, force[acts])
    return total[tendons]


def actuation(m: Model, d: Data) -> Data:
    """act_dot, actuator_force and qfrc_actuator from ctrl, act and the transmissions."""
    zero_act = torch.zeros_like(d.act)
    if not m.nu or m.opt.disabled(DisableBit.ACTUATION):
        return d.replace(
            act_dot=zero_act, actuator_force=torch.zeros_like(d.ctrl), qfrc_actuator=torch.zeros_like(d.qvel)
        )
    plan = m.actuator_plan
    ctrl = clamp_ctrl(m, d.ctrl)

    act_dot = zero_act
    if plan.any_act:
        u = ctrl[plan.act_actuator]
        tau = torch.clamp(m.actuator_dynprm[plan.act_actuator, 0], min=math.MINVAL)
        act_dot = plan.act_integrator * u + plan.act_filter * (u - d.act) / tau

    force = _gain_bias_force(m, d, ctrl, act_dot)

    if plan.tendon_frclimited_act.shape[0]:
        acts, tendons = plan.tendon_frclimited_act, plan.tendon_frclimited_id
        lo, hi = m.tendon_actfrcrange[tendons, 0], m.tendon_actfrcrange[tendons, 1]
        t = _tendon_totals(m, force)
        t_safe = torch.where(t == 0, 1.0, t)
        scale = torch.where(t < lo, lo / t_safe, torch.where(t > hi, hi / t_safe, 1.0))
        force = force.index_copy(0, acts, force[acts] * scale)

    lo, hi = m.actuator_forcerange[:, 0], m.actuator_forcerange[:, 1]
    force = torch.where(plan.forcelimited, torch.minimum(torch.maximum(force, lo), hi), force)

    qfrc = force @ d.actuator_moment
    if plan.actgravcomp_dof.shape[0] and not m.opt.disabled(DisableBit.GRAVITY):
        dofs = plan.actgravcomp_dof
        qfrc = workarounds.add_at_distinct(qfrc, dofs, d.qfrc_gravcomp[dofs])
    if plan.jnt_frclimited_dofadr.shape[0]:
        # MuJoCo clamps the first dof of each limited joint
        dofs, jnts = plan.jnt_frclimited_dofadr, plan.jnt_frclimited_jnt
        frange = m.jnt_actfrcrange[jnts]
        clamped = torch.minimum(torch.maximum(qfrc[dofs], frange[:, 0]), frange[:, 1])
        qfrc = qfrc.index_copy(0, dofs, clamped)
    return d.replace(act_dot=act_dot, actuator_force=force, qfrc_actuator=qfrc)


def actuator_force_vel(m: Model, d: Data) -> Tensor:
    """d actuator_force / d actuator_velocity, as MuJoCo's implicit integrators use it. [nu]

    Zero for actuators saturated at their force range, at their joint's or
    tendon's actuatorfrcrange (MuJoCo 4); the gain term multiplies the clamped
    control (or the activation) as in the forward pass.
    """
    plan = m.actuator_plan
    gain_vel = plan.gain_affine * m.actuator_gainprm[:, 2]
    bias_vel = plan.bias_affine * m.actuator_biasprm[:, 2]
    u = actuator_input(m, d, clamp_ctrl(m, d.ctrl), d.act_dot)
    deriv = (bias_vel + gain_vel * u) * plan.enabled

    def at_bound(x: Tensor, bounds: Tensor) -> Tensor:
        return (x <= bounds[..., 0]) | (x >= bounds[..., 1])

    saturated = plan.forcelimited & at_bound(d.actuator_force, m.actuator_forcerange)
    if plan.jnt_frclimited_act.shape[0]:
        jnt = plan.jnt_frclimited_act_jnt
        dof = m.tree.jnt_dofadr[jnt]
        hit = at_bound(d.qfrc_actuator[dof], m.jnt_actfrcrange[jnt])
        saturated = saturated.index_copy(0, plan.jnt_frclimited_act, saturated[plan.jnt_frclimited_act] | hit)
    if plan.tendon_frclimited_act.shape[0]:
        # saturated where the tendon's total force was rescaled to its range
        acts, tendons = plan.tendon_frclimited_act, plan.tendon_frclimited_id
        total = _tendon_totals(m, _gain_bias_force(m, d, clamp_ctrl(m, d.ctrl), d.act_dot))
        bounds = m.tendon_actfrcrange[tendons]
        hit = (total < bounds[:, 0]) | (total > bounds[:, 1])
        saturated = saturated.index_copy(0, acts, saturated[acts] | hit)
    return torch.where(saturated, 0.0, deriv)
