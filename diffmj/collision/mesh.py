"""Convex mesh geoms: the data MuJoCo's collision functions use, and mesh-plane collision.

MuJoCo collides a mesh geom as the convex hull of its vertices. The compiler
stores the hull's faces merged into polygons (``mesh_polyvert``,
``mesh_polynormal``) and, for each vertex, the polygons that meet there
(``mesh_polymap``). Here every mesh becomes fixed-shape arrays, padded to
the model's largest mesh so that all pairs of one type pair are collided in
one batch (and under ``torch.vmap`` / ``torch.compile``):

* ``vert`` [nmesh, V, 3]: the mesh's vertices that collision can see (those of
  its hull and polygons: MuJoCo's float32 values; a visual mesh's interior
  vertices are left out), padded with copies of vertex 0. A support point (the vertex farthest along
  a direction) is an ``argmax`` over them: a copy never beats the original
  (``argmax`` returns the first of equals), so padding is never chosen.
* ``vert_poly`` [nmesh, V, P], ``poly_vert`` [nmesh, F, K]: ids, -1 padded.
* ``poly_normal`` [nmesh, F, 3].
* ``on_hull`` [nmesh, V]: the vertices GJK's support may return. For 10 or more
  vertices MuJoCo climbs the hull graph, whose vertices are qhull's: a vertex
  qhull counted as inside (up to ~1e-5 outside a hull facet, seen) is then no
  part of the geom.
* ``vert_edge`` [nmesh, V, P]: for each polygon at a vertex, the vertex before it
  in the polygon (the edges MuJoCo's multi-contact tries at a vertex), -1 padded.
* ``facet`` [nmesh, T, 3]: the hull as triangles of its vertices, for exact
  distances: qhull's triangulation (scipy) of the ``on_hull`` vertices, which is
  what MuJoCo's GJK / EPA see. The compiler's polygons are no substitute: it
  merges nearly coplanar facets into polygons that need not be planar (~1e-6
  off in float32 vertices) and can leave out a hull vertex (seen 1e-5 outside
  them). ``edge`` [nmesh, E, 2] are the triangles' edges and ``edge_facet``
  [nmesh, E, 2] the two triangles at each, for the separating-axis test of two
  hulls; ``vert_incident`` [nmesh, V, D] the edges at each vertex (-1 padded),
  along which that test walks the hull.

Mesh-plane (``mjc_PlaneConvex`` in MuJoCo 4) gives up to 4 contacts, none
unless the deepest vertex is within the margin. The hull polygon at the
deepest vertex that faces the plane most directly (least ``normal . plane
normal``) supplies them: its vertices in the polygon's order starting at the
deepest one, cut to 4 by MuJoCo's largest-quadrilateral search when it has
more; of these the deepest, and the others that lie within the margin and
below the mesh's centre. This differs from the C source at hand (MuJoCo 3.12:
up to 3 contacts from the deepest vertex's hull neighbours); the rule was
established against mujoco 4.0's output (random convex hulls, irregular
prisms with 12-gon faces, boxes, tetrahedra, with and without margin) and
agrees with it to rounding wherever the choices involved (the deepest
vertex, the polygon, the quadrilateral) are not tied.
"""

from __future__ import annotations

import mujoco
import numpy as np
import torch
from scipy.spatial import ConvexHull
from torch import Tensor

from diffmj.collision.common import Candidates, GeomPose, MeshPose, MeshShape, compact, make_candidates
from diffmj.collision.convex import largest_quad
from diffmj.dataclass import PyTreeNode, pytree_dataclass
from diffmj.math import cross, dot, mat_t_vec, mat_vec

PLANE_CONTACTS = 4  # mesh-plane contacts (mj_maxContact)


