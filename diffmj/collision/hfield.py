"""Heightfield collision: MuJoCo's mjc_ConvexHField for an hfield (geom 1) and a convex geom.

An hfield of ``nrow x ncol`` points spans ``[-size0, size0] x [-size1, size1]``
in its frame; point (r, c) lies at x = c dx - size0, y = r dy - size1 (dx =
2 size0 / (ncol - 1), dy likewise) at height ``data[r, c] size2``. Each grid
cell is split by its diagonal from (r, c) to (r + 1, c + 1) into two
triangles, and each triangle extended down to the base (z = -size3) is a
triangular prism: a convex polytope of six vertices.

MuJoCo collides the other geom with the prisms of the cells under its
bounding box in the hfield's frame (the box from the geom's support along
the frame's axes, without the margin): columns ``floor((xmin + size0) /
(2 size0) (ncol - 1))`` up to ``ceil`` of the same at ``xmax``, rows
likewise, clamped to the grid. Each prism gives at most one contact (its
general convex collision, single contact), in the order row, column,
triangle (the one at (r + 1, c) first), up to ``mjMAXCONPAIR`` (50) per pair.
Established against mujoco 4.0's output: the box is widened by the margin
(+ gap) before the cells are chosen, and a contact's ``dist`` is the prism's
signed distance to the geom, emitted below the margin, as for mjc_Convex (the
C source at hand, 3.12, raises the prism tops by the margin and chooses the
cells without it). A box or mesh without margin is refused
(``hfield_unsupported``).

Here the prisms are polytopes (``polytope.Polytope``) and each is collided by
the exact convex machinery of the mesh pairs: a sphere by its centre's
signed distance (``mesh.sphere_contact``), a capsule by its segment's
(``mesh_convex.capsule_contact``), an ellipsoid by its stationary normals
(``mesh_convex.ellipsoid_contact``), a cylinder by the faces and creases of
its Minkowski difference with the prism (``mesh_convex.cylinder_contact``;
one contact per prism here too, no multi-contact, as MuJoCo 4 gives), a box or a mesh hull by separating axes
and GJK (``polytope.convex_contact``). The number of candidate cells per pair
is fixed at ``put_model`` (``candidate_cells``: from the geom's bounding
radius, margin and gap and the cell size); the cells past the geom's box are
masked. A geom made to reach farther later (``geom_size``, ``geom_margin``,
... by ``set_param``) would have cells past the planned ones: the collision
driver refuses it (``driver.check_hfield_reach``) rather than drop them.

Shapes: ``n`` pairs; a single pair without the leading dim is accepted (as
under ``torch.vmap`` over the pairs).
"""

from __future__ import annotations

import functools
import math

import mujoco
import numpy as np
import torch
from torch import Tensor

from diffmj.collision.common import Candidates, GeomPose, HFieldPose, HFieldShape, MeshPose, compact, make_candidates
from diffmj.collision.mesh import facet_edges, incident_edges, sphere_contact, vertex_edges
from diffmj.collision.mesh_convex import capsule_contact, cylinder_contact, ellipsoid_contact
from diffmj.collision.polytope import Polytope, batched, box_polytope, convex_contact, mesh_polytope
from diffmj.dataclass import PyTreeNode, pytree_dataclass
from diffmj.enums import GeomType
from diffmj.math import cross, dot, mat_t_vec, mat_vec
from diffmj.workarounds import literal

MAX_CONTACTS = 50  # mjMAXCONPAIR: MuJoCo's cap on the contacts of one hfield pair


@pytree_dataclass
class HFields(PyTreeNode):
    """Every hfield of a model that a candidate pair uses, padded to common grid sizes."""

    height: Tensor  # [nhfield, R, C] elevation (hfield_data x size[2]), zero past each grid
    size: Tensor  # [nhfield, 4]
    grid: Tensor  # [nhfield, 2] long: rows, columns


