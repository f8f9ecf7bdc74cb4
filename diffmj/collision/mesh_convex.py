"""Capsule-mesh, ellipsoid-mesh and cylinder-mesh collision: MuJoCo's mjc_Convex for a capsule, an
ellipsoid or a cylinder and a mesh's convex hull.

MuJoCo shrinks a capsule to its axis segment for GJK (``mjc_ccd``): where the
segment is separated from the hull the contact is the segment's distance
less the radius (``inflate``), else it runs GJK / EPA on the whole capsule.
Both give the capsule's signed distance to the hull, which is the segment's
signed distance less the radius (the support function of the capsule is the
segment's plus the radius), so here it is found exactly for the segment:

* **Separated** segment: the least of the distances from each segment end to
  each hull triangle it projects into, and from the segment to each hull edge
  (closest points of two segments). The nearest hull feature is that triangle,
  that edge or, where the nearest edge point is an end, that vertex.
* **Penetrating** segment: the separating-axis test. The axes are the hull's
  triangle normals and the cross products of the segment with the hull edges
  whose Gauss-map arcs cross the segment's great circle (the faces of the
  Minkowski difference); the few best edge axes are rechecked with full
  supports, so an edge admitted by rounding never decides the depth.

MuJoCo 4's multi-contact (``convex.multicontact_choice``) then treats the
capsule as a point with one edge, its surface line through the witness point
(as for the primitive pairs in ``convex.py``), and no face: where that line is
within ~5 degrees of parallel to a hull polygon at the nearest feature and the
polygon faces the capsule, the line clipped by the polygon gives up to two
contacts (a capsule lying on a face), else the single contact stands.

**Ellipsoid-mesh** (one contact: MuJoCo's multi-contact leaves ellipsoids out). The signed distance
is ``-min f(u)`` over unit ``u`` of ``f(u) = h_ellipsoid(u) + h_hull(-u)``, the support function of the
Minkowski difference. On the normal cone of each hull feature ``f`` is ``h_ellipsoid(u) - u . x``
(``x`` on the feature), whose least value there is at a stationary point of it or on the cone's
border, which is the cones of the adjacent features (a vertex's: its edges'; an edge's: its two
triangles' normals): so ``f``'s least value is among the stationary points that lie in their
feature's cone. For a triangle that is its normal; for a vertex, the normals
of the ellipsoid that pass through it (up to six: the roots of Eberly's nearest-point equation,
bracketed between its poles and found by bisection); for an edge, the same in the plane across the
edge (the ellipsoid projected to an ellipse: up to four). The least few are rechecked with full
supports (a cone test admitted by rounding never decides), and the contact is that normal, the
ellipsoid's support point along it, and the hull's plane, vertex or edge line.

All searches run without gradient in float64; the contact is then recomputed
from the chosen features with gradient (the derivative of the optimum is the
derivative at fixed features; for the ellipsoid, one Newton step of the stationary point from the
converged one carries it).

**Cylinder-mesh** (up to 4 contacts): the same support-function sum, whose least value lies on a
face of the Minkowski difference of the cylinder and the hull or (separated) on a crease of it: one
candidate normal per pair of features (see ``cylinder_mesh``); a rim point against a hull edge is a
1-D search in the rim angle. MuJoCo 4's multi-contact then clips a cap or a side line on a hull face.

Shapes: ``n`` pairs; a single pair without the leading dim is accepted (as
under ``torch.vmap`` over the pairs).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
from torch import Tensor

from diffmj.collision.common import Candidates, GeomPose, MeshPose, make_candidates, single_or_multi
from diffmj.collision.convex import clip_contacts, cylinder_cap, cylinder_clip_feature, multicontact_choice
from diffmj.collision.polytope import (MAX_CONTACTS, ClipFeature, Polytope, batched, clip_feature, clip_features,
                                      face_normals, facet_planes, line_parameters, mesh_polytope, polygon)
from diffmj.math import cross, dot, mat_t_vec, mat_vec, normalize

CAPSULE_CONTACTS = 2  # the capsule's line clipped by a hull polygon
_RECHECK = 8  # edge axes rechecked with full supports


def _rows(x: Tensor, index: Tensor) -> Tensor:
    """Rows of x [n, m, ...] at index [n, ...] (negative ids read row 0): [n, ..., *x.shape[2:]]."""
    batch = torch.arange(x.shape[0], device=x.device).reshape(-1, *(1,) * (index.dim() - 1))
    return x[batch, index.clamp(min=0)]


def _closest_on_segments(p0: Tensor, p1: Tensor, q0: Tensor, q1: Tensor) -> tuple[Tensor, Tensor]:
    """Parameters s, t [...] in [0, 1] of the closest points p0 + s (p1 - p0), q0 + t (q1 - q0) of two
    segments [..., 3] (Ericson's ClosestPtSegmentSegment; parallel segments: s from p0's end)."""
    d1, d2, r = p1 - p0, q1 - q0, p0 - q0
    a, e, b, c, f = dot(d1, d1), dot(d2, d2), dot(d1, d2), dot(d1, r), dot(d2, r)
    a_ok, e_ok = a > 0, e > 0
    denom = a * e - b * b
    general = denom > 1e-14 * a * e
    s = torch.where(general, ((b * f - c * e) / torch.where(general, denom, 1.0)).clamp(0, 1), 0.0)
    t = torch.where(e_ok, (b * s + f) / torch.where(e_ok, e, 1.0), 0.0)
    safe_a = torch.where(a_ok, a, 1.0)
    s = torch.where(t < 0, (-c / safe_a).clamp(0, 1), torch.where(t > 1, ((b - c) / safe_a).clamp(0, 1), s))
    s = torch.where(a_ok, s, 0.0)
    return s, t.clamp(0, 1)


class SegmentContact(NamedTuple):
    dist: Tensor  # [n] signed distance of the segment and the hull
    normal: Tensor  # [n, 3] from the segment to the hull
    point1: Tensor  # [n, 3] witness on the segment
    point2: Tensor  # [n, 3] witness on the hull
    dim2: Tensor  # [n] the hull's feature: 1 vertex, 2 edge, 3 triangle
    ids2: Tensor  # [n, 3] its vertex ids (the first dim2 count, the last repeated)


def _penetration_axis(ends: Tensor, p: Polytope):
    """The separating axis of most separation of the segment ends [n, 2, 3] and the hull.

    Returns (separation [n], edge axis won [n], triangle or edge id [n]).
    """
    normal, offset, ok = facet_planes(p)
    sep_face = torch.where(ok, (normal @ ends.transpose(-1, -2)).amin(-1) - offset, -torch.inf)  # [n, T]

    d = ends[..., 1, :] - ends[..., 0, :]
    edge_ends = _rows(p.vert, p.edge)  # [n, E, 2, 3]
    facet_normal = _rows(normal, p.edge_facet)  # [n, E, 2, 3]
    side = dot(facet_normal, d[..., None, None, :])  # [n, E, 2]
    crossing = (side[..., 0] * side[..., 1] < 0) & (p.edge[..., 0] >= 0)
    axis = cross(d[..., None, :], edge_ends[..., 1, :] - edge_ends[..., 0, :])  # [n, E, 3]
    inner = p.vert.mean(-2)
    # the hull's outward normal at the edge is -axis: orient axis towards the hull's inside
    axis = axis * -torch.sign(dot(axis, edge_ends[..., 0, :] - inner[..., None, :]))[..., None]
    length = torch.sqrt(dot(axis, axis))
    usable = crossing & (length > 1e-10 * torch.sqrt(dot(d, d))[..., None])
    cheap = torch.where(usable, dot(axis, edge_ends[..., 0, :] - ends[..., None, 0, :]) /
                        torch.where(usable, length, 1.0), -torch.inf)

    k = min(_RECHECK, cheap.shape[-1])
    best_cheap, pick = cheap.topk(k, -1)
    u = normalize(_rows(axis, pick))[0]  # [n, k, 3]
    exact = (u @ p.vert.transpose(-1, -2)).amin(-1) - (u @ ends.transpose(-1, -2)).amax(-1)
    exact = torch.where(torch.isfinite(best_cheap), exact, -torch.inf)

    every = torch.cat((sep_face, exact), -1)
    best = every.argmax(-1)
    is_edge = best >= sep_face.shape[-1]
    index = torch.where(is_edge, _rows(pick, (best - sep_face.shape[-1]).clamp(min=0)), best)
    return torch.take_along_dim(every, best[..., None], -1)[..., 0], is_edge, index


def _nearest_features(ends: Tensor, p: Polytope):
    """The nearest hull feature to a separated segment (ends [n, 2, 3]).

    Returns (edge won [n], triangle or edge id [n], the segment end of a triangle [n]).
    """
    normal, offset, ok = facet_planes(p)
    corner = _rows(p.vert, p.facet)  # [n, T, 3, 3]
    height = normal @ ends.transpose(-1, -2) - offset[..., None]  # [n, T, 2]
    sides = corner.roll(-1, -2) - corner  # [n, T, 3, 3]
    rel = ends[..., None, :, None, :] - corner[..., :, None, :, :]  # [n, T, 2, 3, 3]
    inside = (dot(cross(sides[..., :, None, :, :], rel), normal[..., :, None, None, :]) >= 0).all(-1)
    face_dist = torch.where(ok[..., None] & inside & (height >= 0), height, torch.inf).flatten(-2)  # [n, 2T]

    edge_ends = _rows(p.vert, p.edge)  # [n, E, 2, 3]
    q0, q1 = edge_ends[..., 0, :], edge_ends[..., 1, :]
    p0, p1 = ends[..., None, 0, :].expand_as(q0), ends[..., None, 1, :].expand_as(q0)
    s, t = _closest_on_segments(p0, p1, q0, q1)
    gap = q0 + t[..., None] * (q1 - q0) - p0 - s[..., None] * (p1 - p0)
    edge_dist = torch.where(p.edge[..., 0] >= 0, torch.sqrt(dot(gap, gap)), torch.inf)

    every = torch.cat((face_dist, edge_dist), -1)  # triangles first: a tie with its edges goes to the triangle
    best = every.argmin(-1)
    is_edge = best >= face_dist.shape[-1]
    index = torch.where(is_edge, best - face_dist.shape[-1], best // 2)
    return is_edge, index, best % 2


def segment_contact(ends: Tensor, p: Polytope) -> SegmentContact:
    """Signed distance, normal, witnesses and the hull's feature, with gradient (see module doc)."""
    with torch.no_grad():
        q = Polytope(*(x.detach().double() if x.is_floating_point() else x for x in p))
        qe = ends.detach().double()
        depth, pen_edge, pen_index = _penetration_axis(qe, q)
        sep_edge, sep_index, sep_end = _nearest_features(qe, q)
    separated = depth > 0
    on_edge = torch.where(separated, sep_edge, pen_edge)
    index = torch.where(separated, sep_index, pen_index)

    # a triangle: the segment end lowest over its plane (separated: the one found)
    facet = _rows(p.facet, torch.where(on_edge, 0, index))  # [n, 3]
    corner = _rows(p.vert, facet)
    plane = normalize(cross(corner[..., 1, :] - corner[..., 0, :], corner[..., 2, :] - corner[..., 0, :]))[0]
    height = dot(ends - corner[..., None, 0, :], plane[..., None, :])  # [n, 2]
    end = torch.where(separated, sep_end, height.argmin(-1))
    face_point1 = _rows(ends, end)
    face_dist = torch.take_along_dim(height, end[..., None], -1)[..., 0]
    face_point2 = face_point1 - face_dist[..., None] * plane

    # an edge: the closest points of the segment and the edge (penetrating: of their lines)
    edge = _rows(p.edge, torch.where(on_edge, index, 0))  # [n, 2]
    edge_ends = _rows(p.vert, edge)
    q0, q1 = edge_ends[..., 0, :], edge_ends[..., 1, :]
    p0, p1 = ends[..., 0, :], ends[..., 1, :]
    s, t = _closest_on_segments(p0, p1, q0, q1)
    s_line, t_line = line_parameters(p0, p1, q0, q1)
    s, t = torch.where(separated, s, s_line), torch.where(separated, t, t_line)
    edge_point1, edge_point2 = p0 + s[..., None] * (p1 - p0), q0 + t[..., None] * (q1 - q0)
    gap = edge_point2 - edge_point1
    across = cross(p1 - p0, q1 - q0)  # the separating axis, towards the hull's inside
    across = normalize(across * -torch.sign(dot(across, q0 - p.vert.mean(-2)))[..., None])[0]
    edge_normal = torch.where(separated[..., None], normalize(gap)[0], across)
    edge_dist = torch.where(separated, torch.sqrt(torch.where(separated, dot(gap, gap), 1.0)), dot(gap, across))

    # the hull's feature: a triangle, an edge, or (an edge's end point) a vertex
    vertex = torch.where(t <= 0, edge[..., 0], edge[..., 1])
    edge_dim = torch.where(separated & ((t <= 0) | (t >= 1)), 1, 2)
    edge_ids = torch.where((edge_dim == 1)[..., None], vertex[..., None].expand(*vertex.shape, 3),
                           torch.cat((edge, edge[..., 1:]), -1))
    e = on_edge[..., None]
    return SegmentContact(torch.where(on_edge, edge_dist, face_dist), torch.where(e, edge_normal, -plane),
                    torch.where(e, edge_point1, face_point1), torch.where(e, edge_point2, face_point2),
                    torch.where(on_edge, edge_dim, 3), torch.where(e, edge_ids, facet))


