"""Tendon wrapping around spheres and cylinders (MuJoCo's ``mju_wrap``, engine_util_misc.c).

A spatial tendon's span from one site to the next may pass a wrapping geom: it is then
the straight segment to a tangent point, an arc on the geom (a great circle of a sphere,
a helix on a cylinder) and the straight segment from a second tangent point. MuJoCo
solves this in the plane of the circle: the plane through the two sites and the sphere's
centre, or the cylinder's cross-section (the helix's height is filled in afterwards).
A side site picks the side of the circle the tendon passes; a side site inside the geom
asks for the other solution MuJoCo has, a tendon pressed against the inside of an arc
(``wrap_inside``, a short Newton iteration).

Every span computes every candidate (no wrap, either tangent solution, inside wrap) and
keeps one with ``torch.where``, so shapes never depend on the state: ``vmap`` and
``torch.compile`` see one graph, and the candidates not kept stay finite (their
gradients are multiplied by zero, never by NaN).
"""

from __future__ import annotations

import math as pymath

import torch
from torch import Tensor

from diffmj import math, workarounds
from diffmj.math import MINVAL

# wrap_inside's Newton iteration (MuJoCo's constants)
_INSIDE_ITERATIONS = 20
_INSIDE_TOLERANCE = 1e-6
_INTERSECTING = -10000.0  # wrap_circle's goodness of a solution whose segments cross


def _dot2(a: Tensor, b: Tensor) -> Tensor:
    """Dot product of 2D vectors [..., 2], summed in mju_dot's order. [...]"""
    return a[..., 0] * b[..., 0] + a[..., 1] * b[..., 1]


def _cross2(a: Tensor, b: Tensor) -> Tensor:
    """z-component of the cross product of 2D vectors [..., 2]. [...]"""
    return a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]


def _safe_acos(x: Tensor) -> Tensor:
    """acos(x) with x clamped to [-1, 1] and gradient 0 (not inf) at the ends."""
    inside = x.abs() < 1
    return torch.where(inside, torch.acos(torch.where(inside, x, 0.0)), torch.where(x > 0, 0.0, pymath.pi))


def _segments_intersect(p1: Tensor, p2: Tensor, p3: Tensor, p4: Tensor) -> Tensor:
    """Whether 2D segments p1-p2 and p3-p4 [..., 2] cross (is_intersect; parallel ones never). [...]"""
    det = _cross2(p2 - p1, p4 - p3)
    valid = det.abs() >= MINVAL
    det = torch.where(valid, det, 1.0)
    a = _cross2(p4 - p3, p1 - p3) / det
    b = _cross2(p2 - p1, p1 - p3) / det
    return valid & (a >= 0) & (a <= 1) & (b >= 0) & (b <= 1)


def _arc_length(p0: Tensor, p1: Tensor, second: Tensor, radius: Tensor) -> Tensor:
    """Length of the arc from p0 to p1 [..., 2] on the circle (length_circle).

    ``second`` [...]: the arc of wrap_circle's second solution, which turns the other way.
    """
    angle = _safe_acos(_dot2(math.normalize(p0)[0], math.normalize(p1)[0]))
    turn = _cross2(p0, p1)
    flip = ((turn < 0) & second) | ((turn > 0) & ~second)
    return radius * torch.where(flip, 2 * pymath.pi - angle, angle)


