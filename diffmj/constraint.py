"""Constraint rows: Jacobians, impedance and reference accelerations (engine_core_constraint.c).

``make_constraint`` builds every row of the fixed layout in ``m.constraint_plan``
(equalities, frictionloss, limits, contacts) with MuJoCo's Jacobian, position,
margin, approximate inverse inertia and impedance (efc_R, efc_D, efc_KBIP);
``reference_constraint`` adds the velocity-dependent reference acceleration
efc_aref. Rows MuJoCo would not instantiate (a limit not reached, an empty or
excluded contact slot, an inactive equality) have ``efc_active = False`` and
take no part in the solver.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from diffmj import math
from diffmj.plan import ROW_BLOCKS
from diffmj.smooth import jac, jac_dif_frame
from diffmj.types import Data, DisableBit, Model

MINIMP, MAXIMP = 1e-4, 0.9999  # mjMINIMP, mjMAXIMP


class Rows(NamedTuple):
    """Constraint rows of one block, all [k] or [k, ...]."""

    J: Tensor  # [k, nv]
    pos: Tensor  # distance / violation of each row
    margin: Tensor
    active: Tensor  # bool
    diag: Tensor  # approximate inverse inertia (mj_diagApprox)
    solref: Tensor  # [k, 2] reference for the K / B terms of each row
    solimp: Tensor  # [k, 5]
    imp_pos: Tensor  # position the impedance is evaluated at (norm over connect / weld rows)
    imp_margin: Tensor
    frictionloss: Tensor


def _rows(J, pos, margin, active, diag, solref, solimp, imp_pos=None, imp_margin=None, frictionloss=None):
    return Rows(
        J, pos, margin, active, diag, solref, solimp,
        pos if imp_pos is None else imp_pos,
        margin if imp_margin is None else imp_margin,
        torch.zeros_like(pos) if frictionloss is None else frictionloss,
    )


def _repeat(x: Tensor, n: int) -> Tensor:
    """Each entry of x [k, ...] repeated n times: [k * n, ...]."""
    return x.repeat_interleave(n, dim=0)


def _anchors(m: Model, d: Data, eq: Tensor, weld: bool):
    """World anchor points and bodies of connect / weld equalities (mj_equalityAnchors, body semantic)."""
    b1 = m.constraint_plan.eq_obj1[eq]
    b2 = m.constraint_plan.eq_obj2[eq]
    data = m.eq_data[eq]
    local1, local2 = (data[:, 3:6], data[:, :3]) if weld else (data[:, :3], data[:, 3:6])
    pos1 = d.xpos[b1] + (d.xmat[b1] @ local1[..., None])[..., 0]
    pos2 = d.xpos[b2] + (d.xmat[b2] @ local2[..., None])[..., 0]
    return pos1, pos2, b1, b2


def _equality_active(d: Data, eq: Tensor, n: int) -> Tensor:
    return _repeat(d.eq_active[eq], n)


def _connect_rows(m: Model, d: Data) -> Rows:
    eq = m.constraint_plan.connect_eq
    pos1, pos2, b1, b2 = _anchors(m, d, eq, weld=False)
    jac1, _ = jac(m, d, pos1, b1)
    jac2, _ = jac(m, d, pos2, b2)
    err = pos1 - pos2  # [k, 3]
    inv = m.body_invweight0
    diag = (inv[b1, 0] + inv[b2, 0])[:, None].expand(-1, 3)
    norm = math.safe_norm(err)
    return _rows(
        (jac1 - jac2).flatten(0, 1),
        err.flatten(),
        torch.zeros_like(err).flatten(),
        _equality_active(d, eq, 3),
        diag.flatten(),
        _repeat(m.eq_solref[eq], 3),
        _repeat(m.eq_solimp[eq], 3),
        imp_pos=_repeat(norm, 3),
    )


def _weld_orientation(m: Model, d: Data, eq: Tensor, b1: Tensor, b2: Tensor):
    """(q0 * relpose, neg(q1)) of weld equalities."""
    relpose = m.eq_data[eq, 6:10]
    return math.quat_mul(d.xquat[b1], relpose), math.quat_conj(d.xquat[b2])


def _weld_rows(m: Model, d: Data) -> Rows:
    eq = m.constraint_plan.weld_eq
    pos1, pos2, b1, b2 = _anchors(m, d, eq, weld=True)
    jacp1, jacr1 = jac(m, d, pos1, b1)
    jacp2, jacr2 = jac(m, d, pos2, b2)
    torquescale = m.eq_data[eq, 10]
    q0r, negq1 = _weld_orientation(m, d, eq, b1, b2)
    rot_err = math.quat_mul(negq1, q0r)[:, 1:] * torquescale[:, None]
    # rotation Jacobian: 0.5 * neg(q1) * (jacr0 - jacr1) * q0 * relpose, per dof column
    axis = (jacr1 - jacr2).transpose(-1, -2)  # [k, nv, 3]
    quat_axis = torch.cat((torch.zeros_like(axis[..., :1]), axis), -1)
    jr = 0.5 * math.quat_mul(math.quat_mul(negq1[:, None], quat_axis), q0r[:, None])[..., 1:]
    jr = jr.transpose(-1, -2) * torquescale[:, None, None]
    err = torch.cat((pos1 - pos2, rot_err), -1)  # [k, 6]
    inv = m.body_invweight0
    diag = torch.cat(((inv[b1, 0] + inv[b2, 0])[:, None].expand(-1, 3), (inv[b1, 1] + inv[b2, 1])[:, None].expand(-1, 3)), -1)
    return _rows(
        torch.cat((jacp1 - jacp2, jr), 1).flatten(0, 1),
        err.flatten(),
        torch.zeros_like(err).flatten(),
        _equality_active(d, eq, 6),
        diag.flatten(),
        _repeat(m.eq_solref[eq], 6),
        _repeat(m.eq_solimp[eq], 6),
        imp_pos=_repeat(math.safe_norm(err), 6),
    )


def _coupling_rows(m: Model, d: Data, eq: Tensor, value: Tensor, ref: Tensor, jac_rows: Tensor, diag: Tensor) -> Rows:
    """Joint / tendon equalities: obj1 = obj2 polynomial; value, ref, jac_rows [k, 2(, nv)], diag [k, 2]."""
    data = m.eq_data[eq]
    has2 = m.constraint_plan.eq_has_obj2[eq]
    dif = (value[:, 1] - ref[:, 1]) * has2
    poly = data[:, 1] * dif + data[:, 2] * dif**2 + data[:, 3] * dif**3 + data[:, 4] * dif**4
    deriv = data[:, 1] + 2 * data[:, 2] * dif + 3 * data[:, 3] * dif**2 + 4 * data[:, 4] * dif**3
    pos = value[:, 0] - ref[:, 0] - data[:, 0] - poly * has2
    J = jac_rows[:, 0] - (deriv * has2)[:, None] * jac_rows[:, 1]
    return _rows(
        J, pos, torch.zeros_like(pos), d.eq_active[eq], diag[:, 0] + diag[:, 1] * has2,
        m.eq_solref[eq], m.eq_solimp[eq],
    )


def _joint_eq_rows(m: Model, d: Data) -> Rows:
    eq = m.constraint_plan.joint_eq
    jnt = torch.stack((m.constraint_plan.eq_obj1[eq], m.constraint_plan.eq_obj2[eq]), -1)
    qadr, dadr = m.tree.jnt_qposadr[jnt], m.tree.jnt_dofadr[jnt]
    jac_rows = torch.nn.functional.one_hot(dadr, m.nv).to(m.dtype)
    return _coupling_rows(m, d, eq, d.qpos[qadr], m.qpos0[qadr], jac_rows, m.dof_invweight0[dadr])


def _tendon_eq_rows(m: Model, d: Data) -> Rows:
    eq = m.constraint_plan.tendon_eq
    ten = torch.stack((m.constraint_plan.eq_obj1[eq], m.constraint_plan.eq_obj2[eq]), -1)
    return _coupling_rows(
        m, d, eq, d.ten_length[ten], m.tendon_length0[ten], d.ten_J[ten], m.tendon_invweight0[ten]
    )


def _friction_rows(J: Tensor, diag: Tensor, solref: Tensor, solimp: Tensor, frictionloss: Tensor) -> Rows:
    """Frictionloss rows: always active, at zero distance."""
    zero = torch.zeros(J.shape[0], dtype=J.dtype, device=J.device)
    return _rows(J, zero, zero, torch.ones_like(zero, dtype=torch.bool), diag, solref, solimp,
                 frictionloss=frictionloss)


def _dof_friction_rows(m: Model, d: Data) -> Rows:
    dof = m.constraint_plan.friction_dof
    J = torch.nn.functional.one_hot(dof, m.nv).to(m.dtype)
    return _friction_rows(J, m.dof_invweight0[dof], m.dof_solref[dof], m.dof_solimp[dof], m.dof_frictionloss[dof])


def _tendon_friction_rows(m: Model, d: Data) -> Rows:
    ten = m.constraint_plan.friction_tendon
    return _friction_rows(d.ten_J[ten], m.tendon_invweight0[ten], m.tendon_solref_fri[ten],
                          m.tendon_solimp_fri[ten], m.tendon_frictionloss[ten])


def _two_sided(value: Tensor, bounds: Tensor, J: Tensor):
    """Lower and upper limit rows: dist = value - lo, hi - value; J = +J, -J. Interleaved [2k]."""
    dist = torch.stack((value - bounds[:, 0], bounds[:, 1] - value), -1).flatten()
    return dist, torch.stack((J, -J), 1).flatten(0, 1)


def _limit_rows(J: Tensor, dist: Tensor, margin: Tensor, diag: Tensor, solref: Tensor, solimp: Tensor) -> Rows:
    """Limit rows: active once the distance is below the margin."""
    return _rows(J, dist, margin, dist < margin, diag, solref, solimp)


def _scalar_limit_rows(m: Model, d: Data) -> Rows:
    """Hinge and slide joint limits: lower and upper row per joint."""
    jnt = m.constraint_plan.limit_scalar_jnt
    dofadr = m.tree.jnt_dofadr[jnt]
    eye = torch.nn.functional.one_hot(dofadr, m.nv).to(m.dtype)
    dist, J = _two_sided(d.qpos[m.tree.jnt_qposadr[jnt]], m.jnt_range[jnt], eye)
    return _limit_rows(J, dist, _repeat(m.jnt_margin[jnt], 2), _repeat(m.dof_invweight0[dofadr], 2),
                       _repeat(m.jnt_solref[jnt], 2), _repeat(m.jnt_solimp[jnt], 2))


def _ball_limit_rows(m: Model, d: Data) -> Rows:
    """Ball joint limits: distance of the rotation angle to the largest range value, J = -unit axis."""
    ball = m.constraint_plan.limit_ball_jnt
    dofadr = m.tree.jnt_dofadr[ball]
    quat = math.quat_normalize(math.gather_blocks(d.qpos, m.tree.jnt_qposadr[ball], 4))
    axis, angle = math.normalize(math.quat_to_vel(quat))
    dist = torch.maximum(m.jnt_range[ball, 0], m.jnt_range[ball, 1]) - angle
    J = torch.zeros(ball.shape[0], m.nv, dtype=m.dtype, device=m.device)
    J = J.scatter(1, dofadr[:, None] + torch.arange(3, device=m.device), -axis)
    return _limit_rows(J, dist, m.jnt_margin[ball], m.dof_invweight0[dofadr], m.jnt_solref[ball], m.jnt_solimp[ball])


def _tendon_limit_rows(m: Model, d: Data) -> Rows:
    """Tendon length limits: lower and upper row per tendon."""
    ten = m.constraint_plan.limit_tendon
    dist, J = _two_sided(d.ten_length[ten], m.tendon_range[ten], d.ten_J[ten])
    return _limit_rows(J, dist, _repeat(m.tendon_margin[ten], 2), _repeat(m.tendon_invweight0[ten], 2),
                       _repeat(m.tendon_solref_lim[ten], 2), _repeat(m.tendon_solimp_lim[ten], 2))


def _contact_rows(m: Model, d: Data, group) -> Rows:
    """Rows of the contacts of one condim: frictionless, pyramidal or elliptic (mj_instantiateContact)."""
    con = d.contact
    slot, dim, per = group.slot, group.dim, group.rows_per_contact
    geom = m.collision_plan.contact_geom[slot]
    body1, body2 = m.tree.geom_bodyid[geom[:, 0]], m.tree.geom_bodyid[geom[:, 1]]
    pos, frame = con.pos[slot], con.frame[slot]
    # contact-frame Jacobian rows: normal, tangents, then spin and rolls [k, dim, nv]
    full = jac_dif_frame(m, d, pos, body1, body2, frame[:, : min(dim, 3)], rotation=dim > 3)[:, :dim]
    friction = con.friction[slot]
    dist = torch.where(con.active[slot], con.dist[slot], 0.0)  # no inf past this point
    includemargin = con.includemargin[slot]
    inv = m.body_invweight0
    tran = inv[body1, 0] + inv[body2, 0]
    rot = inv[body1, 1] + inv[body2, 1]
    solref, solimp = con.solref[slot], con.solimp[slot]
    if dim == 1:
        J = full[:, 0]
        diag = tran[:, None]
        ref = solref[:, None]
        pos_rows = dist[:, None]
        margin_rows = includemargin[:, None]
    elif m.constraint_plan.elliptic:
        J = full
        diag = torch.stack([tran if j < 3 else rot for j in range(dim)], -1)
        # friction rows use solreffriction when it is set (any component non-zero)
        fri_ref = con.solreffriction[slot]
        has = (fri_ref != 0).any(-1, keepdim=True)
        ref = torch.stack([solref] + [torch.where(has, fri_ref, solref)] * (dim - 1), 1)
        pos_rows = torch.cat((dist[:, None], torch.zeros_like(friction[:, : dim - 1])), -1)
        margin_rows = torch.cat((includemargin[:, None], torch.zeros_like(friction[:, : dim - 1])), -1)
    else:
        mu = friction[:, : dim - 1, None]
        edges = torch.stack((full[:, :1] + mu * full[:, 1:], full[:, :1] - mu * full[:, 1:]), 2)
        J = edges.flatten(1, 2)  # pairs of opposing pyramid edges
        fri2 = friction[:, : dim - 1] ** 2
        scale = torch.stack([tran if j < 2 else rot for j in range(dim - 1)], -1)
        diag = _repeat_last(tran[:, None] + fri2 * scale, 2)
        ref = solref[:, None].expand(-1, per, -1)
        pos_rows = dist[:, None].expand(-1, per)
        margin_rows = includemargin[:, None].expand(-1, per)
    k = slot.shape[0]
    return _rows(
        J.reshape(k * per, m.nv),
        pos_rows.reshape(-1),
        margin_rows.reshape(-1),
        _repeat(con.active[slot], per),
        diag.reshape(-1),
        ref.reshape(k * per, 2),
        _repeat(solimp, per),
        imp_pos=_repeat(dist, per),
        imp_margin=_repeat(includemargin, per),
    )


def _repeat_last(x: Tensor, n: int) -> Tensor:
    """[k, m] -> [k, m * n] repeating each entry n times along the last dim."""
    return x.repeat_interleave(n, dim=-1)


def _impedance(solimp: Tensor, pos: Tensor, margin: Tensor) -> tuple[Tensor, Tensor]:
    """Impedance and its derivative w.r.t. pos (MuJoCo's getimpedance). [k] each."""
    d0, dwidth, width, mid, power = solimp.unbind(-1)
    flat = (d0 == dwidth) | (width <= math.MINVAL)
    width_safe = torch.where(flat, 1.0, width)
    x = (pos - margin) / width_safe
    sgn = torch.where(x < 0, -1.0, 1.0)
    x = x.abs()
    saturated = (x >= 1) | (x <= 0)
    xs = torch.where(saturated, 0.5, x)  # keep pow / division finite on the unused branch
    lower = xs <= mid
    base = torch.where(lower, xs, 1 - xs)
    knot = torch.where(lower, mid, 1 - mid)
    knot = torch.where(knot > 0, knot, 1.0)
    scaled = base / knot
    poly = scaled ** (power - 1)  # = base^(p-1) / knot^(p-1)
    y_low, y_high = xs * poly, 1 - (1 - xs) * poly
    y = torch.where(power == 1, xs, torch.where(lower, y_low, y_high))
    y_prime = torch.where(power == 1, 1.0, power * poly)
    y = torch.where(saturated, torch.where(x >= 1, 1.0, 0.0), y)
    y_prime = torch.where(saturated, 0.0, y_prime)
    imp = d0 + y * (dwidth - d0)
    imp_p = y_prime * sgn * (dwidth - d0) / width_safe
    mid_imp = 0.5 * (d0 + dwidth)
    return torch.where(flat, mid_imp, imp), torch.where(flat, 0.0, imp_p)


def _clamp_solimp(solimp: Tensor) -> Tensor:
    lo = solimp.new_tensor([MINIMP, MINIMP, 0.0, MINIMP, 1.0])
    hi = solimp.new_tensor([MAXIMP, MAXIMP, torch.inf, MAXIMP, torch.inf])
    return torch.minimum(torch.maximum(solimp, lo), hi)


def _safe_ref(m: Model, ref: Tensor) -> Tensor:
    """Impose ref[0] >= 2 * timestep for standard (positive) references (integrator safety)."""
    if m.opt.disabled(DisableBit.REFSAFE):
        return ref
    standard = ref[:, :1] > 0
    safe0 = torch.where(standard, torch.maximum(ref[:, :1], 2 * m.opt.timestep), ref[:, :1])
    return torch.cat((safe0, ref[:, 1:]), -1)


# the rows of each block of ROW_BLOCKS
_ROW_BUILDERS = {
    "connect_eq": _connect_rows,
    "weld_eq": _weld_rows,
    "joint_eq": _joint_eq_rows,
    "tendon_eq": _tendon_eq_rows,
    "friction_dof": _dof_friction_rows,
    "friction_tendon": _tendon_friction_rows,
    "limit_scalar_jnt": _scalar_limit_rows,
    "limit_ball_jnt": _ball_limit_rows,
    "limit_tendon": _tendon_limit_rows,
}


def _all_rows(m: Model, d: Data) -> Rows:
    """Every row of the plan's layout, in MuJoCo's order."""
    plan = m.constraint_plan
    # a block without elements is not traced: its empty tensors would still be ops to compile
    blocks = [_ROW_BUILDERS[name](m, d) for name, _, _ in ROW_BLOCKS if getattr(plan, name).shape[0]]
    blocks += [_contact_rows(m, d, group) for group in plan.contacts]
    return Rows(*(torch.cat(parts) for parts in zip(*blocks)))


def make_constraint(m: Model, d: Data) -> Data:
    """Constraint Jacobian, positions, margins and impedance of every row (mj_makeConstraint)."""
    plan = m.constraint_plan
    if not plan.nefc:
        return d
    rows = _all_rows(m, d)
    solimp = _clamp_solimp(rows.solimp)
    imp, imp_p = _impedance(solimp, rows.imp_pos, rows.imp_margin)
    ref = _safe_ref(m, rows.solref)
    dwidth = solimp[:, 1]

    # K = 1 / (dmax^2 timeconst^2 dampratio^2) or -ref0 / dmax^2; B = 2 / (dmax timeconst) or -ref1 / dmax
    no_stiffness = plan.frictional_rows
    k_std = 1 / torch.clamp(dwidth**2 * ref[:, 0] ** 2 * ref[:, 1] ** 2, min=math.MINVAL)
    k_dir = -ref[:, 0] / torch.clamp(dwidth**2, min=math.MINVAL)
    stiffness = torch.where(no_stiffness, 0.0, torch.where(ref[:, 0] > 0, k_std, k_dir))
    damping = torch.where(
        ref[:, 1] > 0,
        2 / torch.clamp(dwidth * ref[:, 0], min=math.MINVAL),
        -ref[:, 1] / torch.clamp(dwidth, min=math.MINVAL),
    )
    R = torch.clamp((1 - imp) * rows.diag / imp, min=math.MINVAL)
    R = _contact_regularizer(m, d, R)
    return d.replace(
        efc_active=rows.active,
        efc_J=rows.J,
        efc_pos=rows.pos,
        efc_margin=rows.margin,
        efc_frictionloss=rows.frictionloss,
        efc_KBIP=torch.stack((stiffness, damping, imp, imp_p), -1),
        efc_R=R,
        efc_D=1 / R,
        efc_diagA=R * imp / (1 - imp),
    )


def _contact_regularizer(m: Model, d: Data, R: Tensor) -> Tensor:
    """Frictional contact rows: R[1] = R[0] / impratio and the cone-matching rules (mj_makeImpedance)."""
    for group in m.constraint_plan.contacts:
        if group.dim == 1:
            continue
        rows = group.row[:, None] + torch.arange(group.rows_per_contact, device=R.device)
        r0 = R[group.row]
        r1 = r0 / torch.clamp(m.opt.impratio, min=math.MINVAL)
        friction = d.contact.friction[group.slot]
        if m.constraint_plan.elliptic:
            f0 = friction[:, :1]
            rest = r1[:, None] * f0**2 / friction[:, 1 : group.dim - 1] ** 2
            new = torch.cat((r0[:, None], r1[:, None], rest), -1)
        else:
            mu = friction[:, 0] * torch.sqrt(r1 / r0)
            new = (2 * mu**2 * r0)[:, None].expand(-1, group.rows_per_contact)
        R = R.index_copy(0, rows.reshape(-1), new.reshape(-1))
    return R


def contact_mu(m: Model, d: Data, group) -> Tensor:
    """Friction of the regularised cone, friction[0] * sqrt(R[1] / R[0]) (contact.mu). [k]"""
    r0, r1 = d.efc_R[group.row], d.efc_R[group.row + 1]
    return d.contact.friction[group.slot, 0] * torch.sqrt(r1 / r0)


def jac_dot(m: Model, d: Data, point: Tensor, body: Tensor) -> tuple[Tensor, Tensor]:
    """Time derivatives of the point and rotation Jacobians (mj_jacDot). [k, 3, nv] each."""
    tree = m.tree
    mask = tree.body_dof_ancestor[body][:, None, :]
    com = d.subtree_com[tree.body_rootid[body]]
    offset = point - com
    point_vel = math.transform_motion(d.cvel[body], point, com)[:, 3:]  # [k, 3]
    # quaternion dofs take cdof_dot from their own body's velocity
    quat_dot = math.cross_motion(d.cvel[tree.dof_bodyid], d.cdof)
    quat = tree.dof_axis_from_body.sum(-1, keepdim=True)
    cdof_dot = d.cdof_dot + (quat_dot - d.cdof_dot) * quat  # [nv, 6]
    ang = cdof_dot[:, :3][None]  # [1, nv, 3]
    lin = cdof_dot[:, 3:][None] + math.cross(ang, offset[:, None]) + math.cross(d.cdof[:, :3][None], point_vel[:, None])
    return lin.transpose(-1, -2) * mask, ang.transpose(-1, -2) * mask


def _equality_jdotv(m: Model, d: Data) -> Tensor:
    """Jdot * qvel of connect and weld rows (mj_Jdotv), the first blocks of ROW_BLOCKS; zero for other rows. [nefc]"""
    plan = m.constraint_plan
    parts = []
    for eq, weld in ((plan.connect_eq, False), (plan.weld_eq, True)):
        if not eq.shape[0]:
            continue
        pos1, pos2, b1, b2 = _anchors(m, d, eq, weld)
        jp1, jr1 = jac_dot(m, d, pos1, b1)
        jp2, jr2 = jac_dot(m, d, pos2, b2)
        trans = (jp1 - jp2) @ d.qvel
        if not weld:
            parts.append(trans.flatten())
            continue
        torquescale = m.eq_data[eq, 10]
        q0r, negq1 = _weld_orientation(m, d, eq, b1, b2)
        omega1, omega2 = d.cvel[b1, :3], d.cvel[b2, :3]
        domega = omega1 - omega2
        qdot0r = math.quat_mul(_quat_deriv(d.xquat[b1], omega1), m.eq_data[eq, 6:10])
        negqdot1 = math.quat_conj(_quat_deriv(d.xquat[b2], omega2))
        djrdv = (jr1 - jr2) @ d.qvel

        def qaxis(q, v):
            return math.quat_mul(q, torch.cat((torch.zeros_like(v[:, :1]), v), -1))

        term = (
            math.quat_mul(qaxis(negqdot1, domega), q0r)
            + math.quat_mul(qaxis(negq1, djrdv), q0r)
            + math.quat_mul(qaxis(negq1, domega), qdot0r)
        )
        rot = 0.5 * term[:, 1:] * torquescale[:, None]
        parts.append(torch.cat((trans, rot), -1).flatten())
    jdotv = torch.cat(parts) if parts else d.qvel.new_zeros(0)
    return torch.cat((jdotv, jdotv.new_zeros(plan.nefc - jdotv.shape[0])))


def _quat_deriv(quat: Tensor, vel: Tensor) -> Tensor:
    """Time derivative of a body orientation under its world-frame angular velocity: 0.5 (0, vel) * quat."""
    return 0.5 * math.quat_mul(torch.cat((torch.zeros_like(vel[:, :1]), vel), -1), quat)


def _surface_velocity(m: Model, d: Data) -> Tensor:
    """Relative surface velocity (geom 2's minus geom 1's) of each contact along its rows: its tangent
    and spin components, none along the normal or rolling (mj_addSurfaceVel). [nefc]

    A geom's surface moves at geom_surfacevel (linear, angular; in the geom's frame) relative to the
    geom, the linear part taken at the geom's centre.
    """
    plan = m.constraint_plan
    out = d.efc_J.new_zeros(plan.nefc)
    tangent_and_spin = out.new_tensor([0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    for group in plan.contacts:
        geom = m.collision_plan.contact_geom[group.slot]
        pos, frame = d.contact.pos[group.slot], d.contact.frame[group.slot]
        lin, ang = torch.zeros_like(pos), torch.zeros_like(pos)
        for side, sign in ((0, -1.0), (1, 1.0)):
            g = geom[:, side]
            xmat, surface = d.geom_xmat[g], m.geom_surfacevel[g]
            w = (xmat @ surface[:, 3:, None])[..., 0]
            v = (xmat @ surface[:, :3, None])[..., 0] + math.cross(w, pos - d.geom_xpos[g])
            lin, ang = lin + sign * v, ang + sign * w
        frame_vel = torch.cat(((frame @ lin[..., None])[..., 0], (frame @ ang[..., None])[..., 0]), -1)
        frame_vel = frame_vel * tangent_and_spin
        if group.dim == 1 or plan.elliptic:
            rows = frame_vel[:, : group.dim]
        else:  # opposing pyramid edges n +- mu_i t_i
            tangent = frame_vel[:, 1 : group.dim] * d.contact.friction[group.slot, : group.dim - 1]
            rows = torch.stack((tangent, -tangent), -1).flatten(1)
        index = group.row[:, None] + torch.arange(group.rows_per_contact, device=group.row.device)
        out = out.index_copy(0, index.flatten(), rows.flatten())
    return out


def reference_constraint(m: Model, d: Data) -> Data:
    """Constraint velocities and reference accelerations (mj_referenceConstraint)."""
    if not m.constraint_plan.nefc:
        return d
    vel = d.efc_J @ d.qvel
    if m.constraint_plan.surface_velocity:
        vel = vel + _surface_velocity(m, d)
    K, B, imp = d.efc_KBIP[:, 0], d.efc_KBIP[:, 1], d.efc_KBIP[:, 2]
    aref = -B * vel - K * imp * (d.efc_pos - d.efc_margin)
    if m.constraint_plan.ne:
        aref = aref - _equality_jdotv(m, d)
    return d.replace(efc_vel=vel, efc_aref=aref)
