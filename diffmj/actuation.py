"""Actuation: activation dynamics, gains, biases, forces (mj_fwdActuation).

Supported: dynamics none / integrator / filter / filterexact / muscle, gain
fixed / affine / muscle, bias none / affine / muscle, DC motors driven by
voltage (with or without a current state, cogging), control, activation and
force clamping, ``actearly``, tendon and joint actuator force limits,
actuator gravity compensation. Everything else is refused in ``put_model``.

DC motors (MuJoCo's ``dcmotor``: gainprm = (R, K, ...), dynprm = (te, di/dt max,
...), biasprm = (cogging amplitude, periods, phase, ...)) drive ``K / R (V - K
omega)`` without a current state and ``K i`` with one, ``di/dt = (V / R - K
omega / R - i) / te``; cogging ``A sin(Np length + phase)`` is added after the
force clamps. Muscles are MuJoCo's (``mju_muscleGain``, ``mju_muscleBias``,
``mju_muscleDynamics``): the gain and bias read the actuator's length
normalised by the compiled ``actuator_lengthrange`` and, for ``force < 0``,
the peak force ``scale / actuator_acc0``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffmj import math, workarounds
from diffmj.types import Data, DisableBit, Model

MAXVAL = 1e10  # mjMAXVAL: larger controls count as bad, like NaN


def clamp_ctrl(m: Model, ctrl: Tensor) -> Tensor:
    """Clamp controls to ctrlrange (unless disabled); zero all if any is NaN or huge.

    The derivative at a bound is the inward one (1), as ``mjd_transitionFD`` differentiates there (one-sided,
    into the range); torch.minimum / maximum would split a tie's gradient and give half of it.
    """
    plan = m.actuator_plan
    if not m.opt.disabled(DisableBit.CLAMPCTRL):
        lo, hi = m.actuator_ctrlrange[:, 0], m.actuator_ctrlrange[:, 1]
        clamped = torch.where(ctrl < lo, lo, torch.where(ctrl > hi, hi, ctrl))
        ctrl = torch.where(plan.ctrllimited, clamped, ctrl)
    bad = (torch.isnan(ctrl) | (ctrl.abs() > MAXVAL)).any(-1, keepdim=True)
    return torch.where(bad, 0.0, ctrl)


def _sigmoid(x: Tensor) -> Tensor:
    """mju_sigmoid: 0 below 0, 1 above 1, the quintic 6x^5 - 15x^4 + 10x^3 between."""
    inner = x * x * x * (3 * x * (2 * x - 5) + 10)
    return torch.where(x <= 0, 0.0, torch.where(x >= 1, 1.0, inner))


def muscle_dynamics(ctrl: Tensor, act: Tensor, dynprm: Tensor) -> Tensor:
    """Muscle activation rate (mju_muscleDynamics). ctrl, act [k]; dynprm [k, >=3] -> act_dot [k].

    dynprm = (tau_act, tau_deact, tausmooth): time constants scaled by the activation as in
    Millard et al. (2013); ``tausmooth > 0`` blends them with a quintic sigmoid of the excess
    excitation instead of switching on its sign.
    """
    act_clamped = torch.clamp(act, 0, 1)
    tau_act = dynprm[:, 0] * (0.5 + 1.5 * act_clamped)
    tau_deact = dynprm[:, 1] / (0.5 + 1.5 * act_clamped)
    width = dynprm[:, 2]
    excess = torch.clamp(ctrl, 0, 1) - act
    smooth = width >= math.MINVAL
    blend = _sigmoid(excess / torch.where(smooth, width, 1.0) + 0.5)
    tau = torch.where(smooth, tau_deact + (tau_act - tau_deact) * blend, torch.where(excess > 0, tau_act, tau_deact))
    return excess / torch.clamp(tau, min=math.MINVAL)


def _muscle_scale(length: Tensor, lengthrange: Tensor, acc0: Tensor, prm: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(peak force, normalised length, optimal length L0) of muscles, each [k].

    prm [k, >=9] = (range[2], force, scale, lmin, lmax, vmax, fpmax, fvmax); lengthrange [k, 2].
    """
    force = torch.where(prm[:, 2] < 0, prm[:, 3] / torch.clamp(acc0, min=math.MINVAL), prm[:, 2])
    optimal = (lengthrange[:, 1] - lengthrange[:, 0]) / torch.clamp(prm[:, 1] - prm[:, 0], min=math.MINVAL)
    normalised = prm[:, 0] + (length - lengthrange[:, 0]) / torch.clamp(optimal, min=math.MINVAL)
    return force, normalised, optimal


