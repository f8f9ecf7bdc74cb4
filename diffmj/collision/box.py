"""Box-box narrow phase (MuJoCo's mjc_BoxBox in engine_collision_box.c).

Two stages, as in C:

1. Separating-axis test over the 15 candidate axes (3 face normals of each
   box, 9 edge-edge cross products). Any axis separating the boxes by more
   than the margin (plus rounding slack) means no contact. The axis of
   largest separation wins, faces preferred over edges on near-ties.
2. Manifold. Edge axis: one contact at the midpoint of the closest points of
   the two supporting edges. Face axis: the incident box's face most opposed
   to the reference face is clipped against the reference face's four side
   planes (Sutherland-Hodgman); every clipped vertex within the margin becomes
   a contact, dropping near-duplicates.

Vectorised with fixed shapes: the polygon lives in a fixed-capacity vertex
buffer whose valid vertices are kept at the front (``compact``), and every
sequential C loop whose outcome depends on earlier iterations is an unrolled
loop of ``torch.where`` updates.
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffmj.collision.common import (
    Candidates, GeomPose, axis_onehot, compact, make_candidates, plus_minus, select, take,
)
from diffmj.math import MINVAL, dot, mat_t_vec, mat_vec

EDGEBIAS = 1e-6  # mjBOXBOX_EDGEBIAS: relative penalty on edge axes at near-ties with faces
MAXVERT = 12  # mjBOXBOX_MAXVERT: vertex capacity of the clipped polygon
MAXCONTACT = 8  # mj_maxContact for box-box

# Rounding scales (mjBOXBOX_*), for double and single precision:
# slack on separation tests (times the summed half-sizes), sin^2 below which an edge-cross
# axis is noise, axis component below which a support corner is ambiguous, squared relative
# radius for deduplicating clipped vertices.
_EPS = {
    torch.float64: dict(sep=1e-13, par=1e-16, sgn=1e-9, dup=1e-14),
    torch.float32: dict(sep=1e-6, par=1e-7, sgn=1e-5, dup=1e-10),
}


def _clip(
    poly: Tensor, count: Tensor, coord: int, sign: float, limit: Tensor, capacity: int
) -> tuple[Tensor, Tensor]:
    """Clip a polygon to sign * v[coord] <= limit (clipHalfPlane).

    poly [..., m, 3] with its ``count`` [...] valid vertices first, in winding
    order; returns the clipped polygon [..., capacity, 3] and its count. Each
    vertex inside is kept, followed by the intersection of its outgoing edge
    with the plane when that edge strictly crosses it.
    """
    m = poly.shape[-2]
    k = torch.arange(m, device=poly.device)
    valid = k < count[..., None]
    following = torch.where(k + 1 == count[..., None], 0, k + 1)  # cyclic successor
    d = sign * poly[..., coord] - limit[..., None]
    d_next = torch.take_along_dim(d, following, -1)
    p_next = torch.take_along_dim(poly, following[..., None], -2)
    keep = valid & (d <= 0)
    crosses = valid & (((d < 0) & (d_next > 0)) | ((d > 0) & (d_next < 0)))
    t = d / torch.where(crosses, d - d_next, 1.0)
    cut = poly + t[..., None] * (p_next - poly)
    emitted = torch.stack((keep, crosses), -1).flatten(-2)  # [..., 2m]: vertex, then its cut
    vertices = torch.stack((poly, cut), -2).flatten(-3, -2)
    new_valid, new_poly = compact(emitted, capacity, vertices)
    return new_poly, new_valid.sum(-1)


def box_box(box1: GeomPose, box2: GeomPose, margin: Tensor) -> Candidates:
    """mjc_BoxBox, k = 8. Shapes as in ``primitive.py``: [n, 3], [n, 3, 3], margin [n]."""
    dtype, device = box1.pos.dtype, box1.pos.device
    eps = _EPS.get(dtype, _EPS[torch.float32])
    size1, size2 = box1.size, box2.size
    mat1, mat2 = box1.mat, box2.mat
    arange3 = torch.arange(3, device=device)
    next1, next2 = (arange3 + 1) % 3, (arange3 + 2) % 3

    # rot: box2 axes in box1 frame (columns); pos21 / pos12: each centre in the other's frame
    pos21 = mat_t_vec(mat1, box2.pos - box1.pos)
    pos12 = mat_t_vec(mat2, box1.pos - box2.pos)
    rot = dot(mat1.transpose(-1, -2)[..., :, None, :], mat2.transpose(-1, -2)[..., None, :, :])
    rotabs = rot.abs()

    # ------------------------------------------------------------ stage 1: separating axes
    septol = margin + eps["sep"] * (size1.sum(-1) + size2.sum(-1))
    radius2 = dot(rotabs, size2[..., None, :])
    radius1 = dot(rotabs.transpose(-1, -2), size1[..., None, :])
    face_sep = torch.cat((pos21.abs() - size1 - radius2, pos12.abs() - size2 - radius1), -1)
    code_face = face_sep.argmax(-1)  # 0..2 face of box1, 3..5 face of box2 (first maximum)
    sep_face = take(face_sep, code_face)

    # edge axis (i, j) = e_i x (column j of rot), in box1 frame: components (i1, i2) = (ax1, ax2)
    rot_i1 = rot[..., next1, :]  # [i, j] -> rot[i1, j]
    rot_i2 = rot[..., next2, :]
    ax1, ax2 = -rot_i2, rot_i1
    norm2 = ax1 * ax1 + ax2 * ax2
    edge_ok = norm2 >= eps["par"]  # nearly parallel edges: covered by the face axes
    inv = 1 / torch.sqrt(torch.where(edge_ok, norm2, 1.0))
    ax1, ax2 = ax1 * inv, ax2 * inv
    edge_radius1 = size1[..., next1, None] * ax1.abs() + size1[..., next2, None] * ax2.abs()
    a2_1 = ax1 * rot_i1[..., next1] + ax2 * rot_i2[..., next1]
    a2_2 = ax1 * rot_i1[..., next2] + ax2 * rot_i2[..., next2]
    edge_radius2 = size2[..., None, next1] * a2_1.abs() + size2[..., None, next2] * a2_2.abs()
    centre = ax1 * pos21[..., next1, None] + ax2 * pos21[..., next2, None]
    edge_sep = (centre.abs() - edge_radius1 - edge_radius2).flatten(-2)  # [..., 9], i-major
    edge_ok = edge_ok.flatten(-2)

    separated = (face_sep > septol[..., None]).any(-1) | (
        edge_ok & (edge_sep > septol[..., None])
    ).any(-1)

    # edges must beat the running best by a bias-scaled amount and the best face outright
    sep_best, code = sep_face, code_face
    for e in range(9):
        sep = edge_sep[..., e]
        better = edge_ok[..., e] & (sep - EDGEBIAS * sep.abs() > sep_best) & (sep > sep_face)
        sep_best = torch.where(better, sep, sep_best)
        code = torch.where(better, 6 + e, code)

    # unit edge axes as 3-vectors [..., 9, 3], and the winner's
    unit1 = (next1[:, None] == arange3).to(dtype)  # [i, c]: c == i1
    unit2 = (next2[:, None] == arange3).to(dtype)
    edge_axes = ax1[..., None] * unit1[:, None, :] + ax2[..., None] * unit2[:, None, :]
    edge_axes = edge_axes.flatten(-3, -2)
    edge_index = (code - 6).clamp(min=0)
    axis = torch.take_along_dim(edge_axes, edge_index[..., None, None], -2)[..., 0, :]

    # an edge axis within ~8 degrees of the best face axis yields to it unless 5% deeper
    face_dot = take(torch.cat((axis, mat_t_vec(rot, axis)), -1), code_face).abs()
    yields = (code >= 6) & (face_dot > 0.99)
    yields = yields & (sep_best < sep_face + 0.05 * sep_face.abs() + MINVAL)
    code = torch.where(yields, code_face, code)

    is_edge = code >= 6
    edge = _edge_contact(box1, size2, rot, pos21, axis, edge_index, septol, eps["sgn"])
    face = _face_contacts(box1, box2, rot, pos21, pos12, code % 3, code < 3, margin, eps["dup"])
    valid, dist, pos, normal = select(is_edge, edge, face)
    return make_candidates(valid & ~separated[..., None], dist, pos, normal)


def _edge_contact(
    box1: GeomPose, size2: Tensor, rot: Tensor, pos21: Tensor, axis: Tensor, edge: Tensor,
    septol: Tensor, ambiguous: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Stage 2a: one contact between the supporting edges of the winning edge axis.

    Returns (valid, dist, pos, normal) laid out as k = 8 slots, only slot 0 usable.
    ``axis`` [..., 3] is the unit edge axis e_i x rot[:, j] in box1's frame, ``edge`` = 3i + j.
    """
    dtype = axis.dtype
    size1 = box1.size
    i, j = edge // 3, edge % 3
    axis = torch.where(dot(axis, pos21)[..., None] < 0, -axis, axis)  # from box1 towards box2
    a2 = mat_t_vec(rot, axis)  # the axis in box2's frame

    # supporting corners: box1's along +axis, box2's along -axis, at coordinate 0 along the edge
    on_i = axis_onehot(i, dtype).bool()
    on_j = axis_onehot(j, dtype).bool()
    c1 = torch.where(on_i, 0.0, torch.where(axis >= 0, size1, -size1))
    cc = torch.where(on_j, 0.0, torch.where(a2 >= 0, -size2, size2))

    # a near-zero axis component makes the corner sign arbitrary: try both signs (at most one
    # such component per box), in C's order (box1 flip outer, box2 flip inner)
    def ambiguous_axis(v: Tensor, k: Tensor) -> Tensor:
        k1, k2 = (k + 1) % 3, (k + 2) % 3
        return torch.where(take(v, k1).abs() < ambiguous, k1,
                           torch.where(take(v, k2).abs() < ambiguous, k2, -1))

    amb1, amb2 = ambiguous_axis(axis, i), ambiguous_axis(a2, j)
    flip1 = torch.tensor([False, False, True, True], device=axis.device)
    flip2 = torch.tensor([False, True, False, True], device=axis.device)
    arange3 = torch.arange(3, device=axis.device)
    c1 = c1[..., None, :]
    c1 = torch.where(flip1[:, None] & (arange3 == amb1[..., None, None]), -c1, c1)  # [..., 4, 3]
    cc = cc[..., None, :]
    cc = torch.where(flip2[:, None] & (arange3 == amb2[..., None, None]), -cc, cc)
    variant_ok = (~flip1 | (amb1[..., None] >= 0)) & (~flip2 | (amb2[..., None] >= 0))
    c2 = mat_vec(rot[..., None, :, :], cc) + pos21[..., None, :]

    # closest points of the edge segments c1 + s e_i and c2 + t d2, each clamp re-solving the other
    d2 = torch.take_along_dim(rot, j[..., None, None], -1)[..., 0]  # column j of rot
    b = take(d2, i)[..., None]
    denom = 1 - b * b
    e = c2 - c1
    d1e = take(e, i[..., None])
    d2e = dot(d2[..., None, :], e)
    parallel = denom < MINVAL
    s = torch.where(parallel, 0.0, (d1e - b * d2e) / torch.where(parallel, 1.0, denom))
    lim1 = take(size1, i)[..., None]
    lim2 = take(size2, j)[..., None]
    s = torch.clamp(s, -lim1, lim1)
    t = torch.clamp(b * s - d2e, -lim2, lim2)
    s = torch.clamp(d1e + b * t, -lim1, lim1)
    p1 = c1 + on_i[..., None, :].to(dtype) * s[..., None]
    p2 = c2 + d2[..., None, :] * t[..., None]
    gap = p2 - p1
    best = torch.where(variant_ok, dot(gap, gap), torch.inf).argmin(-1)
    w1 = torch.take_along_dim(p1, best[..., None, None], -2)[..., 0, :]
    w2 = torch.take_along_dim(p2, best[..., None, None], -2)[..., 0, :]

    dist = dot(w2 - w1, axis)
    pos = mat_vec(box1.mat, 0.5 * (w1 + w2)) + box1.pos
    normal = mat_vec(box1.mat, axis)
    slots = (*dist.shape, MAXCONTACT)
    valid = (dist <= septol)[..., None] & (torch.arange(MAXCONTACT, device=dist.device) == 0)
    return (valid, dist[..., None].expand(slots), pos[..., None, :].expand(*slots, 3),
            normal[..., None, :].expand(*slots, 3))


