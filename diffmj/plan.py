"""Index plans for tendons and actuators, computed once in ``put_model``.

A plan turns MuJoCo's per-element type switches into a few groups of equal
type, each with the index tensors its vectorised code gathers with, and 0/1
masks for choices that are cheaper to blend than to split.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from diffmj.dataclass import PyTreeNode, pytree_dataclass, static_field
from diffmj.tree import BALL, FREE

TRN_JOINT, TRN_JOINTINPARENT, TRN_TENDON, TRN_SITE = 0, 1, 3, 4
DYN_NONE, DYN_INTEGRATOR, DYN_FILTER, DYN_FILTEREXACT = 0, 1, 2, 3
GAIN_AFFINE = 1
BIAS_AFFINE = 1


def _long(values, device) -> Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.int64).reshape(-1), device=device)


def _floats(values, dtype, device) -> Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.float64), device=device).to(dtype)


@pytree_dataclass
class TendonPlan(PyTreeNode):
    """Fixed tendons as sums over wrap entries."""

    wrap_tendon: Tensor  # [nwrap] tendon of each wrap entry
    wrap_qposadr: Tensor  # [nwrap] qpos address of its joint
    wrap_dofadr: Tensor  # [nwrap] dof address of its joint


@pytree_dataclass
class ActuatorPlan(PyTreeNode):
    """Actuators grouped by transmission, plus per-actuator masks."""

    order: Tensor  # [nu] position of actuator i in the group-concatenated order
    scalar_joint_act: Tensor  # hinge / slide joint transmissions
    scalar_joint_qposadr: Tensor
    scalar_joint_dofadr: Tensor
    ball_act: Tensor  # ball joint transmissions
    ball_qposadr: Tensor
    ball_dofadr: Tensor
    ball_inparent: Tensor  # [k] 1 for jointinparent
    free_act: Tensor  # free joint transmissions
    free_qposadr: Tensor  # address of the quaternion
    free_dofadr: Tensor
    free_inparent: Tensor
    tendon_act: Tensor  # tendon transmissions
    tendon_id: Tensor
    site_act: Tensor  # site transmissions (no refsite)
    site_id: Tensor
    site_body: Tensor
    act_index: Tensor  # [nu] index into act of the actuator's (last) activation; 0 if none
    has_act: Tensor  # [nu] 1 if the actuator has an activation state
    gain_affine: Tensor  # [nu]
    bias_affine: Tensor  # [nu]
    ctrllimited: Tensor  # [nu] bool
    forcelimited: Tensor  # [nu] bool
    actearly: Tensor  # [nu] bool
    enabled: Tensor  # [nu] 0 for actuators disabled by their group
    act_actuator: Tensor  # [na] actuator owning each activation
    act_integrator: Tensor  # [na] 1 for integrator dynamics
    act_filter: Tensor  # [na] 1 for filter and filterexact dynamics
    act_filterexact: Tensor  # [na] 1 for filterexact dynamics
    act_limited: Tensor  # [na] bool
    tendon_frclimited_act: Tensor  # actuators on force-limited tendons
    tendon_frclimited_id: Tensor  # their tendon
    jnt_frclimited_dofadr: Tensor  # first dof of each joint with actuatorfrcrange
    jnt_frclimited_jnt: Tensor
    jnt_frclimited_act: Tensor  # joint-transmission actuators on such joints
    jnt_frclimited_act_jnt: Tensor  # their joint
    actgravcomp_dof: Tensor  # dofs whose gravity compensation goes through actuators
    any_act: bool = static_field()
    any_actearly: bool = static_field()


def build_tendon_plan(mjm, device) -> TendonPlan:
    wrap_tendon = np.zeros(mjm.nwrap, dtype=int)
    for t in range(mjm.ntendon):
        wrap_tendon[mjm.tendon_adr[t] : mjm.tendon_adr[t] + mjm.tendon_num[t]] = t
    jnt = mjm.wrap_objid
    return TendonPlan(
        wrap_tendon=_long(wrap_tendon, device),
        wrap_qposadr=_long(mjm.jnt_qposadr[jnt], device),
        wrap_dofadr=_long(mjm.jnt_dofadr[jnt], device),
    )


def build_actuator_plan(mjm, dtype, device) -> ActuatorPlan:
    nu = mjm.nu
    trn = mjm.actuator_trntype
    trnid = mjm.actuator_trnid[:, 0] if nu else np.zeros(0, int)
    jtype = mjm.jnt_type

    def joint_acts(types):
        return [i for i in range(nu) if trn[i] in (TRN_JOINT, TRN_JOINTINPARENT) and jtype[trnid[i]] in types]

    scalar = joint_acts((2, 3))
    ball = joint_acts((BALL,))
    free = joint_acts((FREE,))
    tendon = [i for i in range(nu) if trn[i] == TRN_TENDON]
    site = [i for i in range(nu) if trn[i] == TRN_SITE]
    concat = scalar + ball + free + tendon + site
    order = np.argsort(np.asarray(concat, dtype=int)) if nu else np.zeros(0, int)

    actadr, actnum = mjm.actuator_actadr, mjm.actuator_actnum
    has_act = actnum > 0
    act_index = np.where(has_act, actadr + actnum - 1, 0)
    act_actuator = np.zeros(mjm.na, dtype=int)
    for i in range(nu):
        if actnum[i]:
            act_actuator[actadr[i] : actadr[i] + actnum[i]] = i
    dyn = mjm.actuator_dyntype[act_actuator]
    group = mjm.actuator_group
    disabled = [(0 <= g <= 30) and bool(mjm.opt.disableactuator & (1 << g)) for g in group]

    limited_tendon_acts = [i for i in tendon if mjm.tendon_actfrclimited[trnid[i]]]
    limited_jnts = [j for j in range(mjm.njnt) if mjm.jnt_actfrclimited[j]]
    limited_jnt_acts = [i for i in scalar + ball + free if mjm.jnt_actfrclimited[trnid[i]]]
    dofnum = {0: 6, 1: 3, 2: 1, 3: 1}
    gravcomp_dofs = [
        mjm.jnt_dofadr[j] + k
        for j in range(mjm.njnt)
        if mjm.jnt_actgravcomp[j]
        for k in range(dofnum[jtype[j]])
    ]

    def f(x):
        return _floats(x, dtype, device)

    return ActuatorPlan(
        order=_long(order, device),
        scalar_joint_act=_long(scalar, device),
        scalar_joint_qposadr=_long(mjm.jnt_qposadr[trnid[scalar]], device),
        scalar_joint_dofadr=_long(mjm.jnt_dofadr[trnid[scalar]], device),
        ball_act=_long(ball, device),
        ball_qposadr=_long(mjm.jnt_qposadr[trnid[ball]], device),
        ball_dofadr=_long(mjm.jnt_dofadr[trnid[ball]], device),
        ball_inparent=f(trn[ball] == TRN_JOINTINPARENT),
        free_act=_long(free, device),
        free_qposadr=_long(mjm.jnt_qposadr[trnid[free]] + 3, device),
        free_dofadr=_long(mjm.jnt_dofadr[trnid[free]], device),
        free_inparent=f(trn[free] == TRN_JOINTINPARENT),
        tendon_act=_long(tendon, device),
        tendon_id=_long(trnid[tendon], device),
        site_act=_long(site, device),
        site_id=_long(trnid[site], device),
        site_body=_long(mjm.site_bodyid[trnid[site]], device),
        act_index=_long(act_index, device),
        has_act=f(has_act),
        gain_affine=f(mjm.actuator_gaintype == GAIN_AFFINE),
        bias_affine=f(mjm.actuator_biastype == BIAS_AFFINE),
        ctrllimited=torch.as_tensor(mjm.actuator_ctrllimited.astype(bool), device=device),
        forcelimited=torch.as_tensor(mjm.actuator_forcelimited.astype(bool), device=device),
        actearly=torch.as_tensor(mjm.actuator_actearly.astype(bool), device=device),
        enabled=f(np.logical_not(disabled)),
        act_actuator=_long(act_actuator, device),
        act_integrator=f(dyn == DYN_INTEGRATOR),
        act_filter=f((dyn == DYN_FILTER) | (dyn == DYN_FILTEREXACT)),
        act_filterexact=f(dyn == DYN_FILTEREXACT),
        act_limited=torch.as_tensor(mjm.actuator_actlimited[act_actuator].astype(bool), device=device),
        tendon_frclimited_act=_long(limited_tendon_acts, device),
        tendon_frclimited_id=_long(trnid[limited_tendon_acts], device),
        jnt_frclimited_dofadr=_long(mjm.jnt_dofadr[limited_jnts], device),
        jnt_frclimited_jnt=_long(limited_jnts, device),
        jnt_frclimited_act=_long(limited_jnt_acts, device),
        jnt_frclimited_act_jnt=_long(trnid[limited_jnt_acts], device),
        actgravcomp_dof=_long(gravcomp_dofs, device),
        any_act=bool(mjm.na > 0),
        any_actearly=bool(np.any(mjm.actuator_actearly[has_act])) if nu else False,
    )
