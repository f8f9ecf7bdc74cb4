"""Kinematic-tree plans, computed once in ``put_model``.

Two tools make the tree vectorisable:

* **Depth levels.** Bodies are grouped by depth; forward kinematics runs one
  vectorised step per level (rotations compose, so this pass is sequential).
  What a body's joints do to its frame depends on its own qpos only, so the
  joints of every body are composed first, the k-th joint of all bodies at
  once, and each level then applies its parents' frames once.
* **Ancestor matrices.** In MuJoCo's com-based frame every other recursion
  is a plain sum over ancestors or over a subtree: body velocities, bias
  accelerations, composite inertias, subtree momenta. Each becomes one
  matmul with a constant 0/1 matrix, which vmaps, compiles and
  differentiates without loops.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from diffmj.dataclass import PyTreeNode, pytree_dataclass, static_field
from diffmj.enums import JointType


@pytree_dataclass
class Level(PyTreeNode):
    """Bodies at one depth of the tree."""

    body: Tensor  # [n] body ids
    parent_slot: Tensor  # [n] position of each parent within the previous level


@pytree_dataclass
class TreePlan(PyTreeNode):
    """Index tensors and ancestor matrices of the kinematic tree."""

    levels: tuple[Level, ...]  # depth 1, 2, ... (the world is depth 0)
    body_order: Tensor  # [nbody] position of body i in the level-concatenated order
    # kinematics: [K, nbody] the k-th joint of each body, njnt where it has fewer; free joints (the only
    # joint of their body, which they place in place of body_pos / body_quat) are left out, and so is a
    # slot no body fills
    body_joint: Tensor
    chain_jnt: Tensor  # [n] the joints in body_joint (all but the free ones), ascending
    chain_slot: Tensor  # [n] k * nbody + body of each: the k-th joint of its body
    chain_parent: Tensor  # [n] parent of each one's body
    jnt_order: Tensor  # [njnt] position of each joint in chain_jnt followed by free_jnt
    hinge_jnt: Tensor  # [n] hinge joints
    hinge_qposadr: Tensor
    slide_jnt: Tensor  # [n] slide joints
    slide_qposadr: Tensor
    free_body: Tensor  # [n] body of each free joint (free_jnt's order)
    mocap_body: Tensor  # [k] mocap bodies
    mocap_id: Tensor  # [k] their mocap ids
    body_rootid: Tensor  # [nbody]
    jnt_dofadr: Tensor  # [njnt]
    jnt_qposadr: Tensor  # [njnt]
    geom_bodyid: Tensor  # [ngeom]
    site_bodyid: Tensor  # [nsite]
    body_subtree: Tensor  # [nbody, nbody] 1 where column body is in the subtree of row body
    body_dof_ancestor: Tensor  # [nbody, nv] 1 where dof moves the body
    dof_ancestor: Tensor  # [nv, nv] 1 where column dof is an ancestor of (or is) the row dof
    dof_chain: Tensor  # [nv, nv] 1 where one dof is an ancestor of the other (MuJoCo's M / D sparsity)
    dof_vel_ancestor: Tensor  # [nv, nv] 1 where column dof adds to the velocity cdof_dot uses
    dof_bodyid: Tensor  # [nv]
    dof_jntid: Tensor  # [nv]
    dof_rootid: Tensor  # [nv] root body of the dof's body
    dof_axis_from_joint: Tensor  # [nv] 1 for hinge and slide dofs (axis = xaxis)
    dof_axis_from_body: Tensor  # [nv, 3] one-hot body-frame column for ball / free rotation dofs
    dof_axis_world: Tensor  # [nv, 3] unit world axis of free translation dofs
    dof_rotational: Tensor  # [nv] 1 for hinge, ball, free rotation (cdof = [axis, axis x r])
    dof_free_translation: Tensor  # [nv] 1 for free translation dofs (cdof_dot = 0)
    # joints by type, for passive forces and position integration
    scalar_jnt: Tensor  # [n] hinge and slide joints
    scalar_qposadr: Tensor
    scalar_dofadr: Tensor
    ball_jnt: Tensor  # [n] ball joints
    ball_qposadr: Tensor
    ball_dofadr: Tensor
    free_jnt: Tensor  # [n] free joints
    free_qposadr: Tensor
    free_dofadr: Tensor
    rotation_dofadr: Tensor  # [n] first dof of each ball joint and free-joint rotation
    # [k] bodies gravity compensation runs over: all but the world if any body had gravcomp at put_model
    # (as mj_gravcomp loops over every body once ngravcomp > 0, so set_param can change any of them), else none
    gravcomp_body: Tensor
    max_depth: int = static_field()
    free_body_dofadr: tuple[int, ...] = static_field()  # standalone free bodies (mj_isFreeBody)


def _long(values, device) -> Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.int64).reshape(-1), device=device)


def build_tree_plan(mjm, dtype: torch.dtype, device: torch.device) -> TreePlan:
    """Derive the tree plan from a ``mujoco.MjModel``."""
    nbody, nv, njnt = mjm.nbody, mjm.nv, mjm.njnt
    parent = mjm.body_parentid
    jnt_type = mjm.jnt_type

    depth = np.zeros(nbody, dtype=int)
    for b in range(1, nbody):
        depth[b] = depth[parent[b]] + 1
    max_depth = int(depth.max()) if nbody > 1 else 0

    # ---- levels and joint chains for forward kinematics
    levels = []
    slot_of_body = np.zeros(nbody, dtype=int)
    order = [0]
    for level in range(1, max_depth + 1):
        bodies = [b for b in range(nbody) if depth[b] == level]
        for s, b in enumerate(bodies):
            slot_of_body[b] = s
        order.extend(bodies)
        levels.append(
            Level(
                body=_long(bodies, device),
                parent_slot=_long([slot_of_body[parent[b]] for b in bodies], device),
            )
        )
    body_order = np.argsort(np.asarray(order))  # concatenated position -> body id, inverted

    is_free = jnt_type == JointType.FREE
    chain_jnt = np.flatnonzero(~is_free)
    chain_length = int(mjm.body_jntnum[mjm.jnt_bodyid[chain_jnt]].max()) if chain_jnt.size else 0
    body_joint = np.full((chain_length, nbody), njnt)
    chain_slot = np.zeros(chain_jnt.size, dtype=int)
    for i, j in enumerate(chain_jnt):
        b = mjm.jnt_bodyid[j]
        k = j - mjm.body_jntadr[b]
        chain_slot[i] = k * nbody + b
        body_joint[k, b] = j
    jnt_order = np.argsort(np.concatenate((chain_jnt, np.flatnonzero(is_free))))
    mocap_body = [b for b in range(nbody) if mjm.body_mocapid[b] >= 0]

    # ---- ancestor matrices
    def ancestors(b):
        chain = [b]
        while b:
            b = parent[b]
            chain.append(b)
        return chain

    body_subtree = np.zeros((nbody, nbody))
    for b in range(nbody):
        for a in ancestors(b):
            body_subtree[a, b] = 1.0

    dof_body = mjm.dof_bodyid
    body_dof_ancestor = np.zeros((nbody, nv))
    for b in range(nbody):
        for a in ancestors(b):
            body_dof_ancestor[b, dof_body == a] = 1.0

    dof_parent = mjm.dof_parentid
    dof_ancestor = np.zeros((nv, nv))
    for i in range(nv):
        j = i
        while j >= 0:
            dof_ancestor[i, j] = 1.0
            j = dof_parent[j]

    # dofs whose velocity enters cdof_dot of dof i (MuJoCo's mj_comVel): all dofs of
    # ancestor joints; for a ball joint none of its own; for free rotations the free
    # translations before them.
    dof_jnt = mjm.dof_jntid
    dof_vel_ancestor = np.zeros((nv, nv))
    free_translation = np.zeros(nv)
    axis_from_joint = np.zeros(nv)
    axis_from_body = np.zeros((nv, 3))
    axis_world = np.zeros((nv, 3))
    rotational = np.zeros(nv)
    for i in range(nv):
        j = dof_jnt[i]
        first = mjm.jnt_dofadr[j]
        k = i - first
        jtype = jnt_type[j]
        if jtype == JointType.FREE and k < 3:
            free_translation[i] = 1.0
            axis_world[i, k] = 1.0
            continue
        if jtype in (JointType.FREE, JointType.BALL):
            own_first = first + 3 if jtype == JointType.FREE else first
            axis_from_body[i, i - own_first] = 1.0
            rotational[i] = 1.0
        else:
            axis_from_joint[i] = 1.0
            rotational[i] = float(jtype == JointType.HINGE)
            own_first = i
        dof_vel_ancestor[i] = dof_ancestor[own_first]
        dof_vel_ancestor[i, own_first] = 0.0

    def joints_of(types):
        ids = [j for j in range(njnt) if jnt_type[j] in types]
        return (
            _long(ids, device),
            _long(mjm.jnt_qposadr[ids], device),
            _long(mjm.jnt_dofadr[ids], device),
        )

    def floats(x):
        return torch.as_tensor(np.asarray(x, dtype=np.float64), device=device).to(dtype)

    scalar = joints_of((JointType.SLIDE, JointType.HINGE))
    hinge = joints_of((JointType.HINGE,))
    slide = joints_of((JointType.SLIDE,))
    ball = joints_of((JointType.BALL,))
    free = joints_of((JointType.FREE,))
    return TreePlan(
        levels=tuple(levels),
        body_order=_long(body_order, device),
        body_joint=_long(body_joint, device).reshape(chain_length, nbody),
        chain_jnt=_long(chain_jnt, device),
        chain_slot=_long(chain_slot, device),
        chain_parent=_long(parent[mjm.jnt_bodyid[chain_jnt]], device),
        jnt_order=_long(jnt_order, device),
        hinge_jnt=hinge[0],
        hinge_qposadr=hinge[1],
        slide_jnt=slide[0],
        slide_qposadr=slide[1],
        free_body=_long(mjm.jnt_bodyid[is_free], device),
        mocap_body=_long(mocap_body, device),
        mocap_id=_long(mjm.body_mocapid[mocap_body], device),
        body_rootid=_long(mjm.body_rootid, device),
        jnt_dofadr=_long(mjm.jnt_dofadr, device),
        jnt_qposadr=_long(mjm.jnt_qposadr, device),
        geom_bodyid=_long(mjm.geom_bodyid, device),
        site_bodyid=_long(mjm.site_bodyid, device),
        body_subtree=floats(body_subtree),
        body_dof_ancestor=floats(body_dof_ancestor),
        dof_ancestor=floats(dof_ancestor),
        dof_chain=floats(np.minimum(dof_ancestor + dof_ancestor.T, 1.0)),
        dof_vel_ancestor=floats(dof_vel_ancestor),
        dof_bodyid=_long(dof_body, device),
        dof_jntid=_long(dof_jnt, device),
        dof_rootid=_long(mjm.body_rootid[dof_body], device),
        dof_axis_from_joint=floats(axis_from_joint),
        dof_axis_from_body=floats(axis_from_body),
        dof_axis_world=floats(axis_world),
        dof_rotational=floats(rotational),
        dof_free_translation=floats(free_translation),
        scalar_jnt=scalar[0],
        scalar_qposadr=scalar[1],
        scalar_dofadr=scalar[2],
        ball_jnt=ball[0],
        ball_qposadr=ball[1],
        ball_dofadr=ball[2],
        free_jnt=free[0],
        free_qposadr=free[1],
        free_dofadr=free[2],
        rotation_dofadr=torch.cat((ball[2], free[2] + 3)),
        gravcomp_body=_long(np.arange(1, nbody) if mjm.ngravcomp else [], device),
        max_depth=max_depth,
        free_body_dofadr=_standalone_free_bodies(mjm),
    )


def _standalone_free_bodies(mjm) -> tuple[int, ...]:
    """First dof of each body with a single free joint whose kinematic tree has no other dofs.

    Bodies welded below it (no joints) do not disqualify it: MuJoCo 4.0.0 solves their
    6x6 block with the bias derivative of the whole welded composite as well.
    """
    out = []
    for b in range(1, mjm.nbody):
        if mjm.body_jntnum[b] != 1 or mjm.jnt_type[mjm.body_jntadr[b]] != JointType.FREE:
            continue
        adr = int(mjm.jnt_dofadr[mjm.body_jntadr[b]])
        if mjm.tree_dofnum[mjm.dof_treeid[adr]] == 6:
            out.append(adr)
    return tuple(out)
