"""Narrow phase for the pairs MuJoCo sends to ``mjc_Convex`` (general convex collision).

Sphere-ellipsoid, capsule-ellipsoid, ellipsoid-ellipsoid, capsule-cylinder,
ellipsoid-cylinder, cylinder-cylinder, ellipsoid-box and cylinder-box.

MuJoCo computes these with GJK / EPA (``mjc_ccd``): the signed distance of
the two geoms (inflated by half the margin each), the normal and a pair of
witness points, each to within ``opt.ccd_tolerance``. Two parts here:

1. **The contact** (``_penetration``). Both geoms are described by their
   support functions, each a sum of terms: a point (the centre), a ball
   (sphere, capsule radius), segments ``w |u.d|`` (capsule axis, cylinder
   axis, box axes), a disk ``r |P u|`` (cylinder caps) and an ellipsoid
   ``|S R^T u|``. The signed distance is ``sd = -min_{|u|=1} f(u)`` with
   ``f(u) = h1(u) + h2(-u)``, the support function of the Minkowski
   difference, minimised at the contact normal ``u`` (pointing from geom1 to
   geom2). ``f`` is minimised by Newton's method on the unit sphere, from the
   best of a fixed set of directions: first on ``f`` with every kink
   ``|x|`` smoothed to ``sqrt(x^2 + eps^2)`` for a decreasing sequence of
   ``eps``, then on the exact ``f`` with the kinks the solution sits on
   (an edge, a face, a cap) held as constraints ``u.d = 0``. The result is
   exact to rounding, not to a tolerance, so it differs from MuJoCo's EPA by
   MuJoCo's own error (about 1e-6 in distance, 1e-3 in normal and position
   for curved contacts with the default ``ccd_tolerance``). All iterations run
   without gradient, in float64 whatever the input dtype; a final Newton step
   from the converged point carries the gradient (the implicit-function-theorem
   derivative of the optimality condition).

2. **Extra contacts for flat features** (``_multicontact``), MuJoCo 4's
   ``mjc_multicontact`` (multi-CCD), for capsule-cylinder (up to 2 contacts),
   cylinder-cylinder and cylinder-box (up to 4). When a face of one geom is
   within ~5 degrees of antiparallel to a face of the other (a box face or a
   cylinder cap, the latter as a 16-gon), or an edge (a box edge, a capsule or
   cylinder side line) is within ~5 degrees of parallel to a face, the
   contacting polygon is clipped against the other face, and the clipped
   vertices within the margin become the contacts (reduced to the largest
   quadrilateral when more than 4). MuJoCo picks the features from the EPA
   polytope's last face; here they come from the exact contact (which box
   corner, edge or face supports it, which cylinder cap or side line). The
   clipping is a line-by-line port, so with the same features the contacts
   agree to rounding.

Shapes: ``n`` pairs, positions [n, 3], rotation matrices [n, 3, 3], sizes
[n, 3], margin [n], as in ``primitive.py``; or a single pair without the
leading dim (as under ``torch.vmap`` over the pairs).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from diffmj import workarounds
from diffmj.collision.common import Candidates, GeomPose, compact, make_candidates
from diffmj.enums import GeomType
from diffmj.math import MINVAL, cross, dot, mat_t_vec, normalize

# ---------------------------------------------------------------- support functions


class _Terms(NamedTuple):
    """Support function of one geom, or of the difference of two, as a sum of terms.

    ``h(u) = center.u + ball |u| + sum_k seg_len_k |u.seg_dir_k|
    + sum_k disk_radius_k |u - (u.disk_axis_k) disk_axis_k| + sum_k |ell_size_k * ell_mat_k^T u|``.
    ``owner`` (static) tells, for every segment, disk and ellipsoid term, whether it
    belongs to geom 1 (0) or geom 2 (1).
    """

    center: Tensor  # [n, 3]
    ball: Tensor  # [n]
    seg_dir: Tensor  # [n, S, 3] unit
    seg_len: Tensor  # [n, S]
    disk_axis: Tensor  # [n, K, 3] unit
    disk_radius: Tensor  # [n, K]
    ell_mat: Tensor  # [n, E, 3, 3]
    ell_size: Tensor  # [n, E, 3]
    seg_owner: tuple[int, ...]
    disk_owner: tuple[int, ...]
    ell_owner: tuple[int, ...]


def _geom_terms(kind: GeomType, geom: GeomPose) -> _Terms:
    """Support function terms of one geom of type ``kind`` (all owned by geom 1)."""
    pos, mat, size = geom.pos, geom.mat, geom.size
    batch = pos.shape[:-1]
    none3, none = pos.new_zeros(*batch, 0, 3), pos.new_zeros(*batch, 0)
    axis = mat[..., None, :, 2]
    ball = size[..., 0] * 0
    seg_dir, seg_len, disk_axis, disk_radius = none3, none, none3, none
    ell_mat, ell_size = pos.new_zeros(*batch, 0, 3, 3), none3
    if kind == GeomType.SPHERE:
        ball = size[..., 0]
    elif kind == GeomType.CAPSULE:
        ball, seg_dir, seg_len = size[..., 0], axis, size[..., 1:2]
    elif kind == GeomType.CYLINDER:
        seg_dir, seg_len, disk_axis, disk_radius = axis, size[..., 1:2], axis, size[..., 0:1]
    elif kind == GeomType.BOX:
        seg_dir, seg_len = mat.transpose(-1, -2), size
    elif kind == GeomType.ELLIPSOID:
        ell_mat, ell_size = mat[..., None, :, :], size[..., None, :]
    return _Terms(pos, ball, seg_dir, seg_len, disk_axis, disk_radius, ell_mat, ell_size,
                  (0,) * seg_dir.shape[-2], (0,) * disk_axis.shape[-2], (0,) * ell_mat.shape[-3])


def _difference(t1: _Terms, t2: _Terms) -> _Terms:
    """Terms of f(u) = h1(u) + h2(-u): every term but the centre is even in u."""
    return _Terms(
        t1.center - t2.center,
        t1.ball + t2.ball,
        torch.cat((t1.seg_dir, t2.seg_dir), -2),
        torch.cat((t1.seg_len, t2.seg_len), -1),
        torch.cat((t1.disk_axis, t2.disk_axis), -2),
        torch.cat((t1.disk_radius, t2.disk_radius), -1),
        torch.cat((t1.ell_mat, t2.ell_mat), -3),
        torch.cat((t1.ell_size, t2.ell_size), -2),
        (0,) * len(t1.seg_owner) + (1,) * len(t2.seg_owner),
        (0,) * len(t1.disk_owner) + (1,) * len(t2.disk_owner),
        (0,) * len(t1.ell_owner) + (1,) * len(t2.ell_owner),
    )


def _repeat(terms: _Terms, k: int) -> _Terms:
    """Every tensor of ``terms`` [n, ...] repeated k times: [n * k, ...] (pair-major)."""
    return terms._replace(**{
        name: torch.repeat_interleave(getattr(terms, name), k, dim=0)
        for name in _Terms._fields if isinstance(getattr(terms, name), Tensor)
    })


def _perpendiculars(axis: Tensor) -> tuple[Tensor, Tensor]:
    """Two unit vectors [..., 3] orthogonal to the unit ``axis`` [..., 3] and to each other."""
    helper = torch.where((axis[..., :1].abs() < 0.6), axis.new_tensor([1.0, 0, 0]), axis.new_tensor([0, 1.0, 0]))
    e1 = normalize(cross(axis, helper))[0]
    return e1, cross(axis, e1)


def _sqrt(x: Tensor) -> Tensor:
    """sqrt with gradient 0 (not inf) at 0."""
    positive = x > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, x, 1.0)), 0.0)


def _kinks(t: _Terms, u: Tensor) -> tuple[Tensor, Tensor]:
    """x = u.d [n, S] of every segment term and |P u| [n, K] of every disk term."""
    x = (t.seg_dir * u[..., None, :]).sum(-1)
    pu = u[..., None, :] - (t.disk_axis * u[..., None, :]).sum(-1, keepdim=True) * t.disk_axis
    return x, _sqrt((pu * pu).sum(-1))


def _value(t: _Terms, u: Tensor) -> Tensor:
    """f(u) [...] at unit vectors u [..., 3]; the terms broadcast against u's leading dims."""
    x, rho = _kinks(t, u)
    y = (t.ell_mat * u[..., None, :, None]).sum(-2)
    return (dot(t.center, u) + t.ball + (t.seg_len * x.abs()).sum(-1) + (t.disk_radius * rho).sum(-1)
            + torch.sqrt((t.ell_size**2 * y * y).sum(-1)).sum(-1))


