"""Smooth dynamics: kinematics, inertia, velocities, bias forces, tendons, transmissions.

Each stage is a pure function ``f(m, d) -> d`` mirroring MuJoCo's
``engine_core_smooth.c`` (``mj_kinematics``, ``mj_comPos``, ``mj_crb``,
``mj_factorM``, ``mj_comVel``, ``mj_rne``, ``mj_tendon``,
``mj_transmission``). All spatial quantities live in MuJoCo's com-based
frame, where tree recursions other than kinematics are sums over ancestors
or subtrees (matmuls with the constant matrices of ``m.tree``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffmj import math, workarounds
from diffmj.plan import TendonSpans
from diffmj.types import Data, DisableBit, Model, WrapType
from diffmj.wrap import wrap


def kinematics(m: Model, d: Data) -> Data:
    """Global frames of bodies, joints, geoms and sites from qpos (mj_kinematics).

    A joint moves its body's frame by a motion that depends on its own qpos only: a rotation
    ``qloc`` about the joint's anchor, or a slide along its axis. So each body's frame in its
    parent's frame (body_pos / body_quat, then its joints in order) is composed for all bodies at
    once, one joint slot at a time, and the tree levels then only apply the parents' frames.
    MuJoCo composes the same products in another order; when body_quat is the identity and a
    hinge's jnt_pos is zero (the usual case), the sums are the same.
    """
    tree = m.tree
    dtype, device = m.dtype, m.device
    qpos = d.qpos
    identity = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=dtype, device=device)

    # every joint's motion in its body's frame, and a last row for "no joint": qloc [njnt + 1, 4]
    # rotates about jnt_pos, so the frame's origin moves by shift = jnt_pos - qloc(jnt_pos); a slide
    # moves it along jnt_axis
    qloc = identity.expand(m.njnt + 1, 4)
    shift = m.jnt_pos.new_zeros(m.njnt + 1, 3)
    if tree.hinge_jnt.shape[0]:
        angle = qpos[tree.hinge_qposadr] - m.qpos0[tree.hinge_qposadr]
        qloc = qloc.index_copy(0, tree.hinge_jnt, math.axis_angle_to_quat(m.jnt_axis[tree.hinge_jnt], angle))
    if tree.ball_jnt.shape[0]:
        ball = math.quat_normalize(math.gather_blocks(qpos, tree.ball_qposadr, 4))
        qloc = qloc.index_copy(0, tree.ball_jnt, ball)
    if tree.hinge_jnt.shape[0] or tree.ball_jnt.shape[0]:
        jnt_pos = torch.cat((m.jnt_pos, m.jnt_pos.new_zeros(1, 3)))  # and the "no joint" row
        shift = jnt_pos - math.rot_vec_quat(jnt_pos, qloc)  # zero where qloc is the identity
    if tree.slide_jnt.shape[0]:
        amount = qpos[tree.slide_qposadr] - m.qpos0[tree.slide_qposadr]
        shift = shift.index_copy(0, tree.slide_jnt, m.jnt_axis[tree.slide_jnt] * amount[:, None])

    # each body's frame in its parent's, joint slot by joint slot; mocap and free bodies (children of
    # the world) take their pose from mocap_pos / qpos
    pos, quat = m.body_pos, m.body_quat
    if tree.mocap_body.shape[0]:
        pos = pos.index_copy(0, tree.mocap_body, d.mocap_pos[tree.mocap_id])
        quat = quat.index_copy(0, tree.mocap_body, math.quat_normalize(d.mocap_quat[tree.mocap_id]))
    if tree.free_jnt.shape[0]:
        pos = pos.index_copy(0, tree.free_body, math.gather_blocks(qpos, tree.free_qposadr, 3))
        free_quat = math.quat_normalize(math.gather_blocks(qpos, tree.free_qposadr + 3, 4))
        quat = quat.index_copy(0, tree.free_body, free_quat)
    before_pos, before_quat = [], []  # the frame each joint slot starts from [nbody, 3], [nbody, 4]
    # by position: Dynamo lifts the items of `for jnt in tree.body_joint` into a loop body (RK4's stages)
    # as inputs that alias one another, which while_loop and scan refuse
    for k in range(tree.body_joint.shape[0]):
        jnt = tree.body_joint[k]
        before_pos.append(pos)
        before_quat.append(quat)
        pos = pos + math.rot_vec_quat(shift[jnt], quat)
        quat = math.quat_mul(quat, qloc[jnt])

    # the tree, level by level
    xpos = [torch.zeros(1, 3, dtype=dtype, device=device)]
    xquat = [identity[None]]
    xmat = [torch.eye(3, dtype=dtype, device=device)[None]]
    for level in tree.levels:
        parent_pos, parent_mat = xpos[-1][level.parent_slot], xmat[-1][level.parent_slot]
        xpos.append(parent_pos + (parent_mat @ pos[level.body][..., None])[..., 0])
        xquat.append(math.quat_normalize(math.quat_mul(xquat[-1][level.parent_slot], quat[level.body])))
        xmat.append(math.quat_to_mat(xquat[-1]))
    order = tree.body_order
    xpos_all = torch.cat(xpos)[order]
    xquat_all = torch.cat(xquat)[order]
    xmat_all = torch.cat(xmat)[order]

    # joint anchors and axes: from the frame before the joint, in the parent's frame, then global; a free
    # joint's are its body's position (whatever jnt_pos says) and jnt_axis
    anchors, axes = [], []
    if before_pos:
        jnt, parent = tree.chain_jnt, tree.chain_parent
        frame_quat = torch.cat(before_quat)[tree.chain_slot][:, None]
        local = math.rot_vec_quat(torch.stack((m.jnt_pos[jnt], m.jnt_axis[jnt]), 1), frame_quat)
        local = torch.stack((torch.cat(before_pos)[tree.chain_slot] + local[:, 0], local[:, 1]), 1)
        world = (xmat_all[parent][:, None] @ local[..., None])[..., 0]  # [n, 2, 3]
        anchors.append(xpos_all[parent] + world[:, 0])
        axes.append(world[:, 1])
    if tree.free_jnt.shape[0]:
        anchors.append(xpos_all[tree.free_body])
        axes.append(m.jnt_axis[tree.free_jnt])
    if anchors:
        xanchor = torch.cat(anchors)[tree.jnt_order]
        xaxis = torch.cat(axes)[tree.jnt_order]
    else:
        xanchor, xaxis = d.xanchor, d.xaxis

    def local_to_global(body: Tensor | None, local_pos: Tensor, local_quat: Tensor,
                        inertial: tuple[Tensor, Tensor, Tensor, Tensor] | None = None):
        """mj_local2Global: the element's frame composed from its body's, except where it is within the
        compiler's FRAME_EPS of the body's frame or (``inertial``: body_ipos, body_iquat, xipos, ximat) of its
        inertial frame: MuJoCo then copies that frame (mjtSameFrame, geom_ / site_ / body_sameframe)."""
        pos, mat, quat = (xpos_all, xmat_all, xquat_all) if body is None else (
            xpos_all[body], xmat_all[body], xquat_all[body])
        glob_pos = pos + (mat @ local_pos[..., None])[..., 0]
        glob_mat = math.quat_to_mat(math.quat_mul(quat, local_quat))
        null_quat = _same_quat(local_quat, identity)
        null_pose = null_quat & _within_frame_eps(local_pos, 0.0)
        if inertial is None:
            return _copied(null_pose, pos, glob_pos), _copied(null_quat, mat, glob_mat)
        ipos, iquat, xipos, ximat = (t[body] for t in inertial)
        same_iquat = _same_quat(local_quat, iquat)
        same_ipose = ~null_quat & same_iquat & _within_frame_eps(local_pos, ipos)
        # the body's frame first, as MuJoCo tests it first
        glob_pos = _copied(null_pose | same_ipose, torch.where(null_pose[:, None], pos, xipos), glob_pos)
        glob_mat = _copied(null_quat | same_iquat, torch.where(null_quat[:, None, None], mat, ximat), glob_mat)
        return glob_pos, glob_mat

    xipos, ximat = local_to_global(None, m.body_ipos, m.body_iquat)
    # geoms and sites in one pass: [ngeom + nsite]
    elem_xpos, elem_xmat = local_to_global(
        torch.cat((m.tree.geom_bodyid, m.tree.site_bodyid)), torch.cat((m.geom_pos, m.site_pos)),
        torch.cat((m.geom_quat, m.site_quat)), (m.body_ipos, m.body_iquat, xipos, ximat))
    geom_xpos, site_xpos = elem_xpos.split((m.ngeom, m.nsite))
    geom_xmat, site_xmat = elem_xmat.split((m.ngeom, m.nsite))
    return d.replace(
        xpos=xpos_all,
        xquat=xquat_all,
        xmat=xmat_all,
        xipos=xipos,
        ximat=ximat,
        xanchor=xanchor,
        xaxis=xaxis,
        geom_xpos=geom_xpos,
        geom_xmat=geom_xmat,
        site_xpos=site_xpos,
        site_xmat=site_xmat,
    )


# the compiler's and mj_setConst's tolerance for an element's frame equal to its body's or inertial frame
FRAME_EPS = 1e-6


def _within_frame_eps(a: Tensor, b: Tensor) -> Tensor:
    """[...]: every component of a [..., k] within FRAME_EPS of b's (user_model.cc IsSameVec)."""
    return ((a - b).abs() < FRAME_EPS).all(-1)


