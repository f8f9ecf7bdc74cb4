"""Types shared by the narrow-phase pair functions.

Every pair function has the signature::

    fn(geom1: GeomPose, geom2: GeomPose, margin: Tensor) -> Candidates

for a batch of ``n`` geom pairs of one type pair (for example all
sphere-capsule pairs of a model), ``margin`` [n] being MuJoCo's margin + gap
for each pair. It returns ``k`` candidate contacts per pair (``k`` fixed per
function: MuJoCo's ``mj_maxContact``, or fewer where the C function can never
emit that many, as capsule-box's 2 of 4) in the order MuJoCo's ``mjc_*``
function emits them. A slot MuJoCo would not emit (no contact, or dist >
margin) has ``dist = +inf``; every other field of such a slot is finite, and
the infinity is introduced with ``torch.where`` from a constant so that no
gradient through it is NaN. Empty slots may sit between emitted ones: the
emitted contacts, read in slot order, are MuJoCo's.

Conventions (MuJoCo's): ``normal`` is the contact frame's first axis and
points from geom1 to geom2; ``dist`` is negative in penetration; ``pos`` is
the midpoint between the two surfaces; ``tangent`` is the frame's second axis
when the pair function defines it, else zero (``mju_makeFrame`` completes
the frame later).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from diffmj.math import cross, dot, normalize


class GeomPose(NamedTuple):
    """Geoms of one type in world coordinates."""

    pos: Tensor  # [n, 3] geom_xpos
    mat: Tensor  # [n, 3, 3] geom_xmat
    size: Tensor  # [n, 3] geom_size


class MeshShape(NamedTuple):
    """The convex hull of a mesh geom, as MuJoCo's collision functions see it (see ``mesh.py``)."""

    vert: Tensor  # [n, V, 3] the mesh's vertices in its frame, padded with copies of vertex 0
    vert_poly: Tensor  # [n, V, P] long: the hull polygons at each vertex (-1: none)
    poly_vert: Tensor  # [n, F, K] long: each hull polygon's vertices in order (-1 past the end)
    poly_normal: Tensor  # [n, F, 3] outward unit normal of each hull polygon, in the mesh frame
    facet: Tensor  # [n, T, 3] long: the hull's triangles, counter-clockwise seen from outside (-1: none)
    on_hull: Tensor  # [n, V] bool: the vertex is one MuJoCo's GJK support may return
    vert_edge: Tensor  # [n, V, P] long: per polygon at a vertex, the vertex before it in the polygon (-1: none)
    edge: Tensor  # [n, E, 2] long: the edges of the hull's triangles (-1: none)
    edge_facet: Tensor  # [n, E, 2] long: the two triangles that meet at each edge
    vert_incident: Tensor  # [n, V, D] long: the edges at each vertex (-1: none)


class MeshPose(NamedTuple):
    """Mesh geoms in world coordinates, with their hulls: what pair functions get for a mesh geom."""

    pose: GeomPose
    shape: MeshShape


class Candidates(NamedTuple):
    """Up to k contacts for each of n geom pairs."""

    dist: Tensor  # [n, k]
    pos: Tensor  # [n, k, 3]
    normal: Tensor  # [n, k, 3]
    tangent: Tensor  # [n, k, 3]


def make_candidates(
    valid: Tensor, dist: Tensor, pos: Tensor, normal: Tensor, tangent: Tensor | None = None
) -> Candidates:
    """Candidates with dist = +inf where not ``valid`` [n, k].

    ``normal`` and ``tangent`` (default zero) broadcast to ``pos`` [n, k, 3].
    """
    normal = normal.expand_as(pos)
    tangent = torch.zeros_like(pos) if tangent is None else tangent.expand_as(pos)
    return Candidates(torch.where(valid, dist, torch.inf), pos, normal, tangent)


def single_or_multi(single: tuple[Tensor, ...], multi: tuple[Tensor, ...], margin: Tensor) -> Candidates:
    """mjc_Convex's contacts [n, k]: the multi-contact ones where they are used, else the single one.

    ``single``: (dist [n], pos [n, 3], normal [n, 3], emitted [n]); ``multi``: (use [n], dist [n, k],
    pos [n, k, 3], normal [n, k, 3], count [n]). The multi-contacts are used only where one of the
    ``count`` listed is within the margin [n], and only where the single contact is emitted.
    """
    dist, pos, normal, emitted = single
    use, mdist, mpos, mnormal, count = multi
    slots = torch.arange(mdist.shape[-1], device=mdist.device)
    listed = slots < count[..., None]
    use = use & (torch.where(listed, mdist, torch.inf).amin(-1) < margin)
    valid = emitted[..., None] & torch.where(use[..., None], listed, slots == 0)
    return make_candidates(valid, torch.where(use[..., None], mdist, dist[..., None]),
                           torch.where(use[..., None, None], mpos, pos[..., None, :]),
                           torch.where(use[..., None, None], mnormal, normal[..., None, :]))