def _evaluate(t: _Terms, u: Tensor, seg_act: Tensor, disk_act: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """f [n], its gradient [n, 3] and Hessian [n, 3, 3] in R^3 at unit vectors u [n, 3].

    The segment / disk terms marked active ([n, S] / [n, K] bool) are left out: they sit
    at their kink (zero), which the caller holds as a constraint.
    """
    eye = torch.eye(3, dtype=u.dtype, device=u.device)
    f = dot(t.center, u) + t.ball
    g = t.center + t.ball[..., None] * u
    h = t.ball[..., None, None] * (eye - u[..., :, None] * u[..., None, :])

    x, rho = _kinks(t, u)
    w = torch.where(seg_act, 0.0, t.seg_len)  # segments w |u.d|: linear off the kink
    f = f + (w * x.abs()).sum(-1)
    g = g + ((w * torch.sign(x))[..., None] * t.seg_dir).sum(-2)

    a = t.disk_axis  # disks r |P u|, P = I - a a^T
    pu = u[..., None, :] - (a * u[..., None, :]).sum(-1, keepdim=True) * a
    off = ~disk_act & (rho > 0)
    r = torch.where(off, t.disk_radius, 0.0)
    s = torch.where(off, rho, 1.0)
    f = f + (r * rho).sum(-1)
    g = g + ((r / s)[..., None] * pu).sum(-2)
    h = h + ((r / s)[..., None, None] * (eye - a[..., :, None] * a[..., None, :])
             - (r / s**3)[..., None, None] * pu[..., :, None] * pu[..., None, :]).sum(-3)

    y = (t.ell_mat * u[..., None, :, None]).sum(-2)  # ellipsoids |S R^T u|
    q = torch.sqrt((t.ell_size**2 * y * y).sum(-1))
    grad = (t.ell_mat * (t.ell_size**2 * y)[..., None, :]).sum(-1) / q[..., None]  # R S^2 y / q
    rs2r = (t.ell_mat * (t.ell_size**2)[..., None, :]) @ t.ell_mat.transpose(-1, -2)
    f = f + q.sum(-1)
    g = g + grad.sum(-2)
    h = h + ((rs2r - grad[..., :, None] * grad[..., None, :]) / q[..., None, None]).sum(-3)
    return f, g, h


# ---------------------------------------------------------------- Newton's method on the sphere

_ITERATIONS = 24  # active-set Newton iterations
_MAX_STEP = 0.5  # largest Newton step (radians)
_ZERO = 1e-12  # |u.d| or |P u| below which a kink is active
_STARTS = 3  # independent runs from different initial directions
_STALLED = 1e-9  # trust radius below which Newton has stalled
_NEAR = 1e-6  # |u.d| or |P u| below which a stalled u is moved onto the kink


def fibonacci_directions(k: int) -> list[list[float]]:
    """k nearly uniform unit vectors (a spherical Fibonacci lattice)."""
    golden = math.pi * (3 - math.sqrt(5))
    out = []
    for i in range(k):
        z = 1 - (2 * i + 1) / k
        r = math.sqrt(1 - z * z)
        out.append([r * math.cos(golden * i), r * math.sin(golden * i), z])
    return out


_LATTICE = workarounds.Literal.of(fibonacci_directions(40))
_CIRCLE = 24  # samples on each segment kink's great circle


def _constraints(t: _Terms) -> Tensor:
    """Directions c [n, J, 3] of the kinks u.c = 0: segment axes, then two per disk (its plane)."""
    e1, e2 = _perpendiculars(t.disk_axis)
    return torch.cat((t.seg_dir, torch.stack((e1, e2), -2).flatten(-3, -2)), -2)


def _active_constraints(seg_act: Tensor, disk_act: Tensor) -> Tensor:
    """Active mask [n, J] of the rows of ``_constraints``."""
    return torch.cat((seg_act, disk_act.repeat_interleave(2, -1)), -1)


def _feasible_basis(u: Tensor, cons: Tensor, active: Tensor):
    """Orthonormal directions along which u may move while keeping every active kink.

    Returns (b1, b2, rank, r1, r2): b1, b2 [n, 3] span the feasible tangent space (zero
    columns where it has lower dimension), rank [n] the number of independent active
    constraints (0, 1, 2), r1, r2 [n, 3] the first two independent constraint directions.
    """
    t1, t2 = _perpendiculars(u)
    rank = torch.zeros(u.shape[:-1], dtype=torch.long, device=u.device)
    q1 = torch.zeros_like(u)
    r1, r2 = torch.zeros_like(u), torch.zeros_like(u)
    for j in range(cons.shape[-2]):
        c = cons[..., j, :]
        c = c - dot(c, u)[..., None] * u
        c = c - dot(c, q1)[..., None] * q1
        length = _sqrt(dot(c, c))
        new = active[..., j] & (length > 1e-6) & (rank < 2)
        first = (new & (rank == 0))[..., None]
        q1 = torch.where(first, c / torch.where(first, length[..., None], 1.0), q1)
        r1 = torch.where(first, cons[..., j, :], r1)
        r2 = torch.where((new & (rank == 1))[..., None], cons[..., j, :], r2)
        rank = rank + new.long()
    along = normalize(cross(u, q1))[0]
    b1 = torch.where((rank == 0)[..., None], t1, torch.where((rank == 1)[..., None], along, 0.0))
    b2 = torch.where((rank == 0)[..., None], t2, 0.0)
    return b1, b2, rank, r1, r2


def _nearest(line: Tensor, u: Tensor) -> Tensor:
    """+-line (unit) [..., 3], the sign that is nearer to u."""
    return torch.where((dot(line, u) < 0)[..., None], -line, line)


def _project(u: Tensor, rank: Tensor, r1: Tensor, r2: Tensor) -> Tensor:
    """u moved onto the active kinks: u.r1 = 0 (rank 1), u = +-r1 x r2 (rank 2)."""
    on_plane = normalize(u - dot(u, r1)[..., None] * r1)[0]
    on_line = _nearest(normalize(cross(r1, r2))[0], u)
    return torch.where((rank == 1)[..., None], on_plane, torch.where((rank == 2)[..., None], on_line, u))


def _newton_step(u: Tensor, g: Tensor, h: Tensor, b1: Tensor, b2: Tensor, radius: Tensor) -> Tensor:
    """A Newton step for min f on the unit sphere within span(b1, b2), at most ``radius`` long.

    The Riemannian Hessian B^T (H - (u.g) I) B is shifted (Levenberg-Marquardt) where it is
    not positive enough for the step to stay within the radius [n]. Returns the new unit u.
    """
    basis = torch.stack((b1, b2), -1)  # [n, 3, 2]
    eye3 = torch.eye(3, dtype=u.dtype, device=u.device)
    hr = basis.transpose(-1, -2) @ (h - dot(u, g)[..., None, None] * eye3) @ basis
    unused = (basis * basis).sum(-2) == 0  # [n, 2]
    hr = hr + torch.diag_embed(unused.to(u.dtype))
    gr = (basis.transpose(-1, -2) @ g[..., None])[..., 0]
    a, b, d = hr[..., 0, 0], hr[..., 0, 1], hr[..., 1, 1]
    lowest = 0.5 * (a + d) - _sqrt(0.25 * (a - d) ** 2 + b * b)
    shift = torch.relu(_sqrt((gr * gr).sum(-1)) / radius - lowest)
    a, d = a + shift, d + shift
    det = a * d - b * b
    det = torch.where(det > 0, det, 1.0)
    s1 = -(d * gr[..., 0] - b * gr[..., 1]) / det
    s2 = -(a * gr[..., 1] - b * gr[..., 0]) / det
    return normalize(u + s1[..., None] * b1 + s2[..., None] * b2)[0]


def _multipliers(u: Tensor, g_free: Tensor, cons: Tensor, active: Tensor) -> Tensor:
    """Weights mu [n, J] of the active kink directions balancing the free gradient's tangential part.

    At the optimum grad f = f u: P_T g_free + sum_j mu_j c_j = 0 (c_j tangent). The
    minimum-norm solution is taken where the active kinks are redundant (non-unique witnesses).
    """
    c = cons * active[..., None].to(u.dtype)
    target = -(g_free - dot(g_free, u)[..., None] * u)
    gram = c.transpose(-1, -2) @ c  # [n, 3, 3]
    eye = torch.eye(3, dtype=u.dtype, device=u.device)
    regularise = max(1e-12, 100 * torch.finfo(u.dtype).eps)  # stays nonsingular in float32
    y = torch.linalg.solve(gram + regularise * eye, target)
    return (c * y[..., None, :]).sum(-1)


def _initial_directions(t: _Terms, count: int) -> Tensor:
    """``count`` starting directions [n, count, 3]: the best of a fixed set (a lattice, the
    centre line, the axes and their pairwise normals), each at least 30 degrees from the others."""
    lattice = _LATTICE.tensor(t.center.dtype, t.center.device).expand(*t.center.shape[:-1], -1, -1)
    axes = torch.cat((t.seg_dir, t.disk_axis, t.ell_mat.transpose(-1, -2).flatten(-3, -2)), -2)
    pairs = [cross(t.seg_dir[..., i, :], t.seg_dir[..., j, :])
             for i in range(t.seg_dir.shape[-2]) for j in range(i)]
    axes = torch.cat((axes, *(normalize(p)[0][..., None, :] for p in pairs)), -2)
    line = normalize(-t.center)[0][..., None, :]
    # f is often least on a kink (an edge or side contact): sample every segment kink's circle
    angle = torch.arange(_CIRCLE, dtype=t.center.dtype, device=t.center.device) * (2 * math.pi / _CIRCLE)
    e1, e2 = _perpendiculars(t.seg_dir)
    circles = (torch.cos(angle)[:, None] * e1[..., None, :] + torch.sin(angle)[:, None] * e2[..., None, :])
    cand = torch.cat((line, axes, -axes, lattice, circles.flatten(-3, -2)), -2)  # [n, C, 3]
    values = _value(_unsqueeze(t), cand)
    starts = []
    for _ in range(count):
        best = values.argmin(-1)
        start = torch.take_along_dim(cand, best[..., None, None], -2)[..., 0, :]
        starts.append(start)
        values = torch.where((cand * start[..., None, :]).sum(-1) > math.cos(math.pi / 6), torch.inf, values)
    return torch.stack(starts, -2)


def _unsqueeze(t: _Terms) -> _Terms:
    """Terms with a singleton dim after the batch dim, to broadcast against [n, C, 3] points."""
    return t._replace(**{name: getattr(t, name)[:, None] for name in _Terms._fields[:8]})


def _snaps(t: _Terms, u: Tensor, seg_act: Tensor, disk_act: Tensor, rank: Tensor, r1: Tensor):
    """Points on inactive kinks near u that keep the active ones.

    Returns candidates [n, C, 3] with the segment [n, C, S] and disk [n, C, K] kinks they
    add, and a validity mask [n, C]: onto one segment kink (rank 0, or crossing the active
    one at rank 1), onto two (a face normal, rank 0), onto a disk's axis (rank 0).
    """
    nseg, ndisk = t.seg_len.shape[-1], t.disk_radius.shape[-1]
    x, _ = _kinks(t, u)
    free = ~seg_act
    cand, add_seg, add_disk, valid = [], [], [], []

    def add(v, ok, segs=(), disk=-1):
        cand.append(v)
        add_seg.append([k in segs for k in range(nseg)])
        add_disk.append([k == disk for k in range(ndisk)])
        valid.append(ok)

    for k in range(nseg):
        d = t.seg_dir[..., k, :]
        plane = normalize(u - x[..., k, None] * d)[0]
        across, length = normalize(cross(r1, d))
        v = torch.where((rank == 0)[..., None], plane, _nearest(across, u))
        add(v, free[..., k] & ((rank == 0) | ((rank == 1) & (length > 1e-6))), (k,))
        for j in range(k):
            corner, length = normalize(cross(t.seg_dir[..., j, :], d))
            add(_nearest(corner, u), free[..., k] & free[..., j] & (rank == 0) & (length > 1e-6), (j, k))
    for k in range(ndisk):
        axis = t.disk_axis[..., k, :]
        keeps = (rank == 0) | ((rank == 1) & (dot(axis, r1).abs() < 1e-9))
        add(_nearest(axis, u), ~disk_act[..., k] & keeps, disk=k)
    if not cand:
        return u[..., None, :][..., :0, :], seg_act[..., None, :][..., :0, :], \
            disk_act[..., None, :][..., :0, :], seg_act[..., :0]
    shape = (*u.shape[:-1], len(cand))
    as_mask = lambda rows, width: workarounds.literal(rows, torch.bool, u.device).reshape(
        len(rows), width).expand(*shape, width)  # noqa: E731
    return (torch.stack(cand, -2), as_mask(add_seg, nseg), as_mask(add_disk, ndisk),
            torch.stack(valid, -1))


def _releases(t: _Terms, u: Tensor, g: Tensor, cons: Tensor, seg_act: Tensor, disk_act: Tensor):
    """Points just off each held kink, keeping the others: where f decreases, the kink is not optimal.

    For every held segment or disk, u is nudged by 1e-7 along the directions that keep the other
    held kinks: the whole tangent plane if none stay (probed along the direction the kink's
    weight points to and four axes), the line orthogonal to them if they leave one degree of
    freedom (both ways); and off all of them at once, in nine directions. Returns candidates [n, C, 3], their held masks [n, C, S], [n, C, K]
    and a validity mask [n, C].
    """
    nseg, ndisk = t.seg_len.shape[-1], t.disk_radius.shape[-1]
    ngroup = nseg + ndisk
    if not ngroup:
        return (u[..., None, :][..., :0, :], seg_act[..., None, :][..., :0, :], disk_act[..., None, :][..., :0, :],
                seg_act[..., :0])
    active = _active_constraints(seg_act, disk_act)
    mu = _multipliers(u, g, cons, active)
    t1, t2 = _perpendiculars(u)
    c2 = torch.stack((dot(cons, t1[..., None, :]), dot(cons, t2[..., None, :])), -1)  # [n, J, 2]
    rows = workarounds.literal([k for k in range(nseg)] + [nseg + k // 2 for k in range(2 * ndisk)], device=u.device)
    groups = torch.arange(ngroup, device=u.device)
    held = active[..., None, :] & (rows != groups[:, None])  # [n, G, J]: the other held kinks
    gram = (held[..., None, None] * c2[..., None, :, :, None] * c2[..., None, :, None, :]).sum(-3)
    a, b, d = gram[..., 0, 0], gram[..., 0, 1], gram[..., 1, 1]
    root = torch.sqrt(0.25 * (a - d) ** 2 + b * b)
    low, high = 0.5 * (a + d) - root, 0.5 * (a + d) + root
    rank = (high > 1e-12).long() + (low > 1e-12).long()
    v1, v2 = torch.stack((b, low - a), -1), torch.stack((low - d, b), -1)
    v = torch.where((dot2(v1) >= dot2(v2))[..., None], v1, v2)
    v = v / torch.sqrt(dot2(v)).clamp(min=1e-30)[..., None]
    line = v[..., :1] * t1[..., None, :] + v[..., 1:] * t2[..., None, :]  # [n, G, 3]
    # the direction the kink's weight says f decreases along
    e1, e2 = _perpendiculars(t.disk_axis)
    disk_mu = mu[..., nseg:].unflatten(-1, (-1, 2))
    off = torch.cat((torch.sign(mu[..., :nseg, None]) * t.seg_dir,
                     disk_mu[..., 0:1] * e1 + disk_mu[..., 1:2] * e2), -2)
    off = _normalize3(off - dot(off, u[..., None, :])[..., None] * u[..., None, :])
    free = torch.stack((off, t1[..., None, :].expand_as(off), -t1[..., None, :].expand_as(off),
                        t2[..., None, :].expand_as(off), -t2[..., None, :].expand_as(off)), -2)
    along = torch.stack((line, -line, line, line, line), -2)
    direction = torch.where((rank == 0)[..., None, None], free, along)  # [n, G, 5, 3]
    valid = (torch.cat((seg_act, disk_act), -1) & (rank < 2))[..., None] & \
        ((rank == 0)[..., None] | (torch.arange(5, device=u.device) < 2))
    # or leave all of them: along the descent direction of the free terms and eight compass directions
    descent = _normalize3(-(g - dot(g, u)[..., None] * u))
    s = math.sqrt(0.5)
    compass = [t1, -t1, t2, -t2, s * (t1 + t2), s * (t1 - t2), -s * (t1 + t2), s * (t2 - t1)]
    everything = torch.stack([descent] + compass, -2)
    cand = torch.cat((direction.flatten(-3, -2), everything), -2)
    cand = normalize(u[..., None, :] + 1e-7 * cand)[0]
    keep = torch.cat(((groups[:, None] != groups).repeat_interleave(5, 0),
                      torch.zeros(9, ngroup, dtype=torch.bool, device=u.device)))  # [G * 5 + 9, G]
    valid = torch.cat((valid.flatten(-2), (active.any(-1, keepdim=True)).expand(*u.shape[:-1], 9)), -1)
    return cand, seg_act[..., None, :] & keep[:, :nseg], disk_act[..., None, :] & keep[:, nseg:], valid


def dot2(x: Tensor) -> Tensor:
    """Squared length along the last dim."""
    return (x * x).sum(-1)


def _iterate(t: _Terms, cons: Tensor, u: Tensor, seg_act: Tensor, disk_act: Tensor, radius: Tensor):
    """One step of the active-set Newton method; returns the new (u, seg_act, disk_act, radius).

    Candidates: a Newton step within the held kinks; leaving one held kink (``_releases``);
    snapping onto kinks (``_snaps``). The best candidate is taken if it decreases the exact f,
    and kinks that u sits on are marked held.
    """
    _, g, h = _evaluate(t, u, seg_act, disk_act)
    active = _active_constraints(seg_act, disk_act)
    b1, b2, rank, r1, r2 = _feasible_basis(u, cons, active)
    trial = _project(_newton_step(u, g, h, b1, b2, radius), rank, r1, r2)
    off, off_seg, off_disk, off_ok = _releases(t, u, g, cons, seg_act, disk_act)
    snaps, add_seg, add_disk, snap_ok = _snaps(t, u, seg_act, disk_act, rank, r1)
    cand = torch.cat((trial[..., None, :], off, snaps), -2)
    cand_seg = torch.cat((seg_act[..., None, :], off_seg.expand(*off.shape[:-1], -1), seg_act[..., None, :] | add_seg), -2)
    cand_disk = torch.cat((disk_act[..., None, :], off_disk.expand(*off.shape[:-1], -1),
                           disk_act[..., None, :] | add_disk), -2)
    ok = torch.cat((torch.ones_like(u[..., :1], dtype=torch.bool), off_ok, snap_ok), -1)
    values = torch.where(ok, _value(_unsqueeze(t), cand), torch.inf)
    best = values.argmin(-1)
    current = _value(t, u)
    improved = torch.take_along_dim(values, best[..., None], -1)[..., 0] < current
    pick = lambda x: torch.take_along_dim(x, best[..., None, None], -2)[..., 0, :]  # noqa: E731
    u = torch.where(improved[..., None], pick(cand), u)
    seg_act = torch.where(improved[..., None], pick(cand_seg), seg_act)
    disk_act = torch.where(improved[..., None], pick(cand_disk), disk_act)
    # the trust radius follows the Newton trial alone: a release or snap winning must not reset it,
    # or Newton never gets the small steps a kink line passing near a cone tip needs
    newton_won = improved & (best == 0)
    radius = torch.where(newton_won, torch.clamp(2 * radius, max=_MAX_STEP),
                         torch.where(values[..., 0] < current, radius, 0.25 * radius))
    # u sits on the kinks within _ZERO; within _NEAR when Newton has stalled (a cone, an edge)
    near = torch.where(radius < _STALLED, _NEAR, _ZERO)[..., None]
    x, rho = _kinks(t, u)
    seg_act, disk_act = seg_act | (x.abs() < near), disk_act | (rho < near)
    b1, b2, rank, r1, r2 = _feasible_basis(u, cons, _active_constraints(seg_act, disk_act))
    return _project(u, rank, r1, r2), seg_act, disk_act, radius


class _Solution(NamedTuple):
    dist: Tensor  # [n] signed distance (negative: penetration)
    normal: Tensor  # [n, 3] from geom 1 to geom 2
    point1: Tensor  # [n, 3] witness on geom 1's surface
    point2: Tensor  # [n, 3] witness on geom 2's surface
    seg_act: Tensor  # [n, S] bool: segment terms at their kink (u.d = 0)
    disk_act: Tensor  # [n, K] bool: disk terms at their kink (u = +-axis)
    mu: Tensor  # [n, J] weights of the active kinks (see _multipliers)


def _penetration(geom1: _Terms, geom2: _Terms) -> _Solution:
    """Signed distance, normal and witness points of two geoms (see module doc)."""
    t = _difference(geom1, geom2)
    # the search runs in float64 whatever the input dtype: its kink thresholds (_ZERO, _NEAR)
    # lie below float32 resolution
    td = _Terms(*(x.detach().double() if isinstance(x, Tensor) else x for x in t))
    with torch.no_grad():
        # _STARTS runs side by side from the best initial directions; keep the lowest f
        starts = _initial_directions(td, _STARTS)
        tr = _repeat(td, _STARTS)
        cons = _constraints(tr)
        u = starts.flatten(0, 1)
        x, rho = _kinks(tr, u)
        seg_act, disk_act = x.abs() < _ZERO, rho < _ZERO
        radius = torch.full_like(u[..., 0], _MAX_STEP)
        for _ in range(_ITERATIONS):
            u, seg_act, disk_act, radius = _iterate(tr, cons, u, seg_act, disk_act, radius)
        best = _value(tr, u).view(-1, _STARTS).argmin(-1)[..., None, None]
        pick = lambda v: torch.take_along_dim(v.unflatten(0, (-1, _STARTS)), best.view(  # noqa: E731
            -1, 1, *(1,) * (v.dim() - 1)), 1)[:, 0]
        u, seg_act, disk_act = pick(u).to(t.center.dtype), pick(seg_act), pick(disk_act)

    # one more Newton step with gradients: the implicit derivative of the optimality condition
    # (onto the held kinks as they move with the inputs first, then along them)
    cons = _constraints(t)
    active = _active_constraints(seg_act, disk_act)
    _, _, rank, r1, r2 = _feasible_basis(u, cons, active)
    u = _project(u, rank, r1, r2)
    b1, b2, rank, r1, r2 = _feasible_basis(u, cons, active)
    _, g, h = _evaluate(t, u, seg_act, disk_act)
    u = _project(_newton_step(u, g, h, b1, b2, torch.full_like(u[..., 0], _MAX_STEP)), rank, r1, r2)

    f, g, _ = _evaluate(t, u, seg_act, disk_act)
    mu = _multipliers(u, g, cons, active)
    even1, even2 = _even_parts(t, u, mu, seg_act, disk_act)
    point1 = geom1.center + geom1.ball[..., None] * u + even1
    point2 = geom2.center - geom2.ball[..., None] * u - even2
    return _Solution(-f, u, point1, point2, seg_act, disk_act, mu)


def _even_parts(t: _Terms, u: Tensor, mu: Tensor, seg_act: Tensor, disk_act: Tensor):
    """Gradients at u of the segment, disk and ellipsoid terms of geom 1 and of geom 2 [n, 3].

    The active kinks contribute their weights mu instead of an (undefined) gradient.
    """
    parts = [torch.zeros_like(u), torch.zeros_like(u)]
    nseg = t.seg_len.shape[-1]
    x, _ = _kinks(t, u)
    coef = torch.where(seg_act, mu[..., :nseg], t.seg_len * torch.sign(x))
    for k, owner in enumerate(t.seg_owner):
        parts[owner] = parts[owner] + coef[..., k, None] * t.seg_dir[..., k, :]
    e1, e2 = _perpendiculars(t.disk_axis)
    disk_mu = mu[..., nseg:].unflatten(-1, (-1, 2))
    pu = u[..., None, :] - (t.disk_axis * u[..., None, :]).sum(-1, keepdim=True) * t.disk_axis
    rim = t.disk_radius[..., None] * normalize(pu)[0]
    cap = disk_mu[..., 0, None] * e1 + disk_mu[..., 1, None] * e2
    disk = torch.where(disk_act[..., None], cap, rim)
    for k, owner in enumerate(t.disk_owner):
        parts[owner] = parts[owner] + disk[..., k, :]
    y = (t.ell_mat * u[..., None, :, None]).sum(-2)
    q = torch.sqrt((t.ell_size**2 * y * y).sum(-1))
    ell = (t.ell_mat * (t.ell_size**2 * y)[..., None, :]).sum(-1) / q[..., None]
    for k, owner in enumerate(t.ell_owner):
        parts[owner] = parts[owner] + ell[..., k, :]
    return parts[0], parts[1]


# ---------------------------------------------------------------- multi-CCD (mjc_multicontact)

FACE_TOL = 0.996  # mjFACE_TOL: cosine within which two faces are antiparallel (~5.1 degrees)
EDGE_TOL = 0.0888  # mjEDGE_TOL: sine within which an edge is parallel to a face
FACING = 1e-15  # an edge's partner face must face the other geom by more than this

# MuJoCo's 16-gon for a cylinder cap (cylinderFace): vertex k at angle 2 pi k / 16, as literals
_COS16 = (1.0, 0.923879532511287, 0.707106781186548, 0.38268343236509, 0.0, -0.38268343236509,
          -0.707106781186547, -0.923879532511287, -1.0, -0.923879532511287, -0.707106781186548,
          -0.38268343236509, 0.0, 0.38268343236509, 0.707106781186547, 0.923879532511287)
_SIN16 = (0.0, 0.38268343236509, 0.707106781186547, 0.923879532511287, 1.0, 0.923879532511287,
          0.707106781186548, 0.38268343236509, 0.0, -0.38268343236509, -0.707106781186547,
          -0.923879532511287, -1.0, -0.923879532511287, -0.707106781186548, -0.38268343236509)

# box faces (boxFace): corner sign patterns of the four vertices of faces +x, -x, +y, -y, +z, -z
BOX_FACES = (
    ((1, 1, 1), (1, 1, -1), (1, -1, -1), (1, -1, 1)),
    ((-1, 1, -1), (-1, 1, 1), (-1, -1, 1), (-1, -1, -1)),
    ((-1, 1, -1), (1, 1, -1), (1, 1, 1), (-1, 1, 1)),
    ((-1, -1, 1), (1, -1, 1), (1, -1, -1), (-1, -1, -1)),
    ((-1, 1, 1), (1, 1, 1), (1, -1, 1), (-1, -1, 1)),
    ((1, 1, -1), (-1, 1, -1), (-1, -1, -1), (1, -1, -1)),
)
_BOX_FACES = workarounds.Literal.of(BOX_FACES)
_MAXVERT = 16  # vertices of the largest face (a cylinder cap)


class _Feature(NamedTuple):
    """The part of a geom that supports the contact, as MuJoCo's EPA reports it."""

    dim: Tensor  # [n] 1: a corner / a point of a cap rim or of a capsule, 2: an edge / a cylinder side line, 3: a face
    index: Tensor  # [n, 3] box corners (bit k set: + side of axis k), or cylinder caps (0 top, 1 bottom)
    point: Tensor  # [n, 3] cylinder: the rim point at the contact's azimuth (the side line starts there)


def _local_to_world(geom: GeomPose, local: Tensor) -> Tensor:
    """mat @ local + pos summed as MuJoCo's globalcoord; local [n, ..., 3]."""
    extra = local.dim() - geom.pos.dim()
    mat = geom.mat[(...,) + (None,) * extra + (slice(None),) * 2]
    pos = geom.pos[(...,) + (None,) * extra + (slice(None),)]
    return torch.stack([(mat[..., i, 0] * local[..., 0] + mat[..., i, 1] * local[..., 1])
                        + mat[..., i, 2] * local[..., 2] for i in range(3)], -1) + pos


def _box_corners(geom: GeomPose, index: Tensor) -> Tensor:
    """World positions [n, ..., 3] of box corners with the given indices [n, ...]."""
    bits = (index[..., None] >> torch.arange(3, device=index.device)) & 1
    extra = index.dim() - 1
    size = geom.size[(...,) + (None,) * extra + (slice(None),)]
    return _local_to_world(geom, torch.where(bits == 1, size, -size))


def _feature(kind: GeomType, geom: GeomPose, direction: Tensor, seg_act: Tensor, witness: Tensor) -> _Feature:
    """The ideal EPA feature of a geom supporting ``direction`` [n, 3] at the exact contact.

    ``seg_act`` [n, S] tells which of the geom's segment terms sit at their kink, ``witness``
    [n, 3] is its contact point. A box corner, edge or face is the set of corners supporting
    the direction (an edge as its two corners, the one on the - side of the edge axis first;
    a face as three of its corners). A cylinder supports at one cap (dim 1) unless the
    contact is on its side (dim 2, top cap first); a capsule is a single point for MuJoCo.
    """
    n = geom.pos.shape[:-1]
    long = dict(dtype=torch.long, device=geom.pos.device)
    if kind == GeomType.CAPSULE:
        return _Feature(torch.ones(n, **long), torch.full((*n, 3), -1, **long), witness)
    if kind == GeomType.BOX:
        bit = torch.tensor([1, 2, 4], **long)
        corner = ((mat_t_vec(geom.mat, direction) > 0).long() * bit).sum(-1)
        held = (seg_act.long() * bit).sum(-1)
        base = corner & ~held
        lowest = torch.take_along_dim(bit.expand(*n, 3), seg_act.long().argmax(-1)[..., None], -1)[..., 0]
        count = seg_act.sum(-1)
        index = torch.stack((
            torch.where(count == 0, corner, base),
            torch.where(count == 0, corner, base | lowest),
            torch.where(count == 2, base | held, torch.where(count == 1, base, corner))), -1)
        return _Feature(count + 1, index, witness)
    # cylinder: the rim point at the witness's azimuth, on the supporting cap
    side = seg_act[..., 0]
    local = mat_t_vec(geom.mat, witness - geom.pos)
    radial, length = normalize(local * local.new_tensor([1.0, 1.0, 0.0]))
    cap = torch.where(side, 0, (dot(direction, geom.mat[..., :, 2]) < 0).long())
    height = torch.where(cap == 1, -geom.size[..., 1], geom.size[..., 1])
    rim = radial * geom.size[..., :1] + height[..., None] * local.new_tensor([0.0, 0.0, 1.0])
    rim = _local_to_world(geom, torch.where((length > 0)[..., None], rim, local))
    index = torch.stack((cap, torch.where(side, 1, cap), cap), -1)
    return _Feature(1 + side.long(), index, rim)


def _face_normals(kind: GeomType, geom: GeomPose, feat: _Feature):
    """Candidate face normals of the feature (MuJoCo's boxNormals / cylinder cap normal).

    Returns normals [n, A, 3], face indices [n, A] and a validity mask [n, A], in
    MuJoCo's order: a box has a slot per axis (the faces of a corner, of an edge, or the
    face itself), a cylinder one slot (its cap, when the feature is on one cap), a capsule none.
    """
    if kind == GeomType.BOX:
        axes = torch.arange(3, device=feat.index.device)
        bits = (feat.index[..., None] >> axes) & 1  # [n, corner, axis]
        counted = (axes < torch.where(feat.dim == 3, 3, 2)[..., None])[..., None]  # corners that count
        common = ((bits == 1) | ~counted).all(-2).long() - ((bits == 0) | ~counted).all(-2).long()
        sign = torch.where((feat.dim == 1)[..., None], 2 * bits[..., 0, :] - 1, common)
        normals = sign[..., None].to(geom.mat.dtype) * geom.mat.transpose(-1, -2)
        return normals, 2 * axes + (sign < 0).long(), sign != 0
    if kind == GeomType.CYLINDER:
        sign = torch.where(feat.index[..., :1] == 0, 1.0, -1.0).to(geom.mat.dtype)
        return sign[..., None] * geom.mat[..., None, :, 2], feat.index[..., :1], (feat.dim == 1)[..., None]
    return geom.pos.new_zeros(*feat.dim.shape, 0, 3), feat.index[..., :0], feat.index[..., :0] > 0


def _edges(kind: GeomType, geom: GeomPose, feat: _Feature, witness: Tensor):
    """Candidate edges of the feature (MuJoCo's geomEdgeNormals): start [n, 3], ends [n, E, 3],
    unit directions [n, E, 3], validity [n, E].

    A capsule's edge is its surface line through the (inflated) witness; a cylinder's its side
    line from the feature's rim point across to the other cap; a box's the edge itself, or the
    three edges leaving the corner.
    """
    if kind == GeomType.CAPSULE:
        axis, half = geom.mat[..., :, 2], geom.size[..., 1]
        along = dot(witness - geom.pos, axis)
        start = (-along - half)[..., None] * axis + witness
        end = (half - along)[..., None] * axis + witness
        return start, end[..., None, :], axis[..., None, :], feat.dim[..., None] > 0
    if kind == GeomType.CYLINDER:
        sign = torch.where(feat.index[..., 0] == 0, -1.0, 1.0).to(geom.mat.dtype)
        direction = sign[..., None] * geom.mat[..., :, 2]
        end = (geom.size[..., 1] + geom.size[..., 1])[..., None] * direction + feat.point
        return feat.point, end[..., None, :], direction[..., None, :], feat.dim[..., None] > 0
    start = _box_corners(geom, feat.index[..., 0])
    flips = feat.index[..., :1] ^ torch.tensor([1, 2, 4], device=feat.index.device)
    ends = torch.where((feat.dim == 2)[..., None], torch.cat((feat.index[..., 1:2], flips[..., 1:]), -1), flips)
    ends = _box_corners(geom, ends)
    valid = (torch.arange(3, device=ends.device) < torch.where(feat.dim == 2, 1, 3)[..., None])
    return start, ends, _normalize3(ends - start[..., None, :]), valid & (feat.dim < 3)[..., None]


def _face_polygon(kind: GeomType, geom: GeomPose, index: Tensor) -> tuple[Tensor, Tensor]:
    """Vertices [n, 16, 3] (padded) and vertex count [n] of face ``index`` [n] of a box or cylinder."""
    dtype = geom.pos.dtype
    if kind == GeomType.BOX:
        signs = _BOX_FACES.tensor(dtype, geom.pos.device)  # [6, 4, 3]
        faces = _local_to_world(geom, signs * geom.size[..., None, None, :])  # [n, 6, 4, 3]
        face = torch.take_along_dim(faces, index[..., None, None, None], -3)[..., 0, :, :]
        face = torch.cat((face, face[..., :1, :].expand(*face.shape[:-2], _MAXVERT - 4, 3)), -2)
        return face, torch.full_like(index, 4)
    cos = workarounds.literal(_COS16, dtype, geom.pos.device)
    sin = workarounds.literal(_SIN16, dtype, geom.pos.device)
    radius, half = geom.size[..., 0, None], geom.size[..., 1, None]
    sign = torch.where(index == 0, 1.0, -1.0).to(dtype)[..., None]
    local = torch.stack((radius * cos, sign * (radius * -sin), (sign * half).expand_as(radius * cos)), -1)
    return _local_to_world(geom, local), torch.full_like(index, 16)


def cylinder_clip_feature(cylinder: GeomPose, normal: Tensor, side: Tensor, witness: Tensor):
    """A cylinder's faces and edges for mjc_multicontact against another geom, as for the pairs here:
    ``normal`` [n, 3] from the cylinder to the other geom, ``side`` [n] whether the contact is on its side
    line (else at a cap's rim or face), ``witness`` [n, 3] its inflated witness point.

    Returns (normals [n, 1, 3], cap ids [n, 1], in use [n, 1], dim [n], start [n, 3], ends [n, 1, 3],
    directions [n, 1, 3], in use [n, 1]) (``polytope.ClipFeature``'s fields).
    """
    feat = _feature(GeomType.CYLINDER, cylinder, normal, side[..., None], witness)
    return (*_face_normals(GeomType.CYLINDER, cylinder, feat), feat.dim,
            *_edges(GeomType.CYLINDER, cylinder, feat, witness))


def cylinder_cap(cylinder: GeomPose, index: Tensor) -> tuple[Tensor, Tensor]:
    """MuJoCo's 16-gon of cap ``index`` [n] (0 top, 1 bottom): vertices [n, 16, 3], count [n]."""
    return _face_polygon(GeomType.CYLINDER, cylinder, index)


_CAPACITY = 2 * _MAXVERT + 4  # vertices of a clipped polygon of the primitive geoms' faces


def _capacity(face: Tensor, poly: Tensor) -> int:
    """Vertex slots of a clipped polygon: a clip by each face edge adds at most one vertex."""
    return max(_CAPACITY, face.shape[-2] + poly.shape[-2] + 4)


def _normalize3(v: Tensor) -> Tensor:
    """mju_normalize3 to the last bit (v times 1/|v|; (1, 0, 0) below mjMINVAL); finite gradient."""
    norm2 = dot(v, v)
    small = norm2 < MINVAL * MINVAL
    unit = v * (1 / torch.sqrt(torch.where(small, 1.0, norm2)))[..., None]
    return torch.where(small[..., None], v.new_tensor([1.0, 0.0, 0.0]), unit)



def _clip(face: Tensor, nface: Tensor, poly: Tensor, npoly: Tensor, normal: Tensor, margin: Tensor):
    """Clip the convex polygon poly [n, P, 3] (npoly vertices) by the side planes of ``face``.

    Port of polygonClip's clipping loop: for each face edge, the plane through it orthogonal
    to the face (normal ``normal`` [n, 3]); each polygon edge P -> Q keeps its crossing point
    and Q when inside (signed distance > -1e-15). Vertices more than ``margin`` [n] above the
    face plane are dropped. Returns the polygon [n, C, 3] and its vertex count, C = _capacity(face, poly).
    """
    arange = torch.arange(face.shape[-2], device=face.device)
    nxt = torch.where(arange + 1 >= nface[..., None], 0, arange + 1)
    v1 = face
    v2 = torch.take_along_dim(face, nxt[..., None], -2)
    v3 = v1 + normal[..., None, :]
    planes = _normalize3(cross(v2 - v1, v3 - v1))  # inward normals of the side planes
    capacity = _capacity(face, poly)
    pad = capacity - poly.shape[-2]
    poly = torch.cat((poly, poly[..., :1, :].expand(*poly.shape[:-2], pad, 3)), -2)
    slots = torch.arange(capacity, device=face.device)
    for e in range(face.shape[-2]):
        origin, plane = v1[..., e, None, :], planes[..., e, None, :]
        q = torch.take_along_dim(poly, torch.where(slots + 1 == npoly[..., None], 0, slots + 1)[..., None], -2)
        d1, d2 = dot(poly - origin, plane), dot(q - origin, plane)
        in1, in2 = d1 > -1e-15, d2 > -1e-15
        den = d1 - d2
        crossing = (in1 != in2) & (den != 0)
        t = d1 / torch.where(crossing, den, 1.0)
        crossing = crossing & (t >= 0) & (t <= 1)
        cut = t[..., None] * (q - poly) + poly
        listed = slots < npoly[..., None]
        emit = torch.stack((crossing & listed, in2 & listed), -1).flatten(-2)
        valid, clipped = compact(emit, capacity, torch.stack((cut, q), -2).flatten(-3, -2))
        use = (e < nface)[..., None]
        poly = torch.where(use[..., None], clipped, poly)
        npoly = torch.where(use[..., 0], valid.sum(-1), npoly)
    below = ~(margin[..., None] < dot(poly - v1[..., :1, :], normal[..., None, :]))
    valid, poly = compact(below & (slots < npoly[..., None]), capacity, poly)
    return poly, valid.sum(-1)


def _quad_area(poly: Tensor, a: Tensor, b: Tensor, c: Tensor, d: Tensor) -> Tensor:
    """Area of the quadrilateral of vertices a, b, c, d [n] of poly [n, P, 3]: |ac x bd| / 2."""
    at = lambda i: torch.take_along_dim(poly, i[..., None, None], -2)[..., 0, :]  # noqa: E731
    # torch.linalg.cross: math.cross's constant tensors would break inductor's while_loop in largest_quad
    return 0.5 * torch.sqrt(dot(*(torch.linalg.cross(at(a) - at(c), at(b) - at(d)),) * 2))


_TIE = 1e-9  # relative area difference within which two quadrilaterals count as equal


def largest_quad(poly: Tensor, npoly: Tensor) -> tuple[Tensor, Tensor]:
    """MuJoCo's polygonQuad: four vertex indices [n, 4] of a large quadrilateral in poly, and
    whether the search met a tie [n].

    A greedy rotating search: for each first vertex a, advance the fourth (d) while the area
    grows, after each advance the third (c), then the second (b). Run as a fixed number of
    single-area steps of the same state machine (phase 0: try d + 1, 1: c + 1, 2: b + 1).
    The area only grows by more than _TIE: a cylinder cap's 16-gon has many quadrilaterals of
    equal area, which MuJoCo's strict comparison tells apart by the last bit of its rounding
    (so the choice flips with 1-ulp changes of the poses); equal areas are kept, as exact
    arithmetic would.
    """
    n = npoly.clamp(min=1)

    def step(carry):  # one area tried; done (phase 3) elements are left as they are
        _, phase, a, b, c, d, best, result, tied = carry
        bn, cn, dn = (b + 1) % n, (c + 1) % n, (d + 1) % n
        area = _quad_area(poly, a, torch.where(phase == 2, bn, b), torch.where(phase == 1, cn, c),
                          torch.where(phase == 0, dn, d))
        grow = best * (1 + _TIE) < area
        tied = tied | ((phase < 3) & ((area - best).abs() <= _TIE * best))
        best = torch.where(grow & (phase < 3), area, best)
        d = torch.where(grow & (phase == 0), dn, d)
        c = torch.where(grow & (phase == 1), cn, c)
        b = torch.where(grow & (phase == 2), bn, b)
        result = torch.where(((phase == 2) & ~grow)[..., None], torch.stack((a, b, c, d), -1), result)
        # d did not grow: next first vertex, keeping b, c, d ahead of it
        nexta = (phase == 0) & ~grow
        fix_b = nexta & (b == a)
        b2 = torch.where(fix_b, bn, b)
        fix_c = fix_b & (c == b2)
        c2 = torch.where(fix_c, cn, c)
        d = torch.where(fix_c & (d == c2), dn, d)
        b, c = b2, c2
        a = torch.where(nexta, a + 1, a)
        phase = torch.where(phase == 3, 3, torch.where(
            phase == 0, torch.where(grow, 1, torch.where(a >= n, 3, 0)),
            torch.where(grow, phase, (phase + 1) % 3)))
        return phase == 3, phase, a, b, c, d, best, result, tied

    a = torch.zeros_like(npoly)
    b, c, d = a + 1, a + 2, a + 3
    phase = torch.where(npoly >= 5, 0, 3)  # 3: done
    carry = (phase == 3, phase, a, b, c, d, _quad_area(poly, a, b, c, d), torch.stack((a, b, c, d), -1),
             torch.zeros_like(npoly, dtype=torch.bool))
    # eager: stops once all are done; compiled: unrolled, as its scan under vmap (2.13) refuses the carry
    *_, result, tied = workarounds.bounded_loop(step, carry, 4 * poly.shape[-2] + 4,
                                                unroll=torch.compiler.is_compiling())
    return result, tied


def _farthest_pair(poly: Tensor, npoly: Tensor) -> Tensor:
    """The first pair (i < j) [n, 2] of polygon vertices at the largest distance (from (0, 1))."""
    cap = poly.shape[-2]
    i, j = torch.triu_indices(cap, cap, 1, device=poly.device)
    diff = poly[..., j, :] - poly[..., i, :]
    dist2 = torch.where(j < npoly[..., None], dot(diff, diff), 0.0)
    k = dist2.argmax(-1)
    return torch.stack((i[k], j[k]), -1)


def clip_contacts(face, nface, poly, npoly, normal, wit, margin, maxc: int, edge: Tensor):
    """polygonClip: clip, pick at most ``maxc`` vertices, and their witness points.

    Returns the count [n], the points on the clipping face [n, maxc, 3], the points on the
    clipped polygon side [n, maxc, 3], their distances along ``wit`` [n, maxc] and whether
    the choice of a quadrilateral met a tie [n] (see largest_quad).
    """
    poly, npoly = _clip(face, nface, poly, npoly, normal, margin)
    with torch.no_grad():
        quad, tied = largest_quad(poly.detach(), npoly)
        pair = _farthest_pair(poly.detach(), npoly)
    first = torch.arange(maxc, device=poly.device).expand(*npoly.shape, maxc)
    use_quad = (maxc < 5) & (npoly >= 5)
    use_pair = edge & (npoly >= 3) & ~use_quad
    pick = torch.where(use_quad[..., None], _pad(quad, maxc), torch.where(use_pair[..., None], _pad(pair, maxc), first))
    count = torch.where(use_quad, 4, torch.where(use_pair, 2, torch.clamp(npoly, max=maxc)))
    v = torch.take_along_dim(poly, pick[..., None], -2)
    height = dot(v - face[..., None, 0, :], normal[..., None, :])
    on_face = v - height[..., None] * normal[..., None, :]
    dist = dot(on_face - v, wit[..., None, :])
    return count, on_face, on_face - dist[..., None] * wit[..., None, :], dist, tied & use_quad


def _pad(index: Tensor, width: int) -> Tensor:
    """index [n, m] cut or padded (with its first column) to [n, width]."""
    if index.shape[-1] >= width:
        return index[..., :width]
    return torch.cat((index, index[..., :1].expand(*index.shape[:-1], width - index.shape[-1])), -1)


def _first(mask: Tensor) -> tuple[Tensor, Tensor]:
    """(any, flat index of the first True) of mask [n, A, B] in row-major order."""
    flat = mask.flatten(-2)
    if not flat.shape[-1]:
        return flat.any(-1), flat.sum(-1).long()
    return flat.any(-1), flat.long().argmax(-1)


class MulticontactChoice(NamedTuple):
    """What mjc_multicontact clips: one of three cases [n] and the face / edge slots in use [n]."""

    face_face: Tensor  # a face of each geom
    edge1: Tensor  # an edge of geom 1 against a face of geom 2
    edge2: Tensor  # an edge of geom 2 against a face of geom 1
    face1: Tensor  # geom 1's face slot (face_face, edge2)
    face2: Tensor  # geom 2's face slot (face_face, edge1)
    edge_slot1: Tensor  # geom 1's edge slot (edge1)
    edge_slot2: Tensor  # geom 2's edge slot (edge2)


def multicontact_choice(direction: Tensor, feature1: tuple, feature2: tuple) -> MulticontactChoice:
    """MuJoCo 4's choice of features to clip, given each geom's candidate faces and edges.

    ``direction`` [n, 3]: from geom 1's witness point to geom 2's. Each feature is (face normals
    [n, A, 3], their validity [n, A], the feature's dimension [n] (1 vertex, 2 edge, 3 face), edge
    directions [n, E, 3], their validity [n, E]). Faces within ~5 degrees of antiparallel, each
    facing the other geom, win (the most antiparallel pair); else an edge within ~5 degrees of
    parallel to a face of the other geom (the first (face, edge) pair; geom 2's edge first where
    geom 2's feature is of lower dimension or geom 2 has no face).
    """
    n1, ok1, dim1, dirs1, edge_ok1 = feature1
    n2, ok2, dim2, dirs2, edge_ok2 = feature2
    slack = EDGE_TOL * _sqrt(dot(direction, direction))[..., None]
    facing1 = ok1 & (dot(direction[..., None, :], n1) < -slack)
    facing2 = ok2 & (dot(direction[..., None, :], n2) > slack)
    cosine = dot(n1[..., :, None, :], n2[..., None, :, :])
    aligned = facing1[..., :, None] & facing2[..., None, :] & (cosine < -FACE_TOL)
    face_face, best = _first(aligned)
    if aligned.numel():
        best = torch.where(aligned, cosine, torch.inf).flatten(-2).argmin(-1)

    count1, count2 = ok1.sum(-1), ok2.sum(-1)
    parallel = lambda normals, dirs: dot(normals[..., :, None, :], dirs[..., None, :, :]).abs() < EDGE_TOL  # noqa: E731
    e1_any, e1_at = _first((ok2 & (dot(direction[..., None, :], n2) > FACING))[..., :, None]
                           & edge_ok1[..., None, :] & parallel(n2, dirs1))
    e1_any = e1_any & (dim1 != 3) & (count2 > 0)
    e2_any, e2_at = _first((ok1 & (dot(-direction[..., None, :], n1) > FACING))[..., :, None]
                           & edge_ok2[..., None, :] & parallel(n1, dirs2))
    e2_any = e2_any & (dim2 != 3) & (count1 > 0)
    e2_first = (count1 > 0) & (dim2 != 3) & ((count2 == 0) | (dim2 < dim1))
    edge1 = ~face_face & e1_any & ~(e2_first & e2_any)
    edge2 = ~face_face & ~edge1 & e2_any
    nedge1, nedge2 = max(dirs1.shape[-2], 1), max(dirs2.shape[-2], 1)
    return MulticontactChoice(face_face, edge1, edge2,
                              torch.where(face_face, best // n2.shape[-2], e2_at // nedge2),
                              torch.where(face_face, best % n2.shape[-2], e1_at // nedge1),
                              e1_at % nedge1, e2_at % nedge2)


def _multicontact(kinds: tuple[GeomType, GeomType], geoms: tuple[GeomPose, GeomPose], sol: _Solution, nseg1: int,
                  margin: Tensor, maxc: int):
    """MuJoCo 4's mjc_multicontact on the ideal features of the exact contact.

    Returns (use [n], dist [n, maxc], pos [n, maxc, 3], normal [n, maxc, 3], count [n], tied [n]):
    where ``use``, the contacts from clipping the contacting features replace the single one;
    ``tied``: their choice among equally large quadrilaterals is arbitrary (see largest_quad).
    """
    geom1, geom2 = geoms
    half = 0.5 * margin[..., None]
    x1 = sol.point1 + half * sol.normal  # witness points of the geoms inflated by half the margin
    x2 = sol.point2 - half * sol.normal
    feat1 = _feature(kinds[0], geom1, sol.normal, sol.seg_act[..., :nseg1], x1)
    feat2 = _feature(kinds[1], geom2, -sol.normal, sol.seg_act[..., nseg1:], x2)
    n1, face1, ok1 = _face_normals(kinds[0], geom1, feat1)
    n2, face2, ok2 = _face_normals(kinds[1], geom2, feat2)
    start1, ends1, dirs1, edge_ok1 = _edges(kinds[0], geom1, feat1, x1)
    start2, ends2, dirs2, edge_ok2 = _edges(kinds[1], geom2, feat2, x2)
    choice = multicontact_choice(x2 - x1, (n1, ok1, feat1.dim, dirs1, edge_ok1), (n2, ok2, feat2.dim, dirs2, edge_ok2))
    face_face, edge1, edge2 = choice.face_face, choice.edge1, choice.edge2

    # the clipping face and the clipped polygon (a face or an edge)
    at = lambda x, i: torch.take_along_dim(x, i[..., None, None], -2)[..., 0, :]  # noqa: E731
    i1, i2, e1_edge, e2_edge = choice.face1, choice.face2, choice.edge_slot1, choice.edge_slot2
    normal1 = at(n1, i1) if n1.shape[-2] else torch.zeros_like(x1)  # a capsule has no face
    normal2 = at(n2, i2)
    fill = torch.zeros_like(x1[..., None, :]).expand(*x1.shape[:-1], _MAXVERT, 3)
    poly1, npoly1 = (_face_polygon(kinds[0], geom1, torch.take_along_dim(face1, i1[..., None], -1)[..., 0])
                     if kinds[0] != GeomType.CAPSULE else (fill, torch.zeros_like(i1)))
    poly2, npoly2 = _face_polygon(kinds[1], geom2, torch.take_along_dim(face2, i2[..., None], -1)[..., 0])
    seg1 = torch.stack((start1, at(ends1, e1_edge)), -2)
    seg2 = torch.stack((start2, at(ends2, e2_edge)), -2)
    pad = lambda s: torch.cat((s, s[..., :1, :].expand(*s.shape[:-2], _MAXVERT - 2, 3)), -2)  # noqa: E731
    two = torch.full_like(npoly2, 2)
    face = torch.where(edge1[..., None, None], poly2, poly1)
    nface = torch.where(edge1, npoly2, npoly1)
    poly = torch.where(face_face[..., None, None], poly2, torch.where(edge1[..., None, None], pad(seg1), pad(seg2)))
    npoly = torch.where(face_face, npoly2, two)
    normal = torch.where(edge1[..., None], normal2, normal1)
    wit = torch.where(face_face[..., None], normal2, -normal)
    inflate = torch.where(edge2[..., None], normal1, -normal2)  # from geom 1 towards geom 2

    m1 = 0.0 if kinds[0] == GeomType.CAPSULE else 0.5  # a capsule's edge already runs through x1
    both = (m1 + 0.5) * margin
    count, on_face, on_poly, dist, tied = clip_contacts(face, nface, poly, npoly, normal, wit, both, maxc,
                                                   ~face_face)
    p1 = torch.where(edge1[..., None, None], on_poly, on_face) + (m1 * margin)[..., None, None] * inflate[..., None, :]
    p2 = torch.where(edge1[..., None, None], on_face, on_poly) - half[..., None] * inflate[..., None, :]
    dist = margin[..., None] + dist - both[..., None]
    use = (face_face | edge1 | edge2) & (count > 0)
    return use, dist, 0.5 * (p1 + p2), _normalize3(p1 - p2), count, tied & use


# ---------------------------------------------------------------- pair function


def collide(kinds: tuple[GeomType, GeomType], geom1: GeomPose, geom2: GeomPose, margin: Tensor,
            max_contacts: int) -> Candidates:
    """mjc_Convex for geoms of types ``kinds``: the exact contact, replaced by multi-CCD contacts
    if max_contacts > 1. Fields [n, max_contacts, ...].

    Also takes a single pair (pos [3], margin [] as under ``torch.vmap`` over the pairs).
    """
    if margin.dim() == 0:
        one = lambda g: GeomPose(*(x[None] for x in g))  # noqa: E731
        return Candidates(*(x[0] for x in collide(kinds, one(geom1), one(geom2), margin[None], max_contacts)))
    terms1, terms2 = _geom_terms(kinds[0], geom1), _geom_terms(kinds[1], geom2)
    sol = _penetration(terms1, terms2)
    touching = sol.dist < margin
    dist = sol.dist[..., None]
    pos = (0.5 * (sol.point1 + sol.point2))[..., None, :]
    normal = sol.normal[..., None, :]
    slots = torch.arange(max_contacts, device=margin.device)
    valid = touching[..., None] & (slots == 0)
    if max_contacts > 1:
        use, mdist, mpos, mnormal, count, _ = _multicontact(kinds, (geom1, geom2), sol, terms1.seg_len.shape[-1],
                                                        margin, max_contacts)
        listed = slots < count[..., None]
        use = use & (torch.where(listed, mdist, torch.inf).amin(-1) < margin)
        valid = torch.where(use[..., None], touching[..., None] & listed, valid)
        dist = torch.where(use[..., None], mdist, dist.expand_as(mdist))
        pos = torch.where(use[..., None, None], mpos, pos.expand_as(mpos))
        normal = torch.where(use[..., None, None], mnormal, normal.expand_as(mnormal))
    return make_candidates(valid, dist, pos, normal)