def _same_quat(q1: Tensor, q2: Tensor) -> Tensor:
    """[...]: q1 [..., 4] the same rotation as q2 within FRAME_EPS, either sign (IsSameQuat)."""
    return _within_frame_eps(q1, q2) | _within_frame_eps(q1, -q2)


def _copied(same: Tensor, frame: Tensor, composed: Tensor) -> Tensor:
    """``frame``'s value where ``same`` [n], else ``composed`` [n, ...]. The derivative is always the
    composition's: the copy is a snap within FRAME_EPS, and a parameter (geom_pos, body_ipos) moved away
    from it should be felt by its gradient."""
    same = same.reshape(same.shape + (1,) * (composed.dim() - same.dim()))
    return composed + torch.where(same, (frame - composed).detach(), 0.0)


def subtree_mass(m: Model) -> Tensor:
    """Mass of each body's subtree [nbody], from the current ``body_mass``."""
    return m.tree.body_subtree @ m.body_mass


def com_pos(m: Model, d: Data) -> Data:
    """Subtree centres of mass, com-frame inertias and motion dofs (mj_comPos)."""
    tree = m.tree
    mass = m.body_mass
    total = subtree_mass(m)
    moment = tree.body_subtree @ (mass[:, None] * d.xipos)
    small = (total < math.MINVAL)[:, None]
    subtree_com = torch.where(small, d.xipos, moment / torch.where(small, 1.0, total[:, None]))

    offset = d.xipos - subtree_com[tree.body_rootid]
    cinert = math.inert_com(m.body_inertia, d.ximat, offset, mass)

    # motion dofs: hinge [axis, axis x r], slide [0, axis], ball / free rotation use the
    # body frame's columns, free translation the world axes
    axis = (
        d.xaxis[tree.dof_jntid] * tree.dof_axis_from_joint[:, None]
        + (d.xmat[tree.dof_bodyid] * tree.dof_axis_from_body[:, None, :]).sum(-1)
        + tree.dof_axis_world
    )
    offset = subtree_com[tree.dof_rootid] - d.xanchor[tree.dof_jntid]
    rotational = tree.dof_rotational[:, None]
    cdof = torch.cat((axis * rotational, math.cross(axis, offset) * rotational + axis * (1 - rotational)), -1)
    return d.replace(subtree_com=subtree_com, cinert=cinert, cdof=cdof)


