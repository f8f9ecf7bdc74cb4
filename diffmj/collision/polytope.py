"""Box-mesh and mesh-mesh collision: MuJoCo's mjc_Convex for two convex polytopes.

MuJoCo runs GJK / EPA on the two geoms inflated by half the margin each
(``nativeccd``): a contact exists when the inflated geoms overlap, i.e. the
signed distance of the geoms is below the margin; its ``dist`` is that
signed distance, its normal points from geom1 to geom2 and its position is
the midpoint of the witness points. Both geoms here are polytopes (a box, or
a mesh's convex hull: ``mesh.py``), so the signed distance is found exactly
instead of to ``ccd_tolerance``:

* **Penetration** by the separating-axis test: the penetration depth of two
  convex polytopes is the least overlap along the face normals of either and
  the cross products of an edge of each. Edge pairs count only where their
  arcs on the Gauss map cross (their cross product is then a face normal of
  the Minkowski difference and the edges are the supporting features, so the
  overlap needs no support search); the few best are rechecked with full
  supports, so a pair admitted by rounding never decides the depth. No
  E1 x E2 table is formed: each arc of one geom is walked across the other's
  Gauss map (``_arc_walk``), and the other's lowest vertex along each
  triangle normal is found by hill climbing over its edges (``_lowest``), so
  the cost grows with the edge count times the walks' and climbs' lengths
  (a few steps on fine meshes).
* **Separation** (within the margin) by GJK: the closest point of the
  Minkowski difference to the origin, each simplex solved by trying all of
  its sub-simplices (exact for polytopes, to rounding).

The supporting features (a face, edge or vertex of each geom) then feed
MuJoCo 4's multi-contact (``mjc_multicontact``, as ported in ``convex.py``):
a pair of faces within ~5 degrees of antiparallel is clipped face against
face (the polygon cut to MuJoCo's largest quadrilateral), an edge within ~5
degrees of parallel to a face is clipped against it (two contacts), else
the single contact stands. MuJoCo reads the features off EPA's last face;
here they are the exact ones, so where several features tie (a face of one
geom exactly parallel to an edge of the other) the choice can differ from
MuJoCo's, as for the primitive pairs.

All searches run without gradient in float64; the contact is then recomputed
from the chosen features with gradient (the derivative of the optimum is the
derivative at fixed features).

Shapes: ``n`` pairs; a single pair without the leading dim is accepted (as
under ``torch.vmap`` over the pairs).
"""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from diffmj import workarounds
from diffmj.collision.common import Candidates, GeomPose, MeshPose, single_or_multi
from diffmj.collision.convex import BOX_FACES, clip_contacts, fibonacci_directions, multicontact_choice
from diffmj.collision.mesh import facet_edges, incident_edges
from diffmj.math import cross, dot, mat_vec

MAX_CONTACTS = 4  # MuJoCo's mjc_Convex cuts box / mesh pairs to 4 contacts


class Polytope(NamedTuple):
    """A convex polytope in world coordinates (a box or a mesh hull), padded as ``MeshShape``."""

    vert: Tensor  # [n, V, 3]
    vert_poly: Tensor  # [n, V, P] long: polygons at each vertex, MuJoCo's order (-1: none)
    vert_edge: Tensor  # [n, V, P] long: the other end of each edge MuJoCo tries at a vertex
    poly_vert: Tensor  # [n, F, K] long: polygon vertices in MuJoCo's clipping order (-1 past the end)
    poly_normal: Tensor  # [n, F, 3] outward unit normals
    facet: Tensor  # [n, T, 3] long: triangles covering the surface (-1: none)
    edge: Tensor  # [n, E, 2] long: the triangles' edges (-1: none)
    edge_facet: Tensor  # [n, E, 2] long: the two triangles at each edge
    vert_incident: Tensor  # [n, V, D] long: the edges at each vertex (-1: none)


# ---------------------------------------------------------------- the two geoms as polytopes

# box vertex k has coordinate +size on axis i where bit i of k is set (MuJoCo's boxSupport index)
_BOX_SIGNS = np.array([[1 if k >> i & 1 else -1 for i in range(3)] for k in range(8)], dtype=np.float64)
_BOX_POLY_VERT = [[int(np.flatnonzero((_BOX_SIGNS == corner).all(1))[0]) for corner in face] for face in BOX_FACES]
_BOX_VERT_POLY = [[2 * i + (1 - (k >> i & 1)) for i in range(3)] for k in range(8)]  # its +-x, +-y, +-z faces
_BOX_FACETS = [[f[0], f[2], f[1]] for f in _BOX_POLY_VERT] + [[f[0], f[3], f[2]] for f in _BOX_POLY_VERT]
_BOX_EDGES, _BOX_EDGE_FACETS = facet_edges(_BOX_FACETS)
_BOX_SIGNS_LITERAL = workarounds.Literal.of(_BOX_SIGNS.tolist())
_BOX_INCIDENT = [ids + [-1] * (5 - len(ids)) for ids in incident_edges(_BOX_EDGES, 8)]  # 3 to 5 each, -1 padded