def _multicontact(capsule: GeomPose, p: Polytope, con: SegmentContact, margin: Tensor):
    """MuJoCo 4's mjc_multicontact for a capsule (geom 1) and a hull: the capsule's line through its
    witness clipped by a hull polygon nearly parallel to it (see module doc).

    Returns (use [n], dist [n, 2], pos [n, 2, 3], normal [n, 2, 3], count [n]).
    """
    half = 0.5 * margin[..., None]
    x1 = con.point1 + half * con.normal  # witness points of the geoms inflated by half the margin
    x2 = con.point2 - half * con.normal
    n2, face2, ok2 = face_normals(p, con.dim2, con.ids2)
    axis, length = capsule.mat[..., :, 2], capsule.size[..., 1]
    along = dot(x1 - capsule.pos, axis)
    line = torch.stack(((-along - length)[..., None] * axis + x1, (length - along)[..., None] * axis + x1), -2)
    no_face = n2[..., :0, :]
    no_edge = n2[..., :0, :]
    choice = multicontact_choice(x2 - x1, (no_face, ok2[..., :0], torch.ones_like(con.dim2), axis[..., None, :],
                                           torch.ones_like(ok2[..., :1])),
                                 (n2, ok2, con.dim2, no_edge, ok2[..., :0]))
    normal2 = _rows(n2, choice.face2)
    face, nface = polygon(p, torch.take_along_dim(face2, choice.face2[..., None], -1)[..., 0])
    # the capsule's line already runs through its inflated witness: only the hull's face is inflated
    count, on_face, on_line, dist, _ = clip_contacts(face, nface, line, torch.full_like(nface, 2), normal2, -normal2,
                                                     half[..., 0], CAPSULE_CONTACTS, torch.ones_like(choice.edge1))
    on_face = on_face + half[..., None] * normal2[..., None, :]
    use = choice.edge1 & (count > 0)
    return use, dist + half, 0.5 * (on_line + on_face), normalize(on_line - on_face)[0], count