def tendon(m: Model, d: Data) -> Data:
    """Tendon lengths and Jacobians (mj_tendon): fixed tendons, and spatial tendons span by span."""
    if not m.ntendon:
        return d
    plan = m.tendon_plan
    coef = m.wrap_prm[plan.joint_wrap]
    length = workarounds.sum_at(m.ntendon, plan.joint_tendon, coef * d.qpos[plan.joint_qposadr])
    ten_j = workarounds.sum_at(m.ntendon * m.nv, plan.joint_tendon * m.nv + plan.joint_dofadr, coef)
    ten_j = ten_j.reshape(m.ntendon, m.nv)
    for spans in plan.spans:
        span_length, span_j = _tendon_spans(m, d, spans)
        length = length + workarounds.sum_at(m.ntendon, spans.tendon, span_length)
        ten_j = ten_j + workarounds.sum_at(m.ntendon, spans.tendon, span_j)
    return d.replace(ten_length=length, ten_J=ten_j)


def _tendon_spans(m: Model, d: Data, spans: TendonSpans) -> tuple[Tensor, Tensor]:
    """Lengths [k] and Jacobians [k, nv] of spatial-tendon spans of one kind.

    A span's Jacobian is the difference of its end points' Jacobians along its direction,
    each point moving with its body (a tangent point with the wrapping geom's), as MuJoCo's.
    """
    site_body, geom_body = m.tree.site_bodyid, m.tree.geom_bodyid

    def segment(a: Tensor, body_a: Tensor, b: Tensor, body_b: Tensor, moving: Tensor) -> tuple[Tensor, Tensor]:
        unit, norm = math.normalize(b - a)
        jac_a, _ = jac(m, d, a, body_a)
        jac_b, _ = jac(m, d, b, body_b)
        return norm, ((jac_b - jac_a) * unit[:, :, None]).sum(1) * moving[:, None]

    x0, x1 = d.site_xpos[spans.site0], d.site_xpos[spans.site1]
    body0, body1 = site_body[spans.site0], site_body[spans.site1]
    length, span_j = segment(x0, body0, x1, body1, spans.moving)
    if spans.wrap_type != WrapType.NONE:
        geom = spans.geom
        wrapped, arc, t0, t1 = wrap(x0, x1, d.geom_xpos[geom], d.geom_xmat[geom], m.geom_size[geom, 0],
                                    d.site_xpos[spans.sidesite], spans.has_side, spans.wrap_type == WrapType.SPHERE,
                                    m.early_exit)
        length_in, j_in = segment(x0, body0, t0, geom_body[geom], spans.moving_in)
        length_out, j_out = segment(t1, geom_body[geom], x1, body1, spans.moving_out)
        length = torch.where(wrapped, length_in + arc + length_out, length)
        span_j = torch.where(wrapped[:, None], j_in + j_out, span_j)
    divisor = torch.where(spans.pulley >= 0, m.wrap_prm[spans.pulley.clamp(min=0)], 1.0)
    return length / divisor, span_j / divisor[:, None]