@pytree_dataclass
class Meshes(PyTreeNode):
    """Every mesh of a model that a candidate pair uses, padded to common sizes (see module doc)."""

    vert: Tensor  # [nmesh, V, 3]
    vert_poly: Tensor  # [nmesh, V, P] long
    poly_vert: Tensor  # [nmesh, F, K] long
    poly_normal: Tensor  # [nmesh, F, 3]
    facet: Tensor  # [nmesh, T, 3] long
    on_hull: Tensor  # [nmesh, V] bool
    vert_edge: Tensor  # [nmesh, V, P] long
    edge: Tensor  # [nmesh, E, 2] long
    edge_facet: Tensor  # [nmesh, E, 2] long
    vert_incident: Tensor  # [nmesh, V, D] long


def mesh_unsupported(mjm: mujoco.MjModel, mesh: int) -> str | None:
    """Why a mesh cannot be collided here, if it cannot."""
    if mjm.mesh_graphadr[mesh] < 0 or mjm.mesh_polynum[mesh] == 0:
        return "no convex hull"
    return None


_HILLCLIMB_MIN = 10  # mjMESH_HILLCLIMB_MIN: meshes with fewer vertices are searched vertex by vertex


def _on_hull(mjm: mujoco.MjModel, mesh: int) -> np.ndarray:
    """Which of the mesh's vertices MuJoCo's mesh support function may return (see module doc)."""
    nvert = mjm.mesh_vertnum[mesh]
    if nvert < _HILLCLIMB_MIN:
        return np.ones(nvert, bool)
    graph = mjm.mesh_graph[mjm.mesh_graphadr[mesh]:]
    numvert = graph[0]
    out = np.zeros(nvert, bool)
    out[graph[2 + numvert: 2 + 2 * numvert]] = True
    return out


def _mesh_arrays(mjm: mujoco.MjModel, mesh: int) \
        -> tuple[np.ndarray, list[list[int]], list[list[int]], np.ndarray, np.ndarray]:
    """Vertices [nvert, 3], polygons at each vertex, vertices of each polygon, polygon normals [npoly, 3],
    on_hull [nvert].

    Only the vertices collision can see are kept: the hull's and the polygons' (a visual mesh's
    interior vertices, often most of them, would only pad every mesh's arrays); ids count the kept ones.
    """
    vertadr, nvert = mjm.mesh_vertadr[mesh], mjm.mesh_vertnum[mesh]
    polyadr, npoly = mjm.mesh_polyadr[mesh], mjm.mesh_polynum[mesh]
    adr, num = mjm.mesh_polyvertadr[polyadr: polyadr + npoly], mjm.mesh_polyvertnum[polyadr: polyadr + npoly]
    poly_vert = [mjm.mesh_polyvert[a: a + k] for a, k in zip(adr, num)]
    on_hull = _on_hull(mjm, mesh)
    kept = on_hull.copy()
    kept[np.concatenate(poly_vert)] = True
    new_id = np.cumsum(kept) - 1
    mapadr, mapnum = mjm.mesh_polymapadr[vertadr: vertadr + nvert], mjm.mesh_polymapnum[vertadr: vertadr + nvert]
    vert_poly = [list(mjm.mesh_polymap[mapadr[v]: mapadr[v] + mapnum[v]]) for v in np.flatnonzero(kept)]
    vert = np.asarray(mjm.mesh_vert[vertadr: vertadr + nvert], np.float64)[kept]
    normal = np.asarray(mjm.mesh_polynormal[polyadr: polyadr + npoly], np.float64)
    return vert, vert_poly, [new_id[ids].tolist() for ids in poly_vert], normal, on_hull[kept]


def _facets(vert: np.ndarray, on_hull: np.ndarray) -> list[list[int]]:
    """Triangles (vertex ids, counter-clockwise from outside) of the convex hull of the vertices
    ``on_hull`` (qhull's, exact to rounding)."""
    ids = np.flatnonzero(on_hull)
    hull = ConvexHull(vert[ids])
    out = []
    for tri, plane in zip(ids[hull.simplices], hull.equations):
        p = vert[tri]
        if np.cross(p[1] - p[0], p[2] - p[0]) @ plane[:3] < 0:
            tri = tri[[0, 2, 1]]
        out.append([int(k) for k in tri])
    return out


