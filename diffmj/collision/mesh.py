"""Convex mesh geoms: the data MuJoCo's collision functions use, and mesh-plane collision.

MuJoCo collides a mesh geom as the convex hull of its vertices. The compiler
stores the hull's faces merged into polygons (``mesh_polyvert``,
``mesh_polynormal``) and, for each vertex, the polygons that meet there
(``mesh_polymap``). Here every mesh becomes fixed-shape arrays, padded to
the model's largest mesh so that all pairs of one type pair are collided in
one batch (and under ``torch.vmap`` / ``torch.compile``):

* ``vert`` [nmesh, V, 3]: the mesh's vertices (MuJoCo's float32 values),
  padded with copies of vertex 0. A support point (the vertex farthest along
  a direction) is an ``argmax`` over them: a copy never beats the original
  (``argmax`` returns the first of equals), so padding is never chosen.
* ``vert_poly`` [nmesh, V, P], ``poly_vert`` [nmesh, F, K]: ids, -1 padded.
* ``poly_normal`` [nmesh, F, 3].

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
from torch import Tensor

from diffmj.collision.common import Candidates, GeomPose, MeshPose, MeshShape, compact, make_candidates
from diffmj.collision.convex import largest_quad
from diffmj.dataclass import PyTreeNode, pytree_dataclass
from diffmj.math import dot, mat_t_vec, mat_vec

PLANE_CONTACTS = 4  # mesh-plane contacts (mj_maxContact)


@pytree_dataclass
class Meshes(PyTreeNode):
    """Every mesh of a model that a candidate pair uses, padded to common sizes (see module doc)."""

    vert: Tensor  # [nmesh, V, 3]
    vert_poly: Tensor  # [nmesh, V, P] long
    poly_vert: Tensor  # [nmesh, F, K] long
    poly_normal: Tensor  # [nmesh, F, 3]


def mesh_unsupported(mjm: mujoco.MjModel, mesh: int) -> str | None:
    """Why a mesh cannot be collided here, if it cannot."""
    if mjm.mesh_graphadr[mesh] < 0 or mjm.mesh_polynum[mesh] == 0:
        return "no convex hull"
    return None


def _mesh_arrays(mjm: mujoco.MjModel, mesh: int) -> tuple[np.ndarray, list[list[int]], list[list[int]], np.ndarray]:
    """Vertices [nvert, 3], polygons at each vertex, vertices of each polygon, polygon normals [npoly, 3]."""
    vertadr, nvert = mjm.mesh_vertadr[mesh], mjm.mesh_vertnum[mesh]
    polyadr, npoly = mjm.mesh_polyadr[mesh], mjm.mesh_polynum[mesh]
    vert = np.asarray(mjm.mesh_vert[vertadr: vertadr + nvert], np.float64)
    mapadr, mapnum = mjm.mesh_polymapadr[vertadr: vertadr + nvert], mjm.mesh_polymapnum[vertadr: vertadr + nvert]
    vert_poly = [list(mjm.mesh_polymap[a: a + k]) for a, k in zip(mapadr, mapnum)]
    adr, num = mjm.mesh_polyvertadr[polyadr: polyadr + npoly], mjm.mesh_polyvertnum[polyadr: polyadr + npoly]
    poly_vert = [list(mjm.mesh_polyvert[a: a + k]) for a, k in zip(adr, num)]
    return vert, vert_poly, poly_vert, np.asarray(mjm.mesh_polynormal[polyadr: polyadr + npoly], np.float64)


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

    npoly = max((len(p[2]) for p in parts), default=1)
    normal = np.zeros((len(parts), npoly, 3))
    for i, p in enumerate(parts):
        normal[i, :len(p[3])] = p[3]
    as_float = lambda x: torch.as_tensor(x, dtype=dtype, device=device)  # noqa: E731
    return Meshes(vert=as_float(vert),
                  vert_poly=torch.as_tensor(stack([p[1] for p in parts], nvert), device=device),
                  poly_vert=torch.as_tensor(stack([p[2] for p in parts], npoly), device=device),
                  poly_normal=as_float(normal))


def mesh_shape(meshes: Meshes, row: Tensor) -> MeshShape:
    """The meshes of rows ``row`` [n]."""
    return MeshShape(meshes.vert[row], meshes.vert_poly[row], meshes.poly_vert[row], meshes.poly_normal[row])


def _at(x: Tensor, index: Tensor) -> Tensor:
    """Rows of x [n, m, ...] at index [n, k]: [n, k, ...]."""
    return torch.take_along_dim(x, index.reshape(*index.shape, *(1,) * (x.dim() - 2)), 1)


def plane_mesh(plane: GeomPose, mesh_geom: MeshPose, margin: Tensor) -> Candidates:
    """mjc_PlaneConvex for a mesh: up to 4 contacts [n, 4] (see module doc).

    Also takes a single pair (no leading dim), as under ``torch.vmap`` over the pairs.
    """
    if margin.dim() == 0:
        one = lambda t: type(t)(*(x[None] for x in t))  # noqa: E731
        found = plane_mesh(one(plane), MeshPose(one(mesh_geom.pose), one(mesh_geom.shape)), margin[None])
        return Candidates(*(x[0] for x in found))
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

