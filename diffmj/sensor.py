"""Sensors: position, velocity and acceleration stages (engine_sensor.c).

``sensor_pos``, ``sensor_vel`` and ``sensor_acc`` mirror ``mj_sensorPos``,
``mj_sensorVel`` and ``mj_sensorAcc``: each evaluates the sensors whose
``sensor_needstage`` is its stage, group by group (``m.sensor_plan`` groups
sensors of one type, object type and reference type), applies ``cutoff``
and writes the outputs into ``d.sensordata`` with one scatter.

Acceleration sensors that need body accelerations or interaction forces
(accelerometer, force, torque, framelinacc, frameangacc) trigger
``rne_post_constraint`` first, as MuJoCo does; its outputs ``cacc``,
``cfrc_int`` and ``cfrc_ext`` are kept in the returned Data.

Rangefinders cast one ray along the z-axis of their site against every
visible plane, sphere, capsule, ellipsoid, cylinder and box geom not on the
site's body (``mj_ray`` with ``flg_static`` set and no geom group mask);
touch sensors cast the contact normal against their site's shape
(``mju_rayGeom``). Ray tests evaluate every candidate surface and select
with ``torch.where``, feeding the unused branches harmless values so that
gradients stay finite.
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffmj import math, workarounds
from diffmj.collision.hfield import HFields
from diffmj.plan import SensorGroup
from diffmj.smooth import contact_force, rne_post_constraint, subtree_mass
from diffmj.types import Data, DataType, DisableBit, GeomType, Model, ObjType
from diffmj.types import SensorType as S


# ---------------------------------------------------------------- stages


def sensor_pos(m: Model, d: Data) -> Data:
    """Position-dependent sensors (mj_sensorPos)."""
    groups = m.sensor_plan.pos
    if not groups or m.opt.disabled(DisableBit.SENSOR):
        return d
    return _write(m, d, groups, [_pos_value(m, d, g) for g in groups])


def sensor_vel(m: Model, d: Data) -> Data:
    """Velocity-dependent sensors (mj_sensorVel)."""
    groups = m.sensor_plan.vel
    if not groups or m.opt.disabled(DisableBit.SENSOR):
        return d
    subtree = subtree_vel(m, d) if m.sensor_plan.subtree_vel else None
    return _write(m, d, groups, [_vel_value(m, d, g, subtree) for g in groups])


def sensor_acc(m: Model, d: Data) -> Data:
    """Acceleration- and force-dependent sensors (mj_sensorAcc), after the constraint solve."""
    groups = m.sensor_plan.acc
    if not groups or m.opt.disabled(DisableBit.SENSOR):
        return d
    if m.sensor_plan.rne_post:
        d = rne_post_constraint(m, d)
    return _write(m, d, groups, [_acc_value(m, d, g) for g in groups])


def _write(m: Model, d: Data, groups: tuple[SensorGroup, ...], values: list[Tensor]) -> Data:
    """Clamp each group's outputs [k, dim] to its cutoff and scatter them into sensordata."""
    clamped = []
    for g, value in zip(groups, values):
        cutoff = m.sensor_cutoff[g.sensor][:, None]
        on = cutoff > 0  # a cutoff of 0 means none
        if g.datatype == DataType.REAL:  # cutoff applies to both sides
            value = torch.where(on, torch.clamp(value, min=-cutoff, max=cutoff), value)
        elif g.datatype == DataType.POSITIVE:  # to the upper side
            value = torch.where(on, torch.minimum(value, cutoff), value)
        clamped.append(value.reshape(-1))
    adr = torch.cat([g.adr.reshape(-1) for g in groups])
    return d.replace(sensordata=d.sensordata.index_copy(0, adr, torch.cat(clamped)))


