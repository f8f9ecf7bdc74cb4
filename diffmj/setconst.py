"""Constants MuJoCo derives from a model's parameters (``mj_setConst``), recomputed differentiably.

MuJoCo computes some model fields from others when it compiles a model, and again whenever
``mj_setConst`` is called after parameters were changed by hand. ``put_model`` copies MuJoCo's
values; ``set_const(m)`` recomputes them from ``m``'s current parameters, as MuJoCo 4.0's
``mj_setConst`` does. Of the fields ``mj_setConst`` writes, diffmj's Model holds these:

=====================  ===========================================================  ==============================
field                  value (at qpos0: kinematics, M and its factor there)          read by
=====================  ===========================================================  ==============================
``body_invweight0``    mean diagonal of J M^-1 J' for the Jacobian J of the body's    connect / weld rows, contacts
[nbody, 2]             com: (translation, rotation); 0 for bodies without dofs;       (efc_R through diagApprox)
                       (1 / mass, 0) for simple sliding bodies (body_simple = 2)
``dof_invweight0``     diagonal of M^-1, averaged over a free joint's translations    dof friction, joint limits,
[nv]                   and its rotations and over a ball joint's dofs; 1 / mass for   joint equalities
                       the dofs of simple sliding bodies
``tendon_invweight0``  ten_J M^-1 ten_J'                                              tendon friction, limits,
[ntendon]                                                                             tendon equalities
``tendon_length0``     ten_length                                                     tendon equalities
``actuator_acc0``      norm of M^-1 moment' of each actuator's moment row             muscles with force < 0
[nu]
``eq_data`` [neq, 11]  connect equalities: columns 3:6 = the anchor (columns 0:3, in   connect rows
                       body1's frame) in body2's frame; other rows unchanged
``geom_rbound``        bounding radius of the geom from ``geom_size``                 (nothing in diffmj)
=====================  ===========================================================  ==============================

``SET_CONST_INPUTS`` lists the parameters these depend on; ``diffmj.set_param`` calls
``set_const`` after changing one of them, ``Model.replace`` does not (call ``set_const`` after
replacing them by hand, as a MuJoCo user calls ``mj_setConst``).

As ``mj_setConst`` (and unlike a recompile from an MjSpec), ``set_const`` leaves the compiler's
statistics alone: ``stat_meaninertia`` keeps ``put_model``'s value (nothing reads it: MuJoCo 4.0
scales its solver's stopping tests by trace(M)). Mocap bodies sit at their ``body_pos`` /
``body_quat`` (a fresh MjData).
MuJoCo refuses (mjERROR) a simple body (``body_simple > 0``) whose inertial frame was moved off its
body frame; ``set_const`` does not check it (the check would depend on values under ``vmap``) and
keeps the simple-body formulas.
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffmj import math
from diffmj.io import make_data
from diffmj.smooth import com_pos, crb, factor_m, jac, kinematics, solve_m, tendon, transmission
from diffmj.types import Data, EqType, GeomType, JointType, Model

# the parameters (Model fields) the constants above are computed from: MuJoCo 4.0's
# MJSETCONST_ARRAYS inputs (mjxmacro.h) that diffmj's Model holds and that feed them
SET_CONST_INPUTS = frozenset({
    "qpos0", "body_pos", "body_quat", "body_ipos", "body_iquat", "body_mass", "body_inertia",
    "jnt_pos", "jnt_axis", "dof_armature", "tendon_armature", "wrap_prm", "eq_data", "geom_size",
    "site_pos", "site_quat", "actuator_gear",
})
# the fields set_const writes (the table above)
SET_CONST_OUTPUTS = frozenset({
    "body_invweight0", "dof_invweight0", "tendon_invweight0", "tendon_length0", "actuator_acc0", "eq_data",
    "geom_rbound",
})

SIMPLE_SLIDING = 2  # body_simple: diagonal mass matrix and slide joints only


def set_const(m: Model) -> Model:
    """A new Model whose derived constants (module docstring) follow ``m``'s parameters (mj_setConst).

    Pure and differentiable in every parameter; works under ``torch.func`` transforms (``vmap``
    over a batch of parameter values included).
    """
    d = _at_qpos0(m)
    eye = torch.eye(m.nv, dtype=m.dtype, device=m.device)
    inv_m = solve_m(m, d, eye) if m.nv else eye  # M^-1 [nv, nv]
    return m.replace(
        body_invweight0=_body_invweight0(m, d, inv_m),
        dof_invweight0=_dof_invweight0(m, inv_m),
        tendon_invweight0=torch.einsum("tv,vw,tw->t", d.ten_J, inv_m, d.ten_J),
        tendon_length0=d.ten_length,
        actuator_acc0=math.safe_norm(d.actuator_moment @ inv_m),
        eq_data=_connect_anchors(m, d),
        geom_rbound=_geom_rbound(m),
    )


def _at_qpos0(m: Model) -> Data:
    """Frames, com quantities, tendons, transmissions, M and its factor at qpos0 (mj_setConst's set0)."""
    d = make_data(m)
    for stage in (kinematics, com_pos, tendon, transmission, crb, factor_m):
        d = stage(m, d)
    return d


def _inverse_mass(m: Model, bodies: list[int]) -> Tensor:
    """1 / max(MINVAL, mass) of the given bodies [k]."""
    return 1 / torch.clamp(m.body_mass[bodies], min=math.MINVAL)


def _body_invweight0(m: Model, d: Data, inv_m: Tensor) -> Tensor:
    """[nbody, 2]: mean diagonal of J M^-1 J' of each body's com Jacobian (mj_jacBodyCom)."""
    bodies = torch.arange(m.nbody, device=m.device)
    jacp, jacr = jac(m, d, d.xipos, bodies)  # [nbody, 3, nv]; zero for bodies without dofs
    trans = torch.einsum("brv,vw,brw->b", jacp, inv_m, jacp) / 3
    rot = torch.einsum("brv,vw,brw->b", jacr, inv_m, jacr) / 3
    invweight = torch.stack((trans, rot), -1)
    sliding = [b for b in range(1, m.nbody) if m.body_simple[b] == SIMPLE_SLIDING and m.body_dofnum[m.body_weldid[b]]]
    if sliding:
        simple = torch.stack((_inverse_mass(m, sliding), torch.zeros(len(sliding), dtype=m.dtype, device=m.device)), -1)
        invweight = invweight.index_copy(0, torch.tensor(sliding, device=m.device), simple)
    return invweight


def _dof_invweight0(m: Model, inv_m: Tensor) -> Tensor:
    """[nv]: M^-1's diagonal averaged over each free joint's translations / rotations and each ball."""
    group, sliding_dofs, sliding_bodies = [], [], []  # group: the block each dof is averaged over
    for j, jtype in enumerate(m.jnt_type):
        nv, body = JointType(jtype).nv, m.jnt_bodyid[j]
        for size in (3, 3) if jtype == JointType.FREE else (nv,):
            group += [group[-1] + 1 if group else 0] * size
        if m.body_simple[body] == SIMPLE_SLIDING:
            sliding_dofs += range(m.jnt_dofadr[j], m.jnt_dofadr[j] + nv)
            sliding_bodies += [body] * nv
    group = torch.tensor(group, dtype=torch.long, device=m.device)
    count = torch.bincount(group).to(m.dtype)  # [ngroups]
    total = torch.zeros_like(count).index_add(0, group, inv_m.diagonal())  # summed in dof order, as MuJoCo
    invweight = (total / count)[group]
    if sliding_dofs:
        invweight = invweight.index_copy(0, torch.tensor(sliding_dofs, device=m.device), _inverse_mass(m, sliding_bodies))
    return invweight


def _connect_anchors(m: Model, d: Data) -> Tensor:
    """eq_data with each connect's anchor (columns 0:3, body1's frame) in body2's frame in columns 3:6."""
    connect = [e for e in range(m.neq) if m.eq_type[e] == EqType.CONNECT]
    if not connect:
        return m.eq_data
    b1 = [m.eq_obj1id[e] for e in connect]
    b2 = [m.eq_obj2id[e] for e in connect]
    data = m.eq_data[connect]
    anchor = d.xpos[b1] + math.mat_vec(d.xmat[b1], data[:, :3])
    local = math.mat_t_vec(d.xmat[b2], anchor - d.xpos[b2])
    rows = torch.cat((data[:, :3], local, data[:, 6:]), -1)
    return m.eq_data.index_copy(0, torch.tensor(connect, device=m.device), rows)


def _geom_rbound(m: Model) -> Tensor:
    """[ngeom] bounding-sphere radius of each geom from its size (mjCGeom::GetRBound); 0 for planes."""
    rbound = torch.zeros_like(m.geom_rbound)
    for gtype, radius in _RBOUND.items():
        ids = [g for g, t in enumerate(m.geom_type) if t == gtype]
        if ids:  # each formula sees only its own geoms: no sqrt(0) of another type's size in the gradient
            rbound = rbound.index_copy(0, torch.tensor(ids, device=m.device), radius(m.geom_size[ids]))
    return rbound


# bounding radius from geom_size [k, 3], by geom type (the others have 0)
_RBOUND = {
    GeomType.SPHERE: lambda size: size[:, 0],
    GeomType.CAPSULE: lambda size: size[:, 0] + size[:, 1],
    GeomType.CYLINDER: lambda size: torch.sqrt(size[:, 0] * size[:, 0] + size[:, 1] * size[:, 1]),
    GeomType.ELLIPSOID: lambda size: size.amax(-1),
    GeomType.BOX: lambda size: torch.sqrt((size * size).sum(-1)),
}