def wrap_circle(end0: Tensor, end1: Tensor, side: Tensor, has_side: Tensor, radius: Tensor):
    """The tendon from end0 to end1 [k, 2] around the circle of ``radius`` [k] at the origin.

    ``side`` [k, 2] (where ``has_side``) is the side site projected onto the circle: the
    tangent pair closer to it is taken, else the pair with the closer tangent points.
    Returns (wrapped [k] bool, arc length [k], tangent points [k, 2] and [k, 2]).
    """
    sqlen0, sqlen1 = _dot2(end0, end0), _dot2(end1, end1)
    sqrad = radius * radius
    dif = end1 - end0
    dd = _dot2(dif, dif)
    # a segment that misses the circle wraps only if a side site asks for the other side: its nearest
    # point to the centre is away from the side site, and the ends lie on either side of the line
    # through the centre and the side site. (The second test is MuJoCo 4.0's, measured against it:
    # the 3.12 source has only the first.)
    a = (-_dot2(dif, end0) / torch.where(dd < MINVAL, 1.0, dd)).clamp(0.0, 1.0)
    nearest = end0 + a[:, None] * dif
    other_side = (_dot2(side, nearest) < 0) & (_cross2(side, end0) * _cross2(side, end1) < 0)
    misses = (_dot2(nearest, nearest) > sqrad) & (~has_side | ~other_side)
    wrapped = ~((sqlen0 < sqrad) | (sqlen1 < sqrad) | (radius < MINVAL) | (dd < MINVAL) | misses)

    root0 = math.safe_sqrt(sqlen0 - sqrad)[:, None]
    root1 = math.safe_sqrt(sqlen1 - sqrad)[:, None]
    scale0 = torch.where(sqlen0 < MINVAL, 1.0, sqlen0)[:, None]
    scale1 = torch.where(sqlen1 < MINVAL, 1.0, sqlen1)[:, None]
    r, r2 = radius[:, None], sqrad[:, None]
    perp0 = torch.stack((end0[:, 1], -end0[:, 0]), -1)  # end0 turned by -90 degrees
    perp1 = torch.stack((-end1[:, 1], end1[:, 0]), -1)  # end1 turned by +90 degrees
    solutions, goodness = [], []
    for sign in (1.0, -1.0):
        tangent0 = (end0 * r2 + sign * r * perp0 * root0) / scale0
        tangent1 = (end1 * r2 + sign * r * perp1 * root1) / scale1
        toward_side = _dot2(math.normalize(tangent0 + tangent1)[0], side)
        shortness = -_dot2(tangent0 - tangent1, tangent0 - tangent1)
        good = torch.where(has_side, toward_side, shortness)
        good = torch.where(_segments_intersect(end0, tangent0, end1, tangent1), _INTERSECTING, good)
        solutions.append((tangent0, tangent1))
        goodness.append(good)
    second = ~(goodness[0] > goodness[1])
    pick = second[:, None]
    tangent0 = torch.where(pick, solutions[1][0], solutions[0][0])
    tangent1 = torch.where(pick, solutions[1][1], solutions[0][1])
    wrapped = wrapped & ~_segments_intersect(end0, tangent0, end1, tangent1)
    return wrapped, _arc_length(tangent0, tangent1, second, radius), tangent0, tangent1