def _pos_value(m: Model, d: Data, g: SensorGroup) -> Tensor:
    """Outputs [k, dim] of one group of position sensors (mj_computeSensorPos)."""
    t, obj = g.type, g.obj
    if t == S.MAGNETOMETER:
        return math.mat_t_vec(d.site_xmat[obj], m.opt.magnetic)
    if t == S.RANGEFINDER:
        return _rangefinder(m, d, g)
    if t == S.JOINTPOS:
        return d.qpos[m.tree.jnt_qposadr[obj]][:, None]
    if t == S.TENDONPOS:
        return d.ten_length[obj][:, None]
    if t == S.ACTUATORPOS:
        return d.actuator_length[obj][:, None]
    if t == S.BALLQUAT:
        return math.quat_normalize(math.gather_blocks(d.qpos, m.tree.jnt_qposadr[obj], 4))
    if t in (S.JOINTLIMITPOS, S.TENDONLIMITPOS):
        return _limit_value(d, g, d.efc_pos - d.efc_margin)
    if t in (S.FRAMEPOS, S.FRAMEXAXIS, S.FRAMEYAXIS, S.FRAMEZAXIS):
        return _frame_vector(m, d, g)
    if t == S.FRAMEQUAT:
        quat = _object_quat(m, d, g.objtype, obj)
        if g.reftype == ObjType.UNKNOWN:
            return quat
        return math.quat_mul(math.quat_conj(_object_quat(m, d, g.reftype, g.ref)), quat)
    if t == S.SUBTREECOM:
        return d.subtree_com[obj]
    if t == S.CLOCK:
        return d.time.expand(obj.shape[0], 1)
    raise AssertionError(f"no position sensor of type {t}")  # put_model refuses the rest


def _vel_value(m: Model, d: Data, g: SensorGroup, subtree: tuple[Tensor, Tensor] | None) -> Tensor:
    """Outputs [k, dim] of one group of velocity sensors (mj_computeSensorVel)."""
    t, obj = g.type, g.obj
    if t in (S.VELOCIMETER, S.GYRO):
        vel = object_velocity(m, d, ObjType.SITE, obj, local=True)
        return vel[:, 3:] if t == S.VELOCIMETER else vel[:, :3]
    if t == S.JOINTVEL:
        return d.qvel[m.tree.jnt_dofadr[obj]][:, None]
    if t == S.TENDONVEL:
        return d.ten_velocity[obj][:, None]
    if t == S.ACTUATORVEL:
        return d.actuator_velocity[obj][:, None]
    if t == S.BALLANGVEL:
        return math.gather_blocks(d.qvel, m.tree.jnt_dofadr[obj], 3)
    if t in (S.JOINTLIMITVEL, S.TENDONLIMITVEL):
        return _limit_value(d, g, d.efc_vel)
    if t in (S.FRAMELINVEL, S.FRAMEANGVEL):
        vel = _relative_velocity(m, d, g)
        return vel[:, 3:] if t == S.FRAMELINVEL else vel[:, :3]
    if t == S.SUBTREELINVEL:
        return subtree[0][obj]
    if t == S.SUBTREEANGMOM:
        return subtree[1][obj]
    raise AssertionError(f"no velocity sensor of type {t}")


def _acc_value(m: Model, d: Data, g: SensorGroup) -> Tensor:
    """Outputs [k, dim] of one group of acceleration / force sensors (mj_computeSensorAcc)."""
    t, obj = g.type, g.obj
    if t == S.TOUCH:
        return _touch(m, d, g)
    if t == S.ACCELEROMETER:
        return object_acceleration(m, d, ObjType.SITE, obj, local=True)[:, 3:]
    if t in (S.FORCE, S.TORQUE):
        # interaction force between the site's body and its parent, in the site frame
        body = m.tree.site_bodyid[obj]
        com = d.subtree_com[m.tree.body_rootid[body]]
        wrench = _rotate(d.site_xmat[obj], math.transform_force(d.cfrc_int[body], d.site_xpos[obj], com))
        return wrench[:, 3:] if t == S.FORCE else wrench[:, :3]
    if t == S.ACTUATORFRC:
        return d.actuator_force[obj][:, None]
    if t == S.JOINTACTFRC:
        return d.qfrc_actuator[m.tree.jnt_dofadr[obj]][:, None]
    if t == S.TENDONACTFRC:
        plan = m.actuator_plan
        per_tendon = workarounds.sum_at(m.ntendon, plan.tendon_id, d.actuator_force[plan.tendon_act])
        return per_tendon[obj][:, None]
    if t in (S.JOINTLIMITFRC, S.TENDONLIMITFRC):
        return _limit_value(d, g, d.efc_force)
    if t in (S.FRAMELINACC, S.FRAMEANGACC):
        acc = object_acceleration(m, d, g.objtype, obj, local=False)
        return acc[:, 3:] if t == S.FRAMELINACC else acc[:, :3]
    raise AssertionError(f"no acceleration sensor of type {t}")