def box_polytope(box: GeomPose) -> Polytope:
    """A box as a polytope: MuJoCo's corner numbering, face order and vertex order per face (boxFace)."""
    n, device = box.pos.shape[:-1], box.pos.device
    long = lambda x: workarounds.literal(x, torch.long, device).expand(*n, *np.shape(x))  # noqa: E731
    signs = _BOX_SIGNS_LITERAL.tensor(box.pos.dtype, device)
    local = signs * box.size[..., None, :]
    normal = torch.eye(3, dtype=box.pos.dtype, device=device).repeat_interleave(2, 0) * \
        torch.tensor([1.0, -1.0] * 3, dtype=box.pos.dtype, device=device)[:, None]
    edge_of_vertex = [[k ^ (1 << i) for i in range(3)] for k in range(8)]  # boxEdgeNormals: flip x, y, z
    return Polytope(_to_world(box, local), long(_BOX_VERT_POLY), long(edge_of_vertex), long(_BOX_POLY_VERT),
                    mat_vec(box.mat[..., None, :, :], normal), long(_BOX_FACETS), long(_BOX_EDGES),
                    long(_BOX_EDGE_FACETS), long(_BOX_INCIDENT))


def mesh_polytope(mesh_geom: MeshPose) -> Polytope:
    """A mesh hull as a polytope; polygons in MuJoCo's clipping order (meshFace: reversed)."""
    pose, shape = mesh_geom
    # vertices off MuJoCo's hull moved to the hull's centroid, where they support no direction
    weight = shape.on_hull.to(shape.vert.dtype)[..., None]
    centroid = (weight * shape.vert).sum(-2) / weight.sum(-2)
    vert = torch.where(shape.on_hull[..., None], shape.vert, centroid[..., None, :])
    count = (shape.poly_vert >= 0).sum(-1, keepdim=True)
    slots = torch.arange(shape.poly_vert.shape[-1], device=count.device)
    reverse = torch.where(slots < count, count - 1 - slots, slots)
    return Polytope(_to_world(pose, vert), shape.vert_poly, shape.vert_edge,
                    torch.take_along_dim(shape.poly_vert, reverse, -1),
                    mat_vec(pose.mat[..., None, :, :], shape.poly_normal), shape.facet, shape.edge, shape.edge_facet,
                    shape.vert_incident)


def _to_world(pose: GeomPose, local: Tensor) -> Tensor:
    return mat_vec(pose.mat[..., None, :, :], local) + pose.pos[..., None, :]


def _at(x: Tensor, index: Tensor) -> Tensor:
    """Rows of x [n, m, ...] at index [n, ...] (ids out of range read row 0 or m - 1, for values that
    are not used): [n, ..., *x.shape[2:]]."""
    flat = index.clamp(0, x.shape[1] - 1).reshape(index.shape[0], -1)
    rows = torch.gather(x, 1, flat.reshape(*flat.shape, *(1,) * (x.dim() - 2)).expand(*flat.shape, *x.shape[2:]))
    return rows.reshape(*index.shape, *x.shape[2:])


def facet_planes(p: Polytope) -> tuple[Tensor, Tensor, Tensor]:
    """Outward unit normals [n, T, 3], plane offsets [n, T] and validity [n, T] of the triangles."""
    corner = _at(p.vert, p.facet)  # [n, T, 3, 3]
    normal = cross(corner[..., 1, :] - corner[..., 0, :], corner[..., 2, :] - corner[..., 0, :])
    length = torch.sqrt(dot(normal, normal))
    valid = (p.facet[..., 0] >= 0) & (length > 0)
    normal = normal / torch.where(valid, length, 1.0)[..., None]
    return normal, dot(normal, corner[..., 0, :]), valid


# ---------------------------------------------------------------- penetration: separating axes

_RECHECK = 8  # edge-pair axes rechecked with full supports


class _Axis(NamedTuple):
    """The best separating axis: separation along it (negative: penetration) and its features."""

    separation: Tensor  # [n]
    normal: Tensor  # [n, 3] from geom 1 to geom 2
    kind: Tensor  # [n] 0: a triangle of geom 1, 1: a triangle of geom 2, 2: an edge of each
    index1: Tensor  # [n] the triangle or edge of geom 1 (kind 0, 2)
    index2: Tensor  # [n] the triangle or edge of geom 2 (kind 1, 2)


def _neighbours(q: Polytope) -> Tensor:
    """The vertices next to each vertex of q along its edges: ids [n, V, D] (-1: none)."""
    ends = _at(q.edge, q.vert_incident)  # [n, V, D, 2]
    vertices = torch.arange(q.vert.shape[-2], device=ends.device)[:, None]
    return torch.where(q.vert_incident < 0, -1, torch.where(ends[..., 0] == vertices, ends[..., 1], ends[..., 0]))