def vertex_edges(vert_poly: list[list[int]], poly_vert: list[list[int]]) -> list[list[int]]:
    """For each vertex, the vertex before it in each polygon at it (MuJoCo's meshEdgeNormals)."""
    return [[poly_vert[p][poly_vert[p].index(v) - 1] for p in polys] for v, polys in enumerate(vert_poly)]


def facet_edges(facets: list[list[int]]) -> tuple[list[list[int]], list[list[int]]]:
    """The edges (vertex pairs) of a closed triangle mesh and the two triangles at each."""
    at: dict[tuple[int, int], list[int]] = {}
    for t, tri in enumerate(facets):
        for k in range(3):
            at.setdefault(tuple(sorted((tri[k], tri[k - 1]))), []).append(t)
    return [list(e) for e in at], [(ts * 2)[:2] for ts in at.values()]


def incident_edges(edges: list[list[int]], nvert: int) -> list[list[int]]:
    """For each of nvert vertices, the ids of the edges (vertex pairs) at it."""
    at: list[list[int]] = [[] for _ in range(nvert)]
    for k, ends in enumerate(edges):
        for v in ends:
            at[v].append(k)
    return at


def build_meshes(mjm: mujoco.MjModel, meshes: list[int], dtype: torch.dtype, device: torch.device) -> Meshes:
    """Padded arrays of the given meshes, rows in that order."""
    parts = [_mesh_arrays(mjm, k) for k in meshes]
    nvert = max((len(p[0]) for p in parts), default=1)
    vert = np.stack([np.concatenate((p[0], p[0][:1].repeat(nvert - len(p[0]), 0))) for p in parts]) \
        if parts else np.zeros((0, 1, 3))

    def stack(rows_per_mesh: list[list[list[int]]], count: int) -> np.ndarray:
        """Per-mesh lists of id rows as one array [nmesh, count, width], -1 padded."""
        width = max((len(r) for rows in rows_per_mesh for r in rows), default=1)
        out = np.full((len(rows_per_mesh), count, width), -1, np.int64)
        for i, rows in enumerate(rows_per_mesh):
            for j, r in enumerate(rows):
                out[i, j, :len(r)] = r
        return out

    hull = [p[4] for p in parts]
    facets = [_facets(p[0], on) for p, on in zip(parts, hull)]
    edges = [facet_edges(f) for f in facets]
    nedge = max((len(e) for e, _ in edges), default=1)
    npoly = max((len(p[2]) for p in parts), default=1)
    normal = np.zeros((len(parts), npoly, 3))
    for i, p in enumerate(parts):
        normal[i, :len(p[3])] = p[3]
    as_float = lambda x: torch.as_tensor(x, dtype=dtype, device=device)  # noqa: E731
    return Meshes(vert=as_float(vert),
                  vert_poly=torch.as_tensor(stack([p[1] for p in parts], nvert), device=device),
                  poly_vert=torch.as_tensor(stack([p[2] for p in parts], npoly), device=device),
                  poly_normal=as_float(normal),
                  facet=torch.as_tensor(stack(facets, max((len(f) for f in facets), default=1)), device=device),
                  on_hull=torch.as_tensor(np.stack([np.pad(on, (0, nvert - len(on))) for on in hull])
                                          if parts else np.zeros((0, 1), bool), device=device),
                  vert_edge=torch.as_tensor(stack([vertex_edges(p[1], p[2]) for p in parts], nvert), device=device),
                  edge=torch.as_tensor(stack([e for e, _ in edges], nedge), device=device),
                  edge_facet=torch.as_tensor(stack([f for _, f in edges], nedge), device=device),
                  vert_incident=torch.as_tensor(stack([incident_edges(e, nvert) for e, _ in edges], nvert),
                                                device=device))


def mesh_shape(meshes: Meshes, row: Tensor) -> MeshShape:
    """The meshes of rows ``row`` [n]."""
    return MeshShape(*(getattr(meshes, name)[row] for name in MeshShape._fields))