def _limit_value(d: Data, g: SensorGroup, efc_value: Tensor) -> Tensor:
    """efc_value of the first instantiated row of each sensor's limit, 0 if none. [k, 1]"""
    padded = torch.cat((efc_value, efc_value.new_zeros(1)))  # row nefc: a limit without rows
    active = torch.cat((d.efc_active, d.efc_active.new_zeros(1)))[g.rows]
    value = padded[g.rows]
    return torch.where(active[:, 0], value[:, 0], torch.where(active[:, 1], value[:, 1], 0.0))[:, None]


# ---------------------------------------------------------------- object frames and motion


def _object_body(m: Model, objtype: int, obj: Tensor) -> Tensor:
    """Body of each object [k]."""
    if objtype == ObjType.GEOM:
        return m.tree.geom_bodyid[obj]
    if objtype == ObjType.SITE:
        return m.tree.site_bodyid[obj]
    return obj


def _object_frame(m: Model, d: Data, objtype: int, obj: Tensor) -> tuple[Tensor, Tensor]:
    """Position [k, 3] and orientation [k, 3, 3] of objects (get_xpos_xmat); body = inertial frame."""
    if objtype == ObjType.XBODY:
        return d.xpos[obj], d.xmat[obj]
    if objtype == ObjType.BODY:
        return d.xipos[obj], d.ximat[obj]
    if objtype == ObjType.GEOM:
        return d.geom_xpos[obj], d.geom_xmat[obj]
    return d.site_xpos[obj], d.site_xmat[obj]


def _object_quat(m: Model, d: Data, objtype: int, obj: Tensor) -> Tensor:
    """Global orientation quaternion [k, 4] of objects (get_xquat)."""
    if objtype == ObjType.XBODY:
        return d.xquat[obj]
    local = {ObjType.BODY: m.body_iquat, ObjType.GEOM: m.geom_quat, ObjType.SITE: m.site_quat}[objtype]
    return math.quat_mul(d.xquat[_object_body(m, objtype, obj)], local[obj])


def _rotate(mat: Tensor, vec: Tensor) -> Tensor:
    """Both halves of spatial vectors [k, 6] rotated into the frames mat [k, 3, 3]."""
    return torch.cat((math.mat_t_vec(mat, vec[:, :3]), math.mat_t_vec(mat, vec[:, 3:])), -1)


def _object_motion(m: Model, d: Data, objtype: int, obj: Tensor, local: bool, *com_based: Tensor):
    """Com-based motion vectors [nbody, 6] of the objects' bodies, moved to the objects' origins.

    Returns the moved vectors [k, 6] (in the objects' frames if ``local``, else in the
    world frame), then the objects' positions [k, 3] and orientations [k, 3, 3].
    """
    body = _object_body(m, objtype, obj)
    pos, mat = _object_frame(m, d, objtype, obj)
    com = d.subtree_com[m.tree.body_rootid[body]]
    moved = [math.transform_motion(vec[body], pos, com) for vec in com_based]
    return *(_rotate(mat, vec) if local else vec for vec in moved), pos, mat


def object_velocity(m: Model, d: Data, objtype: int, obj: Tensor, local: bool) -> Tensor:
    """Angular:linear velocity [k, 6] of objects at their origin (mj_objectVelocity).

    ``local`` expresses it in the object's frame, otherwise in the world frame.
    """
    return _object_motion(m, d, objtype, obj, local, d.cvel)[0]


def object_acceleration(m: Model, d: Data, objtype: int, obj: Tensor, local: bool) -> Tensor:
    """Angular:linear acceleration [k, 6] of objects at their origin (mj_objectAcceleration).

    Needs ``d.cacc`` (rne_post_constraint). The linear part adds the
    Coriolis term omega x v of the moving point.
    """
    acc, vel, _, _ = _object_motion(m, d, objtype, obj, local, d.cacc, d.cvel)
    return torch.cat((acc[:, :3], acc[:, 3:] + math.cross(vel[:, :3], vel[:, 3:])), -1)


def _frame_vector(m: Model, d: Data, g: SensorGroup) -> Tensor:
    """framepos / frame[xyz]axis [k, 3], in the world or in the reference frame."""
    pos, mat = _object_frame(m, d, g.objtype, g.obj)
    vec = pos if g.type == S.FRAMEPOS else mat[:, :, g.type - S.FRAMEXAXIS]
    if g.reftype == ObjType.UNKNOWN:
        return vec
    ref_pos, ref_mat = _object_frame(m, d, g.reftype, g.ref)
    if g.type == S.FRAMEPOS:
        vec = vec - ref_pos
    return math.mat_t_vec(ref_mat, vec)