def build_hfields(mjm: mujoco.MjModel, hfields: list[int], dtype: torch.dtype, device: torch.device) -> HFields:
    """Padded arrays of the given hfields, rows in that order."""
    rows = max((int(mjm.hfield_nrow[k]) for k in hfields), default=1)
    cols = max((int(mjm.hfield_ncol[k]) for k in hfields), default=1)
    height = np.zeros((len(hfields), rows, cols))
    for i, k in enumerate(hfields):
        nrow, ncol, adr = int(mjm.hfield_nrow[k]), int(mjm.hfield_ncol[k]), int(mjm.hfield_adr[k])
        # float32 data widened, then scaled in float64, as MuJoCo does
        data = np.asarray(mjm.hfield_data[adr: adr + nrow * ncol], np.float64).reshape(nrow, ncol)
        height[i, :nrow, :ncol] = data * mjm.hfield_size[k, 2]
    return HFields(height=torch.as_tensor(height, dtype=dtype, device=device),
                   size=torch.as_tensor(np.asarray(mjm.hfield_size[hfields]).reshape(-1, 4), dtype=dtype,
                                        device=device),
                   grid=torch.as_tensor(np.stack([mjm.hfield_nrow[hfields], mjm.hfield_ncol[hfields]], -1)
                                        .reshape(-1, 2).astype(np.int64), device=device))


def hfield_shape(hfields: HFields, row: Tensor, cells: Tensor) -> HFieldShape:
    """The hfields of rows ``row`` [n], with the candidate cell offsets ``cells`` [K, 2] for each."""
    return HFieldShape(hfields.height[row], hfields.size[row], hfields.grid[row],
                       cells.expand(row.shape[0], *cells.shape))


def candidate_cells(mjm: mujoco.MjModel,
                    pairs: list[tuple[int, int, float]]) -> tuple[list[tuple[int, int]], list[float]]:
    """Offsets (row, column) of every cell that may lie under the geom of any of the (hfield geom, geom,
    margin + gap) ``pairs``, and for each pair the reach those cells cover (``planned_reach``).

    The bounding box of a geom of bounding radius rb, widened by the margin m, spans s = 2 (rb + m) / dx
    cells of width dx, so it touches at most floor(s) + 2 columns (floor at one end, ceil at the other);
    s is taken 1e-6 larger, so that the planned geom stays clear of its bound under rounding (float32).
    """
    rows = cols = 1
    for hfield_geom, geom, margin in pairs:
        nrow, ncol, dx, dy = _grid(mjm, hfield_geom)
        span = 2 * (float(mjm.geom_rbound[geom]) + margin) * (1 + 1e-6)
        rows = max(rows, min(nrow - 1, math.floor(span / dy) + 2))
        cols = max(cols, min(ncol - 1, math.floor(span / dx) + 2))
    return [(r, c) for r in range(rows) for c in range(cols)], [planned_reach(mjm, h, rows, cols) for h, _, _ in pairs]


def planned_reach(mjm: mujoco.MjModel, hfield_geom: int, rows: int, cols: int) -> float:
    """The largest geom_rbound + margin + gap of a geom whose cells over ``hfield_geom``'s grid are all
    among ``rows`` x ``cols`` candidate cells: floor(s) + 2 <= cols while s < cols - 1 (see
    ``candidate_cells``), so the reach is (cols - 1) dx / 2, the lesser of the two axes; inf where
    the candidates span the whole grid."""
    nrow, ncol, dx, dy = _grid(mjm, hfield_geom)
    along_x = math.inf if cols >= ncol - 1 else (cols - 1) * dx / 2
    along_y = math.inf if rows >= nrow - 1 else (rows - 1) * dy / 2
    return min(along_x, along_y)


def _grid(mjm: mujoco.MjModel, hfield_geom: int) -> tuple[int, int, float, float]:
    """Rows, columns and the cell sizes dx, dy of the hfield of geom ``hfield_geom``."""
    k = mjm.geom_dataid[hfield_geom]
    nrow, ncol = int(mjm.hfield_nrow[k]), int(mjm.hfield_ncol[k])
    return nrow, ncol, 2 * float(mjm.hfield_size[k, 0]) / (ncol - 1), 2 * float(mjm.hfield_size[k, 1]) / (nrow - 1)


def hfield_unsupported(mjm: mujoco.MjModel, geom: int, margin: float) -> str | None:
    """Why the hfield pair with ``geom`` (margin + gap ``margin``) cannot be collided as MuJoCo does, if
    it cannot: a box or mesh without margin is a "discrete" pair to MuJoCo 4's EPA, which stops once a
    support point's vertex ids repeat, and its prism support sets no vertex id, so the EPA stops early
    (shallower contacts than the prism's penetration; measured up to 1e-2 too shallow)."""
    if margin <= 0 and mjm.geom_type[geom] in (GeomType.BOX, GeomType.MESH):
        return "hfield against a box or mesh without margin (MuJoCo's EPA stops early on hfield prisms)"
    return None