def crb(m: Model, d: Data) -> Data:
    """Composite inertias and the joint-space inertia matrix qM (mj_crb + mj_tendonArmature)."""
    tree = m.tree
    composite = tree.body_subtree @ d.cinert
    composite = torch.cat((d.cinert[:1], composite[1:]))  # the world accumulates nothing
    force = math.inert_mul(composite[tree.dof_bodyid], d.cdof)  # crb_body(i) * cdof_i
    lower = (force @ d.cdof.transpose(-1, -2)) * tree.dof_ancestor  # [i, j]: cdof_j . force_i
    qm = lower + lower.transpose(-1, -2) - torch.diag_embed(torch.diagonal(lower, 0, -2, -1))
    qm = qm + torch.diag_embed(m.dof_armature)
    if m.ntendon:
        # like MuJoCo, only within M's sparsity (dofs on one kinematic chain)
        armature = d.ten_J.transpose(-1, -2) @ (m.tendon_armature[:, None] * d.ten_J)
        qm = qm + armature * tree.dof_chain
    return d.replace(crb=composite, qM=qm)


def factor_m(m: Model, d: Data) -> Data:
    """Cholesky factor of qM (mj_factorM; dense here)."""
    return d.replace(qLD=math.cholesky(d.qM))


def solve_m(m: Model, d: Data, x: Tensor) -> Tensor:
    """qM^-1 x for x [nv] or [nv, k] (mj_solveM)."""
    if x.dim() == 1:
        return torch.cholesky_solve(x[:, None], d.qLD)[:, 0]
    return torch.cholesky_solve(x, d.qLD)


def com_vel(m: Model, d: Data) -> Data:
    """Body velocities in the com frame and cdof time derivatives (mj_comVel)."""
    tree = m.tree
    dof_vel = d.cdof * d.qvel[:, None]
    cvel = tree.body_dof_ancestor @ dof_vel
    vel_before = tree.dof_vel_ancestor @ dof_vel
    cdof_dot = math.cross_motion(vel_before, d.cdof) * (1 - tree.dof_free_translation)[:, None]
    return d.replace(cvel=cvel, cdof_dot=cdof_dot)


def rne(m: Model, d: Data, qacc: Tensor | None = None) -> Tensor:
    """Recursive Newton-Euler: C(q, v) + g(q), plus M qacc if given (mj_rne). [nv]"""
    tree = m.tree
    cacc = tree.body_dof_ancestor @ (d.cdof_dot * d.qvel[:, None])
    if qacc is not None:
        cacc = cacc + tree.body_dof_ancestor @ (d.cdof * qacc[:, None])
    if not m.opt.disabled(DisableBit.GRAVITY):
        cacc = cacc + torch.cat((torch.zeros_like(m.opt.gravity), -m.opt.gravity))
    frc = math.inert_mul(d.cinert, cacc) + math.cross_force(d.cvel, math.inert_mul(d.cinert, d.cvel))
    frc = tree.body_subtree @ frc
    return (d.cdof * frc[tree.dof_bodyid]).sum(-1)