def _relative_velocity(m: Model, d: Data, g: SensorGroup) -> Tensor:
    """framelinvel / frameangvel: object velocity [k, 6], relative to a moving reference frame if any."""
    vel, pos, _ = _object_motion(m, d, g.objtype, g.obj, False, d.cvel)
    if g.reftype == ObjType.UNKNOWN:
        return vel
    ref_vel, ref_pos, ref_mat = _object_motion(m, d, g.reftype, g.ref, False, d.cvel)
    rel = vel - ref_vel
    # the reference frame rotates: subtract omega_ref x (pos - ref_pos)
    rel = torch.cat((rel[:, :3], rel[:, 3:] + math.cross(pos - ref_pos, ref_vel[:, :3])), -1)
    return _rotate(ref_mat, rel)


def subtree_vel(m: Model, d: Data) -> tuple[Tensor, Tensor]:
    """Linear velocity of each subtree's com and its angular momentum about it (mj_subtreeVel).

    Returns subtree_linvel, subtree_angmom [nbody, 3]. The angular momentum
    of subtree b is sum_j (I_j w_j + (xipos_j - com_b) x m_j v_j) over its
    bodies j, which is what MuJoCo's leaf-to-root recursion accumulates.
    """
    tree = m.tree
    bodies = torch.arange(m.nbody, device=m.device)
    vel = object_velocity(m, d, ObjType.BODY, bodies, local=False)
    momentum = m.body_mass[:, None] * vel[:, 3:]
    mass = subtree_mass(m)
    linvel = (tree.body_subtree @ momentum) / torch.clamp(mass, min=math.MINVAL)[:, None]
    spin = math.mat_vec(d.ximat, m.body_inertia * math.mat_t_vec(d.ximat, vel[:, :3]))
    arm = d.xipos[None, :, :] - d.subtree_com[:, None, :]  # [b, j, 3] from subtree com to body com
    orbital = (tree.body_subtree[..., None] * math.cross(arm, momentum[None])).sum(1)
    return linvel, tree.body_subtree @ spin + orbital


# ---------------------------------------------------------------- touch


def _touch(m: Model, d: Data, g: SensorGroup) -> Tensor:
    """Normal force of the contacts on the sensor's body whose force ray crosses its site. [k, 1]

    The ray starts at the contact point along the normal force, pointing
    away from the sensor's body (mjSENS_TOUCH).
    """
    sensor, slot = g.pairs[:, 0], g.pairs[:, 1]
    normal_force = contact_force(m, d)[slot, 0]  # zero for inactive slots
    ray, _ = math.normalize(d.contact.frame[slot, 0] * normal_force[:, None])
    ray = ray * g.pair_sign[:, None]
    site = g.obj[sensor]
    pos = d.contact.pos[slot]
    hits, start = [], 0
    for site_type, count in g.pair_site_types:  # pairs come sorted by the type of their site
        part = slice(start, start + count)
        sites = site[part]
        dist, _ = ray_geom(site_type, d.site_xpos[sites], d.site_xmat[sites], m.site_size[sites], pos[part],
                           ray[part])
        hits.append(torch.isfinite(dist))
        start += count
    hit = torch.cat(hits) if hits else torch.zeros_like(normal_force, dtype=torch.bool)
    force = torch.where(hit & (normal_force > 0), normal_force, 0.0)
    return workarounds.sum_at(g.obj.shape[0], sensor, force)[:, None]


# ---------------------------------------------------------------- rangefinder