def _at(x: Tensor, index: Tensor) -> Tensor:
    """Rows of x [n, m, ...] at index [n, k]: [n, k, ...]."""
    return torch.take_along_dim(x, index.reshape(*index.shape, *(1,) * (x.dim() - 2)), 1)


def _one_pair(fn, geom: GeomPose, mesh_geom: MeshPose, margin: Tensor) -> Candidates:
    """``fn`` on a single pair given without the leading dim (as under ``torch.vmap`` over the pairs)."""
    one = lambda t: type(t)(*(x[None] for x in t))  # noqa: E731
    found = fn(one(geom), MeshPose(one(mesh_geom.pose), one(mesh_geom.shape)), margin[None])
    return Candidates(*(x[0] for x in found))


def plane_mesh(plane: GeomPose, mesh_geom: MeshPose, margin: Tensor) -> Candidates:
    """mjc_PlaneConvex for a mesh: up to 4 contacts [n, 4] (see module doc).

    Also takes a single pair (no leading dim), as under ``torch.vmap`` over the pairs.
    """
    if margin.dim() == 0:
        return _one_pair(plane_mesh, plane, mesh_geom, margin)
    mesh, shape = mesh_geom
    normal = plane.mat[..., :, 2]
    down = mat_t_vec(mesh.mat, -normal)  # the support direction in the mesh frame
    deepest = (shape.vert * down[..., None, :]).sum(-1).argmax(-1, keepdim=True)  # [n, 1]

    # the polygon at the deepest vertex facing the plane most directly
    polys = _at(shape.vert_poly, deepest)[..., 0, :]  # [n, P]
    facing = dot(_at(shape.poly_normal, polys.clamp(min=0)), down[..., None, :])
    face = torch.take_along_dim(polys, torch.where(polys >= 0, facing, -torch.inf).argmax(-1, keepdim=True), -1)
    ids = _at(shape.poly_vert, face)[..., 0, :]  # [n, K]
    if ids.shape[-1] < PLANE_CONTACTS:
        ids = torch.cat((ids, torch.full_like(ids[..., :1], -1).expand(*ids.shape[:-1], PLANE_CONTACTS - ids.shape[-1])), -1)

    # its vertices from the deepest on; more than 4: MuJoCo's largest quadrilateral of them
    count = (ids >= 0).sum(-1, keepdim=True).clamp(min=1)
    start = (ids == deepest).long().argmax(-1, keepdim=True)
    slots = torch.arange(ids.shape[-1], device=ids.device)
    ids = torch.take_along_dim(ids, (start + slots) % count, -1)
    local = _at(shape.vert, ids)
    points = mat_vec(mesh.mat[..., None, :, :], local) + mesh.pos[..., None, :]
    pick = slots[:PLANE_CONTACTS].expand(*count.shape[:-1], -1)
    if ids.shape[-1] > PLANE_CONTACTS:  # some polygon has more vertices than contacts
        quad, _ = largest_quad(points.detach(), count[..., 0])
        pick = torch.where(count > PLANE_CONTACTS, quad, pick)
    local, points = _at(local, pick), _at(points, pick)

    # of these, the deepest vertex and those within the margin below the mesh's centre
    dist = dot(points - plane.pos[..., None, :], normal[..., None, :])
    threshold = torch.clamp(dot(normal, mesh.pos - plane.pos) - margin, min=0)
    below = dot(local, down[..., None, :]) > threshold[..., None]
    first = slots[:PLANE_CONTACTS] == 0
    keep = (first | below) & (pick < count) & (dist[..., :1] <= margin[..., None])
    valid, points, dist = compact(keep, PLANE_CONTACTS, points, dist)
    pos = points - 0.5 * dist[..., None] * normal[..., None, :]
    return make_candidates(valid, dist, pos, normal[..., None, :])