def jac(m: Model, d: Data, point: Tensor, body: Tensor) -> tuple[Tensor, Tensor]:
    """Translational and rotational Jacobians of points fixed to bodies (mj_jac).

    point [k, 3] in world coordinates, body [k] ids; returns jacp, jacr [k, 3, nv].
    """
    mask = m.tree.body_dof_ancestor[body][:, None, :]  # [k, 1, nv]
    offset = point - d.subtree_com[m.tree.body_rootid[body]]  # [k, 3]
    ang = d.cdof[:, :3].transpose(-1, -2)[None]  # [1, 3, nv]
    lin = d.cdof[:, 3:].transpose(-1, -2)[None]
    jacp = (lin + math.cross(ang.transpose(-1, -2), offset[:, None, :]).transpose(-1, -2)) * mask
    return jacp, ang * mask


def jac_dif_frame(m: Model, d: Data, point: Tensor, body1: Tensor, body2: Tensor, frame: Tensor,
                  rotation: bool = False) -> Tensor:
    """frame @ (J(body2) - J(body1)) of points moving with both bodies (mj_jacDifPair turned into a
    contact frame): the translational rows [k, r, nv], then with ``rotation`` the rotational ones
    ([k, 2 r, nv] in all).

    point [k, 3] world, body1 / body2 [k] ids, frame [k, r, 3] rows. Along a frame row f, a dof's
    motion cdof = (ang, lin) moves the point at f.lin + f.(ang x o) = (o x f, f) . cdof, with o the
    point's offset from its tree's subtree com: one [k, r, 6] @ [6, nv] product per body instead of
    a cross product per point and dof. Dofs moving both bodies drop out (exact zeros).
    """
    tree = m.tree
    mask1, mask2 = tree.body_dof_ancestor[body1], tree.body_dof_ancestor[body2]  # [k, nv] of 0 / 1
    only1, only2 = (mask1 * (1 - mask2))[:, None, :], (mask2 * (1 - mask1))[:, None, :]
    cdof = d.cdof.transpose(-1, -2)  # [6, nv]

    def translation(body: Tensor) -> Tensor:  # [k, r, nv], every dof's column
        offset = point - d.subtree_com[tree.body_rootid[body]]
        return torch.cat((math.cross(offset[:, None, :], frame), frame), -1) @ cdof

    rows = translation(body2) * only2 - translation(body1) * only1
    return torch.cat((rows, (frame @ cdof[:3]) * (only2 - only1)), 1) if rotation else rows


def apply_ft(
    m: Model, d: Data, force: Tensor, torque: Tensor, point: Tensor, body: Tensor | None = None
) -> Tensor:
    """Generalised force of forces / torques [k, 3] acting at points on bodies (mj_applyFT). [nv]

    ``body`` [k] gives the body of each point; None means one point per body.
    Each wrench becomes a com-frame spatial force; a dof feels the sum over the
    bodies it moves: qfrc_j = cdof_j . sum_b [torque_b + r_b x force_b, force_b].
    """
    tree = m.tree
    rootid, ancestor = (tree.body_rootid, tree.body_dof_ancestor) if body is None else (
        tree.body_rootid[body], tree.body_dof_ancestor[body])
    offset = point - d.subtree_com[rootid]
    wrench = torch.cat((torque + math.cross(offset, force), force), -1)  # [k, 6]
    per_dof = ancestor.transpose(-1, -2) @ wrench  # [nv, 6]
    return (d.cdof * per_dof).sum(-1)