def select(cond: Tensor, a: tuple[Tensor, ...], b: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """torch.where over matching tuples of tensors; cond [...] broadcasts over trailing dims."""
    return tuple(
        torch.where(cond[(...,) + (None,) * (x.dim() - cond.dim())], x, y) for x, y in zip(a, b)
    )


def plus_minus(positive: Tensor, dtype: torch.dtype) -> Tensor:
    """+1 where ``positive``, else -1."""
    return positive.to(dtype) * 2 - 1


def axis_onehot(axis: Tensor, dtype: torch.dtype) -> Tensor:
    """One-hot [..., 3] of an axis index [...] in 0..2."""
    return (axis[..., None] == torch.arange(3, device=axis.device)).to(dtype)


def take(x: Tensor, index: Tensor) -> Tensor:
    """x[..., index] with a per-element integer index: x [..., m], index [...] -> [...].

    The leading dims of x and index broadcast against each other.
    """
    shape = torch.broadcast_shapes(x.shape[:-1], index.shape)
    index = index.expand(shape)[..., None]
    return torch.take_along_dim(x.expand(*shape, x.shape[-1]), index, -1)[..., 0]


def compact(valid: Tensor, k: int, *values: Tensor) -> tuple[Tensor, ...]:
    """Move the first ``k`` valid entries along dim -1 of valid [..., m] to the front.

    Returns (valid [..., k], *values) with each value [..., m] or [..., m, c]
    cut to [..., k] or [..., k, c], in the original order: MuJoCo's
    ``con[cnt++]`` with a cap of k. Unfilled slots copy entry 0 (finite) and
    are marked invalid.
    """
    count = torch.cumsum(valid.long(), -1)  # [..., m], nondecreasing: rises by one at each valid entry
    # as count (batched under vmap): an unbatched one would be expanded over the batch, which searchsorted copies
    wanted = count.new_zeros(*count.shape[:-1], k) + torch.arange(1, k + 1, device=valid.device)
    index = torch.searchsorted(count, wanted)  # [..., k] the first entry whose count reaches slot + 1
    filled = index < valid.shape[-1]
    index = torch.where(filled, index, 0)  # unfilled slots read entry 0
    out = [filled]
    for v in values:
        if v.dim() == valid.dim():
            out.append(torch.take_along_dim(v, index, -1))
        else:
            out.append(torch.take_along_dim(v, index[..., None], -2))
    return tuple(out)


def make_frame(normal: Tensor, tangent: Tensor) -> Tensor:
    """Contact frame [..., 3, 3] with rows normal, tangent, normal x tangent (mju_makeFrame).

    The normal is normalised; a tangent shorter than 0.5 is replaced by (0, 1, 0),
    or (0, 0, 1) when the normal is within 60 degrees of the y axis; the tangent
    is then made orthogonal to the normal and normalised.
    """
    x = normalize(normal)[0]
    unit = torch.eye(3, dtype=normal.dtype, device=normal.device)
    default = torch.where((x[..., 1:2] < 0.5) & (x[..., 1:2] > -0.5), unit[1], unit[2])
    y = torch.where(dot(tangent, tangent)[..., None] < 0.25, default, tangent)
    y = normalize(y - x * dot(x, y)[..., None])[0]
    return torch.stack((x, y, cross(x, y)), -2)


class HFieldShape(NamedTuple):
    """A heightfield's grid, and the cells under a geom to collide (see ``hfield.py``)."""

    height: Tensor  # [n, R, C] elevation of each grid point (hfield_data x size[2]), zero past the grid
    size: Tensor  # [n, 4] hfield_size: half extents x, y, top z, base depth
    grid: Tensor  # [n, 2] long: rows, columns of the grid
    cells: Tensor  # [n, K, 2] long: offsets (row, column) of the candidate cells from the geom's first cell


class HFieldPose(NamedTuple):
    """Heightfield geoms in world coordinates, with their grids: what pair functions get for an hfield."""

    pose: GeomPose
    shape: HFieldShape