def _face_contacts(
    box1: GeomPose, box2: GeomPose, rot: Tensor, pos21: Tensor, pos12: Tensor, a: Tensor,
    ref1: Tensor, margin: Tensor, duplicate: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Stage 2b: clip the incident face against the reference face ``a`` of box1 (``ref1``) or box2.

    Returns (valid, dist, pos, normal) with k = 8 slots.
    """
    dtype = rot.dtype
    r = ref1[..., None]
    size_ref = torch.where(r, box1.size, box2.size)
    size_inc = torch.where(r, box2.size, box1.size)
    pos_ref = torch.where(r, box1.pos, box2.pos)
    mat_ref = torch.where(r[..., None], box1.mat, box2.mat)
    pos_inc = torch.where(r, pos21, pos12)  # incident centre in the reference frame
    rinc = torch.where(r[..., None], rot, rot.transpose(-1, -2))  # incident axes (columns)

    # face side of the incident box, and its face most opposed to the reference normal
    sgn = plus_minus(take(pos_inc, a) >= 0, dtype)
    row = torch.take_along_dim(rinc, a[..., None, None], -2)[..., 0, :]
    binc = row.abs().argmax(-1)
    tinc = plus_minus(~(sgn * take(row, binc) > 0), dtype)

    # incident face centre and half-edges in (x, y, z) = reference axes (a+1, a+2, a), z being
    # the height above the reference face (negative inside)
    ref_axes = torch.stack(((a + 1) % 3, (a + 2) % 3, a), -1)
    inc_axes = torch.stack((binc, (binc + 1) % 3, (binc + 2) % 3), -1)
    rows = torch.take_along_dim(rinc, ref_axes[..., :, None], -2)
    proj = torch.take_along_dim(rows, inc_axes[..., None, :], -1)  # [r, q] = rinc[ref r, inc q]
    half = torch.take_along_dim(size_inc, inc_axes, -1)
    cx = torch.take_along_dim(pos_inc, ref_axes, -1)
    cx = cx + (tinc * half[..., 0])[..., None] * proj[..., 0]
    du = half[..., 1:2] * proj[..., 1]
    dv = half[..., 2:3] * proj[..., 2]
    is_z = torch.arange(3, device=a.device) == 2
    size_a = take(size_ref, a)
    cx = torch.where(is_z, sgn[..., None] * cx - size_a[..., None], cx)
    du = torch.where(is_z, du * sgn[..., None], du)
    dv = torch.where(is_z, dv * sgn[..., None], dv)
    su = rot.new_tensor([1.0, -1.0, -1.0, 1.0])[:, None]
    sv = rot.new_tensor([1.0, 1.0, -1.0, -1.0])[:, None]
    poly = cx[..., None, :] + su * du[..., None, :] + sv * dv[..., None, :]  # [..., 4, 3]

    # clip against the reference face's side planes |x| <= size_x, |y| <= size_y
    size_x, size_y = size_ref.take_along_dim(ref_axes[..., :2], -1).unbind(-1)
    count = torch.full_like(a, 4)
    for coord, sign, limit, capacity in (
        (0, 1.0, size_x, 8), (0, -1.0, size_x, MAXVERT), (1, 1.0, size_y, MAXVERT),
        (1, -1.0, size_y, MAXVERT),
    ):
        poly, count = _clip(poly, count, coord, sign, limit, capacity)

    # accept vertices within the margin, dropping near-duplicates of earlier accepted ones
    x, y, z = poly.unbind(-1)
    candidate = torch.arange(MAXVERT, device=a.device) < count[..., None]
    candidate = candidate & (z <= margin[..., None])
    dx = x[..., :, None] - x[..., None, :]
    dy = y[..., :, None] - y[..., None, :]
    close = dx * dx + dy * dy < (duplicate * (size_x * size_x + size_y * size_y))[..., None, None]
    accepted = candidate[..., :1]
    for k in range(1, MAXVERT):
        duplicate_k = (accepted & close[..., :k, k]).any(-1, keepdim=True)
        accepted = torch.cat((accepted, candidate[..., k : k + 1] & ~duplicate_k), -1)

    # contact midway between the reference face and the incident surface, normal from box1 to box2
    height = sgn[..., None] * (size_a[..., None] + 0.5 * z)
    local = (x[..., None] * axis_onehot(ref_axes[..., 0], dtype)[..., None, :]
             + y[..., None] * axis_onehot(ref_axes[..., 1], dtype)[..., None, :]
             + height[..., None] * axis_onehot(a, dtype)[..., None, :])
    pos = mat_vec(mat_ref[..., None, :, :], local) + pos_ref[..., None, :]
    normal = torch.where(ref1, sgn, -sgn)[..., None] * torch.take_along_dim(
        mat_ref, a[..., None, None], -1)[..., 0]
    valid, dist, pos = compact(accepted, MAXCONTACT, z, pos)
    return valid, dist, pos, normal[..., None, :].expand_as(pos)