def capsule_contact(capsule: GeomPose, p: Polytope) -> SegmentContact:
    """The capsule's contact with the hull (``segment_contact`` less the radius): the capsule's
    signed distance, its normal towards the hull, the witness on the capsule's surface and on the hull."""
    axis = capsule.mat[..., :, 2] * capsule.size[..., 1:2]
    con = segment_contact(torch.stack((capsule.pos - axis, capsule.pos + axis), -2), p)
    radius = capsule.size[..., 0]
    return con._replace(dist=con.dist - radius, point1=con.point1 + radius[..., None] * con.normal)


@batched
def capsule_mesh(capsule: GeomPose, mesh_geom: MeshPose, margin: Tensor) -> Candidates:
    """Capsule-mesh (mjc_Convex): up to 2 contacts [n, 2] (see module doc)."""
    p = mesh_polytope(mesh_geom)
    con = capsule_contact(capsule, p)
    single = (con.dist, 0.5 * (con.point1 + con.point2), con.normal, con.dist < margin)
    return single_or_multi(single, _multicontact(capsule, p, con, margin), margin)


# ---------------------------------------------------------------- ellipsoid-mesh

_BISECTIONS = 110  # halvings of the bracket of the nearest-point root: float64 resolution from any bracket


def _bisect(fn, low: Tensor, high: Tensor) -> Tensor:
    """Where the increasing function fn crosses zero in [low, high] (elementwise), by bisection."""
    for _ in range(_BISECTIONS):
        mid = 0.5 * (low + high)
        above = fn(mid) > 0
        low, high = torch.where(above, low, mid), torch.where(above, mid, high)
    return 0.5 * (low + high)


def _in_edge_cone(n1: Tensor, n2: Tensor, e: Tensor, w: Tensor) -> Tensor:
    """Whether w [..., 3], orthogonal to a hull edge's direction e, lies in the cone of the outward normals
    n1, n2 of the edge's two triangles (the hull's support along w is then the edge), to a rounding slack;
    never for a flat edge (coplanar triangles: their normal is the triangle's candidate). Broadcasts."""
    span, one, two = dot(cross(n1, n2), e), dot(cross(n1, w), e), dot(cross(w, n2), e)
    tol = 1e-9 * span.abs()
    return (one * torch.sign(span) >= -tol) & (two * torch.sign(span) >= -tol) & (dot(w, n1 + n2) > 0) & (span != 0)