def _muscle_length_curve(length: Tensor, lmin: Tensor, lmax: Tensor) -> Tensor:
    """mju_muscleGainLength: four half-quadratics, 0 at lmin and lmax, 1 at length 1. [k]"""
    a, b = 0.5 * (lmin + 1), 0.5 * (1 + lmax)
    rising = 0.5 * ((length - lmin) / torch.clamp(a - lmin, min=math.MINVAL)) ** 2
    below_peak = 1 - 0.5 * ((1 - length) / torch.clamp(1 - a, min=math.MINVAL)) ** 2
    above_peak = 1 - 0.5 * ((length - 1) / torch.clamp(b - 1, min=math.MINVAL)) ** 2
    falling = 0.5 * ((lmax - length) / torch.clamp(lmax - b, min=math.MINVAL)) ** 2
    curve = torch.where(
        length <= a, rising, torch.where(length <= 1, below_peak, torch.where(length <= b, above_peak, falling))
    )
    return torch.where((lmin <= length) & (length <= lmax), curve, 0.0)


def _muscle_velocity_curve(velocity: Tensor, fvmax: Tensor) -> tuple[Tensor, Tensor]:
    """(FV, dFV / dV) of the normalised velocity V: 0 below -1, quadratic up to fvmax - 1, fvmax beyond."""
    y = fvmax - 1
    y_safe = torch.clamp(y, min=math.MINVAL)
    shortening, lengthening = velocity <= 0, velocity <= y
    curve = torch.where(
        shortening, (velocity + 1) ** 2, torch.where(lengthening, fvmax - (y - velocity) ** 2 / y_safe, fvmax)
    )
    slope = torch.where(shortening, 2 * velocity + 2, torch.where(lengthening, (2 * y - 2 * velocity) / y_safe, 0.0))
    stalled = velocity <= -1
    return torch.where(stalled, 0.0, curve), torch.where(stalled, 0.0, slope)