def contact_slots(ncell: int) -> int:
    """Contact slots of an hfield pair with ``ncell`` candidate cells: one per prism, at most 50."""
    return min(2 * ncell, MAX_CONTACTS)


# ---------------------------------------------------------------- the prisms

# prism vertices 0-2: the triangle at the base, 3-5: the same above (k + 3 over k); counter-clockwise
# from above, so that these polygons are counter-clockwise seen from outside
_PRISM_POLY_VERT = [[3, 4, 5], [0, 2, 1], [0, 1, 4, 3], [1, 2, 5, 4], [2, 0, 3, 5]]
_PRISM_FACETS = [t for p in _PRISM_POLY_VERT for t in ([p] if len(p) == 3 else [p[:3], [p[0], p[2], p[3]]])]
_PRISM_VERT_POLY = [[f for f, p in enumerate(_PRISM_POLY_VERT) if v in p] for v in range(6)]
_PRISM_VERT_EDGE = vertex_edges(_PRISM_VERT_POLY, _PRISM_POLY_VERT)
_PRISM_EDGES, _PRISM_EDGE_FACETS = facet_edges(_PRISM_FACETS)
_PRISM_INCIDENT = incident_edges(_PRISM_EDGES, 6)
# the two triangles of cell (r, c), as (row, column) offsets of their grid points, counter-clockwise;
# MuJoCo's first triangle holds (r + 1, c), its second (r, c + 1)
_TRIANGLES = [[(1, 0), (0, 0), (1, 1)], [(0, 0), (0, 1), (1, 1)]]


def _prism_polytope(vert: Tensor) -> Polytope:
    """Prisms as polytopes, from their vertices [N, 6, 3] (world)."""
    n, device = vert.shape[:-2], vert.device
    long = lambda x: literal(x, torch.long, device).expand(*n, *np.shape(x))  # noqa: E731
    poly_vert = long([p + [-1] * (4 - len(p)) for p in _PRISM_POLY_VERT])
    corner = vert[..., [p[0] for p in _PRISM_POLY_VERT], :], vert[..., [p[1] for p in _PRISM_POLY_VERT], :], \
        vert[..., [p[2] for p in _PRISM_POLY_VERT], :]
    normal = cross(corner[1] - corner[0], corner[2] - corner[0])
    normal = normal / torch.sqrt(dot(normal, normal))[..., None]
    return Polytope(vert, long(_PRISM_VERT_POLY), long(_PRISM_VERT_EDGE), poly_vert, normal, long(_PRISM_FACETS),
                    long(_PRISM_EDGES), long(_PRISM_EDGE_FACETS), long(_PRISM_INCIDENT))


def _local_box(kind: GeomType, geom: GeomPose | MeshPose, frame: GeomPose) -> tuple[Tensor, Tensor]:
    """The bounding box of each geom in the hfield's frame (its support along the frame's axes, no
    margin, as MuJoCo's): low [n, 3], high [n, 3]."""
    pose = geom.pose if kind == GeomType.MESH else geom
    pos = mat_t_vec(frame.mat, pose.pos - frame.pos)
    mat = frame.mat.transpose(-1, -2) @ pose.mat
    if kind == GeomType.MESH:
        vert = mat_vec(mat[..., None, :, :], geom.shape.vert) + pos[..., None, :]
        return vert.amin(-2), vert.amax(-2)
    size = pose.size
    if kind == GeomType.SPHERE:
        half = size[..., :1].expand_as(pos)
    elif kind == GeomType.CAPSULE:
        half = mat[..., :, 2].abs() * size[..., 1:2] + size[..., :1]
    elif kind == GeomType.ELLIPSOID:
        half = torch.sqrt(((mat * size[..., None, :]) ** 2).sum(-1))
    elif kind == GeomType.CYLINDER:  # its axis's extent plus the rim's: r sqrt(1 - a_i^2)
        along = mat[..., :, 2]
        half = along.abs() * size[..., 1:2] + size[..., :1] * torch.sqrt((1 - along ** 2).clamp(min=0))
    else:  # box
        half = (mat.abs() * size[..., None, :]).sum(-1)
    return pos - half, pos + half