def wrap_inside(end0: Tensor, end1: Tensor, radius: Tensor, early_exit: bool = True):
    """The tendon from end0 to end1 [k, 2] pressed against the inside of the circle (wrap_inside).

    Both tangent points are one point, at angle asin(z) - asin(A z) from an end, where
    g(t) = asin(A sin t) + asin(B sin t) - 2 t + G = 0 with z = sin t (A, B: radius over the
    ends' distances, G: the angle between the ends). Newton's method finds t from pi / 2;
    where it fails, the point between the ends is used. (MuJoCo 4.0 iterates on t from
    pi / 2, measured against it: the 3.12 source iterates on z from 1 - 1e-7, whose
    derivative is infinite at 1, and stops elsewhere within the tolerance.)
    ``early_exit`` as in ``wrap``. Returns (wrapped [k] bool, arc length (0) [k], the point
    [k, 2] twice).
    """
    len0, len1 = math.safe_norm(end0), math.safe_norm(end1)
    dif = end1 - end0
    dd = _dot2(dif, dif)
    a = -_dot2(dif, end0) / torch.where(dd > MINVAL, dd, 1.0)
    nearest = end0 + a[:, None] * dif
    crosses = (dd > MINVAL) & (a > 0) & (a < 1) & (math.safe_norm(nearest) <= radius)
    fails = (len0 <= radius) | (len1 <= radius) | (radius < MINVAL) | (len0 < MINVAL) | (len1 < MINVAL) | crosses

    fallback = math.normalize(0.5 * (end0 + end1))[0] * radius[:, None]
    len0 = torch.where(fails, 1.0, len0)
    len1 = torch.where(fails, 1.0, len1)
    coef_a = torch.where(fails, 0.5, radius / len0)
    coef_b = torch.where(fails, 0.5, radius / len1)
    cos_g = (len0 * len0 + len1 * len1 - dd) / (2 * len0 * len1)
    fails = fails | (cos_g < -1 + MINVAL)
    use_fallback = cos_g > 1 - MINVAL
    angle_g = _safe_acos(cos_g)

    def residual(t: Tensor, a: Tensor, b: Tensor, angle: Tensor) -> Tensor:
        z = torch.sin(t)
        return torch.asin(a * z) + torch.asin(b * z) - 2 * t + angle

    def slope(t: Tensor, a: Tensor, b: Tensor) -> Tensor:
        z, dz = torch.sin(t), torch.cos(t)
        return (a * dz / math.safe_sqrt(1 - (a * z) ** 2).clamp(min=MINVAL)
                + b * dz / math.safe_sqrt(1 - (b * z) ** 2).clamp(min=MINVAL) - 2)

    # the iteration runs on constants (never differentiated through: it may be a compiled loop);
    # the root's derivative is the implicit function theorem's, dt = -dg / g'(t), added below
    coefs = (coef_a.detach(), coef_b.detach(), angle_g.detach())
    t = torch.full_like(cos_g, pymath.pi / 2).detach()  # batched like the ends (a compiled loop needs it)
    g = residual(t, *coefs)
    use_fallback = use_fallback | (g > 0)
    steps = torch.zeros_like(g)

    def iterate(carry):
        """One Newton step where still running; a failed step leaves the fallback point."""
        done, t, g, use_fallback, steps = carry
        dg = slope(t, *coefs[:2])
        bad_slope = dg > -MINVAL
        t_next = t - g / torch.where(bad_slope, -1.0, dg)
        update = ~done & ~(bad_slope | (t_next > t))
        t = torch.where(update, t_next, t)
        g = torch.where(update, residual(t, *coefs), g)
        failed = ~done & ~(update & (g <= _INSIDE_TOLERANCE))
        steps = steps + (~done).to(steps.dtype)
        use_fallback = use_fallback | failed
        return done | failed | (g.abs() <= _INSIDE_TOLERANCE), t, g, use_fallback, steps

    done = fails | use_fallback | (g.abs() <= _INSIDE_TOLERANCE)
    _, t, _, use_fallback, steps = workarounds.bounded_loop(
        iterate, (done, t, g, use_fallback, steps), _INSIDE_ITERATIONS, early_exit=early_exit)
    step = -residual(t, coef_a, coef_b, angle_g) / slope(t, *coefs[:2])
    t = t + (step - step.detach())  # t's value, the root's derivative
    use_fallback = use_fallback | (steps >= _INSIDE_ITERATIONS)

    counterclockwise = (_cross2(end0, end1) > 0)[:, None]
    ref = torch.where(counterclockwise, end0, end1)
    coef = torch.where(counterclockwise[:, 0], coef_a, coef_b)
    turn = t - torch.asin(coef * torch.sin(t))
    ref = math.normalize(ref)[0]
    cos, sin = torch.cos(turn), torch.sin(turn)
    point = radius[:, None] * torch.stack((cos * ref[:, 0] - sin * ref[:, 1], sin * ref[:, 0] + cos * ref[:, 1]), -1)
    point = torch.where(use_fallback[:, None], fallback, point)
    return ~fails, torch.zeros_like(radius), point, point