def _rangefinder(m: Model, d: Data, g: SensorGroup) -> Tensor:
    """Rays along the z-axis of each sensor's site: the fields of its dataspec. [k, dim]

    A ray that hits nothing reports dist = depth = -1 and zero direction, point and normal.
    """
    origin = d.site_xpos[g.obj]
    direction = d.site_xmat[g.obj][:, :, 2]
    dist = torch.full_like(origin[:, 0], torch.inf)
    normal = torch.zeros_like(origin)
    for group in g.ray:
        geom = group.geom
        if group.geom_type == GeomType.HFIELD:
            x, n = ray_hfield(group.hfields, d.geom_xpos[geom][None], d.geom_xmat[geom][None], origin[:, None],
                              direction[:, None])  # [k, g]
        else:
            x, n = ray_geom(group.geom_type, d.geom_xpos[geom][None], d.geom_xmat[geom][None],
                            m.geom_size[geom][None], origin[:, None], direction[:, None])  # [k, g]
        x = torch.where(group.exclude, torch.inf, x)
        nearest = torch.argmin(x, -1, keepdim=True)
        x = x.gather(-1, nearest)[:, 0]
        n = n.gather(1, nearest[..., None].expand(-1, -1, 3))[:, 0]
        closer = x < dist  # strictly closer, as mj_ray
        dist = torch.where(closer, x, dist)
        normal = torch.where(closer[:, None], n, normal)
    hit = torch.isfinite(dist)[:, None]
    dist = torch.where(hit, dist[:, None], -1.0)
    zero = torch.zeros_like(origin)
    fields = (
        dist,
        torch.where(hit, direction, zero),
        origin,
        torch.where(hit, origin + direction * torch.where(hit, dist, 0.0), zero),
        torch.where(hit, normal, zero),
        dist,  # depth of a site rangefinder: the distance
    )
    return torch.cat([f for bit, f in enumerate(fields) if g.dataspec & (1 << bit)], -1)


def ray_geom(geom_type: int, pos: Tensor, mat: Tensor, size: Tensor, pnt: Tensor, vec: Tensor):
    """Intersect rays pnt + x vec (x >= 0) with primitive geoms (mju_rayGeom), broadcasting.

    pos [..., 3], mat [..., 3, 3], size [..., 3] describe the geoms; pnt, vec
    [..., 3] the rays. Returns the distance x [...] to the nearest surface
    point (+inf where there is none) and the world surface normal [..., 3]
    there (meaningless where x is inf).
    """
    if geom_type == GeomType.SPHERE:
        return _ray_sphere(pos, size[..., 0], pnt, vec)
    lpnt = math.mat_t_vec(mat, pnt - pos)  # ray in the geom frame
    lvec = math.mat_t_vec(mat, vec)
    x, normal = _LOCAL_RAYS[geom_type](size, lpnt, lvec)  # candidates [..., n], normals [..., n, 3]
    nearest = torch.argmin(x, -1, keepdim=True)  # first of equal candidates, as MuJoCo's strict <
    x = x.gather(-1, nearest)[..., 0]
    normal = normal.gather(-2, nearest[..., None].expand(*normal.shape[:-2], 1, 3))[..., 0, :]
    return x, math.mat_vec(mat, normal)


def _nonnegative(x: Tensor, valid: Tensor) -> Tensor:
    """x where valid and x >= 0, else +inf (no intersection)."""
    return torch.where(valid & (x >= 0), x, torch.inf)


def _finite(x: Tensor) -> Tensor:
    """x with +inf replaced by 0, for formulas that are only used where x is finite."""
    return torch.where(torch.isfinite(x), x, 0.0)