def _prisms(hfield: HFieldPose, low: Tensor, high: Tensor) -> tuple[Tensor, Tensor]:
    """The candidate prisms under each geom's box: vertices [n, K, 2, 6, 3] (world) and whether their
    cell is under the box [n, K]."""
    pose, shape = hfield
    size, height = shape.size, shape.height
    steps = shape.grid.flip(-1).to(size.dtype) - 1  # [n, 2] cells along x, y
    half = size[..., :2]
    first = torch.floor((low[..., :2] + half) / (2.0 * half) * steps).clamp(min=0)
    end = torch.minimum(torch.ceil((high[..., :2] + half) / (2.0 * half) * steps), steps)
    first, end = first.long(), end.long()  # [n, 2] (column, row)
    row = first[..., 1:] + shape.cells[..., 0]  # [n, K]
    col = first[..., :1] + shape.cells[..., 1]
    inside = (row < end[..., 1:]) & (col < end[..., :1])
    step = 2.0 * half / steps  # dx, dy

    corners = literal(_TRIANGLES, device=row.device)  # [2, 3, 2]
    r = (row[..., None, None] + corners[..., 0]).clamp(max=height.shape[-2] - 1)  # [n, K, 2, 3]
    c = (col[..., None, None] + corners[..., 1]).clamp(max=height.shape[-1] - 1)
    x = step[..., None, None, None, 0] * c - half[..., None, None, None, 0]
    y = step[..., None, None, None, 1] * r - half[..., None, None, None, 1]
    top = height.flatten(-2).gather(-1, (r * height.shape[-1] + c).flatten(-3)).reshape(r.shape)
    base = (-size[..., 3])[..., None, None, None].expand_as(top)
    local = torch.stack((torch.cat((x, x), -1), torch.cat((y, y), -1), torch.cat((base, top), -1)), -1)
    world = mat_vec(pose.mat[..., None, None, None, :, :], local) + pose.pos[..., None, None, None, :]
    return world, inside


def _repeat(x, count: int):
    """Each pair's tensors (or tuples of them) repeated ``count`` times along dim 0."""
    if isinstance(x, tuple):
        return type(x)(*(_repeat(y, count) for y in x))
    return x.repeat_interleave(count, 0)


def _contact(kind: GeomType, prism: Polytope, geom: GeomPose | MeshPose, margin: Tensor):
    """One prism's single contact with the geom: dist [N], pos [N, 3], normal [N, 3] (from the prism)."""
    if kind == GeomType.SPHERE:
        dist, pos, normal = sphere_contact(prism, geom.pos, geom.size[..., 0])
        return dist, pos, normal
    if kind == GeomType.CAPSULE:
        con = capsule_contact(geom, prism)
        return con.dist, 0.5 * (con.point1 + con.point2), -con.normal
    if kind == GeomType.ELLIPSOID:
        dist, normal, pos = ellipsoid_contact(geom, prism)
        return dist, pos, -normal
    if kind == GeomType.CYLINDER:
        con = cylinder_contact(geom, prism)
        return con.dist, 0.5 * (con.point1 + con.point2), -con.normal
    other = mesh_polytope(geom) if kind == GeomType.MESH else box_polytope(geom)
    con = convex_contact(prism, other, margin)
    return con.dist, 0.5 * (con.point1 + con.point2), con.normal


def collide(kind: GeomType, hfield: HFieldPose, geom: GeomPose | MeshPose, margin: Tensor) -> Candidates:
    """mjc_ConvexHField of an hfield and a geom of type ``kind``: contacts [n, contact_slots(K)] in
    MuJoCo's order (see module doc)."""
    low, high = _local_box(kind, geom, hfield.pose)
    low, high = low - margin[..., None], high + margin[..., None]
    vert, inside = _prisms(hfield, low, high)
    n, ncell = inside.shape
    count = 2 * ncell
    dist, pos, normal = _contact(kind, _prism_polytope(vert.flatten(0, 2)), _repeat(geom, count),
                                 margin.repeat_interleave(count, 0))
    dist, pos, normal = dist.reshape(n, count), pos.reshape(n, count, 3), normal.reshape(n, count, 3)
    emitted = inside.repeat_interleave(2, -1) & (dist < margin[..., None])
    valid, dist, pos, normal = compact(emitted, contact_slots(ncell), dist, pos, normal)
    return make_candidates(valid, dist, pos, normal)


def collider(kind: GeomType):
    """The pair function of hfield - ``kind`` (also taking a single pair, as under vmap)."""
    return batched(functools.partial(collide, kind))
