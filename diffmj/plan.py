"""Index plans for tendons, actuators, constraint rows and sensors, computed once in ``put_model``.

A plan turns MuJoCo's per-element type switches into a few groups of equal
type, each with the index tensors its vectorised code gathers with, and 0/1
masks for choices that are cheaper to blend than to split.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from diffmj.collision.hfield import HFields, build_hfields
from diffmj.collision.plan import CollisionPlan
from diffmj.dataclass import PyTreeNode, pytree_dataclass, static_field
from diffmj.math import MINVAL
from diffmj.enums import (
    BiasType,
    ConeType,
    ConstraintType,
    DisableBit,
    DynType,
    EqType,
    GainType,
    GeomType,
    JointType,
    ObjType,
    SensorType,
    Stage,
    TrnType,
    WrapType,
)


def _long(values, device) -> Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.int64).reshape(-1), device=device)


def _floats(values, dtype, device) -> Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.float64), device=device).to(dtype)


@pytree_dataclass
class TendonSpans(PyTreeNode):
    """Spans of spatial tendons from one site to the next, of one kind: straight, or past a sphere or cylinder.

    A span belongs to one tendon and is divided by the divisor of the pulley before it
    (MuJoCo's pulleys split a tendon into branches that share its length).
    """

    wrap_type: WrapType = static_field()  # NONE (straight), SPHERE or CYLINDER
    tendon: Tensor  # [k]
    site0: Tensor  # [k] the sites the span runs between
    site1: Tensor  # [k]
    pulley: Tensor  # [k] wrap entry of the pulley before the span (its divisor in wrap_prm); -1 if none
    geom: Tensor  # [k] the wrapping geom (0 for straight spans)
    sidesite: Tensor  # [k] the geom's side site (0 where there is none)
    has_side: Tensor  # [k] bool
    moving: Tensor  # [k] 1 where site0 and site1 are on different bodies (MuJoCo skips the others' Jacobian)
    moving_in: Tensor  # [k] 1 where site0 and the geom are on different bodies (wrap spans)
    moving_out: Tensor  # [k] 1 where the geom and site1 are on different bodies (wrap spans)


@pytree_dataclass
class TendonPlan(PyTreeNode):
    """Fixed tendons as sums over their joint entries; spatial tendons as spans grouped by kind."""

    joint_wrap: Tensor  # [k] wrap entries of fixed tendons (their coefficients in wrap_prm)
    joint_tendon: Tensor  # [k] tendon of each
    joint_qposadr: Tensor  # [k] qpos address of its joint
    joint_dofadr: Tensor  # [k] dof address of its joint
    spans: tuple[TendonSpans, ...]  # non-empty groups of straight, sphere and cylinder spans


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
    site_act: Tensor  # site transmissions without a reference site
    site_id: Tensor
    site_body: Tensor
    refsite_act: Tensor  # [k] site transmissions relative to a reference site
    refsite_site: Tensor  # [k] the actuated site and its reference site
    refsite_ref: Tensor
    refsite_site_body: Tensor  # [k] their bodies
    refsite_ref_body: Tensor
    refsite_unshared_dofs: Tensor  # [k, nv] 0 on the dofs moving both sites (their common ancestral chain), 1 elsewhere
    slidercrank_act: Tensor  # [k] slider-crank transmissions
    slidercrank_crank: Tensor  # [k] crank site
    slidercrank_slider: Tensor  # [k] slider site (its z axis is the slider's)
    slidercrank_crank_body: Tensor  # [k] bodies of the crank and slider sites
    slidercrank_slider_body: Tensor
    body_act: Tensor  # [k] body (adhesion) transmissions
    body_slot: Tensor  # [s] contact slots with a geom on the body of a body transmission
    body_slot_act: Tensor  # [s] which of body_act each such slot belongs to
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
    act_filterexact: Tensor  # [na] 1 where integrated exactly with time constant dynprm[0] (also DC motor currents)
    act_limited: Tensor  # [na] bool (never for DC motors: MuJoCo does not clamp their states)
    act_muscle: Tensor  # [k] activations with muscle dynamics
    gain_muscle_act: Tensor  # [k] actuators with muscle gain
    bias_muscle_act: Tensor  # [k] actuators with muscle bias
    dcmotor_act: Tensor  # [k] DC motors (dynamics, gain and bias DC motor; voltage input, at most a current state)
    act_dcmotor: Tensor  # [k] their current states
    tendon_frclimited_act: Tensor  # actuators on force-limited tendons
    tendon_frclimited_id: Tensor  # their tendon
    jnt_frclimited_dofadr: Tensor  # first dof of each joint with actuatorfrcrange
    jnt_frclimited_jnt: Tensor
    jnt_frclimited_act: Tensor  # joint-transmission actuators on such joints
    jnt_frclimited_act_jnt: Tensor  # their joint
    actgravcomp_dof: Tensor  # dofs whose gravity compensation goes through actuators
    any_act: bool = static_field()
    any_actearly: bool = static_field()


def _spatial_spans(mjm, t: int) -> list[tuple]:
    """(wrap type, site0, site1, pulley, geom, sidesite) of each span of spatial tendon t, as mj_tendon walks it."""
    adr, num = mjm.tendon_adr[t], mjm.tendon_num[t]
    types, ids, prm = mjm.wrap_type[adr : adr + num], mjm.wrap_objid[adr : adr + num], mjm.wrap_prm[adr : adr + num]
    spans, pulley, j = [], -1, 0
    while j < num - 1:
        if WrapType.PULLEY in (types[j], types[j + 1]):
            if types[j] == WrapType.PULLEY:
                pulley = adr + j
            j += 1
        elif types[j + 1] in (WrapType.SPHERE, WrapType.CYLINDER):
            spans.append((types[j + 1], ids[j], ids[j + 2], pulley, ids[j + 1], int(round(prm[j + 1]))))
            j += 2
        else:
            spans.append((WrapType.NONE, ids[j], ids[j + 1], pulley, 0, -1))
            j += 1
    return spans


def build_tendon_plan(mjm, dtype, device) -> TendonPlan:
    joint_wrap = np.flatnonzero(mjm.wrap_type == WrapType.JOINT)
    wrap_tendon = np.zeros(mjm.nwrap, dtype=int)
    for t in range(mjm.ntendon):
        wrap_tendon[mjm.tendon_adr[t] : mjm.tendon_adr[t] + mjm.tendon_num[t]] = t
    jnt = mjm.wrap_objid[joint_wrap]
    spans = [(t, *span) for t in range(mjm.ntendon) if mjm.wrap_type[mjm.tendon_adr[t]] != WrapType.JOINT
             for span in _spatial_spans(mjm, t)]
    site_body, geom_body = mjm.site_bodyid, mjm.geom_bodyid
    groups = []
    for kind in (WrapType.NONE, WrapType.SPHERE, WrapType.CYLINDER):
        members = [s for s in spans if s[1] == kind]
        if not members:
            continue
        tendon, _, site0, site1, pulley, geom, side = (np.asarray(c, dtype=int) for c in zip(*members))
        groups.append(TendonSpans(
            wrap_type=kind,
            tendon=_long(tendon, device),
            site0=_long(site0, device),
            site1=_long(site1, device),
            pulley=_long(pulley, device),
            geom=_long(geom, device),
            sidesite=_long(np.maximum(side, 0), device),
            has_side=torch.as_tensor(side >= 0, device=device),
            moving=_floats(site_body[site0] != site_body[site1], dtype, device),
            moving_in=_floats(site_body[site0] != geom_body[geom], dtype, device),
            moving_out=_floats(geom_body[geom] != site_body[site1], dtype, device),
        ))
    return TendonPlan(
        joint_wrap=_long(joint_wrap, device),
        joint_tendon=_long(wrap_tendon[joint_wrap], device),
        joint_qposadr=_long(mjm.jnt_qposadr[jnt], device),
        joint_dofadr=_long(mjm.jnt_dofadr[jnt], device),
        spans=tuple(groups),
    )


def _off_common_chain(mjm, i: int) -> np.ndarray:
    """[nv] 1, but 0 on the dofs moving both the site and the reference site of site actuator i: from
    the last dof of each site's weld body up the dof tree to their first common dof (mj_transmission)."""
    keep = np.ones(mjm.nv)
    last = []
    for site in mjm.actuator_trnid[i]:
        body = mjm.body_weldid[mjm.site_bodyid[site]]
        last.append(mjm.body_dofadr[body] + mjm.body_dofnum[body] - 1)
    a, b = last
    if a < 0 or b < 0:
        return keep
    while a != b and a >= 0 and b >= 0:
        if a < b:
            b = mjm.dof_parentid[b]
        else:
            a = mjm.dof_parentid[a]
    while a == b and a >= 0:
        keep[a] = 0
        a = b = mjm.dof_parentid[a]
    return keep


def build_actuator_plan(mjm, contact_geom: np.ndarray, dtype, device) -> ActuatorPlan:
    """contact_geom [ncon, 2]: geom ids of each contact slot (the collision plan's)."""
    nu = mjm.nu
    trn = mjm.actuator_trntype
    trnid = mjm.actuator_trnid[:, 0] if nu else np.zeros(0, int)
    jtype = mjm.jnt_type

    def joint_acts(types):
        return [i for i in range(nu) if trn[i] in (TrnType.JOINT, TrnType.JOINTINPARENT) and jtype[trnid[i]] in types]

    scalar = joint_acts((JointType.SLIDE, JointType.HINGE))
    ball = joint_acts((JointType.BALL,))
    free = joint_acts((JointType.FREE,))
    tendon = [i for i in range(nu) if trn[i] == TrnType.TENDON]
    site = [i for i in range(nu) if trn[i] == TrnType.SITE and mjm.actuator_trnid[i, 1] < 0]
    refsite = [i for i in range(nu) if trn[i] == TrnType.SITE and mjm.actuator_trnid[i, 1] >= 0]
    slidercrank = [i for i in range(nu) if trn[i] == TrnType.SLIDERCRANK]
    slider_site = mjm.actuator_trnid[slidercrank, 1] if nu else np.zeros(0, int)
    ref_site = mjm.actuator_trnid[refsite, 1] if nu else np.zeros(0, int)
    body = [i for i in range(nu) if trn[i] == TrnType.BODY]
    slot_body = mjm.geom_bodyid[contact_geom] if len(contact_geom) else np.zeros((0, 2), int)
    body_slot, body_slot_act = [], []
    for k, i in enumerate(body):
        slots = np.flatnonzero((slot_body == trnid[i]).any(-1))
        body_slot += list(slots)
        body_slot_act += [k] * len(slots)
    concat = scalar + ball + free + tendon + site + refsite + slidercrank + body
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
    gravcomp_dofs = [
        mjm.jnt_dofadr[j] + k
        for j in range(mjm.njnt)
        if mjm.jnt_actgravcomp[j]
        for k in range(JointType(jtype[j]).nv)
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
        ball_inparent=f(trn[ball] == TrnType.JOINTINPARENT),
        free_act=_long(free, device),
        free_qposadr=_long(mjm.jnt_qposadr[trnid[free]] + 3, device),
        free_dofadr=_long(mjm.jnt_dofadr[trnid[free]], device),
        free_inparent=f(trn[free] == TrnType.JOINTINPARENT),
        tendon_act=_long(tendon, device),
        tendon_id=_long(trnid[tendon], device),
        site_act=_long(site, device),
        site_id=_long(trnid[site], device),
        site_body=_long(mjm.site_bodyid[trnid[site]], device),
        refsite_act=_long(refsite, device),
        refsite_site=_long(trnid[refsite], device),
        refsite_ref=_long(ref_site, device),
        refsite_site_body=_long(mjm.site_bodyid[trnid[refsite]], device),
        refsite_ref_body=_long(mjm.site_bodyid[ref_site], device),
        refsite_unshared_dofs=_floats([_off_common_chain(mjm, i) for i in refsite], dtype, device).reshape(
            len(refsite), mjm.nv),
        slidercrank_act=_long(slidercrank, device),
        slidercrank_crank=_long(trnid[slidercrank], device),
        slidercrank_slider=_long(slider_site, device),
        slidercrank_crank_body=_long(mjm.site_bodyid[trnid[slidercrank]], device),
        slidercrank_slider_body=_long(mjm.site_bodyid[slider_site], device),
        body_act=_long(body, device),
        body_slot=_long(body_slot, device),
        body_slot_act=_long(body_slot_act, device),
        act_index=_long(act_index, device),
        has_act=f(has_act),
        gain_affine=f(mjm.actuator_gaintype == GainType.AFFINE),
        bias_affine=f(mjm.actuator_biastype == BiasType.AFFINE),
        ctrllimited=torch.as_tensor(mjm.actuator_ctrllimited.astype(bool), device=device),
        forcelimited=torch.as_tensor(mjm.actuator_forcelimited.astype(bool), device=device),
        actearly=torch.as_tensor(mjm.actuator_actearly.astype(bool), device=device),
        enabled=f(np.logical_not(disabled)),
        act_actuator=_long(act_actuator, device),
        act_integrator=f(dyn == DynType.INTEGRATOR),
        act_filter=f((dyn == DynType.FILTER) | (dyn == DynType.FILTEREXACT)),
        act_filterexact=f((dyn == DynType.FILTEREXACT) | (dyn == DynType.DCMOTOR)),
        act_limited=torch.as_tensor(mjm.actuator_actlimited[act_actuator].astype(bool) & (dyn != DynType.DCMOTOR),
                                    device=device),
        act_muscle=_long(np.flatnonzero(dyn == DynType.MUSCLE), device),
        gain_muscle_act=_long(np.flatnonzero(mjm.actuator_gaintype == GainType.MUSCLE), device),
        bias_muscle_act=_long(np.flatnonzero(mjm.actuator_biastype == BiasType.MUSCLE), device),
        dcmotor_act=_long(np.flatnonzero(mjm.actuator_dyntype == DynType.DCMOTOR), device),
        act_dcmotor=_long(np.flatnonzero(dyn == DynType.DCMOTOR), device),
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


# ---------------------------------------------------------------- constraint rows

# MuJoCo's efc row order up to the contacts, which follow grouped by condim: (block, efc_type, rows per
# element). ConstraintPlan holds each block's element ids under its name; constraint.py builds the rows
# block by block in this order.
ROW_BLOCKS = (
    ("connect_eq", ConstraintType.EQUALITY, 3),
    ("weld_eq", ConstraintType.EQUALITY, 6),
    ("joint_eq", ConstraintType.EQUALITY, 1),
    ("tendon_eq", ConstraintType.EQUALITY, 1),
    ("friction_dof", ConstraintType.FRICTION_DOF, 1),
    ("friction_tendon", ConstraintType.FRICTION_TENDON, 1),
    ("limit_scalar_jnt", ConstraintType.LIMIT_JOINT, 2),  # lower, upper
    ("limit_ball_jnt", ConstraintType.LIMIT_JOINT, 1),
    ("limit_tendon", ConstraintType.LIMIT_TENDON, 2),  # lower, upper
)


@pytree_dataclass
class FluidPlan(PyTreeNode):
    """Bodies and geoms that feel fluid forces (mj_fluid), fixed in put_model.

    MuJoCo applies the ellipsoid model to every geom with ``fluidshape`` (geom_fluid[:, 0] != 0)
    of a body that has one, and the inertia-box model to each other body with mass. Empty, and
    ``enabled`` False, when the model was loaded with no density and no viscosity.
    """

    box_body: Tensor  # [k] bodies of the inertia-box model
    geom: Tensor  # [g] geoms of the ellipsoid model
    geom_semiaxis: Tensor  # [g, 3] geom_size entries of each semi-axis (mju_geomSemiAxes)
    geom_capsule: Tensor  # [g] 1 for capsules, whose third semi-axis adds the radius
    geom_symmetric: Tensor  # [g] 1 where implicitfast symmetrises the derivative (not a standalone free body)
    enabled: bool = static_field()


def _standalone_free_body(mjm, body: int) -> bool:
    """mj_isFreeBody: one free joint, a tree of 6 dofs and no mass below the body."""
    if mjm.body_jntnum[body] != 1 or mjm.jnt_type[mjm.body_jntadr[body]] != JointType.FREE:
        return False
    adr = mjm.jnt_dofadr[mjm.body_jntadr[body]]
    return mjm.tree_dofnum[mjm.dof_treeid[adr]] == 6 and mjm.body_subtreemass[body] == mjm.body_mass[body]


def build_fluid_plan(mjm, dtype, device) -> FluidPlan:
    enabled = bool(mjm.opt.density > 0 or mjm.opt.viscosity > 0)
    box, geoms = [], []
    for b in range(mjm.nbody) if enabled else ():
        if mjm.body_mass[b] < MINVAL:
            continue
        own = range(mjm.body_geomadr[b], mjm.body_geomadr[b] + mjm.body_geomnum[b])
        if any(mjm.geom_fluid[g, 0] > 0 for g in own):
            geoms += [g for g in own if mjm.geom_fluid[g, 0] != 0]
        else:
            box.append(b)
    semiaxis = {GeomType.SPHERE: (0, 0, 0), GeomType.CAPSULE: (0, 0, 1), GeomType.CYLINDER: (0, 0, 1)}
    types = [int(mjm.geom_type[g]) for g in geoms]
    return FluidPlan(
        box_body=_long(box, device),
        geom=_long(geoms, device),
        geom_semiaxis=_long([semiaxis.get(t, (0, 1, 2)) for t in types], device).reshape(-1, 3),
        geom_capsule=_floats([t == GeomType.CAPSULE for t in types], dtype, device),
        geom_symmetric=_floats([not _standalone_free_body(mjm, mjm.geom_bodyid[g]) for g in geoms], dtype, device),
        enabled=enabled,
    )


@pytree_dataclass
class ContactRows(PyTreeNode):
    """Contact slots of one condim and the first of their constraint rows."""

    slot: Tensor  # [k] contact slots
    row: Tensor  # [k] first efc row of each slot
    dim: int = static_field()
    rows_per_contact: int = static_field()


@pytree_dataclass
class ConstraintPlan(PyTreeNode):
    """Fixed layout of the constraint rows (efc_*), in blocks of one kind each.

    Row order: the blocks of ``ROW_BLOCKS``, then contacts grouped by condim.
    Within a block, rows follow element order. Each row exists every step;
    ``d.efc_active`` marks the rows MuJoCo would instantiate.
    """

    connect_eq: Tensor  # [k] equality ids
    weld_eq: Tensor
    joint_eq: Tensor
    tendon_eq: Tensor
    friction_dof: Tensor  # dofs with frictionloss
    friction_tendon: Tensor  # tendons with frictionloss
    limit_scalar_jnt: Tensor  # limited hinge / slide joints (two rows each: lower, upper)
    limit_ball_jnt: Tensor  # limited ball joints
    limit_tendon: Tensor  # limited tendons (two rows each)
    contacts: tuple[ContactRows, ...]
    eq_obj1: Tensor  # [neq] first object of each equality
    eq_obj2: Tensor  # [neq] second object (0 when there is none)
    eq_has_obj2: Tensor  # [neq] 1 when the equality has a second object
    frictional_rows: Tensor  # [nefc] bool: frictionloss and elliptic tangent rows (no stiffness)
    surface_velocity: bool = static_field()  # some geom has a surface velocity (mjModel.flg_surfacevel)
    # constraint islands (mj_island): the kinematic trees (MuJoCo's tree ids) each row touches
    efc_tree: Tensor  # [nefc, ntree] 1 where MuJoCo names the row's trees (dof, joint, geoms, connect / weld bodies)
    efc_tree_from_J: Tensor  # [nefc] bool: the other rows, whose trees are those of their Jacobian's nonzeros
    dof_tree: Tensor  # [nv, ntree] 1 at each dof's tree
    efc_type: tuple[int, ...] = static_field()
    efc_id: tuple[int, ...] = static_field()
    # (first row, slot, condim) of each contact with friction rows, in MuJoCo's contact order
    # (the order its noslip sweep visits them: efc rows follow d.contact there)
    frictional_contacts: tuple[tuple[int, int, int], ...] = static_field()
    ne: int = static_field()  # equality rows
    nf: int = static_field()  # friction rows
    nl: int = static_field()  # limit rows
    nefc: int = static_field()
    elliptic: bool = static_field()
    islands: bool = static_field()  # the solver splits the problem by island (mjDSBL_ISLAND not set)


def _row_trees(mjm, efc_type: list[int], efc_id: list[int], contact_geom: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(efc_tree [nefc, ntree], efc_tree_from_J [nefc]) as mj_island finds each row's trees (treeIterInit)."""
    trees = np.zeros((len(efc_type), mjm.ntree))
    from_J = np.zeros(len(efc_type), dtype=bool)

    def touch(row: int, body: int) -> None:
        if body >= 0 and mjm.body_treeid[body] >= 0:  # no body (-1), the world and static bodies: no tree
            trees[row, mjm.body_treeid[body]] = 1

    contact_types = (ConstraintType.CONTACT_FRICTIONLESS, ConstraintType.CONTACT_PYRAMIDAL,
                     ConstraintType.CONTACT_ELLIPTIC)
    for row, (kind, obj) in enumerate(zip(efc_type, efc_id)):
        if kind == ConstraintType.FRICTION_DOF:
            trees[row, mjm.dof_treeid[obj]] = 1
        elif kind == ConstraintType.LIMIT_JOINT:
            trees[row, mjm.dof_treeid[mjm.jnt_dofadr[obj]]] = 1
        elif kind in contact_types:
            for geom in contact_geom[obj]:
                touch(row, mjm.geom_bodyid[geom])
        elif kind == ConstraintType.EQUALITY and mjm.eq_type[obj] in (EqType.CONNECT, EqType.WELD):
            bodies = (mjm.eq_obj1id[obj], mjm.eq_obj2id[obj])
            if mjm.eq_objtype[obj] == ObjType.SITE:
                bodies = tuple(mjm.site_bodyid[b] if b >= 0 else -1 for b in bodies)
            for body in bodies:
                touch(row, body)
        else:
            from_J[row] = True
    return trees, from_J


def build_constraint_plan(mjm, collision_plan: CollisionPlan, dtype, device) -> ConstraintPlan:
    """Row layout for the model's equalities, frictionloss, limits and contact slots.

    The collision plan gives the contact slots' condim, geoms and MuJoCo's contact order.
    """
    contact_dim, contact_order = collision_plan.contact_dim, collision_plan.contact_order
    contact_geom = collision_plan.contact_geom.cpu().numpy()
    flags = mjm.opt.disableflags
    if flags & DisableBit.CONSTRAINT:
        contact_dim = ()
    eq_on = not flags & (DisableBit.CONSTRAINT | DisableBit.EQUALITY)
    fri_on = not flags & (DisableBit.CONSTRAINT | DisableBit.FRICTIONLOSS)
    lim_on = not flags & (DisableBit.CONSTRAINT | DisableBit.LIMIT)
    elliptic = bool(mjm.opt.cone == ConeType.ELLIPTIC)

    eq_types = mjm.eq_type if eq_on else np.zeros(0, int)
    eqs = {t: [i for i in range(len(eq_types)) if eq_types[i] == t] for t in EqType}
    limited = [j for j in range(mjm.njnt) if lim_on and mjm.jnt_limited[j]]
    elements = {  # ids of the elements of each row block
        "connect_eq": eqs[EqType.CONNECT],
        "weld_eq": eqs[EqType.WELD],
        "joint_eq": eqs[EqType.JOINT],
        "tendon_eq": eqs[EqType.TENDON],
        "friction_dof": [i for i in range(mjm.nv) if fri_on and mjm.dof_frictionloss[i] > 0],
        "friction_tendon": [i for i in range(mjm.ntendon) if fri_on and mjm.tendon_frictionloss[i] > 0],
        "limit_scalar_jnt": [j for j in limited if mjm.jnt_type[j] in (JointType.SLIDE, JointType.HINGE)],
        "limit_ball_jnt": [j for j in limited if mjm.jnt_type[j] == JointType.BALL],
        "limit_tendon": [t for t in range(mjm.ntendon) if lim_on and mjm.tendon_limited[t]],
    }

    efc_type: list[int] = []
    efc_id: list[int] = []

    def rows(kind: int, ids, per: int) -> None:
        for i in ids:
            efc_type.extend([kind] * per)
            efc_id.extend([i] * per)

    for name, kind, per in ROW_BLOCKS:
        rows(kind, elements[name], per)
    ne = efc_type.count(ConstraintType.EQUALITY)
    nf = efc_type.count(ConstraintType.FRICTION_DOF) + efc_type.count(ConstraintType.FRICTION_TENDON)
    nl = efc_type.count(ConstraintType.LIMIT_JOINT) + efc_type.count(ConstraintType.LIMIT_TENDON)

    contacts = []
    for dim in sorted(set(contact_dim)):
        slots = [c for c, cd in enumerate(contact_dim) if cd == dim]
        if dim == 1:
            kind, per = ConstraintType.CONTACT_FRICTIONLESS, 1
        elif elliptic:
            kind, per = ConstraintType.CONTACT_ELLIPTIC, dim
        else:
            kind, per = ConstraintType.CONTACT_PYRAMIDAL, 2 * (dim - 1)
        first = len(efc_type)
        rows(kind, slots, per)
        contacts.append(
            ContactRows(
                slot=_long(slots, device),
                row=_long([first + per * k for k in range(len(slots))], device),
                dim=dim,
                rows_per_contact=per,
            )
        )
    first_row = {s: r for group in contacts for s, r in zip(group.slot.tolist(), group.row.tolist())}
    frictional_contacts = tuple((first_row[s], s, contact_dim[s]) for s in contact_order
                                if s in first_row and contact_dim[s] > 1)
    obj2 = np.asarray(mjm.eq_obj2id, dtype=np.int64).reshape(-1)
    frictional = [t in (ConstraintType.FRICTION_DOF, ConstraintType.FRICTION_TENDON) for t in efc_type]
    for group in contacts:
        if elliptic and group.dim > 1:
            for first in group.row.tolist():
                for j in range(1, group.dim):
                    frictional[first + j] = True
    efc_tree, efc_tree_from_J = _row_trees(mjm, efc_type, efc_id, contact_geom)
    return ConstraintPlan(
        efc_tree=_floats(efc_tree, dtype, device),
        efc_tree_from_J=torch.as_tensor(efc_tree_from_J, dtype=torch.bool, device=device),
        dof_tree=_floats(np.eye(mjm.ntree)[mjm.dof_treeid].reshape(mjm.nv, mjm.ntree), dtype, device),
        islands=not flags & DisableBit.ISLAND,
        eq_obj1=_long(mjm.eq_obj1id, device),
        eq_obj2=_long(np.maximum(obj2, 0), device),
        eq_has_obj2=_floats(obj2 >= 0, dtype, device),
        frictional_rows=torch.as_tensor(frictional, dtype=torch.bool, device=device),
        surface_velocity=bool(mjm.flg_surfacevel),
        **{name: _long(ids, device) for name, ids in elements.items()},
        contacts=tuple(contacts),
        efc_type=tuple(efc_type),
        efc_id=tuple(efc_id),
        frictional_contacts=frictional_contacts,
        ne=ne,
        nf=nf,
        nl=nl,
        nefc=len(efc_type),
        elliptic=elliptic,
    )


# ---------------------------------------------------------------- sensors


_S = SensorType
SUPPORTED_SENSORS = frozenset(_S) - {
    _S.CAMPROJECTION, _S.INSIDESITE, _S.GEOMDIST, _S.GEOMNORMAL, _S.GEOMFROMTO, _S.CONTACT,
    _S.E_POTENTIAL, _S.E_KINETIC, _S.TACTILE, _S.PLUGIN, _S.USER,
}
RNE_POST_SENSORS = frozenset({_S.ACCELEROMETER, _S.FORCE, _S.TORQUE, _S.FRAMELINACC, _S.FRAMEANGACC})
SUBTREE_VEL_SENSORS = frozenset({_S.SUBTREELINVEL, _S.SUBTREEANGMOM})
LIMIT_SENSORS = {  # sensor type -> the efc_type of the rows it reads
    **dict.fromkeys((_S.JOINTLIMITPOS, _S.JOINTLIMITVEL, _S.JOINTLIMITFRC), ConstraintType.LIMIT_JOINT),
    **dict.fromkeys((_S.TENDONLIMITPOS, _S.TENDONLIMITVEL, _S.TENDONLIMITFRC), ConstraintType.LIMIT_TENDON),
}
# sensors whose reference frame (sensor_refid) changes their output
REF_FRAME_SENSORS = frozenset({_S.FRAMEPOS, _S.FRAMEQUAT, _S.FRAMEXAXIS, _S.FRAMEYAXIS, _S.FRAMEZAXIS,
                               _S.FRAMELINVEL, _S.FRAMEANGVEL})
RAY_PRIMITIVES = (GeomType.PLANE, GeomType.SPHERE, GeomType.CAPSULE, GeomType.ELLIPSOID, GeomType.CYLINDER,
                  GeomType.BOX)
RAY_GEOMS = (GeomType.HFIELD, *RAY_PRIMITIVES)  # the geom types a rangefinder ray is intersected with


@pytree_dataclass
class RayGeoms(PyTreeNode):
    """Geoms of one type that the rays of a rangefinder group may hit."""

    geom: Tensor  # [g]
    exclude: Tensor  # [k, g] bool: the geom is on the body of the sensor's site (bodyexclude)
    hfields: HFields  # hfield geoms: the hfield of each of the g geoms (none for other types)
    geom_type: GeomType = static_field()


@pytree_dataclass
class SensorGroup(PyTreeNode):
    """Sensors of one type, object type and reference type, evaluated together.

    Type-specific fields are empty for other types.
    """

    sensor: Tensor  # [k] sensor ids
    adr: Tensor  # [k, dim] sensordata address of each output
    obj: Tensor  # [k] sensor_objid
    ref: Tensor  # [k] sensor_refid (0 when there is no reference frame)
    rows: Tensor  # [k, 2] limit sensors: the limit's efc rows in MuJoCo's order, nefc where absent
    pairs: Tensor  # [p, 2] touch: (position in the group, contact slot) of slots touching its body
    pair_sign: Tensor  # [p] touch: -1 where the sensor's body is the slot's second body, else 1
    ray: tuple[RayGeoms, ...]  # rangefinder: geoms by type
    type: int = static_field()
    objtype: int = static_field()
    reftype: int = static_field()  # ObjType.UNKNOWN without a reference frame
    dim: int = static_field()
    datatype: int = static_field()  # mjtDataType: how cutoff applies
    dataspec: int = static_field()  # rangefinder: bits of mjtRayDataField
    pair_site_types: tuple[tuple[int, int], ...] = static_field()  # touch: (site type, pairs), in order


@pytree_dataclass
class SensorPlan(PyTreeNode):
    """Sensors grouped by computation stage, then by type (engine_sensor.c)."""

    pos: tuple[SensorGroup, ...]
    vel: tuple[SensorGroup, ...]
    acc: tuple[SensorGroup, ...]
    rne_post: bool = static_field()  # an acceleration sensor needs mj_rnePostConstraint
    subtree_vel: bool = static_field()  # a velocity sensor needs mj_subtreeVel


def ray_geoms(mjm) -> list[int]:
    """Geoms a rangefinder ray may hit: visible ones (mj_ray with flg_static, no geomgroup)."""
    out = []
    for g in range(mjm.ngeom):
        mat = mjm.geom_matid[g]
        alpha = mjm.mat_rgba[mat, 3] if mat >= 0 else mjm.geom_rgba[g, 3]
        if alpha != 0:
            out.append(g)
    return out


def build_sensor_plan(mjm, constraint_plan: ConstraintPlan, contact_geom: np.ndarray, dtype, device) -> SensorPlan:
    """Group the model's sensors; ``contact_geom`` [ncon, 2] are the geoms of each contact slot."""
    keys: dict[tuple, list[int]] = {}
    for i in range(mjm.nsensor):
        typ = int(mjm.sensor_type[i])
        has_ref = typ in REF_FRAME_SENSORS and mjm.sensor_refid[i] >= 0
        key = (
            int(mjm.sensor_needstage[i]), typ, int(mjm.sensor_objtype[i]),
            int(mjm.sensor_reftype[i]) if has_ref else ObjType.UNKNOWN,
            int(mjm.sensor_intprm[i, 0]) if typ == _S.RANGEFINDER else 0,
        )
        keys.setdefault(key, []).append(i)
    stages = {Stage.POS: [], Stage.VEL: [], Stage.ACC: []}
    for (stage, typ, objtype, reftype, dataspec), ids in keys.items():
        stages[stage].append(_sensor_group(mjm, ids, typ, objtype, reftype, dataspec, constraint_plan,
                                           contact_geom, dtype, device))
    types = set(int(t) for t in mjm.sensor_type)
    return SensorPlan(
        pos=tuple(stages[Stage.POS]),
        vel=tuple(stages[Stage.VEL]),
        acc=tuple(stages[Stage.ACC]),
        rne_post=bool(types & RNE_POST_SENSORS),
        subtree_vel=bool(types & SUBTREE_VEL_SENSORS),
    )


def _sensor_group(mjm, ids, typ, objtype, reftype, dataspec, constraint_plan, contact_geom, dtype, device):
    """One group of sensors ``ids`` sharing type, object / reference type and (rangefinder) dataspec."""
    dims = {int(mjm.sensor_dim[i]) for i in ids}
    datatypes = {int(mjm.sensor_datatype[i]) for i in ids}
    assert len(dims) == 1 and len(datatypes) == 1, "one sensor group has one output size and data type"
    dim = dims.pop()
    obj = mjm.sensor_objid[ids]
    rows = np.zeros((len(ids), 0), dtype=int)
    if typ in LIMIT_SENSORS:
        kinds, efc_ids = np.asarray(constraint_plan.efc_type), np.asarray(constraint_plan.efc_id)
        rows = np.full((len(ids), 2), constraint_plan.nefc)
        for k, j in enumerate(obj):
            found = np.flatnonzero((kinds == LIMIT_SENSORS[typ]) & (efc_ids == j))
            rows[k, : len(found)] = found
    pairs = []  # (site type, position in the group, slot, sign), sorted by site type
    if typ == _S.TOUCH:
        contact_body = mjm.geom_bodyid[contact_geom] if len(contact_geom) else np.zeros((0, 2), dtype=int)
        for k, site in enumerate(obj):
            body = mjm.site_bodyid[site]
            for slot in np.flatnonzero((contact_body == body).any(-1)):
                pairs.append((int(mjm.site_type[site]), k, slot, -1.0 if contact_body[slot, 1] == body else 1.0))
        pairs.sort(key=lambda pair: pair[0])
    site_types = [pair[0] for pair in pairs]
    ray = ()
    if typ == _S.RANGEFINDER:
        candidates = ray_geoms(mjm)
        site_body = mjm.site_bodyid[obj]
        ray = tuple(
            RayGeoms(
                geom=_long(geoms, device),
                exclude=torch.as_tensor(site_body[:, None] == mjm.geom_bodyid[geoms][None], device=device),
                hfields=build_hfields(mjm, [int(mjm.geom_dataid[g]) for g in geoms] if t == GeomType.HFIELD else [],
                                      dtype, device),
                geom_type=t,
            )
            for t in RAY_GEOMS
            if (geoms := [g for g in candidates if mjm.geom_type[g] == t])
        )
    adr = mjm.sensor_adr[ids][:, None] + np.arange(dim)
    return SensorGroup(
        sensor=_long(ids, device),
        adr=_long(adr, device).reshape(len(ids), dim),
        obj=_long(obj, device),
        ref=_long(np.maximum(mjm.sensor_refid[ids], 0), device),
        rows=_long(rows, device).reshape(len(ids), -1),
        pairs=_long([pair[1:3] for pair in pairs], device).reshape(-1, 2),
        pair_sign=_floats([pair[3] for pair in pairs], dtype, device),
        ray=ray,
        type=typ,
        objtype=objtype,
        reftype=reftype,
        dim=dim,
        datatype=datatypes.pop(),
        dataspec=dataspec,
        pair_site_types=tuple((t, site_types.count(t)) for t in sorted(set(site_types))),
    )