def closest_on_hull(shape: MeshShape, point: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Signed distance [n] from ``point`` [n, 3] (mesh frame) to the hull (negative inside), the
    nearest hull surface point [n, 3] and the outward unit normal there [n, 3]. Reads only ``vert``
    and ``facet``: any convex polytope with those (``polytope.Polytope``) in the point's frame will do.

    Inside, the nearest facet plane. Outside, the nearest of every facet's projection of the point
    (where it falls inside the facet) and every facet edge's nearest point.
    """
    listed = shape.facet[..., 0] >= 0  # [n, T]
    corner = _at(shape.vert, shape.facet.clamp(min=0).flatten(-2)).unflatten(-2, shape.facet.shape[-2:])
    edge = corner.roll(-1, -2) - corner  # [n, T, 3 edges, 3]
    normal = cross(edge[..., 0, :], -edge[..., 2, :])
    normal = normal / torch.sqrt(dot(normal, normal)).clamp(min=1e-30)[..., None]
    height = torch.where(listed, dot(point[..., None, :] - corner[..., 0, :], normal), -torch.inf)  # [n, T]

    # inside: the nearest facet plane
    face = height.argmax(-1, keepdim=True)
    depth = torch.take_along_dim(height, face, -1)[..., 0]
    face_normal = _at(normal, face)[..., 0, :]
    inside_point = point - depth[..., None] * face_normal

    # outside: projections inside their facets, and nearest points of the edges
    projected = point[..., None, :] - torch.where(listed, height, 0)[..., None] * normal
    within = listed & (dot(cross(edge, projected[..., None, :] - corner), normal[..., None, :]) >= 0).all(-1)
    along = dot(point[..., None, None, :] - corner, edge) / dot(edge, edge).clamp(min=1e-30)
    on_edge = corner + along.clamp(0, 1)[..., None] * edge
    cand = torch.cat((projected, on_edge.flatten(-3, -2)), -2)  # [n, T + 3 T, 3]
    ok = torch.cat((within, listed.repeat_interleave(3, -1)), -1)
    dist2 = torch.where(ok, dot(point[..., None, :] - cand, point[..., None, :] - cand), torch.inf)
    nearest = _at(cand, dist2.argmin(-1, keepdim=True))[..., 0, :]
    offset = point - nearest
    gap2 = dot(offset, offset)
    gap = torch.sqrt(torch.where(gap2 > 0, gap2, 1.0))
    outward = offset / gap[..., None]

    inside = depth <= 0
    return (torch.where(inside, depth, gap), torch.where(inside[..., None], inside_point, nearest),
            torch.where(inside[..., None], face_normal, outward))


def sphere_mesh(sphere: GeomPose, mesh_geom: MeshPose, margin: Tensor) -> Candidates:
    """Sphere-mesh (MuJoCo's mjc_Convex, one contact) [n, 1]: the sphere centre's signed distance
    to the hull, less the radius; the normal points from the sphere into the mesh.

    Also takes a single pair (no leading dim), as under ``torch.vmap`` over the pairs.
    """
    if margin.dim() == 0:
        return _one_pair(sphere_mesh, sphere, mesh_geom, margin)
    mesh, shape = mesh_geom
    dist, pos, outward = sphere_contact(shape, mat_t_vec(mesh.mat, sphere.pos - mesh.pos), sphere.size[..., 0])
    outward = mat_vec(mesh.mat, outward)
    pos = mat_vec(mesh.mat, pos) + mesh.pos
    return make_candidates((dist < margin)[..., None], dist[..., None], pos[..., None, :], -outward[..., None, :])


def sphere_contact(shape: MeshShape, center: Tensor, radius: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A sphere (``center`` [n, 3] in the hull's frame, ``radius`` [n]) against a convex hull (as for
    ``closest_on_hull``): signed distance [n], the midpoint of the two surfaces [n, 3] and the hull's
    outward unit normal towards the sphere [n, 3], in the hull's frame."""
    signed, surface, outward = closest_on_hull(shape, center)
    return signed - radius, 0.5 * (center - radius[..., None] * outward + surface), outward