def _quadratic(a: Tensor, b: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """Roots x0 <= x1 of a x^2 + 2 b x + c = 0, each +inf if negative or not real (ray_quad)."""
    det = b * b - a * c
    real = (det >= 0) & (a >= math.MINVAL)
    positive = det > 0
    root = torch.where(positive, torch.sqrt(torch.where(positive, det, 1.0)), 0.0)
    a = torch.where(real, a, 1.0)
    return _nonnegative((-b - root) / a, real), _nonnegative((-b + root) / a, real)


def _unit(x: Tensor) -> Tensor:
    return math.normalize(x)[0]


def _hit_point(lpnt: Tensor, lvec: Tensor, x: Tensor) -> Tensor:
    """Points lpnt + x lvec [..., 3] at distances x [...] (lpnt where x is inf)."""
    return lpnt + _finite(x)[..., None] * lvec


def _ray_sphere(pos: Tensor, radius: Tensor, pnt: Tensor, vec: Tensor):
    """Sphere, in the world frame as MuJoCo does."""
    dif = pnt - pos
    x = torch.minimum(*_quadratic(math.dot(vec, vec), math.dot(vec, dif), math.dot(dif, dif) - radius * radius))
    return x, _unit(_hit_point(pnt, vec, x) - pos)


def _axis(like: Tensor, i: int, sign: float) -> Tensor:
    """The unit vector sign * e_i, shaped like ``like`` [..., 3]."""
    return (sign * torch.eye(3, dtype=like.dtype, device=like.device)[i]).expand_as(like)


def _ray_plane(size: Tensor, lpnt: Tensor, lvec: Tensor):
    """Front face of a plane, inside its rendered rectangle if size[:2] > 0."""
    front = lvec[..., 2] <= -math.MINVAL
    x = -lpnt[..., 2] / torch.where(front, lvec[..., 2], -1.0)
    p = lpnt[..., :2] + x[..., None] * lvec[..., :2]
    inside = ((size[..., :2] <= 0) | (p.abs() <= size[..., :2])).all(-1)
    return _nonnegative(x, front & inside)[..., None], _axis(lpnt, 2, 1.0)[..., None, :]


def _round_side(radius: Tensor, lpnt: Tensor, lvec: Tensor, half_height: Tensor) -> Tensor:
    """Nearest intersection with the round side of a cylinder of axis z, between its flat ends."""
    a = lvec[..., 0] * lvec[..., 0] + lvec[..., 1] * lvec[..., 1]
    b = lvec[..., 0] * lpnt[..., 0] + lvec[..., 1] * lpnt[..., 1]
    c = lpnt[..., 0] * lpnt[..., 0] + lpnt[..., 1] * lpnt[..., 1] - radius * radius
    x = torch.minimum(*_quadratic(a, b, c))
    between = (lpnt[..., 2] + _finite(x) * lvec[..., 2]).abs() <= half_height
    return torch.where(between, x, torch.inf)


def _ray_capsule(size: Tensor, lpnt: Tensor, lvec: Tensor):
    """Capsule: round side, then both roots on the top and bottom hemispheres."""
    radius, half = size[..., 0], size[..., 1]
    x = _round_side(radius, lpnt, lvec, half)
    point = _hit_point(lpnt, lvec, x)
    candidates = [x]
    normals = [torch.cat((point[..., :2], torch.zeros_like(point[..., 2:])), -1)]
    a = math.dot(lvec, lvec)
    for side in (1.0, -1.0):
        center = _axis(lpnt, 2, side) * half[..., None]
        dif = lpnt - center
        for root in _quadratic(a, math.dot(lvec, dif), math.dot(dif, dif) - radius * radius):
            point = _hit_point(lpnt, lvec, root)
            candidates.append(torch.where(side * point[..., 2] >= half, root, torch.inf))
            normals.append(point - center)
    return torch.stack(candidates, -1), _unit(torch.stack(normals, -2))


def _ray_ellipsoid(size: Tensor, lpnt: Tensor, lvec: Tensor):
    s = 1 / (size * size)
    sv = s * lvec
    a = math.dot(sv, lvec)
    b = math.dot(sv, lpnt)
    c = math.dot(s * lpnt, lpnt) - 1
    x = torch.minimum(*_quadratic(a, b, c))
    return x[..., None], _unit(s * _hit_point(lpnt, lvec, x))[..., None, :]


def _ray_cylinder(size: Tensor, lpnt: Tensor, lvec: Tensor):
    """Cylinder: bottom and top discs, then the round side."""
    radius, half = size[..., 0], size[..., 1]
    axial = lvec[..., 2].abs() > math.MINVAL
    lvec_z = torch.where(axial, lvec[..., 2], 1.0)
    candidates = []
    for side in (-1.0, 1.0):
        x = (side * half - lpnt[..., 2]) / lvec_z
        p0 = lpnt[..., 0] + x * lvec[..., 0]
        p1 = lpnt[..., 1] + x * lvec[..., 1]
        candidates.append(_nonnegative(x, axial & (p0 * p0 + p1 * p1 <= radius * radius)))
    candidates.append(_round_side(radius, lpnt, lvec, half))
    point = _hit_point(lpnt, lvec, candidates[-1])
    round_normal = _unit(torch.cat((point[..., :2], torch.zeros_like(point[..., 2:])), -1))
    normals = [_axis(lpnt, 2, -1.0), _axis(lpnt, 2, 1.0), round_normal]
    return torch.stack(candidates, -1), torch.stack(normals, -2)


def _ray_box(size: Tensor, lpnt: Tensor, lvec: Tensor):
    """Box: faces -x, +x, -y, +y, -z, +z."""
    candidates, normals = [], []
    for i, (j, k) in enumerate(((1, 2), (0, 2), (0, 1))):
        moving = lvec[..., i].abs() > math.MINVAL
        lvec_i = torch.where(moving, lvec[..., i], 1.0)
        for side in (-1.0, 1.0):
            x = (side * size[..., i] - lpnt[..., i]) / lvec_i
            inside = ((lpnt[..., j] + x * lvec[..., j]).abs() <= size[..., j]) & (
                (lpnt[..., k] + x * lvec[..., k]).abs() <= size[..., k])
            candidates.append(_nonnegative(x, moving & inside))
            normals.append(_axis(lpnt, i, side))
    return torch.stack(candidates, -1), torch.stack(normals, -2)


_LOCAL_RAYS = {
    GeomType.PLANE: _ray_plane,
    GeomType.CAPSULE: _ray_capsule,
    GeomType.ELLIPSOID: _ray_ellipsoid,
    GeomType.CYLINDER: _ray_cylinder,
    GeomType.BOX: _ray_box,
}


# ---------------------------------------------------------------- ray against a heightfield


def _ray_basis(lvec: Tensor) -> tuple[Tensor, Tensor]:
    """Two unit vectors b0, b1 [..., 3] spanning the plane normal to the ray (mj_rayHfield's): b1 is
    (1, 1, 1) without its component along the ray's largest axis, made normal to the ray; b0 = b1 x lvec."""
    size = lvec.abs()
    axis = torch.where((size[..., 0] >= size[..., 1]) & (size[..., 0] >= size[..., 2]), 0,
                       torch.where(size[..., 1] >= size[..., 2], 1, 2))
    b0 = 1.0 - (axis[..., None] == torch.arange(3, device=lvec.device)).to(lvec.dtype)
    b1 = _unit(b0 - lvec * (math.dot(lvec, b0) / math.dot(lvec, lvec))[..., None])
    return _unit(math.cross(b1, lvec)), b1


def _ray_triangles(corner: Tensor, valid: Tensor, lpnt: Tensor, lvec: Tensor) -> tuple[Tensor, Tensor]:
    """Rays lpnt + x lvec [..., 3] against triangles ``corner`` [..., T, 3, 3] (``valid`` [..., T]):
    distances x [..., T] (inf: no hit) and the unit normals (v0 - v2) x (v1 - v2) [..., T, 3].

    A hit: the ray's point in the plane normal to it (basis ``_ray_basis``) inside the triangle's
    projection there (barycentric weights t0, t1 of v0, v1 from v2), then the ray meets its plane.
    """
    b0, b1 = _ray_basis(lvec)
    dif = corner - lpnt[..., None, None, :]  # [..., T, 3, 3]
    planar = torch.stack((math.dot(dif, b0[..., None, None, :]), math.dot(dif, b1[..., None, None, :])), -1)
    one_side = ((planar > 0).all(-2) | (planar < 0).all(-2)).any(-1)  # all three on one side of an axis
    a = planar[..., :2, :] - planar[..., 2:, :]  # rows: p0 - p2, p1 - p2; columns: the two axes
    det = a[..., 0, 0] * a[..., 1, 1] - a[..., 1, 0] * a[..., 0, 1]
    ok = valid & ~one_side & (det.abs() >= math.MINVAL)
    det = torch.where(ok, det, 1.0)
    b = -planar[..., 2, :]
    t0 = (a[..., 1, 1] * b[..., 0] - a[..., 1, 0] * b[..., 1]) / det
    t1 = (-a[..., 0, 1] * b[..., 0] + a[..., 0, 0] * b[..., 1]) / det
    ok = ok & (t0 >= 0) & (t1 >= 0) & (t0 + t1 <= 1)
    normal = math.cross(corner[..., 0, :] - corner[..., 2, :], corner[..., 1, :] - corner[..., 2, :])
    denom = math.dot(lvec[..., None, :], normal)
    ok = ok & (denom.abs() >= math.MINVAL)
    x = -math.dot(lpnt[..., None, :] - corner[..., 2, :], normal) / torch.where(ok, denom, 1.0)
    return _nonnegative(x, ok), _unit(normal)


# the two triangles of cell (r, c), as (row, column) offsets of their grid points, in mj_rayHfield's order
_RAY_TRIANGLES = [[(0, 0), (0, 1), (1, 1)], [(0, 0), (1, 1), (1, 0)]]


def ray_hfield(hfields: HFields, pos: Tensor, mat: Tensor, pnt: Tensor, vec: Tensor) -> tuple[Tensor, Tensor]:
    """Intersect rays pnt + x vec (x >= 0) with heightfield geoms (mj_rayHfield), broadcasting.

    ``hfields`` [g] holds each geom's grid, pos [..., g, 3] and mat [..., g, 3, 3] its frame, pnt and
    vec [..., g, 3] the rays. Returns the distance x [..., g] (+inf where none) and the world normal
    [..., g, 3] there. The surface is the base box below z = 0, the grid's triangles and the sides
    of the box above (below the edge's elevation profile). MuJoCo tests only the triangles near the
    ray's path through that box; every triangle is tested here (the others cannot be hit), nearest
    first in MuJoCo's order: base box, then by row, column and triangle, then the four sides.
    """
    size, height, grid = hfields.size, hfields.height, hfields.grid
    lpnt = math.mat_t_vec(mat, pnt - pos)
    lvec = math.mat_t_vec(mat, vec)
    up = torch.zeros_like(size[..., :3])
    up[..., 2] = 1.0

    def box(center_z: Tensor, half_z: Tensor):
        half = torch.cat((size[..., :2], half_z[..., None]), -1)
        return _ray_box(half, lpnt - up * center_z[..., None], lvec)

    base_x, base_normal = box(-0.5 * size[..., 3], 0.5 * size[..., 3])
    top_x, _ = box(0.5 * size[..., 2], 0.5 * size[..., 2])  # [..., g, 6]: -x, +x, -y, +y, -z, +z faces

    # every triangle of the grid, in the hfield frame
    rows, cols = height.shape[-2] - 1, height.shape[-1] - 1
    r = torch.arange(rows, device=lpnt.device)[:, None, None, None]
    c = torch.arange(cols, device=lpnt.device)[None, :, None, None]
    offset = workarounds.literal(_RAY_TRIANGLES, device=lpnt.device)  # [2, 3, 2]
    vr, vc = (x.reshape(-1, 3) for x in torch.broadcast_tensors(r + offset[..., 0], c + offset[..., 1]))  # [T, 3]
    step = 2 * size[..., :2] / (grid.flip(-1) - 1).to(size.dtype)  # dx, dy [g, 2]
    corner = torch.stack((step[..., None, None, 0] * vc - size[..., None, None, 0],
                          step[..., None, None, 1] * vr - size[..., None, None, 1],
                          height.flatten(-2)[..., vr * height.shape[-1] + vc]), -1)  # [g, T, 3, 3]
    valid = ((vr < grid[..., None, None, 0]) & (vc < grid[..., None, None, 1])).all(-1)  # [g, T]: on the grid
    tri_x, tri_normal = _ray_triangles(corner, valid, lpnt, lvec)

    candidates = torch.cat((base_x, tri_x), -1)
    normals = torch.cat((base_normal, tri_normal.expand(*tri_x.shape, 3)), -2)
    nearest = torch.argmin(candidates, -1, keepdim=True)
    x = torch.where(torch.isfinite(top_x).any(-1), candidates.gather(-1, nearest)[..., 0], base_x.amin(-1))
    normal = normals.gather(-2, nearest[..., None].expand(*nearest.shape, 3))[..., 0, :]

    # the sides of the box above, where the ray meets them below the grid's elevation along that edge
    nrow, ncol = grid[..., 0], grid[..., 1]
    for i in range(4):  # -x, +x, -y, +y
        side = top_x[..., i]
        hit = _hit_point(lpnt, lvec, side)
        along = 1 - i // 2  # the grid axis along the side: rows (y) on the x sides, columns on the y sides
        t = (hit[..., along] + size[..., along]) / step[..., along]
        t0 = torch.minimum(torch.floor(t).clamp(min=0), ((nrow if along else ncol) - 2).to(t.dtype))
        first = t0.long()
        edge = ((ncol if along else nrow) - 1) * (i % 2)  # the first or last column (row)
        z0, z1 = ((_grid_at(height, k, edge) if along else _grid_at(height, edge, k)) for k in (first, first + 1))
        below = hit[..., 2] < z0 * (t0 + 1 - t) + z1 * (t - t0)
        take = torch.isfinite(side) & (side < x) & below
        x = torch.where(take, side, x)
        normal = torch.where(take[..., None], _axis(lpnt, i // 2, 1.0 if i % 2 else -1.0), normal)
    return x, math.mat_vec(mat, normal)


def _grid_at(height: Tensor, row: Tensor, col: Tensor) -> Tensor:
    """height [g, R, C] at grid points (row, col) [..., g] (ids broadcast): [..., g]."""
    row, col = torch.broadcast_tensors(row, col)
    geom = torch.arange(height.shape[0], device=height.device).expand_as(row)
    return height[geom, row, col]