def transmission(m: Model, d: Data) -> Data:
    """Actuator lengths and moment arms (mj_transmission)."""
    if not m.nu:
        return d
    plan = m.actuator_plan
    gear = m.actuator_gear
    nv = m.nv
    lengths, moments = [], []

    if plan.scalar_joint_act.shape[0]:
        g = gear[plan.scalar_joint_act, 0]
        lengths.append(d.qpos[plan.scalar_joint_qposadr] * g)
        moments.append(torch.nn.functional.one_hot(plan.scalar_joint_dofadr, nv).to(g.dtype) * g[:, None])

    def rotate_gear(axis_gear: Tensor, quat: Tensor, inparent: Tensor) -> Tensor:
        in_parent = math.rot_vec_quat(axis_gear, math.quat_conj(quat))
        return axis_gear + (in_parent - axis_gear) * inparent[:, None]

    def scatter_dofs(values: Tensor, dofadr: Tensor) -> Tensor:
        k, width = values.shape
        index = dofadr[:, None] + torch.arange(width, device=dofadr.device)
        return torch.zeros(k, nv, dtype=values.dtype, device=values.device).scatter(1, index, values)

    if plan.ball_act.shape[0]:
        quat = math.quat_normalize(math.gather_blocks(d.qpos, plan.ball_qposadr, 4))
        axis = math.quat_to_vel(quat)
        gear_axis = rotate_gear(gear[plan.ball_act, :3], quat, plan.ball_inparent)
        lengths.append((axis * gear_axis).sum(-1))
        moments.append(scatter_dofs(gear_axis, plan.ball_dofadr))

    if plan.free_act.shape[0]:
        quat = math.quat_normalize(math.gather_blocks(d.qpos, plan.free_qposadr, 4))
        gear_axis = rotate_gear(gear[plan.free_act, 3:], quat, plan.free_inparent)
        lengths.append(torch.zeros_like(gear_axis[:, 0]))
        moments.append(scatter_dofs(torch.cat((gear[plan.free_act, :3], gear_axis), -1), plan.free_dofadr))

    if plan.tendon_act.shape[0]:
        g = gear[plan.tendon_act, 0]
        lengths.append(d.ten_length[plan.tendon_id] * g)
        moments.append(d.ten_J[plan.tendon_id] * g[:, None])

    if plan.site_act.shape[0]:
        site_mat = d.site_xmat[plan.site_id]
        wrench_force = (site_mat @ gear[plan.site_act, :3, None])[..., 0]
        wrench_torque = (site_mat @ gear[plan.site_act, 3:, None])[..., 0]
        jacp, jacr = jac(m, d, d.site_xpos[plan.site_id], plan.site_body)
        moment = (jacp * wrench_force[..., None]).sum(1) + (jacr * wrench_torque[..., None]).sum(1)
        lengths.append(torch.zeros_like(wrench_force[:, 0]))
        moments.append(moment)

    if plan.refsite_act.shape[0]:
        length, moment = _site_relative(m, d, gear[plan.refsite_act])
        lengths.append(length)
        moments.append(moment)

    if plan.slidercrank_act.shape[0]:
        length, moment = _slider_crank(m, d)
        g = gear[plan.slidercrank_act, 0]
        lengths.append(length * g)
        moments.append(moment * g[:, None])

    if plan.body_act.shape[0]:
        moments.append(_adhesion_moment(m, d))
        lengths.append(moments[-1].new_zeros(plan.body_act.shape[0]))

    length = torch.cat(lengths)[plan.order]
    moment = torch.cat(moments)[plan.order]
    return d.replace(actuator_length=length, actuator_moment=moment)


def _site_relative(m: Model, d: Data, gear: Tensor) -> tuple[Tensor, Tensor]:
    """Lengths [k] and moments [k, nv] of site transmissions with a reference site (mj_transmission).

    The length is the site's position in the reference site's frame and its rotation from it (as
    mju_subQuat of the two frames' quaternions, each its body's xquat * site_quat)
    along the gear; the moment the gear's wrench in the reference frame through the difference of
    the two sites' Jacobians, without the dofs that move both.
    """
    plan = m.actuator_plan
    site, ref = plan.refsite_site, plan.refsite_ref
    ref_mat = d.site_xmat[ref]
    local = (ref_mat.transpose(-1, -2) @ (d.site_xpos[site] - d.site_xpos[ref])[..., None])[..., 0]
    quat = math.quat_mul(d.xquat[plan.refsite_site_body], m.site_quat[site])
    ref_quat = math.quat_mul(d.xquat[plan.refsite_ref_body], m.site_quat[ref])
    length = (local * gear[:, :3]).sum(-1) + (math.quat_sub(quat, ref_quat) * gear[:, 3:]).sum(-1)
    jacp, jacr = jac(m, d, d.site_xpos[site], plan.refsite_site_body)
    ref_jacp, ref_jacr = jac(m, d, d.site_xpos[ref], plan.refsite_ref_body)
    force = (ref_mat @ gear[:, :3, None])[..., 0]
    torque = (ref_mat @ gear[:, 3:, None])[..., 0]
    moment = ((jacp - ref_jacp) * force[..., None]).sum(1) + ((jacr - ref_jacr) * torque[..., None]).sum(1)
    return length, moment * plan.refsite_unshared_dofs