def _step_offsets(q: Polytope, neighbour: Tensor, at: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
    """For rows at vertex r [rows] of q's pair ``at`` [rows]: the neighbours' ids [rows, D] (``neighbour``:
    ``_neighbours(q)``) and the offsets to them [rows, D, 3] (any value where there is none)."""
    w = neighbour[at, r]
    return w, q.vert[at[:, None], w.clamp(min=0)] - q.vert[at, r][:, None]


_ANCHORS = workarounds.Literal.of(fibonacci_directions(64))  # directions whose lowest vertices start the hill climbs


def _lowest(q: Polytope, neighbour: Tensor, direction: Tensor) -> Tensor:
    """q's lowest vertex (least direction . v) along each direction [n, T, 3]: ids [n, T].

    A hill climb over q's edges (``neighbour``: ``_neighbours(q)``) from the lowest, along that
    direction, of q's lowest vertices along a fixed lattice of directions. Each move lowers
    direction . v; on a convex hull a vertex with no lower neighbour is the lowest (to rounding).
    """
    lattice = _ANCHORS.tensor(direction.dtype, direction.device)
    anchor = (lattice @ q.vert.transpose(-1, -2)).argmin(-1)  # [n, K]
    start = _at(anchor, (direction @ _at(q.vert, anchor).transpose(-1, -2)).argmin(-1))
    n, t = start.shape
    pair, direction = _row_pairs(n, t, start.device), direction.reshape(n * t, 3)  # one row per direction

    def step(carry, rows):
        done, r = carry
        at, u = (pair, direction) if rows is None else (pair[rows], direction[rows])
        w, offset = _step_offsets(q, neighbour, at, r)
        drop = torch.where(w >= 0, dot(u[..., None, :], offset), torch.inf)
        lowest, move = drop.min(-1)
        done = done | ~(lowest < 0)
        return done, torch.where(done, r, torch.take_along_dim(w, move[..., None], -1)[..., 0])

    carry = (torch.zeros_like(start, dtype=torch.bool).reshape(-1), start.reshape(-1))
    return workarounds.bounded_row_loop(step, carry, q.vert.shape[-2])[1].reshape(n, t)


def _row_pairs(n: int, per_pair: int, device: torch.device) -> Tensor:
    """The pair of each row [n * per_pair] when a search's [n, per_pair] elements are flattened to rows."""
    return torch.arange(n, device=device).repeat_interleave(per_pair)


def _arc_walk(p: Polytope, p_normal: Tensor, q: Polytope, neighbour: Tensor,
              start: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The edge pairs of p and q whose Gauss-map arcs cross, found by walking each arc of p over q's map.

    On the Gauss map of the difference q - p, an edge of p is the arc from the normal (``p_normal``
    [n, T, 3]) of its first triangle, na, to that of its second, nb, and a vertex r of q the region
    of directions u along which r is q's lowest vertex (least u . r); q's edges are the borders of
    these regions. The walk starts in the region holding na (``start`` [n, T]: q's lowest vertex
    along each triangle normal of p) and crosses into the neighbour (``neighbour``:
    ``_neighbours(q)``) whose border the arc meets first: along u(t) ~ (1 - t) na + t nb, neighbour
    w beats r past t = a / (a - b), a = na . (w - r), b = nb . (w - r) < 0. Each move lowers
    nb . r, so the walk ends, in q's lowest vertex along nb, within q's vertex count. (Two borders
    met at once: the arc passes a triangle normal of q, and the pairs there are that face's axis.)

    Returns for each edge of p the most separating crossing pair: its separation [n, E] (-inf: none),
    axis [n, E, 3] (unit, from p to q) and q's edge [n, E].
    """
    # (separate tensors, not views of one: torch.compile's while_loop refuses aliased inputs)
    na, nb = _at(p_normal, p.edge_facet[..., 0]), _at(p_normal, p.edge_facet[..., 1])  # [n, E, 3]
    x = _at(p.vert, p.edge[..., 0])
    direction = _at(p.vert, p.edge[..., 1]) - x
    n, e = na.shape[:2]
    pair = _row_pairs(n, e, na.device)  # one row per edge of p
    arcs = tuple(c.reshape(n * e, 3) for c in (na, nb, x, direction))

    def step(carry, rows):
        done, r, best, best_axis, best_edge = carry
        at, (na, nb, x, direction) = (pair, arcs) if rows is None else (pair[rows], tuple(c[rows] for c in arcs))
        w, delta = _step_offsets(q, neighbour, at, r)  # q's vertices next to r [rows, D], offsets [rows, D, 3]
        a = dot(na[..., None, :], delta).clamp(min=0)
        b = dot(nb[..., None, :], delta)
        exits = (w >= 0) & (b < 0)
        t = torch.where(exits, a / torch.where(exits, a - b, 1.0), torch.inf)
        move = t.argmin(-1, keepdim=True)
        done = done | ~exits.any(-1)
        t = torch.take_along_dim(t, move, -1)[..., 0]
        d2 = torch.take_along_dim(delta, move[..., None], -2)[..., 0, :]
        # the crossing pair's axis: the two edges' cross product, oriented along the arc
        axis = torch.linalg.cross(direction, d2)  # math.cross's constant tensors break inductor's while_loop
        length2 = dot(axis, axis)
        along = (1 - t.clamp(max=1))[..., None] * na + t.clamp(max=1)[..., None] * nb
        usable = ~done & (length2 > 1e-20 * dot(direction, direction) * dot(d2, d2)) & (dot(axis, along) != 0)
        axis = axis * (torch.sign(dot(axis, along)) / torch.sqrt(torch.where(usable, length2, 1.0)))[..., None]
        separation = torch.where(usable, dot(axis, q.vert[at, r] - x), -torch.inf)
        better = separation > best
        best = torch.where(better, separation, best)
        best_axis = torch.where(better[..., None], axis, best_axis)
        best_edge = torch.where(better, torch.take_along_dim(q.vert_incident[at, r], move, -1)[..., 0], best_edge)
        r = torch.where(done, r, torch.take_along_dim(w, move, -1)[..., 0])
        return done, r, best, best_axis, best_edge

    start = torch.take_along_dim(start, p.edge_facet[..., 0].clamp(min=0), -1).reshape(-1)
    # (initial values made from batched inputs: under vmap the compiled loop needs them batched as its outputs)
    carry = ((p.edge[..., 0] < 0).reshape(-1), start, torch.full_like(start, -torch.inf, dtype=na.dtype),
             torch.zeros_like(arcs[0]), torch.zeros_like(start))
    _, _, best, best_axis, best_edge = workarounds.bounded_row_loop(step, carry, q.vert.shape[-2])
    return best.reshape(n, e), best_axis.reshape(n, e, 3), best_edge.reshape(n, e)


def _separating_axis(p1: Polytope, p2: Polytope) -> _Axis:
    """The axis of least overlap (most separation) among the triangle normals and the edge pairs."""
    n1, off1, ok1 = facet_planes(p1)
    n2, off2, ok2 = facet_planes(p2)
    # a triangle normal m of one geom: separation min over the other's vertices of (v . m) - offset
    around1, around2 = _neighbours(p1), _neighbours(p2)
    lowest2, lowest1 = _lowest(p2, around2, n1), _lowest(p1, around1, n2)
    sep1 = torch.where(ok1, dot(n1, _at(p2.vert, lowest2)) - off1, -torch.inf)
    sep2 = torch.where(ok2, dot(n2, _at(p1.vert, lowest1)) - off2, -torch.inf)

    # edge pairs whose Gauss-map arcs cross: the arcs of the geom with more edges walked over the other
    # (shorter arcs, shorter walks); the best few rechecked with full supports
    walk2 = p2.edge.shape[-2] > p1.edge.shape[-2]
    if walk2:
        cheap, axis, other = _arc_walk(p2, n2, p1, around1, lowest1)
        axis = -axis
    else:
        cheap, axis, other = _arc_walk(p1, n1, p2, around2, lowest2)
    k = min(_RECHECK, cheap.shape[-1])
    cheap, pick = cheap.topk(k, -1)
    axis, other = _at(axis, pick), _at(other, pick)
    i, j = (other, pick) if walk2 else (pick, other)
    exact = (axis @ p2.vert.transpose(-1, -2)).amin(-1) - (axis @ p1.vert.transpose(-1, -2)).amax(-1)
    exact = torch.where(torch.isfinite(cheap), exact, -torch.inf)

    every = torch.cat((sep1, sep2, exact), -1)
    best = every.argmax(-1)
    t1, t2 = sep1.shape[-1], sep2.shape[-1]
    kind = torch.where(best < t1, 0, torch.where(best < t1 + t2, 1, 2))
    edge_pick = (best - t1 - t2).clamp(min=0)
    normal = torch.where((kind == 0)[..., None], _at(n1, best.clamp(max=t1 - 1)),
                         torch.where((kind == 1)[..., None], -_at(n2, (best - t1).clamp(0, t2 - 1)),
                                     _at(axis, edge_pick)))
    index1 = torch.where(kind == 0, best, _at(i, edge_pick))
    index2 = torch.where(kind == 1, best - t1, _at(j, edge_pick))
    return _Axis(_at(every, best), normal, kind, index1.clamp(min=0), index2.clamp(min=0))


# ---------------------------------------------------------------- separation: GJK

_GJK_ITERATIONS = 32
# the 15 sub-simplices of a 4-point simplex, smallest first (a tie goes to the smaller one)
_SUBSETS = [s for size in range(1, 5) for s in itertools.combinations(range(4), size)]
# made once: GJK reads it at every iteration
_SUBSET_MASK = workarounds.Literal.of([[k in s for k in range(4)] for s in _SUBSETS])


def _affine_closest(w: Tensor, mask: Tensor, independent: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Weights [..., 4] of the point of the affine hull of the masked points w [..., 4, 3] nearest the
    origin, and whether they are well defined (the masked points affinely independent) [...]; tested
    unless ``independent`` is given."""
    mask = mask.expand(w.shape[:-1])
    m = mask.to(w.dtype)
    gram = (w @ w.transpose(-1, -2)) * m[..., :, None] * m[..., None, :]
    eye = torch.eye(4, dtype=w.dtype, device=w.device)
    top = torch.cat((gram + eye * (1 - m)[..., None, :], m[..., :, None]), -1)  # [..., 4, 5]
    kkt = torch.cat((top, torch.cat((m, torch.zeros_like(m[..., :1])), -1)[..., None, :]), -2)
    rhs = torch.zeros_like(kkt[..., 0])
    rhs = torch.where(torch.arange(5, device=w.device) == 4, 1.0, rhs)
    if independent is None:  # the edge vectors' Gram determinant against the product of their lengths
        base = torch.take_along_dim(w, mask.long().argmax(-1)[..., None, None], -2)
        length2 = torch.where(mask, dot(w - base, w - base), 1.0).clamp(min=1e-300).prod(-1)
        independent = torch.linalg.det(kkt).abs() > 1e-10 * length2
    solution = torch.linalg.solve(torch.where(independent[..., None, None], kkt, torch.eye(5, dtype=w.dtype,
                                                                                          device=w.device)), rhs)
    return solution[..., :4] * m, independent


def _closest_on_simplex(w: Tensor, used: Tensor) -> tuple[Tensor, Tensor]:
    """The point of the hull of the used points w [n, 4, 3] nearest the origin: weights [n, 4] and the
    smallest subset of points carrying it [n, 4]."""
    masks = _SUBSET_MASK.tensor(device=w.device)  # [15, 4]
    lam, independent = _affine_closest(w[..., None, :, :].expand(*w.shape[:-2], len(_SUBSETS), 4, 3), masks)
    inside = independent & (lam >= 0).all(-1) & ~(masks & ~used[..., None, :]).any(-1)
    point = (lam[..., None] * w[..., None, :, :]).sum(-2)
    best = torch.where(inside, dot(point, point), torch.inf).argmin(-1)
    return _at(lam, best), masks[best]


def _gjk(p1: Polytope, p2: Polytope, start: Tensor, skip: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """GJK on the difference geom2 - geom1 from direction ``start`` [n, 3]: the final simplex's vertex
    ids in geom 1 and geom 2 [n, 4] and the weights of the closest point [n, 4] (0: unused).

    Pairs where ``skip`` [n] holds keep the first support point (their answer is not used). The
    iterations run in ``bounded_loop``: eager, they stop once every pair has converged.
    """
    def support(direction):  # the vertices of geom 2 farthest along direction, of geom 1 against it
        return ((p1.vert * -direction[..., None, :]).sum(-1).argmax(-1),
                (p2.vert * direction[..., None, :]).sum(-1).argmax(-1))

    def iterate(carry):
        done, ids1, ids2, lam, used = carry
        w = _at(p2.vert, ids2) - _at(p1.vert, ids1)
        v = (lam[..., None] * w).sum(-2)
        new1, new2 = support(-v)
        new = _at(p2.vert, new2[..., None])[..., 0, :] - _at(p1.vert, new1[..., None])[..., 0, :]
        known = (used & (ids1 == new1[..., None]) & (ids2 == new2[..., None])).any(-1)
        vv = dot(v, v)
        done = done | known | (vv - dot(v, new) <= 1e-13 * vv) | (vv == 0)
        slot = (~used).long().argmax(-1, keepdim=True)  # a free slot: at most 3 are used before adding
        add = ~done[..., None] & (torch.arange(4, device=slot.device) == slot)
        ids1, ids2 = torch.where(add, new1[..., None], ids1), torch.where(add, new2[..., None], ids2)
        w = _at(p2.vert, ids2) - _at(p1.vert, ids1)
        lam_new, keep = _closest_on_simplex(w, used | add)
        return done, ids1, ids2, torch.where(done[..., None], lam, lam_new), torch.where(done[..., None], used, keep)

    ids1, ids2 = (x[..., None].repeat(1, 4) for x in support(-start))
    lam = torch.zeros_like(start[..., :1]).repeat(1, 4)
    lam[..., 0] = 1
    used = lam > 0
    done = torch.zeros_like(used[..., 0]) if skip is None else skip.clone()
    # compiled: unrolled (inductor 2.13 fails on this body in a while_loop: "Expected positional argument")
    _, ids1, ids2, lam, used = workarounds.bounded_loop(iterate, (done, ids1, ids2, lam, used), _GJK_ITERATIONS,
                                            unroll=torch.compiler.is_compiling())
    return ids1, ids2, lam * used


# ---------------------------------------------------------------- the contact and its features


class PolytopeContact(NamedTuple):
    dist: Tensor  # [n]
    normal: Tensor  # [n, 3] from geom 1 to geom 2
    point1: Tensor  # [n, 3] witness on geom 1
    point2: Tensor  # [n, 3] witness on geom 2
    dim1: Tensor  # [n] feature of geom 1: 1 vertex, 2 edge, 3 face
    ids1: Tensor  # [n, 3] its vertex ids (the first dim1 count)
    dim2: Tensor
    ids2: Tensor


def _distinct(ids: Tensor, used: Tensor) -> tuple[Tensor, Tensor]:
    """The distinct used ids [n, 4] moved to the front [n, 3] and their count [n]."""
    slots = torch.arange(4, device=ids.device)
    earlier = (ids[..., :, None] == ids[..., None, :]) & used[..., None, :] & (slots[None, :] < slots[:, None])
    first = used & ~earlier.any(-1)
    order = torch.sort((~first).long(), dim=-1, stable=True).indices
    ids = torch.take_along_dim(ids, order, -1)[..., :3]
    count = first.sum(-1).clamp(max=3)
    return torch.where(torch.arange(3, device=ids.device) < count[..., None], ids, ids[..., :1]), count


def convex_contact(p1: Polytope, p2: Polytope, margin: Tensor) -> PolytopeContact:
    """Signed distance, normal, witness points and supporting features, with gradient (see module doc)."""
    with torch.no_grad():
        q1, q2 = (Polytope(*(x.detach().double() if x.is_floating_point() else x for x in p)) for p in (p1, p2))
        axis = _separating_axis(q1, q2)
        # GJK only where the geoms are apart by less than the margin (the separation bounds the distance)
        gjk1, gjk2, lam = _gjk(q1, q2, axis.normal, skip=~((axis.separation > 0) & (axis.separation < margin)))
    separated = axis.separation > 0
    dtype = p1.vert.dtype
    lam = lam.to(dtype)

    # separated: the closest point of the final simplex, recomputed with gradient
    used = lam > 0
    a, b = _at(p1.vert, gjk1), _at(p2.vert, gjk2)  # [n, 4, 3]
    # (the search found these points independent in float64: not retested in the input dtype)
    weights, _ = _affine_closest(b - a, used, independent=separated)
    near1, near2 = (weights[..., None] * a).sum(-2), (weights[..., None] * b).sum(-2)
    gap = near2 - near1
    gap_length = torch.sqrt(torch.where(separated, dot(gap, gap), 1.0))
    gap_normal = gap / gap_length[..., None]

    # penetrating: the axis's features; a triangle of one geom against the deepest vertex of the other
    facet1, facet2 = _at(p1.facet, axis.index1[..., None])[..., 0, :], _at(p2.facet, axis.index2[..., None])[..., 0, :]
    corner1, corner2 = _at(p1.vert, facet1), _at(p2.vert, facet2)
    plane1 = _unit(cross(corner1[..., 1, :] - corner1[..., 0, :], corner1[..., 2, :] - corner1[..., 0, :]))
    plane2 = _unit(cross(corner2[..., 1, :] - corner2[..., 0, :], corner2[..., 2, :] - corner2[..., 0, :]))
    deep2 = (p2.vert * plane1[..., None, :]).sum(-1).argmin(-1)  # geom 2's vertex deepest in face 1
    deep1 = (p1.vert * plane2[..., None, :]).sum(-1).argmin(-1)
    v2, v1 = _at(p2.vert, deep2[..., None])[..., 0, :], _at(p1.vert, deep1[..., None])[..., 0, :]
    s_face1 = dot(plane1, v2 - corner1[..., 0, :])
    s_face2 = dot(plane2, v1 - corner2[..., 0, :])
    # an edge of each: the nearest points of the two lines
    edge1, edge2 = _at(p1.edge, axis.index1[..., None])[..., 0, :], _at(p2.edge, axis.index2[..., None])[..., 0, :]
    ends1, ends2 = _at(p1.vert, edge1), _at(p2.vert, edge2)
    line1, line2 = _nearest_on_lines(ends1, ends2)

    kind = axis.kind
    face1, face2 = (kind == 0)[..., None], (kind == 1)[..., None]
    across = _unit(cross(ends1[..., 1, :] - ends1[..., 0, :], ends2[..., 1, :] - ends2[..., 0, :]))
    across = across * torch.sign(dot(across, axis.normal.to(dtype)))[..., None]
    normal = torch.where(face1, plane1, torch.where(face2, -plane2, across))
    point1 = torch.where(face1, v2 - s_face1[..., None] * plane1, torch.where(face2, v1, line1))
    point2 = torch.where(face1, v2, torch.where(face2, v1 - s_face2[..., None] * plane2, line2))
    dist = torch.where(kind == 0, s_face1, torch.where(kind == 1, s_face2, dot(line2 - line1, normal)))

    pen_ids1 = torch.where(face1, facet1, torch.where(face2, deep1[..., None], _pad3(edge1)))
    pen_ids2 = torch.where(face2, facet2, torch.where(face1, deep2[..., None], _pad3(edge2)))
    pen_dim1 = torch.where(kind == 0, 3, torch.where(kind == 1, 1, 2))
    pen_dim2 = torch.where(kind == 1, 3, torch.where(kind == 0, 1, 2))
    sep_ids1, sep_dim1 = _distinct(gjk1, used)
    sep_ids2, sep_dim2 = _distinct(gjk2, used)

    sep = separated[..., None]
    return PolytopeContact(torch.where(separated, gap_length, dist), torch.where(sep, gap_normal, normal),
                    torch.where(sep, near1, point1), torch.where(sep, near2, point2),
                    torch.where(separated, sep_dim1, pen_dim1), torch.where(sep, sep_ids1, pen_ids1),
                    torch.where(separated, sep_dim2, pen_dim2), torch.where(sep, sep_ids2, pen_ids2))


def _unit(v: Tensor) -> Tensor:
    length2 = dot(v, v)
    return v / torch.sqrt(torch.where(length2 > 0, length2, 1.0))[..., None]


def _pad3(ids: Tensor) -> Tensor:
    """Two ids [n, 2] as three [n, 3] (the last repeated)."""
    return torch.cat((ids, ids[..., 1:]), -1)


def line_parameters(p0: Tensor, p1: Tensor, q0: Tensor, q1: Tensor) -> tuple[Tensor, Tensor]:
    """Parameters s, t [...] of the nearest points of the lines p0 + s (p1 - p0), q0 + t (q1 - q0)
    (not parallel)."""
    d1, d2, r = p1 - p0, q1 - q0, p0 - q0
    a, b, c, d, e = dot(d1, d1), dot(d1, d2), dot(d2, d2), dot(d1, r), dot(d2, r)
    det = a * c - b * b
    det = torch.where(det > 0, det, 1.0)
    return (b * e - c * d) / det, (a * e - b * d) / det


def _nearest_on_lines(ends1: Tensor, ends2: Tensor) -> tuple[Tensor, Tensor]:
    """The nearest points of the lines through ends1 [n, 2, 3] and ends2 [n, 2, 3] (not parallel)."""
    p0, p1, q0, q1 = ends1[..., 0, :], ends1[..., 1, :], ends2[..., 0, :], ends2[..., 1, :]
    s, t = line_parameters(p0, p1, q0, q1)
    return p0 + s[..., None] * (p1 - p0), q0 + t[..., None] * (q1 - q0)


# ---------------------------------------------------------------- multi-contact


def face_normals(p: Polytope, dim: Tensor, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """MuJoCo's meshNormals / boxNormals: the polygons of a feature (of a vertex: all at it; of an
    edge: those at both ends, at most 2; of a face: the first at all three). Normals [n, P, 3],
    polygon ids [n, P], validity [n, P], in MuJoCo's order."""
    polys = _at(p.vert_poly, ids[..., :1])[..., 0, :]  # [n, P]
    at = lambda k: (polys[..., :, None] == _at(p.vert_poly, ids[..., k:k + 1])[..., 0, None, :]).any(-1)  # noqa: E731
    keep = (polys >= 0) & ((dim < 2)[..., None] | at(1)) & ((dim < 3)[..., None] | at(2))
    rank = torch.cumsum(keep.long(), -1)
    keep = keep & (rank <= torch.where(dim == 3, 1, torch.where(dim == 2, 2, polys.shape[-1]))[..., None])
    return _at(p.poly_normal, polys), polys.clamp(min=0), keep


def _edges(p: Polytope, dim: Tensor, ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """MuJoCo's meshEdgeNormals / boxEdgeNormals: the edges of a feature (of an edge: itself; of a
    vertex: one per polygon at it). Start [n, 3], ends [n, P, 3], unit directions [n, P, 3], validity [n, P]."""
    start = _at(p.vert, ids[..., :1])[..., 0, :]
    other = torch.where((dim == 2)[..., None], ids[..., 1:2].expand_as(p.vert_edge[..., 0, :]),
                        _at(p.vert_edge, ids[..., :1])[..., 0, :])
    slots = torch.arange(other.shape[-1], device=other.device)
    valid = (other >= 0) & (dim < 3)[..., None] & ((dim == 1)[..., None] | (slots == 0))
    ends = _at(p.vert, other)
    return start, ends, _unit(ends - start[..., None, :]), valid


def polygon(p: Polytope, poly: Tensor) -> tuple[Tensor, Tensor]:
    """Vertices [n, K, 3] (padded) and count [n] of polygon ``poly`` [n], in clipping order."""
    ids = _at(p.poly_vert, poly[..., None])[..., 0, :]
    return _at(p.vert, ids), (ids >= 0).sum(-1)


class ClipFeature(NamedTuple):
    """One geom's side of mjc_multicontact: the faces and edges of its feature at the contact."""

    normals: Tensor  # [n, A, 3] face normals, MuJoCo's order
    faces: Tensor  # [n, A] their face ids (for ``polygon``)
    ok: Tensor  # [n, A] which are in use
    dim: Tensor  # [n] the feature's dimension: 1 vertex, 2 edge, 3 face
    start: Tensor  # [n, 3] where its edges start
    ends: Tensor  # [n, B, 3] where they end
    dirs: Tensor  # [n, B, 3] their unit directions
    edge_ok: Tensor  # [n, B] which are in use


def clip_feature(p: Polytope, dim: Tensor, ids: Tensor) -> ClipFeature:
    """A polytope's feature of dimension dim [n] and vertex ids [n, 3] for mjc_multicontact."""
    return ClipFeature(*face_normals(p, dim, ids), dim, *_edges(p, dim, ids))


def clip_features(feature1: ClipFeature, feature2: ClipFeature, polygon1, polygon2, x1: Tensor, x2: Tensor,
                  margin: Tensor, max_contacts: int = MAX_CONTACTS):
    """MuJoCo 4's mjc_multicontact on two geoms' features (``convex.multicontact_choice``), for geoms
    inflated by half the margin [n] each: x1, x2 [n, 3] their inflated witness points; ``polygon1``,
    ``polygon2`` map face ids [n] to (vertices [n, K, 3] in clipping order, count [n]).

    Returns (use [n], dist [n, c], pos [n, c, 3], normal [n, c, 3], count [n], tied [n]), c =
    ``max_contacts`` (MuJoCo's 4; more: every vertex of the clipped polygon); ``tied``: the choice among
    equally large quadrilaterals is arbitrary (``convex.largest_quad``).
    """
    half = 0.5 * margin[..., None]
    f1, f2 = feature1, feature2
    choice = multicontact_choice(x2 - x1, (f1.normals, f1.ok, f1.dim, f1.dirs, f1.edge_ok),
                                 (f2.normals, f2.ok, f2.dim, f2.dirs, f2.edge_ok))
    face_face, edge1, edge2 = choice.face_face, choice.edge1, choice.edge2

    # the clipping face and the clipped polygon (a face or an edge)
    pick = lambda x, i: torch.take_along_dim(x, i[..., None], -1)[..., 0]  # noqa: E731
    i1, i2 = choice.face1, choice.face2
    normal1, normal2 = _at(f1.normals, i1[..., None])[..., 0, :], _at(f2.normals, i2[..., None])[..., 0, :]
    poly1, npoly1 = polygon1(pick(f1.faces, i1))
    poly2, npoly2 = polygon2(pick(f2.faces, i2))
    width = max(poly1.shape[-2], poly2.shape[-2])
    pad = lambda s: torch.cat((s, s[..., :1, :].expand(*s.shape[:-2], width - s.shape[-2], 3)), -2)  # noqa: E731
    seg1 = torch.stack((f1.start, _at(f1.ends, choice.edge_slot1[..., None])[..., 0, :]), -2)
    seg2 = torch.stack((f2.start, _at(f2.ends, choice.edge_slot2[..., None])[..., 0, :]), -2)
    face = torch.where(edge1[..., None, None], pad(poly2), pad(poly1))
    nface = torch.where(edge1, npoly2, npoly1)
    poly = torch.where(face_face[..., None, None], pad(poly2), torch.where(edge1[..., None, None], pad(seg1),
                                                                          pad(seg2)))
    npoly = torch.where(face_face, npoly2, torch.full_like(npoly2, 2))
    normal = torch.where(edge1[..., None], normal2, normal1)
    wit = torch.where(face_face[..., None], normal2, -normal)
    inflate = torch.where(edge2[..., None], normal1, -normal2)  # from geom 1 towards geom 2

    count, on_face, on_poly, dist, tied = clip_contacts(face, nface, poly, npoly, normal, wit, margin, max_contacts,
                                                        ~face_face)
    witness1 = torch.where(edge1[..., None, None], on_poly, on_face) + half[..., None] * inflate[..., None, :]
    witness2 = torch.where(edge1[..., None, None], on_face, on_poly) - half[..., None] * inflate[..., None, :]
    use = (face_face | edge1 | edge2) & (count > 0)
    return use, dist, 0.5 * (witness1 + witness2), _unit(witness1 - witness2), count, tied & use


def _multicontact(p1: Polytope, p2: Polytope, con: PolytopeContact, margin: Tensor):
    """MuJoCo 4's mjc_multicontact on the contact's features (``clip_features``, without ``tied``)."""
    half = 0.5 * margin[..., None]
    x1 = con.point1 + half * con.normal  # witness points of the geoms inflated by half the margin
    x2 = con.point2 - half * con.normal
    return clip_features(clip_feature(p1, con.dim1, con.ids1), clip_feature(p2, con.dim2, con.ids2),
                         functools.partial(polygon, p1), functools.partial(polygon, p2), x1, x2, margin)[:5]


# ---------------------------------------------------------------- pair functions


def _collide(p1: Polytope, p2: Polytope, margin: Tensor) -> Candidates:
    """mjc_Convex of two polytopes: up to 4 contacts [n, 4] (see module doc)."""
    con = convex_contact(p1, p2, margin)
    single = (con.dist, 0.5 * (con.point1 + con.point2), con.normal, con.dist < margin)
    return single_or_multi(single, _multicontact(p1, p2, con, margin), margin)


def batched(fn):
    """``fn`` also taking a single pair without the leading dim (as under ``torch.vmap`` over the pairs)."""
    def wrapper(geom1, geom2, margin: Tensor) -> Candidates:
        if margin.dim():
            return fn(geom1, geom2, margin)
        one = lambda x: type(x)(*(one(y) if isinstance(y, tuple) else y[None] for y in x))  # noqa: E731
        return Candidates(*(x[0] for x in fn(one(geom1), one(geom2), margin[None])))
    wrapper.__doc__ = fn.__doc__
    return wrapper


@batched
def box_mesh(box: GeomPose, mesh_geom: MeshPose, margin: Tensor) -> Candidates:
    """Box-mesh (mjc_Convex): up to 4 contacts [n, 4]."""
    return _collide(box_polytope(box), mesh_polytope(mesh_geom), margin)


@batched
def mesh_mesh(mesh1: MeshPose, mesh2: MeshPose, margin: Tensor) -> Candidates:
    """Mesh-mesh (mjc_Convex): up to 4 contacts [n, 4]."""
    return _collide(mesh_polytope(mesh1), mesh_polytope(mesh2), margin)