def _circle_plane(p0: Tensor, p1: Tensor, sphere: bool) -> tuple[Tensor, Tensor]:
    """Orthonormal axes [k, 3] of the plane the wrap is solved in, in the geom's frame.

    A sphere's: the plane through the centre and both ends (any plane holding p0 if they
    are in line with the centre); a cylinder's: its cross-section (x, y).
    """
    if not sphere:
        eye = torch.eye(3, dtype=p0.dtype, device=p0.device)
        return eye[0].expand_as(p0), eye[1].expand_as(p0)
    axis0 = math.normalize(p0)[0]
    normal, norm = math.normalize(math.cross(p0, p1))
    # in line: the normal to axis0 and (1, 1, 1) with a 0 at axis0's largest component (first of ties)
    mag = axis0.abs()
    largest = torch.where((mag[:, 1] > mag[:, 0]) & (mag[:, 1] > mag[:, 2]), 1,
                          torch.where((mag[:, 2] > mag[:, 0]) & (mag[:, 2] > mag[:, 1]), 2, 0))
    other = 1 - torch.nn.functional.one_hot(largest, 3).to(p0.dtype)
    normal = torch.where((norm < MINVAL)[:, None], math.normalize(math.cross(axis0, other))[0], normal)
    return axis0, math.normalize(math.cross(normal, axis0))[0]


def wrap(x0: Tensor, x1: Tensor, pos: Tensor, mat: Tensor, radius: Tensor, side: Tensor, has_side: Tensor,
         sphere: bool, early_exit: bool = True):
    """Wrap spans x0 -> x1 [k, 3] around spheres or cylinders (mju_wrap).

    pos [k, 3], mat [k, 3, 3], radius [k]: the geoms; side [k, 3]: side sites in world
    coordinates, used where ``has_side`` [k]. ``sphere`` (static): spheres, else cylinders.
    ``early_exit``: the inside wrap's iteration stops once every span has converged (the
    Model's ``early_exit``; False for no host synchronisation).
    Returns (wrapped [k] bool, wrap length [k] (the arc, or helix), tangent points
    [k, 3] and [k, 3] in world coordinates); where not wrapped the tendon is x0 -> x1.
    """
    p0, p1 = math.mat_t_vec(mat, x0 - pos), math.mat_t_vec(mat, x1 - pos)
    axis0, axis1 = _circle_plane(p0, p1, sphere)

    def project(p: Tensor) -> Tensor:
        return torch.stack((math.dot(p, axis0), math.dot(p, axis1)), -1)

    end0, end1 = project(p0), project(p1)
    side_local = math.mat_t_vec(mat, side - pos)
    side_plane = math.normalize(project(side_local))[0] * radius[:, None]
    inside = has_side & (math.safe_norm(side_local) < radius)
    circle = wrap_circle(end0, end1, side_plane, has_side, radius)
    pressed = wrap_inside(end0, end1, radius, early_exit)
    wrapped, length, t0, t1 = (torch.where(inside if a.dim() == 1 else inside[:, None], b, a)
                               for a, b in zip(circle, pressed))
    wrapped = wrapped & (math.safe_norm(p0) >= MINVAL) & (math.safe_norm(p1) >= MINVAL)

    res0 = axis0 * t0[:, :1] + axis1 * t0[:, 1:]
    res1 = axis0 * t1[:, :1] + axis1 * t1[:, 1:]
    if not sphere:
        # the helix: heights in proportion to the path length up to each tangent point
        before = math.safe_norm(p0[:, :2] - res0[:, :2])
        after = math.safe_norm(p1[:, :2] - res1[:, :2])
        total = before + length + after
        total = torch.where(total < MINVAL, 1.0, total)
        rise = p1[:, 2] - p0[:, 2]
        z0 = p0[:, 2] + rise * before / total
        z1 = p0[:, 2] + rise * (before + length) / total
        res0 = torch.cat((res0[:, :2], z0[:, None]), -1)
        res1 = torch.cat((res1[:, :2], z1[:, None]), -1)
        length = math.safe_sqrt(length * length + (z1 - z0) ** 2)
    return wrapped, length, math.mat_vec(mat, res0) + pos, math.mat_vec(mat, res1) + pos