def _slider_crank(m: Model, d: Data) -> tuple[Tensor, Tensor]:
    """Lengths [k] and moments [k, nv] (before the gear) of slider-crank transmissions (mj_transmission).

    length = a'v - sqrt(det), det = (a'v)^2 + r^2 - v'v, with a the slider site's z axis, v the
    vector from the slider site to the crank site, r the rod's length; where the rod cannot reach
    (det <= 0) MuJoCo takes length = a'v and the derivatives of a'v.
    """
    plan = m.actuator_plan
    crank, slider = plan.slidercrank_crank, plan.slidercrank_slider
    axis = d.site_xmat[slider, :, 2]
    vec = d.site_xpos[crank] - d.site_xpos[slider]
    rod = m.actuator_cranklength[plan.slidercrank_act]
    av = (vec * axis).sum(-1)
    det = av * av + rod * rod - (vec * vec).sum(-1)
    reach = det > 0
    sdet = torch.sqrt(torch.where(reach, det, 1.0))
    length = torch.where(reach, av - sdet, av)
    scale = torch.where(reach, 1 - av / sdet, 1.0)[:, None]
    dl_dvec = axis * scale + torch.where(reach[:, None], vec / sdet[:, None], 0.0)
    dl_daxis = vec * scale
    jac_slider, jacr_slider = jac(m, d, d.site_xpos[slider], plan.slidercrank_slider_body)
    jac_crank, _ = jac(m, d, d.site_xpos[crank], plan.slidercrank_crank_body)
    jac_axis = math.cross(jacr_slider.transpose(-1, -2), axis[:, None, :]).transpose(-1, -2)  # d axis / dq
    moment = (dl_daxis[:, :, None] * jac_axis + dl_dvec[:, :, None] * (jac_crank - jac_slider)).sum(1)
    return length, moment


def _adhesion_moment(m: Model, d: Data) -> Tensor:
    """Moment arms of body (adhesion) transmissions: minus the mean over the body's contacts of the
    normal Jacobian n . (J2 - J1) at the contact point (mj_transmission's mjTRN_BODY). [k, nv]

    Every contact counts, those in the margin's gap too; MuJoCo averages a pyramidal contact's edge
    rows, whose mean is this normal row. No contact: a zero moment.
    """
    plan = m.actuator_plan
    slot = plan.body_slot
    geom = m.collision_plan.contact_geom[slot]
    pos, normal = d.contact.pos[slot], d.contact.frame[slot, 0]
    body1, body2 = m.tree.geom_bodyid[geom[:, 0]], m.tree.geom_bodyid[geom[:, 1]]
    present = torch.isfinite(d.contact.dist[slot])
    normal_rate = jac_dif_frame(m, d, pos, body1, body2, normal[:, None, :])[:, 0]  # [s, nv]
    rate = torch.where(present[:, None], normal_rate, 0.0)
    k = plan.body_act.shape[0]
    total = rate.new_zeros(k, m.nv).index_add(0, plan.body_slot_act, rate)
    count = rate.new_zeros(k).index_add(0, plan.body_slot_act, present.to(rate.dtype))
    return -total / torch.clamp(count, min=1.0)[:, None]


def contact_force(m: Model, d: Data) -> Tensor:
    """Force and torque of each contact slot in its contact frame (mj_contactForce). [ncon, 6]

    Pyramidal cones store forces along pairs of opposing edges; the frame
    components are recovered as normal = sum of edge forces and tangent
    i = (f_2i - f_2i+1) * friction_i. Empty and inactive slots give zero.
    """
    out = d.efc_force.new_zeros(m.collision_plan.ncon, 6)
    plan = m.constraint_plan
    for group in plan.contacts:
        rows = group.row[:, None] + torch.arange(group.rows_per_contact, device=group.row.device)
        force = d.efc_force[rows]  # [k, rows_per_contact]
        if group.dim > 1 and not plan.elliptic:
            tangent = (force[:, 0::2] - force[:, 1::2]) * d.contact.friction[group.slot, : group.dim - 1]
            force = torch.cat((force.sum(-1, keepdim=True), tangent), -1)
        out = out.index_copy(0, group.slot, torch.nn.functional.pad(force, (0, 6 - group.dim)))
    return out