def _stationary_normals(axes: Tensor, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The normals of the axis-aligned ellipse / ellipsoid with semi-axes axes [..., k] at every boundary
    point x whose normal passes through z [..., k] (z inside or outside): the roots t of Eberly's
    G(t) = sum (a_i z_i / (t + a_i^2))^2 - 1, x = a^2 z / (t + a^2), outward normal z / (t + a^2).

    G has poles at -a_i^2: one root beyond each outer pole, none or two between neighbouring poles
    (G is convex there). Returns t [..., 2k], the unit normals [..., 2k, k] and which exist [..., 2k].
    """
    a2 = axes * axes
    pole = a2.sort(-1).values.neg()  # -a^2 descending: pole[0] the largest
    reach = axes.amax(-1) * torch.sqrt((z * z).sum(-1)) + 1e-300

    def terms(t, power):
        den = t[..., None] + a2
        den = torch.where(den.abs() > 1e-300, den, 1e-300)
        return (a2 * z * z / den ** power).sum(-1)

    g = lambda t: terms(t, 2) - 1  # noqa: E731
    slope = lambda t: -2 * terms(t, 3)  # noqa: E731
    roots = [_bisect(lambda t: -g(t), pole[..., 0], pole[..., 0] + reach),
             _bisect(g, pole[..., -1] - reach, pole[..., -1])]
    valid = [torch.ones_like(reach, dtype=torch.bool)] * 2
    for i in range(axes.shape[-1] - 1):
        low, high = pole[..., i + 1], pole[..., i]
        least = _bisect(slope, low, high)
        valid += [g(least) < 0] * 2
        roots += [_bisect(lambda t: -g(t), low, least), _bisect(g, least, high)]
    t = torch.stack(roots, -1)
    return t, normalize(z[..., None, :] / (t[..., None] + a2[..., None, :]))[0], torch.stack(valid, -1)


def _support_value(size: Tensor, u: Tensor) -> Tensor:
    """The support function [...] of the axis-aligned ellipsoid of semi-axes size [..., 3] at u [..., 3]."""
    return torch.sqrt(dot(size * u, size * u))


def _perpendicular_basis(e: Tensor) -> tuple[Tensor, Tensor]:
    """Two unit vectors [..., 3] orthogonal to e [..., 3] and to each other (the helper axis chosen
    without gradient: the coordinate axis least along e)."""
    helper = torch.eye(3, dtype=e.dtype, device=e.device)[e.detach().abs().argmin(-1)]
    b1 = normalize(cross(e, helper))[0]
    return b1, normalize(cross(normalize(e)[0], b1))[0]


def _edge_normals(size: Tensor, ends: Tensor) -> tuple[Tensor, Tensor]:
    """For lines through ends [n, E, 2, 3] (ellipsoid frame): the unit u [n, E, 4, 3] orthogonal to the
    line where h(u) - u . end is stationary (the normals of the ellipsoid's projection along the line
    through the line's point), and which exist [n, E, 4]."""
    b1, b2 = _perpendicular_basis(ends[..., 1, :] - ends[..., 0, :])
    basis = torch.stack((b1, b2), -1)  # [n, E, 3, 2]
    m2 = basis.transpose(-1, -2) @ (size[..., None, :, None] ** 2 * basis)  # [n, E, 2, 2]
    point = (basis.transpose(-1, -2) @ ends[..., 0, :, None])[..., 0]  # [n, E, 2]
    a, b, d = m2[..., 0, 0], m2[..., 0, 1], m2[..., 1, 1]
    root = torch.sqrt(0.25 * (a - d) ** 2 + b * b)
    lam = torch.stack((0.5 * (a + d) + root, 0.5 * (a + d) - root), -1)  # [n, E, 2]
    v1, v2 = torch.stack((b, lam[..., 0] - a), -1), torch.stack((lam[..., 0] - d, b), -1)
    first = normalize(torch.where(((v1 * v1).sum(-1) >= (v2 * v2).sum(-1))[..., None], v1, v2),
                      torch.tensor([1.0, 0.0], dtype=size.dtype, device=size.device))[0]
    q = torch.stack((first, torch.stack((-first[..., 1], first[..., 0]), -1)), -1)  # columns: eigenvectors
    along_axes = (q.transpose(-1, -2) @ point[..., None])[..., 0]
    _, w, exists = _stationary_normals(torch.sqrt(lam.clamp(min=0)), along_axes)
    return (basis[..., None, :, :] @ (q[..., None, :, :] @ w[..., None]))[..., 0], exists  # [n, E, 4, 3], [n, E, 4]


def _ellipsoid_candidates(size: Tensor, p: Polytope):
    """Every candidate normal of the ellipsoid-hull contact (ellipsoid frame, no gradient): the values
    F = h(u) - u . x of the hull feature x [n, C] (inf where u is not in the feature's normal cone), the
    normals [n, C, 3], kinds [n, C] (0 triangle, 1 vertex, 2 edge), the feature ids [n, C] and, for a
    vertex, the root t of its normal [n, C]."""
    normal, offset, ok = facet_planes(p)
    face_value = torch.where(ok, _support_value(size[..., None, :], -normal) + offset, torch.inf)

    vert_t, vert_u, exists = _stationary_normals(size[..., None, :], p.vert)  # [n, V, 6], [n, V, 6, 3]
    neighbour = _rows(p.vert, p.vert_edge)  # [n, V, P, 3]
    # along -u, no neighbour rises above the vertex where it supports -u
    rise = dot(-vert_u[..., :, None, :], (neighbour - p.vert[..., None, :])[..., None, :, :])  # [n, V, 6, P]
    scale = 1e-9 * (p.vert.amax(-2) - p.vert.amin(-2)).abs().amax(-1)[..., None, None, None]
    supports = exists & (p.vert_edge >= 0).any(-1)[..., None] & \
        ((rise <= scale) | (p.vert_edge < 0)[..., None, :]).all(-1)
    vert_value = torch.where(supports, _support_value(size[..., None, None, :], vert_u)
                             - dot(vert_u, p.vert[..., None, :]), torch.inf).flatten(-2)
    vert_u = vert_u.flatten(-3, -2)

    ends = _rows(p.vert, p.edge)  # [n, E, 2, 3]
    edge_u, exists = _edge_normals(size, ends)  # [n, E, 4, 3]
    n1, n2 = (_rows(normal, p.edge_facet[..., k])[..., None, :] for k in range(2))
    e = (ends[..., 1, :] - ends[..., 0, :])[..., None, :]
    within = _in_edge_cone(n1, n2, e, -edge_u) & exists & (p.edge[..., 0] >= 0)[..., None]
    edge_value = torch.where(within, _support_value(size[..., None, None, :], edge_u)
                             - dot(edge_u, ends[..., None, 0, :]), torch.inf).flatten(-2)
    edge_u = edge_u.flatten(-3, -2)

    value = torch.cat((face_value, vert_value, edge_value), -1)
    u = torch.cat((-normal, vert_u, edge_u), -2)
    counts = (face_value.shape[-1], vert_value.shape[-1], edge_value.shape[-1])
    kind = torch.cat([torch.full_like(x, k, dtype=torch.long) for k, x in enumerate((face_value, vert_value,
                                                                                      edge_value))], -1)
    per = (1, vert_t.shape[-1], exists.shape[-1])  # candidates per triangle, vertex, edge
    ids = torch.cat([(torch.arange(c, device=size.device) // k).expand_as(x)
                     for c, k, x in zip(counts, per, (face_value, vert_value, edge_value))], -1)
    roots = torch.cat((torch.zeros_like(face_value), vert_t.flatten(-2), torch.zeros_like(edge_value)), -1)
    return value, u, kind, ids, roots


def ellipsoid_contact(ellipsoid: GeomPose, p: Polytope):
    """Signed distance [n], normal [n, 3] (world, from the ellipsoid to the hull) and the midpoint of the
    witness points [n, 3], with gradient (see ellipsoid_mesh)."""
    local = p._replace(vert=mat_t_vec(ellipsoid.mat[..., None, :, :], p.vert - ellipsoid.pos[..., None, :]))
    size = ellipsoid.size
    with torch.no_grad():
        q = Polytope(*(x.detach().double() if x.is_floating_point() else x for x in local))
        value, u, kind, ids, roots = _ellipsoid_candidates(size.detach().double(), q)
        k = min(_RECHECK, value.shape[-1])
        _, pick = (-value).topk(k, -1)  # the least cheap values, rechecked with full supports
        cand = _rows(u, pick)
        exact = _support_value(size.detach().double()[..., None, :], cand) + \
            (-cand @ q.vert.transpose(-1, -2)).amax(-1)
        best = _rows(pick, exact.argmin(-1))
        kind, index, u0, t0 = _rows(kind, best), _rows(ids, best), _rows(u, best), _rows(roots, best)

    # the chosen feature's normal, again with gradient: a triangle's; one Newton step of the nearest-point
    # root (vertex) or of the angle about the edge (edge) from the converged point
    facet = _rows(local.facet, torch.where(kind == 0, index, 0))
    corner = _rows(local.vert, facet)
    face_u = -normalize(cross(corner[..., 1, :] - corner[..., 0, :], corner[..., 2, :] - corner[..., 0, :]))[0]

    vertex = _rows(local.vert, torch.where(kind == 1, index, 0))
    a2 = size * size
    den = t0.to(size.dtype)[..., None] + a2
    root = ((size * vertex / den) ** 2).sum(-1) - 1
    slope = -2 * (a2 * vertex ** 2 / den ** 3).sum(-1)
    t1 = t0 - root / torch.where(slope != 0, slope, 1.0)
    vert_u = normalize(vertex / (t1[..., None] + a2))[0]

    ends = _rows(local.vert, _rows(local.edge, torch.where(kind == 2, index, 0)))
    b1, b2 = _perpendicular_basis(ends[..., 1, :] - ends[..., 0, :])
    theta = torch.atan2(dot(u0, b2), dot(u0, b1)).detach()
    w, dw = (torch.cos(theta)[..., None] * b1 + torch.sin(theta)[..., None] * b2,
             -torch.sin(theta)[..., None] * b1 + torch.cos(theta)[..., None] * b2)
    h = _support_value(size, w)
    mw, mdw = a2 * w, a2 * dw
    slope = dot(dw, mw) / h - dot(ends[..., 0, :], dw)
    curvature = (dot(dw, mdw) - dot(w, mw)) / h - dot(dw, mw) ** 2 / h ** 3 + dot(ends[..., 0, :], w)
    theta = theta - slope / torch.where(curvature > 0, curvature, 1.0)
    edge_u = torch.cos(theta)[..., None] * b1 + torch.sin(theta)[..., None] * b2

    u = torch.where((kind == 0)[..., None], face_u, torch.where((kind == 1)[..., None], vert_u, edge_u))
    feature = torch.where((kind == 0)[..., None], corner[..., 0, :], torch.where((kind == 1)[..., None], vertex,
                                                                              ends[..., 0, :]))
    h = _support_value(size, u)
    dist = dot(u, feature) - h
    point1 = a2 * u / h[..., None]  # the ellipsoid's support point along u
    mid = point1 + 0.5 * dist[..., None] * u
    return dist, mat_vec(ellipsoid.mat, u), mat_vec(ellipsoid.mat, mid) + ellipsoid.pos


@batched
def ellipsoid_mesh(ellipsoid: GeomPose, mesh_geom: MeshPose, margin: Tensor) -> Candidates:
    """Ellipsoid-mesh (mjc_Convex, one contact) [n, 1] (see module doc)."""
    dist, normal, pos = ellipsoid_contact(ellipsoid, mesh_polytope(mesh_geom))
    return make_candidates((dist < margin)[..., None], dist[..., None], pos[..., None, :], normal[..., None, :])


# ---------------------------------------------------------------- cylinder-mesh

_RIM_SAMPLES = 32  # samples of a rim's angle bracketing the (at most 4) roots of the rim-edge condition
_RIM_ROOTS = 4
_RIM_ITERATIONS = 24  # safeguarded Newton steps per root (bisection alone: a bracket 1e-7 wide)


def _cylinder_support(cylinder: GeomPose, u: Tensor) -> Tensor:
    """The cylinder's support function [n, ...] at unit u [n, ..., 3]: c.u + h |u.a| + r |P u|."""
    extra = (None,) * (u.dim() - cylinder.pos.dim())
    centre, axis = cylinder.pos[(..., *extra, slice(None))], cylinder.mat[(..., *extra, slice(None), 2)]
    radius, half = (cylinder.size[(..., *extra, k)] for k in (0, 1))
    along = dot(u, axis)
    return dot(u, centre) + half * along.abs() + radius * torch.sqrt((dot(u, u) - along * along).clamp(min=0))


def _supports(p: Polytope, vertex: Tensor, u: Tensor) -> Tensor:
    """Whether hull vertex ``vertex`` [n, C] is the hull's lowest along u [n, C, 3] (its support along -u),
    to a rounding slack: no neighbour along its polygons lies lower. A vertex on no polygon supports nothing."""
    rise = dot(-u[..., None, :], _rows(p.vert, _rows(p.vert_edge, vertex)) - _rows(p.vert, vertex)[..., None, :])
    scale = 1e-9 * (p.vert.amax(-2) - p.vert.amin(-2)).abs().amax(-1).reshape(-1, *(1,) * (vertex.dim()))
    edge = _rows(p.vert_edge, vertex)
    return (edge >= 0).any(-1) & ((rise <= scale) | (edge < 0)).all(-1)


def _rim_edge_condition(phi: Tensor, coef: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
    """t(phi) . (p(phi) - q(phi)) at rim angles phi [...] and its derivative in phi: p the rim point, t its
    unit tangent, q p's projection on the edge line; zero where the rim and the line are at a stationary
    distance. ``coef`` (see _rim_edge_coefficients) broadcast against phi."""
    b1, b2, e0, e1, e2, radius = coef
    cos, sin = torch.cos(phi), torch.sin(phi)
    along, across = -sin * e1 + cos * e2, cos * e1 + sin * e2  # the edge's direction along t and along p - c
    reach = e0 + radius * across
    return (-sin * b1 + cos * b2 - reach * along,
            -cos * b1 - sin * b2 - radius * along * along + reach * across)


def _rim_edge_coefficients(rim_centre: Tensor, cylinder: GeomPose, start: Tensor, e: Tensor):
    """Coefficients of _rim_edge_condition for rims centred at rim_centre [..., 3] (axes x, y of the
    cylinder frame ``cylinder.mat`` broadcast to it) and edge lines start [..., 3] + s e (unit e)."""
    extra = (None,) * (rim_centre.dim() - cylinder.pos.dim())
    x, y = (cylinder.mat[(..., *extra, slice(None), k)] for k in (0, 1))
    offset = rim_centre - start
    radius = cylinder.size[(..., *extra, 0)]
    return dot(x, offset), dot(y, offset), dot(e, offset), dot(x, e), dot(y, e), radius


def _rim_edge_roots(coef: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
    """The roots phi [..., 4] of _rim_edge_condition in [0, 2 pi) (a trigonometric polynomial of degree 2:
    at most 4), bracketed between _RIM_SAMPLES samples, and which exist [..., 4]. Each bracket is narrowed
    by Newton steps that stay inside it and at least halve the previous step, else by bisection
    (Numerical Recipes' rtsafe)."""
    step = 2 * math.pi / _RIM_SAMPLES
    grid = torch.arange(_RIM_SAMPLES, dtype=coef[0].dtype, device=coef[0].device) * step
    coef = tuple(c[..., None] for c in coef)
    value = _rim_edge_condition(grid, coef)[0]
    change = (value > 0) != (value.roll(-1, -1) > 0)
    # the first _RIM_ROOTS sign changes: earlier samples rank higher
    rank, at = (change * torch.arange(_RIM_SAMPLES, 0, -1, device=grid.device)).topk(_RIM_ROOTS, -1)
    low = at * step
    high = low + step
    rising = torch.take_along_dim(value, at, -1) <= 0
    phi, last = low + 0.5 * step, torch.full_like(low, step)
    for _ in range(_RIM_ITERATIONS):
        f, slope = _rim_edge_condition(phi, coef)
        beyond = (f > 0) == rising  # the root lies below phi
        low, high = torch.where(beyond, low, phi), torch.where(beyond, phi, high)
        newton = f / torch.where(slope != 0, slope, 1.0)
        take = (slope != 0) & (phi - newton > low) & (phi - newton < high) & (2 * newton.abs() < last)
        moved = torch.where(take, phi - newton, 0.5 * (low + high))
        last, phi = (moved - phi).abs(), moved
    return phi, rank > 0


# the contact's features: the cylinder's (cap, side line or rim point) and the hull's (vertex, edge, triangle)
_CAP_VERTEX, _FACE, _SIDE_EDGE, _RIM_EDGE, _SIDE_VERTEX, _RIM_VERTEX = range(6)


class _CylinderCandidates(NamedTuple):
    """Candidate normals of the cylinder-hull contact (no gradient), one per column [n, C]."""

    value: Tensor  # f(u) = h_cylinder(u) + h_hull(-u) where the hull feature supports -u, else inf
    u: Tensor  # [n, C, 3] unit, from the cylinder to the hull
    kind: Tensor  # _CAP_VERTEX ... _RIM_VERTEX
    feature: Tensor  # the hull's vertex, triangle or edge
    sign: Tensor  # +-1: the cap (+ the top) of a cap or rim, the orientation of a side-edge normal
    phi: Tensor  # a rim-edge root's angle on the rim (cylinder frame x towards y)


def _cylinder_candidates(cylinder: GeomPose, p: Polytope) -> _CylinderCandidates:
    """Every stationary normal of f(u) = h_cylinder(u) + h_hull(-u) on the unit sphere, by the pair of
    features whose Minkowski difference it is normal to (see cylinder_mesh)."""
    n, device, dtype = p.vert.shape[0], p.vert.device, p.vert.dtype
    centre, axis, radius, half = cylinder.pos, cylinder.mat[..., :, 2], cylinder.size[..., 0], cylinder.size[..., 1]
    signs = torch.tensor([1.0, -1.0], dtype=dtype, device=device)
    blocks = []

    def add(kind, u, value, feature, sign, phi=None):
        blocks.append((value, u, torch.full_like(feature, kind), feature, sign.expand_as(value),
                       torch.zeros_like(value) if phi is None else phi))

    # a cap flat on the hull's lowest vertex along +-axis
    u = signs[:, None] * axis[..., None, :]  # [n, 2, 3]
    lowest = (u @ p.vert.transpose(-1, -2)).argmin(-1)
    add(_CAP_VERTEX, u, _cylinder_support(cylinder, u) - dot(u, _rows(p.vert, lowest)), lowest, signs)

    # a rim point (or a cap or side line) on a triangle
    normal, offset, ok = facet_planes(p)
    add(_FACE, -normal, torch.where(ok, _cylinder_support(cylinder, -normal) + offset, torch.inf),
        torch.arange(normal.shape[-2], device=device).expand(n, -1), signs[:1])

    # a side line across an edge
    ends = _rows(p.vert, p.edge)  # [n, E, 2, 3]
    direction, length = normalize(ends[..., 1, :] - ends[..., 0, :])
    across, across_length = normalize(cross(axis[..., None, :], direction))
    u = signs[:, None] * across[..., None, :]  # [n, E, 2, 3]
    n1, n2 = (_rows(normal, p.edge_facet[..., k]) for k in range(2))  # [n, E, 3]
    ok = (p.edge[..., :1] >= 0) & (across_length[..., None] > 1e-12) & \
        _in_edge_cone(n1[..., None, :], n2[..., None, :], direction[..., None, :], -u)
    add(_SIDE_EDGE, u.flatten(-3, -2), torch.where(ok, _cylinder_support(cylinder, u) - dot(u, ends[..., None, 0, :]),
                                                     torch.inf).flatten(-2),
        torch.arange(p.edge.shape[-2], device=device).repeat_interleave(2).expand(n, -1), signs.repeat(p.edge.shape[-2]))

    # a rim point at a stationary distance from an edge's line
    rim_centre = centre[..., None, :] + (signs[:, None] * half[..., None, None]) * axis[..., None, :]  # [n, 2, 3]
    coef = _rim_edge_coefficients(rim_centre[..., :, None, :], cylinder, ends[..., None, :, 0, :],
                                  direction[..., None, :, :])  # each [n, 2, E]
    phi, exists = _rim_edge_roots(coef)  # [n, 2, E, 4]
    x, y = cylinder.mat[..., None, None, None, :, 0], cylinder.mat[..., None, None, None, :, 1]
    radial = torch.cos(phi)[..., None] * x + torch.sin(phi)[..., None] * y
    tangent = -torch.sin(phi)[..., None] * x + torch.cos(phi)[..., None] * y
    u, u_length = normalize(cross(tangent, direction[..., None, :, None, :]))
    u = u * torch.sign(dot(u, radial))[..., None]  # in the rim point's normal cone: outwards, and towards its cap
    rim_sign = signs[:, None, None]
    ok = exists & (u_length > 1e-12) & (dot(u, axis[..., None, None, None, :]) * rim_sign > 0) & \
        (p.edge[..., None, :, None, 0] >= 0) & \
        _in_edge_cone(*(x[..., None, :, None, :] for x in (n1, n2, direction)), -u)
    value = torch.where(ok, _cylinder_support(cylinder, u) - dot(u, ends[..., None, :, None, 0, :]), torch.inf)
    add(_RIM_EDGE, u.flatten(-4, -2), value.flatten(-3),
        torch.arange(p.edge.shape[-2], device=device)[:, None].expand_as(phi).flatten(-3),
        rim_sign.expand_as(phi).flatten(-3), phi.flatten(-3))

    # the side, or a rim point, nearest a vertex
    ids = torch.arange(p.vert.shape[-2], device=device).expand(n, -1)
    offset = p.vert - centre[..., None, :]
    height = dot(offset, axis[..., None, :])
    out, out_length = normalize(offset - height[..., None] * axis[..., None, :])
    ok = (out_length > 1e-12) & _supports(p, ids, out)
    add(_SIDE_VERTEX, out, torch.where(ok, _cylinder_support(cylinder, out) - dot(out, p.vert), torch.inf), ids,
        signs[:1])
    rim = rim_centre[..., :, None, :] + radius[..., None, None, None] * out[..., None, :, :]  # [n, 2, V, 3]
    u, gap = normalize(p.vert[..., None, :, :] - rim)
    within = (dot(u, axis[..., None, None, :]) * signs[:, None] > 0) & (dot(u, out[..., None, :, :]) > 0)
    ok = within & (gap > 0) & (out_length[..., None, :] > 1e-12) & _supports(p, ids[..., None, :].expand(n, 2, -1), u)
    add(_RIM_VERTEX, u.flatten(-3, -2),
        torch.where(ok, _cylinder_support(cylinder, u) - dot(u, p.vert[..., None, :, :]), torch.inf).flatten(-2),
        ids.repeat(1, 2), signs.repeat_interleave(p.vert.shape[-2]))
    return _CylinderCandidates(*(torch.cat(parts, -2 if k == 1 else -1) for k, parts in enumerate(zip(*blocks))))


class CylinderContact(NamedTuple):
    dist: Tensor  # [n] signed distance of the cylinder and the hull
    normal: Tensor  # [n, 3] from the cylinder to the hull
    point1: Tensor  # [n, 3] witness on the cylinder
    point2: Tensor  # [n, 3] witness on the hull
    side: Tensor  # [n] the cylinder's feature is a side line (else a cap or a rim point)
    dim2: Tensor  # [n] the hull's feature: 1 vertex, 2 edge, 3 triangle
    ids2: Tensor  # [n, 3] its vertex ids (the first dim2 count, the last repeated)


def cylinder_contact(cylinder: GeomPose, p: Polytope) -> CylinderContact:
    """Signed distance, normal, witnesses and features, with gradient (see cylinder_mesh)."""
    with torch.no_grad():
        q = Polytope(*(x.detach().double() if x.is_floating_point() else x for x in p))
        qc = GeomPose(*(x.detach().double() for x in cylinder))
        cand = _cylinder_candidates(qc, q)
        _, pick = (-cand.value).topk(min(_RECHECK, cand.value.shape[-1]), -1)  # rechecked with full supports
        u = _rows(cand.u, pick)
        exact = _cylinder_support(qc, u) + (-u @ q.vert.transpose(-1, -2)).amax(-1)
        best = _rows(pick, exact.argmin(-1))
        kind, feature, sign, phi = (_rows(x, best) for x in (cand.kind, cand.feature, cand.sign, cand.phi))
    dtype = cylinder.pos.dtype
    sign, phi = sign.to(dtype), phi.to(dtype)
    centre, axis, radius, half = cylinder.pos, cylinder.mat[..., :, 2], cylinder.size[..., 0], cylinder.size[..., 1]
    is_vertex = (kind == _CAP_VERTEX) | (kind == _SIDE_VERTEX) | (kind == _RIM_VERTEX)
    is_edge = (kind == _SIDE_EDGE) | (kind == _RIM_EDGE)
    rim_centre = centre + (sign * half)[..., None] * axis

    # a hull vertex: under a cap, beside the side, or nearest a rim point
    vertex_id = torch.where(is_vertex, feature, 0)
    vertex = _rows(p.vert, vertex_id)
    offset = vertex - centre
    out = normalize(offset - dot(offset, axis)[..., None] * axis)[0]
    cap_u = sign[..., None] * axis
    cap_dist = dot(cap_u, offset) - half
    side_dist = dot(out, offset) - radius
    rim = rim_centre + radius[..., None] * out
    rim_u, rim_dist = normalize(vertex - rim)
    vertex_u = torch.where((kind == _CAP_VERTEX)[..., None], cap_u, torch.where((kind == _SIDE_VERTEX)[..., None],
                                                                                out, rim_u))
    vertex_dist = torch.where(kind == _CAP_VERTEX, cap_dist, torch.where(kind == _SIDE_VERTEX, side_dist, rim_dist))

    # a triangle: the cylinder's lowest rim point along its normal
    facet = _rows(p.facet, torch.where(kind == _FACE, feature, 0))
    corner = _rows(p.vert, facet)
    face_u = -normalize(cross(corner[..., 1, :] - corner[..., 0, :], corner[..., 2, :] - corner[..., 0, :]))[0]
    along = dot(face_u, axis)
    face_rim = centre + (torch.sign(along.detach()) * half)[..., None] * axis + \
        radius[..., None] * normalize(face_u - along[..., None] * axis)[0]
    face_dist = dot(face_u, corner[..., 0, :] - face_rim)

    # an edge: across the side line (the nearest points of the axis and the edge lines), or nearest a rim
    # point (one Newton step of the rim angle from the converged root)
    edge = _rows(p.edge, torch.where(is_edge, feature, 0))
    q0, q1 = (_rows(p.vert, edge[..., k]) for k in (0, 1))
    side_u = sign[..., None] * normalize(cross(axis, q1 - q0))[0]
    s, t = line_parameters(centre, centre + axis, q0, q1)
    side_point = centre + s[..., None] * axis + radius[..., None] * side_u
    direction = normalize(q1 - q0)[0]
    coef = _rim_edge_coefficients(rim_centre, cylinder, q0, direction)
    condition, slope = _rim_edge_condition(phi, coef)
    phi = phi - condition / torch.where(slope != 0, slope, 1.0)
    x, y = cylinder.mat[..., :, 0], cylinder.mat[..., :, 1]
    radial = torch.cos(phi)[..., None] * x + torch.sin(phi)[..., None] * y
    rim_edge_u = normalize(cross(-torch.sin(phi)[..., None] * x + torch.cos(phi)[..., None] * y, direction))[0]
    rim_edge_u = rim_edge_u * torch.sign(dot(rim_edge_u, radial)).detach()[..., None]
    rim_point = rim_centre + radius[..., None] * radial
    edge_u = torch.where((kind == _SIDE_EDGE)[..., None], side_u, rim_edge_u)
    edge_point1 = torch.where((kind == _SIDE_EDGE)[..., None], side_point, rim_point)
    edge_dist = dot(edge_u, q0 - edge_point1)

    vertex_point1 = vertex - vertex_dist[..., None] * vertex_u
    v, e = is_vertex[..., None], is_edge[..., None]
    normal = torch.where(v, vertex_u, torch.where(e, edge_u, face_u))
    dist = torch.where(is_vertex, vertex_dist, torch.where(is_edge, edge_dist, face_dist))
    point1 = torch.where(v, vertex_point1, torch.where(e, edge_point1, face_rim))
    ids2 = torch.where(v, vertex_id[..., None].expand(*vertex_id.shape, 3),
                       torch.where(e, torch.cat((edge, edge[..., 1:]), -1), facet))
    return CylinderContact(dist, normal, point1, point1 + dist[..., None] * normal,
                            (kind == _SIDE_EDGE) | (kind == _SIDE_VERTEX),
                            torch.where(is_vertex, 1, torch.where(is_edge, 2, 3)), ids2)


@batched
def cylinder_mesh(cylinder: GeomPose, mesh_geom: MeshPose, margin: Tensor) -> Candidates:
    """Cylinder-mesh (mjc_Convex): up to 4 contacts [n, 4].

    The signed distance is ``-min f(u)`` over unit u of ``f(u) = h_cylinder(u) + h_hull(-u)``
    (``h_cylinder(u) = c.u + h |u.a| + r |P u|``), as for ellipsoid-mesh, found exactly among the
    normals of the faces of the Minkowski difference and, for a separated pair, of its creases: a cap on
    the hull's lowest vertex along the axis (u = +-a), a rim point on a triangle (its normal), the side
    line across an edge (u along a x e), a rim point at a stationary distance from an edge's line (a 1-D
    search: the roots of a trigonometric polynomial of degree 2 in the rim angle, bracketed and bisected),
    the side beside a vertex (u radial) and a rim point nearest a vertex. Each counts only where the hull
    feature supports -u (no neighbouring vertex lower along u), and the least few are rechecked with full
    supports. MuJoCo 4's multi-contact (``polytope.clip_features``, the cylinder's cap and side line as
    for the primitive pairs) then clips a cap within ~5 degrees of a hull face (up to 4 contacts, the
    16-gon cut to the largest quadrilateral) or a side line within ~5 degrees of parallel to one (2).
    """
    p = mesh_polytope(mesh_geom)
    con = cylinder_contact(cylinder, p)
    single = (con.dist, 0.5 * (con.point1 + con.point2), con.normal, con.dist < margin)
    return single_or_multi(single, _cylinder_multicontact(cylinder, p, con, margin)[:5], margin)


def _cylinder_multicontact(cylinder: GeomPose, p: Polytope, con: CylinderContact, margin: Tensor,
                           max_contacts: int = MAX_CONTACTS):
    """mjc_multicontact of a cylinder (geom 1) and a hull (``polytope.clip_features``)."""
    half = 0.5 * margin[..., None]
    x1 = con.point1 + half * con.normal  # witness points of the geoms inflated by half the margin
    x2 = con.point2 - half * con.normal
    cylinder_side = ClipFeature(*cylinder_clip_feature(cylinder, con.normal, con.side, x1))
    return clip_features(cylinder_side, clip_feature(p, con.dim2, con.ids2), functools.partial(cylinder_cap, cylinder),
                         functools.partial(polygon, p), x1, x2, margin, max_contacts)
