"""Narrow phase for primitive geoms: planes, spheres, capsules, ellipsoids, cylinders, boxes.

One function per geom-type pair, ``fn(geom1, geom2, margin) -> Candidates``
(see ``common.py``), reproducing MuJoCo's ``mjc_*`` functions of
``engine_collision_primitive.c`` and ``engine_collision_box.c`` contact by
contact. Each C branch becomes a ``torch.where`` over values computed for
every pair; divisions and square roots on the side not taken are fed
harmless inputs so that gradients stay finite. Box-box lives in ``box.py``.

Shapes: ``[n]`` pairs (any leading dims broadcast), positions ``[n, 3]``,
rotation matrices ``[n, 3, 3]`` whose columns are the geom's axes in world
coordinates, sizes ``[n, 3]``, margin ``[n]``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from diffmj.collision.common import (
    Candidates, GeomPose, axis_onehot, compact, make_candidates, plus_minus, select, take,
)
from diffmj.math import MINVAL, cross, dot, mat_t_vec, mat_vec, normalize
from diffmj.workarounds import literal


def _zaxis(mat: Tensor) -> Tensor:
    """Third column of a rotation matrix: the local z axis in world coordinates."""
    return mat[..., :, 2]


def _single(valid: Tensor, dist: Tensor, pos: Tensor, normal: Tensor) -> Candidates:
    """Candidates with k = 1 from per-pair valid, dist [n] and pos, normal [n, 3]."""
    return make_candidates(valid[..., None], dist[..., None], pos[..., None, :], normal[..., None, :])


def _div_or_inf(num: Tensor, den: Tensor) -> Tensor:
    """num / den for den > 0, +inf for den = 0 (where C divides by zero and then ignores it)."""
    positive = den > 0
    return torch.where(positive, num / torch.where(positive, den, 1.0), torch.inf)


# ---------------------------------------------------------------- building blocks


def _plane_sphere(
    normal: Tensor, plane_pos: Tensor, center: Tensor, radius: Tensor, margin: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """mjraw_PlaneSphere: (valid, dist, pos) of a sphere against a plane (normal is its z axis)."""
    cdist = dot(center - plane_pos, normal)
    dist = cdist - radius
    pos = center + normal * (-dist / 2 - radius)[..., None]
    return cdist <= margin + radius, dist, pos


def _sphere_sphere(
    center1: Tensor, center2: Tensor, radius1: Tensor, radius2: Tensor, margin: Tensor,
    concentric: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """mjraw_SphereSphere: (valid, dist, pos, normal) for two spheres.

    ``concentric`` is the normal used when the centres coincide (MuJoCo: the
    normalised cross product of the two geoms' z axes, see ``_concentric_normal``).
    """
    dif = center1 - center2
    min_dist = margin + radius1 + radius2
    valid = dot(dif, dif) <= min_dist * min_dist
    normal, length = normalize(center2 - center1, concentric)
    dist = length - radius1 - radius2
    pos = center1 + normal * (radius1 + dist / 2)[..., None]
    return valid, dist, pos, normal


def _concentric_normal(mat1: Tensor, mat2: Tensor) -> Tensor:
    """Normal of coincident sphere centres: z1 x z2 normalised, (1, 0, 0) if parallel."""
    return normalize(cross(_zaxis(mat1), _zaxis(mat2)))[0]


def _sphere_box(
    center: Tensor, radius: Tensor, box: GeomPose, margin: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """mjraw_SphereBox: (valid, dist, pos, normal) for sphere centres [..., 3] against a box.

    ``box`` fields and ``radius``/``margin`` broadcast against ``center``.
    """
    size = box.size
    local = mat_t_vec(box.mat, center - box.pos)
    clamped = torch.clamp(local, -size, size)
    direction, dist = normalize(clamped - local)
    valid = dist - radius <= margin

    # centre outside the box: midpoint between the nearest box point and the deepest sphere point
    deepest = local + direction * radius[..., None]
    pos_out = clamped * 0.5 + deepest * 0.5

    # centre inside the box: push out through the nearest face (first of -x, +x, -y, ...)
    face_gap = torch.stack((-size - local, size - local), -1).abs().flatten(-2)  # [..., 6]
    face = face_gap.argmin(-1)
    closest = take(face_gap, face)
    outward = plus_minus(face % 2 == 0, local.dtype)[..., None]
    nearest = axis_onehot(face // 2, local.dtype) * outward
    pos_in = local + nearest * ((radius - closest) / 2)[..., None]

    inside = (dist <= MINVAL)[..., None]
    pos = mat_vec(box.mat, torch.where(inside, pos_in, pos_out)) + box.pos
    normal = mat_vec(box.mat, torch.where(inside, nearest, direction))
    dist = torch.where(inside[..., 0], -closest, dist) - radius
    return valid, dist, pos, normal


# ---------------------------------------------------------------- plane pairs


def plane_sphere(plane: GeomPose, sphere: GeomPose, margin: Tensor) -> Candidates:
    """mjc_PlaneSphere, k = 1."""
    normal = _zaxis(plane.mat)
    valid, dist, pos = _plane_sphere(normal, plane.pos, sphere.pos, sphere.size[..., 0], margin)
    return _single(valid, dist, pos, normal)


def plane_capsule(plane: GeomPose, capsule: GeomPose, margin: Tensor) -> Candidates:
    """mjc_PlaneCapsule, k = 2: the end spheres at +axis, then -axis; tangent = capsule axis."""
    normal = _zaxis(plane.mat)[..., None, :]
    axis = _zaxis(capsule.mat)
    segment = axis * capsule.size[..., 1:2]
    ends = torch.stack((capsule.pos + segment, capsule.pos - segment), -2)
    valid, dist, pos = _plane_sphere(
        normal, plane.pos[..., None, :], ends, capsule.size[..., None, 0], margin[..., None]
    )
    return make_candidates(valid, dist, pos, normal, axis[..., None, :])


def plane_ellipsoid(plane: GeomPose, ellipsoid: GeomPose, margin: Tensor) -> Candidates:
    """mjc_PlaneConvex for an ellipsoid, k = 1: its support point along -normal."""
    normal = _zaxis(plane.mat)
    size = ellipsoid.size
    direction = normalize(mat_t_vec(ellipsoid.mat, -normal) * size)[0]
    support = mat_vec(ellipsoid.mat, direction * size) + ellipsoid.pos
    dist = dot(normal, support - plane.pos)
    pos = support + normal * (-0.5 * dist)[..., None]
    return _single(dist <= margin, dist, pos, normal)


def plane_cylinder(plane: GeomPose, cylinder: GeomPose, margin: Tensor) -> Candidates:
    """mjc_PlaneCylinder, k = 4.

    Slots: the rim point nearest the plane on the cap nearer the plane, the same
    rim point on the other cap, then two points of an inscribed triangle on the
    near cap. No contact at all unless the first point is within the margin.
    """
    normal = _zaxis(plane.mat)
    radius, half = cylinder.size[..., 0], cylinder.size[..., 1]

    # axis pointing towards the plane
    axis = _zaxis(cylinder.mat)
    prjaxis = dot(normal, axis)
    away = prjaxis > 0
    axis = torch.where(away[..., None], -axis, axis)
    prjaxis = torch.where(away, -prjaxis, prjaxis)
    dist0 = dot(cylinder.pos - plane.pos, normal)

    # radial vector towards the plane: -normal minus its axial part, scaled to the radius;
    # a disk parallel to the plane uses the cylinder's x axis
    vec = axis * prjaxis[..., None] - normal
    len_sqr = dot(vec, vec)
    general = len_sqr >= MINVAL * MINVAL
    scale = radius / torch.sqrt(torch.where(general, len_sqr, 1.0))
    xaxis = cylinder.mat[..., :, 0]
    vec = torch.where(general[..., None], vec * scale[..., None], xaxis * radius[..., None])
    prjvec = dot(vec, normal)

    axis = axis * half[..., None]
    prjaxis = prjaxis * half
    dist = torch.stack(
        (
            dist0 + prjaxis + prjvec,
            dist0 - prjaxis + prjvec,
            dist0 + prjaxis + -prjvec * 0.5,
        ),
        -1,
    )[..., (0, 1, 2, 2)]

    # triangle points: +-side, half a radius back from the rim point
    side = normalize(cross(vec, axis))[0] * (radius * math.sqrt(3.0) / 2)[..., None]
    pos = torch.stack(
        (
            cylinder.pos + vec + axis,
            cylinder.pos + vec - axis,
            cylinder.pos + side + axis + vec * -0.5,
            cylinder.pos - side + axis + vec * -0.5,
        ),
        -2,
    )
    pos = pos + normal[..., None, :] * (-dist * 0.5)[..., None]

    near = dist <= margin[..., None]
    valid = near & near[..., :1]
    return make_candidates(valid, dist, pos, normal[..., None, :])


def plane_box(plane: GeomPose, box: GeomPose, margin: Tensor) -> Candidates:
    """mjc_PlaneBox, k = 4: the first four corners (in MuJoCo's corner order) below the margin."""
    normal = _zaxis(plane.mat)
    dist0 = dot(box.pos - plane.pos, normal)

    # corner i has local coordinates (+-size0, +-size1, +-size2), sign + where bit 0/1/2 of i is set
    bits = torch.arange(8, device=box.pos.device)[:, None] >> torch.arange(3, device=box.pos.device)
    signs = plus_minus((bits & 1) == 1, box.pos.dtype)  # [8, 3]
    corner = mat_vec(box.mat[..., None, :, :], signs * box.size[..., None, :])
    ldist = dot(normal[..., None, :], corner)
    dist = dist0[..., None] + ldist
    valid = (dist <= margin[..., None]) & (ldist <= 0)
    pos = (corner + box.pos[..., None, :]) + normal[..., None, :] * (-dist / 2)[..., None]

    valid, dist, pos = compact(valid, 4, dist, pos)
    return make_candidates(valid, dist, pos, normal[..., None, :])


# ---------------------------------------------------------------- sphere pairs


def sphere_sphere(sphere1: GeomPose, sphere2: GeomPose, margin: Tensor) -> Candidates:
    """mjc_SphereSphere, k = 1."""
    valid, dist, pos, normal = _sphere_sphere(
        sphere1.pos, sphere2.pos, sphere1.size[..., 0], sphere2.size[..., 0], margin,
        _concentric_normal(sphere1.mat, sphere2.mat),
    )
    return _single(valid, dist, pos, normal)


def sphere_capsule(sphere: GeomPose, capsule: GeomPose, margin: Tensor) -> Candidates:
    """mjc_SphereCapsule, k = 1: the sphere against the nearest point of the capsule's segment."""
    axis = _zaxis(capsule.mat)
    half = capsule.size[..., 1]
    x = torch.clamp(dot(axis, sphere.pos - capsule.pos), -half, half)
    nearest = axis * x[..., None] + capsule.pos
    valid, dist, pos, normal = _sphere_sphere(
        sphere.pos, nearest, sphere.size[..., 0], capsule.size[..., 0], margin,
        _concentric_normal(sphere.mat, capsule.mat),
    )
    return _single(valid, dist, pos, normal)


def sphere_cylinder(sphere: GeomPose, cylinder: GeomPose, margin: Tensor) -> Candidates:
    """mjc_SphereCylinder, k = 1.

    The sphere centre's axial coordinate x and radial offset select the side
    (sphere-sphere against the axis point), a cap (plane-sphere against the
    cap plane) or the rim (sphere-sphere against a zero-radius rim point);
    a centre inside the cylinder takes the shallower of side and cap.
    """
    r1 = sphere.size[..., 0]
    radius, height = cylinder.size[..., 0], cylinder.size[..., 1]
    axis = _zaxis(cylinder.mat)
    x = dot(axis, sphere.pos - cylinder.pos)
    a_proj = axis * x[..., None]
    p_proj = sphere.pos - cylinder.pos - a_proj
    p_proj_sqr = dot(p_proj, p_proj)

    collide_side = x.abs() < height
    collide_cap = p_proj_sqr < radius * radius
    inside = collide_side & collide_cap
    cap_nearer = height - x.abs() < radius - torch.sqrt(p_proj_sqr)
    collide_side = collide_side & ~(inside & cap_nearer)
    collide_cap = collide_cap & ~(inside & ~cap_nearer)

    concentric = _concentric_normal(sphere.mat, cylinder.mat)
    side = _sphere_sphere(sphere.pos, a_proj + cylinder.pos, r1, radius, margin, concentric)

    # cap plane with outward normal +-axis; the contact normal points from sphere to cylinder
    top = (x > 0)[..., None]
    cap_normal = torch.where(top, axis, -axis)
    cap_pos = cylinder.pos + axis * torch.where(top, height[..., None], -height[..., None])
    cap = (*_plane_sphere(cap_normal, cap_pos, sphere.pos, r1, margin), -cap_normal)

    # rim point nearest the sphere centre (p_proj != 0 here, since the cap test failed)
    positive = p_proj_sqr > 0
    radial = p_proj * (radius / torch.sqrt(torch.where(positive, p_proj_sqr, 1.0)))[..., None]
    rim = axis * torch.where(top, height[..., None], -height[..., None]) + radial + cylinder.pos
    corner = _sphere_sphere(sphere.pos, rim, r1, torch.zeros_like(radius), margin, concentric)

    valid, dist, pos, normal = select(collide_side, side, select(collide_cap, cap, corner))
    return _single(valid, dist, pos, normal)


def sphere_box(sphere: GeomPose, box: GeomPose, margin: Tensor) -> Candidates:
    """mjc_SphereBox, k = 1."""
    valid, dist, pos, normal = _sphere_box(sphere.pos, sphere.size[..., 0], box, margin)
    return _single(valid, dist, pos, normal)


# ---------------------------------------------------------------- capsule pairs


def capsule_capsule(capsule1: GeomPose, capsule2: GeomPose, margin: Tensor) -> Candidates:
    """mjc_CapsuleCapsule, k = 2 (MuJoCo 4.0's segment-weights version).

    With segments P1 + s d1 and P2 + t d2 (s, t in [0, 1], P the -axis ends),
    each contact is a sphere-sphere test between a pair of segment points.
    Non-parallel axes: one pair, the closest points (s from the cross-product
    form of the normal equations, then t, each clamp re-solving the other).
    Parallel axes (sin^2 of the angle <= 1e-8): two pairs, from s = 0 and
    s = 1 projected onto segment 2.
    """
    a1 = _zaxis(capsule1.mat) * capsule1.size[..., 1:2]
    a2 = _zaxis(capsule2.mat) * capsule2.size[..., 1:2]
    p1, p2 = capsule1.pos - a1, capsule2.pos - a2
    d1 = capsule1.pos + a1 - p1
    d2 = capsule2.pos + a2 - p2
    r = p1 - p2
    a, b, c = dot(d1, d1), dot(d1, d2), dot(d1, r)
    e, f = dot(d2, d2), dot(d2, r)
    normal_eq = cross(d1, d2)  # |d1 x d2|^2 = a e - b^2, without the cancellation
    cross2 = dot(normal_eq, normal_eq)
    point1, point2 = a <= MINVAL, e <= MINVAL  # degenerate segments
    parallel = ~point1 & ~point2 & (cross2 <= a * 1e-8 * e)
    a_safe = torch.where(point1, 1.0, a)
    e_safe = torch.where(point2, 1.0, e)

    # t outside [0, 1]: clamp it, and re-solve s for the clamped end of segment 2
    s_at_0 = torch.clamp(-c / a_safe, 0, 1)
    s_at_1 = torch.clamp((b - c) / a_safe, 0, 1)

    def clamp_t(s: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        return torch.where(t < 0, s_at_0, torch.where(t > 1, s_at_1, s)), torch.clamp(t, 0, 1)

    unused = parallel | (cross2 == 0)  # cross2 = 0 only for parallel or degenerate segments
    s = torch.clamp(dot(normal_eq, cross(d2, r)) / torch.where(unused, 1.0, cross2), 0, 1)
    s, t = clamp_t(s, (b * s + f) / e_safe)
    s = torch.where(point2, s_at_0, torch.where(point1, 0.0, s))
    t = torch.where(point2, 0.0, torch.where(point1, torch.clamp(f / e_safe, 0, 1), t))
    s_first, t_first = clamp_t(torch.zeros_like(s), f / e_safe)
    s_second, t_second = clamp_t(torch.ones_like(s), (f + b) / e_safe)
    s = torch.stack((torch.where(parallel, s_first, s), s_second), -1)
    t = torch.stack((torch.where(parallel, t_first, t), t_second), -1)

    valid, dist, pos, normal = _sphere_sphere(
        s[..., None] * d1[..., None, :] + p1[..., None, :],
        t[..., None] * d2[..., None, :] + p2[..., None, :],
        capsule1.size[..., None, 0], capsule2.size[..., None, 0], margin[..., None],
        _concentric_normal(capsule1.mat, capsule2.mat)[..., None, :],
    )
    valid = valid & torch.stack((torch.ones_like(parallel), parallel), -1)
    return make_candidates(valid, dist, pos, normal)


# Edges of a box for mjraw_CapsuleBox, in its loop order: axis j = 0, 1, 2, and for each
# the corners i = 0..7 with bit j clear; the edge runs from corner i along +j.
_EDGE_AXIS = [j for j in range(3) for i in range(8) if not i >> j & 1]
_EDGE_CORNER = [i for j in range(3) for i in range(8) if not i >> j & 1]


def capsule_box(capsule: GeomPose, box: GeomPose, margin: Tensor) -> Candidates:
    """mjc_CapsuleBox, k = 2 (MuJoCo's mj_maxContact reserves 4; the C function emits at most 2).

    Works in the box frame. The capsule segment point closest to the box is
    found among the two segment ends against the box faces and the segment
    against the 12 box edges; from the closest feature, MuJoCo's heuristics
    pick a second segment point (``secondpos``) along the box. Both points are
    then collided as spheres with the box (slot 0: closest, slot 1: second).
    """
    radius, half = capsule.size[..., 0], capsule.size[..., 1]
    size = box.size
    device = size.device
    pos = mat_t_vec(box.mat, capsule.pos - box.pos)
    axis = mat_t_vec(box.mat, _zaxis(capsule.mat))
    halfaxis = axis * half[..., None]
    bit_weight = torch.tensor([1, 2, 4], device=device)
    axisdir = ((halfaxis > 0).long() * bit_weight).sum(-1)  # sign pattern of the axis
    limit = _div_or_inf(2 * size, halfaxis.abs())  # segment parameter spanning each box extent

    # --- candidates 0, 1: segment ends (-1, +1) against the faces (at most one coordinate clamped)
    sides = torch.tensor([-1.0, 1.0], dtype=size.dtype, device=device)
    ends = pos[..., None, :] + halfaxis[..., None, :] * sides[:, None]
    box_size = size[..., None, :]
    below, above = ends < -box_size, ends > box_size
    onto = torch.where(below, -box_size, torch.where(above, box_size, ends)) - ends
    outside = below | above
    face_ok = outside.sum(-1) <= 1
    face_dist = dot(onto, onto)
    face_clface = (outside.long() * torch.arange(1, 4, device=device)).amax(-1) - 1

    # --- candidates 2..13: segment against each box edge (closest points of two segments)
    edge_axis = literal(_EDGE_AXIS, device=device)
    edge_corner = literal(_EDGE_CORNER, device=device)
    on_axis = edge_axis[:, None] == torch.arange(3, device=device)  # [12, 3]
    corner_bits = (edge_corner[:, None] >> torch.arange(3, device=device)) & 1
    signs = plus_minus(corner_bits == 1, size.dtype)
    start = torch.where(on_axis, 0.0, signs) * box_size  # edge midpoints
    dif = start - pos[..., None, :]
    sj = size[..., edge_axis]
    hj = halfaxis[..., edge_axis]
    ma = sj * sj
    mb = -sj * hj
    mc = (half * half)[..., None]
    u = -sj * -pos[..., edge_axis]  # dif[j]: the edge midpoint has coordinate 0
    v = dot(halfaxis[..., None, :], dif)
    det = ma * mc - mb * mb
    edge_ok = det.abs() >= MINVAL
    idet = 1 / torch.where(edge_ok, det, 1.0)
    x1 = (mc * u - mb * v) * idet
    x2 = (ma * v - mb * u) * idet
    # s1, s2: 0 / 1 / 2 for lower end / interior / upper end of the box edge / capsule segment
    s1 = torch.where(x1 > 1, 2, torch.where(x1 < -1, 0, 1))
    x2 = torch.where(x1 > 1, (v - mb) * (1 / mc), torch.where(x1 < -1, (v + mb) * (1 / mc), x2))
    x1 = torch.clamp(x1, -1, 1)
    clamp2 = (x2 > 1) | (x2 < -1)
    x1_resolved = torch.where(x2 > 1, (u - mb) * (1 / ma), (u + mb) * (1 / ma))
    s1 = torch.where(
        clamp2, torch.where(x1_resolved > 1, 2, torch.where(x1_resolved < -1, 0, s1)), s1
    )
    x1 = torch.where(clamp2, torch.clamp(x1_resolved, -1, 1), x1)
    s2 = torch.where(x2 > 1, 2, torch.where(x2 < -1, 0, 1))
    x2 = torch.clamp(x2, -1, 1)
    gap = dif + halfaxis[..., None, :] * -x2[..., None]
    gap = gap + torch.where(on_axis, (sj * x1)[..., None], 0.0)
    edge_dist = dot(gap, gap)
    edge_type = s1 * 3 + s2
    edge_clcorner = edge_corner + (1 << edge_axis) * (edge_type // 6)

    # --- sequential selection as in C: faces replace on <, edges only on < best - MINVAL
    cand_dist = torch.cat((face_dist, edge_dist), -1)
    cand_ok = torch.cat((face_ok, edge_ok), -1)
    best = margin + 2 * (radius + half + size[..., 0] + size[..., 1] + size[..., 2])
    index = torch.full_like(axisdir, -1)
    for c in range(14):
        threshold = best if c < 2 else best - MINVAL
        better = cand_ok[..., c] & (cand_dist[..., c] < threshold)
        best = torch.where(better, cand_dist[..., c], best)
        index = torch.where(better, c, index)
    found = index >= 0
    index = index.clamp(min=0)
    zero = torch.zeros_like(face_dist)
    bestsegmentpos = take(torch.cat((sides.expand_as(face_dist), x2), -1), index)
    bestboxpos = take(torch.cat((zero, x1), -1), index)
    cltype = take(torch.cat((torch.tensor([-3, -1], device=device).expand_as(face_clface),
                             edge_type), -1), index)
    clface = take(face_clface, index.clamp(max=1))
    edge_index = (index - 2).clamp(min=0)
    clcorner = take(edge_clcorner, edge_index)
    cledge = take(edge_axis, edge_index)
    bsp = bestsegmentpos

    # --- second point (segment parameter relative to the first; -4: none)
    none = torch.full_like(bsp, -4.0)
    arange3 = torch.arange(3, device=device)

    # closest to a box corner: the segment leaves the corner along an edge or across a face
    c1 = axisdir ^ clcorner
    flip = (c1 == 3) | (c1 == 5) | (c1 == 6)
    mul = plus_minus(~flip, bsp.dtype)
    c1 = torch.where(flip, 7 - c1, c1)
    de = torch.where(flip, 1 + bsp, 1 - bsp)
    dp = torch.where(flip, 1 - bsp, 1 + bsp)
    ax = (c1 == 2).long() + 2 * (c1 == 4).long()
    along_edge = take(axis, ax) * take(axis, ax) > 0.5
    second_edge = torch.minimum(de, take(limit, ax)) * mul
    second_face = torch.minimum(
        dp, torch.minimum(take(limit, (ax + 1) % 3), take(limit, (ax + 2) % 3))
    ) * -mul
    towards_corner = (c1 == 0) | (c1 == 7)
    second_corner = torch.where(along_edge, second_edge, second_face)
    second_corner = torch.where(towards_corner, none, second_corner)

    # closest to the interior of a box edge: only an X-shaped crossing gets a second point
    c1 = (axisdir ^ clcorner) & (7 - (1 << cledge))
    crossing = (c1 == 1) | (c1 == 2) | (c1 == 4)
    ax = cledge
    ax1, ax2 = (ax + 1) % 3, (ax + 2) % 3
    ax1 = torch.where(take(axis, ax1).abs() > take(axis, ax2).abs(), ax2, ax1)
    ax2 = 3 - ax - ax1
    up = ((c1 >> ax2) & 1) == 1
    mul = plus_minus(up, bsp.dtype)
    second = torch.minimum(torch.where(up, 1 - bsp, 1 + bsp), take(limit, ax2))
    e2 = torch.where((((axisdir >> ax) & 1) == 1) == up, 1 - bestboxpos, 1 + bestboxpos)
    second = torch.minimum(second, _div_or_inf(take(size, ax) * e2, take(halfaxis, ax).abs()))
    second_edge = torch.where(crossing, second * mul, none)

    # closest end over a face: follow the segment to the farthest point still above the face
    mul = plus_minus(cltype == -3, bsp.dtype)
    other_end = pos + halfaxis * -mul[..., None]
    planes = torch.stack((size - other_end, -size - other_end), -1)  # [..., 3, 2]
    nonzero = halfaxis != 0
    crossing_at = planes / torch.where(nonzero, halfaxis, 1.0)[..., None] * mul[..., None, None]
    usable = (nonzero & (arange3 != clface[..., None]))[..., None] & (crossing_at > 0)
    second = torch.where(usable, crossing_at, torch.inf).flatten(-2).amin(-1).clamp(max=2) * mul
    second_face = torch.where(clface == -1, none, second)

    secondpos = torch.where(
        cltype < 0, second_face, torch.where(cltype // 3 == 1, second_edge, second_corner)
    )

    # --- the two points as spheres against the box
    params = torch.stack((bsp, secondpos + bsp), -1)
    local = pos[..., None, :] + halfaxis[..., None, :] * params[..., None]
    centers = mat_vec(box.mat[..., None, :, :], local) + box.pos[..., None, :]
    box_ = GeomPose(box.pos[..., None, :], box.mat[..., None, :, :], box_size)
    valid, dist, pos, normal = _sphere_box(centers, radius[..., None], box_, margin[..., None])
    valid = valid & torch.stack((found, found & (secondpos > -3)), -1)
    return make_candidates(valid, dist, pos, normal)