def _equality_wrenches(m: Model, d: Data) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """World torque:force that connect / weld rows exert on their first body, and the anchors.

    Returns wrench [k, 6], point1 / point2 [k, 3] (the anchors on both bodies, where the
    force acts), body1 / body2 [k]; the second body receives the opposite wrench. A weld's
    rotational rows f act as the torque (dr/domega)' f = torquescale / 2 Im(q0r (0, f) neg(q1)),
    with q0r = xquat1 * relpose and neg(q1) = conj(xquat2), the terms of the rows' error.
    """
    plan = m.constraint_plan
    parts = []
    first = 0
    for eq, weld in ((plan.connect_eq, False), (plan.weld_eq, True)):
        n = 6 if weld else 3
        force = d.efc_force[first : first + n * eq.shape[0]].reshape(-1, n)
        first += n * eq.shape[0]
        data = m.eq_data[eq]
        b1, b2 = plan.eq_obj1[eq], plan.eq_obj2[eq]
        torque = torch.zeros_like(force[:, :3])
        if weld:
            q0r = math.quat_mul(d.xquat[b1], data[:, 6:10])
            rows = torch.cat((torch.zeros_like(force[:, :1]), force[:, 3:]), -1)
            torque = 0.5 * data[:, 10:11] * math.quat_mul(math.quat_mul(q0r, rows), math.quat_conj(d.xquat[b2]))[:, 1:]
        local1, local2 = (data[:, 3:6], data[:, :3]) if weld else (data[:, :3], data[:, 3:6])
        point1 = d.xpos[b1] + math.mat_vec(d.xmat[b1], local1)
        point2 = d.xpos[b2] + math.mat_vec(d.xmat[b2], local2)
        parts.append((torch.cat((torque, force[:, :3]), -1), point1, point2, b1, b2))
    return tuple(torch.cat(p) for p in zip(*parts))


def rne_post_constraint(m: Model, d: Data) -> Data:
    """Body accelerations and forces after the constraint solve (mj_rnePostConstraint).

    cacc [nbody, 6]: com-based acceleration, -gravity for the world.
    cfrc_ext [nbody, 6]: xfrc_applied, contact and connect / weld forces on each body,
    as com-based torque:force (zero for the world).
    cfrc_int [nbody, 6]: force each body receives from its parent, summed over subtrees.
    """
    tree = m.tree
    cacc = tree.body_dof_ancestor @ (d.cdof_dot * d.qvel[:, None] + d.cdof * d.qacc[:, None])
    if not m.opt.disabled(DisableBit.GRAVITY):
        cacc = cacc + torch.cat((torch.zeros_like(m.opt.gravity), -m.opt.gravity))
    com = d.subtree_com[tree.body_rootid]  # [nbody, 3] com each body's wrenches refer to

    def to_com(wrench: Tensor, point: Tensor, body: Tensor) -> Tensor:
        return math.transform_force(wrench, com[body], point)

    xfrc = d.xfrc_applied
    ext = math.transform_force(torch.cat((xfrc[:, 3:], xfrc[:, :3]), -1), com, d.xipos)
    if m.collision_plan.ncon:
        local = contact_force(m, d)
        frame = d.contact.frame
        wrench = torch.cat((math.mat_t_vec(frame, local[:, 3:]), math.mat_t_vec(frame, local[:, :3])), -1)
        geom = m.collision_plan.contact_geom
        body1, body2 = tree.geom_bodyid[geom[:, 0]], tree.geom_bodyid[geom[:, 1]]
        pos = d.contact.pos
        ext = ext - workarounds.sum_at(m.nbody, body1, to_com(wrench, pos, body1))
        ext = ext + workarounds.sum_at(m.nbody, body2, to_com(wrench, pos, body2))
    if m.constraint_plan.connect_eq.shape[0] or m.constraint_plan.weld_eq.shape[0]:
        wrench, point1, point2, body1, body2 = _equality_wrenches(m, d)
        ext = ext + workarounds.sum_at(m.nbody, body1, to_com(wrench, point1, body1))
        ext = ext - workarounds.sum_at(m.nbody, body2, to_com(wrench, point2, body2))
    world = torch.arange(m.nbody, device=ext.device)[:, None] == 0
    ext = torch.where(world, 0.0, ext)

    inertial = math.inert_mul(d.cinert, cacc) + math.cross_force(d.cvel, math.inert_mul(d.cinert, d.cvel))
    cfrc_int = tree.body_subtree @ torch.where(world, 0.0, inertial - ext)
    return d.replace(cacc=cacc, cfrc_int=cfrc_int, cfrc_ext=ext)