def _muscle_gain_terms(
    length: Tensor, velocity: Tensor, lengthrange: Tensor, acc0: Tensor, prm: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(-force * FL, FV, dFV / d velocity): the factors of the muscle gain and of its velocity slope. [k]"""
    force, normalised, optimal = _muscle_scale(length, lengthrange, acc0, prm)
    velocity_scale = torch.clamp(optimal * prm[:, 6], min=math.MINVAL)
    fv, fv_slope = _muscle_velocity_curve(velocity / velocity_scale, prm[:, 8])
    return -force * _muscle_length_curve(normalised, prm[:, 4], prm[:, 5]), fv, fv_slope / velocity_scale


def muscle_gain(length: Tensor, velocity: Tensor, lengthrange: Tensor, acc0: Tensor, prm: Tensor) -> Tensor:
    """Muscle active force per unit activation, -force FL(length) FV(velocity) (mju_muscleGain). [k]

    length, velocity, acc0 [k]; lengthrange [k, 2]; prm [k, >=9] (``_muscle_scale``).
    """
    force_length, fv, _ = _muscle_gain_terms(length, velocity, lengthrange, acc0, prm)
    return force_length * fv


def muscle_bias(length: Tensor, lengthrange: Tensor, acc0: Tensor, prm: Tensor) -> Tensor:
    """Muscle passive force (mju_muscleBias): half-quadratic from length 1 to (1 + lmax) / 2, linear beyond. [k]"""
    force, normalised, _ = _muscle_scale(length, lengthrange, acc0, prm)
    b = 0.5 * (1 + prm[:, 5])
    width = torch.clamp(b - 1, min=math.MINVAL)
    passive = torch.where(
        normalised <= b, 0.5 * ((normalised - 1) / width) ** 2, 0.5 + (normalised - b) / width
    )
    return torch.where(normalised <= 1, 0.0, -force * prm[:, 7] * passive)


def _dcmotor_constants(m: Model) -> tuple[Tensor, Tensor, Tensor]:
    """(resistance clamped to MINVAL, motor constant K, 1 where the motor has a current state) per DC motor. [k]"""
    i = m.actuator_plan.dcmotor_act
    return torch.clamp(m.actuator_gainprm[i, 0], min=math.MINVAL), m.actuator_gainprm[i, 1], m.actuator_plan.has_act[i]


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
    if plan.gain_muscle_act.shape[0]:
        i = plan.gain_muscle_act
        lengthrange, acc0 = m.actuator_lengthrange[i], m.actuator_acc0[i]
        gain = gain.index_copy(0, i, muscle_gain(length[i], velocity[i], lengthrange, acc0, m.actuator_gainprm[i]))
    if plan.bias_muscle_act.shape[0]:
        i = plan.bias_muscle_act
        lengthrange, acc0 = m.actuator_lengthrange[i], m.actuator_acc0[i]
        bias = bias.index_copy(0, i, muscle_bias(length[i], lengthrange, acc0, m.actuator_biasprm[i]))
    if plan.dcmotor_act.shape[0]:
        # with a current state: K times the current; without: K / R times the voltage, minus the back-EMF
        i = plan.dcmotor_act
        resistance, k_motor, has_current = _dcmotor_constants(m)
        dc_gain = torch.where(has_current > 0, k_motor, k_motor / resistance)
        gain = gain.index_copy(0, i, dc_gain)
        bias = bias.index_copy(0, i, (has_current - 1) * dc_gain * k_motor * velocity[i])
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
        if plan.act_muscle.shape[0]:
            k = plan.act_muscle
            dynprm = m.actuator_dynprm[plan.act_actuator[k]]
            act_dot = act_dot.index_copy(0, k, muscle_dynamics(u[k], d.act[k], dynprm))
        if plan.act_dcmotor.shape[0]:
            k = plan.act_dcmotor
            i = plan.act_actuator[k]
            resistance, k_motor = m.actuator_gainprm[i, 0], m.actuator_gainprm[i, 1]
            te, max_rate = torch.clamp(m.actuator_dynprm[i, 0], min=math.MINVAL), m.actuator_dynprm[i, 1]
            rate = (u[k] / resistance - k_motor / resistance * d.actuator_velocity[i] - d.act[k]) / te
            limited = torch.minimum(torch.maximum(rate, -max_rate), max_rate)
            act_dot = act_dot.index_copy(0, k, torch.where(max_rate > 0, limited, rate))

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
    if plan.dcmotor_act.shape[0]:
        # cogging, after the clamps (MuJoCo adds the motor's mechanical forces last)
        i = plan.dcmotor_act
        amplitude, periods, phase = m.actuator_biasprm[i, 0], m.actuator_biasprm[i, 1], m.actuator_biasprm[i, 2]
        cogging = amplitude * torch.sin(periods * d.actuator_length[i] + phase) * plan.enabled[i]
        force = force.index_add(0, i, cogging)

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
    if plan.gain_muscle_act.shape[0]:
        i = plan.gain_muscle_act
        force_length, _, fv_slope = _muscle_gain_terms(
            d.actuator_length[i], d.actuator_velocity[i], m.actuator_lengthrange[i], m.actuator_acc0[i],
            m.actuator_gainprm[i],
        )
        gain_vel = gain_vel.index_copy(0, i, force_length * fv_slope)
    bias_vel = plan.bias_affine * m.actuator_biasprm[:, 2]
    u = actuator_input(m, d, clamp_ctrl(m, d.ctrl), d.act_dot)
    deriv = (bias_vel + gain_vel * u) * plan.enabled
    if plan.dcmotor_act.shape[0]:
        # back-EMF -K^2 / R; with a current state, the share of it one step's exact integration passes, none
        # while the current's rate is at its limit (as MuJoCo 4.0's mjd_actuator_vel: measured on implicit steps)
        i = plan.dcmotor_act
        resistance, k_motor, has_current = _dcmotor_constants(m)
        te, max_rate = torch.clamp(m.actuator_dynprm[i, 0], min=math.MINVAL), m.actuator_dynprm[i, 1]
        through_current = 1 - torch.exp(-m.opt.timestep / te)
        if plan.act_dcmotor.shape[0]:
            rate_limited = (max_rate > 0) & (d.act_dot[plan.act_index[i]].abs() >= max_rate)
            through_current = torch.where(rate_limited, 0.0, through_current)
        passed = torch.where(has_current > 0, through_current, 1.0)
        deriv = deriv.index_copy(0, i, -k_motor * k_motor / resistance * passed * plan.enabled[i])

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
