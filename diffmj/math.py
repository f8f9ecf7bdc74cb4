"""Small geometric helpers: quaternions, rotations, spatial algebra, safe forms.

Every function works on the trailing dimension(s) and broadcasts over any
leading dimensions, so it serves one body, all bodies of a tree level or a
vmapped batch alike. Formulas follow MuJoCo's ``engine_util_spatial.c``
term by term so that float64 results agree to rounding; the products and
rotations (``quat_mul``, ``rot_vec_quat``, ``quat_to_mat``, ``cross``) sum their
terms in MuJoCo 4's order and equal its ``mju_`` functions to the bit
(tests/test_math.py). Those are written as one tensor of the products they
use and a few sums (``_signed_sums``), not one op per product: the stages call
them hundreds of times, and each op is a node torch.compile traces and compiles.

Singular points (zero-length vectors, zero rotation angles) use forms whose
value matches MuJoCo and whose gradient is finite: the unused branch of every
``torch.where`` is fed a harmless input.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from diffmj.workarounds import Literal

MINVAL = 1e-15  # mjMINVAL: smallest denominator MuJoCo accepts


def safe_sqrt(x: Tensor) -> Tensor:
    """Square root of x >= 0 with gradient 0 (not inf) at 0."""
    positive = x > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, x, 1.0)), 0.0)


def safe_norm(x: Tensor, dim: int = -1, keepdim: bool = False) -> Tensor:
    """Euclidean norm with gradient 0 (not NaN) at the origin."""
    return safe_sqrt((x * x).sum(dim, keepdim=keepdim))


def normalize(x: Tensor, fallback: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Return (x / |x|, |x|); where |x| < MINVAL return ``fallback`` (default e_0)."""
    norm = safe_norm(x, keepdim=True)
    small = norm < MINVAL
    unit = x / torch.where(small, 1.0, norm)
    if fallback is None:
        fallback = (torch.arange(x.shape[-1], device=x.device) == 0).to(x.dtype)
    return torch.where(small, fallback, unit), norm[..., 0]


def quat_normalize(q: Tensor) -> Tensor:
    """mju_normalize4: unit quaternion; (1, 0, 0, 0) for a zero quaternion. [..., 4]

    Like MuJoCo, a quaternion whose norm is within MINVAL of 1 is returned as it
    is (its value, bit for bit); the gradient is always that of q / |q|.
    """
    unit, norm = normalize(q)
    keep = ((norm - 1).abs() <= MINVAL)[..., None]
    return torch.where(keep, q.detach() + (unit - unit.detach()), unit)


class _Sums(NamedTuple):
    """A table of signed sums of products a_i * b_j, as constant tuples (made once, at import).

    torch.compile traces every Python operation of a function it compiles: building these tuples
    at each call would cost as much tracing as the tensor ops themselves.
    """

    factors: Literal  # [2, rows, terms] i and j of each term a_i * b_j of each output
    sign: Literal  # [rows, terms] +1.0 or -1.0 of each term
    pairwise: bool


def _sums(terms: tuple[tuple[int, ...], ...], width: int, pairwise: bool = False) -> _Sums:
    """Table of out[r] = sum over t in terms[r] of p[t - 1] (t > 0) or -p[-t - 1] (t < 0), p[i * width + j] =
    a_i * b_j being the products of a [..., n] and b [..., width] flattened row-major."""
    left = tuple(tuple((abs(t) - 1) // width for t in row) for row in terms)
    right = tuple(tuple((abs(t) - 1) % width for t in row) for row in terms)
    sign = tuple(tuple(1.0 if t > 0 else -1.0 for t in row) for row in terms)
    return _Sums(Literal.of((left, right)), Literal.of(sign), pairwise)


def _gathered(x: Tensor, index: Tensor) -> Tensor:
    """x[..., index] [..., *index.shape] by gather: its backward is a scatter_add, which CPU runs in
    parallel, where indexing's is an accumulating index_put on one thread (a quarter of a batched
    reverse-mode Jacobian's time)."""
    flat = index.flatten()
    return x.gather(-1, flat.expand(*x.shape[:-1], flat.shape[0])).unflatten(-1, index.shape)


def _signed_sums(a: Tensor, b: Tensor, sums: _Sums) -> Tensor:
    """out[..., r] = signed sum of the products a_i * b_j that ``sums`` names for r. [..., rows of sums]

    Summed left to right, or for four terms ``pairwise`` as (t0 + t1) + (t2 + t3), as MuJoCo 4's
    C code sums them (a - b is exactly a + (-b)), so the values are the C expression's to the bit,
    in a handful of tensor ops: a graph that torch.compile traces and compiles far faster than
    one op per product. Only the products used are formed (gathered factors), which also keeps the
    backward pass's buffers the size of a and b, not of every product.

    Under vmap (reverse-mode Jacobians) torch 2.13's inductor miscompiles two forms of this: index_select's
    backward (an index_add into an expanded zero tensor, summed over the mapped rows) and gathers by two
    separate index tables (one-thread C++ that reads an index before declaring it); hence gathers by the two
    halves of one table (tests/test_math.py).
    """
    left, right = sums.factors.tensor(device=a.device).unbind(0)
    terms = (_gathered(a, left) * _gathered(b, right) * sums.sign.tensor(a.dtype, a.device)).unbind(-1)
    if sums.pairwise:
        return (terms[0] + terms[1]) + (terms[2] + terms[3])
    out = terms[0]
    for term in terms[1:]:
        out = out + term
    return out


# Hamilton product, (a0*b0 - a1*b1) + (-a2*b2 - a3*b3), ... (mju_mulQuat's sums): 1 + index of a_i * b_j
# of the products a_i * b_j (_sums)
_QUAT_MUL = _sums(((1, -6, -11, -16), (2, 5, 12, -15), (3, -8, 9, 14), (4, 7, -10, 13)), 4, pairwise=True)


def quat_mul(a: Tensor, b: Tensor) -> Tensor:
    """Hamilton product a * b. [..., 4]"""
    return _signed_sums(a, b, _QUAT_MUL)


def quat_conj(q: Tensor) -> Tensor:
    """Conjugate (inverse of a unit quaternion). [..., 4]"""
    return q * q.new_tensor([1.0, -1.0, -1.0, -1.0])


# mju_rotVecQuat: t = q0 * v + q_xyz x v, then v + 2 q_xyz x t, each sum in MuJoCo's order
_ROT_T = _sums(((1, 9, -11), (2, 10, -6), (3, 5, -7)), 3)  # q0*v0 + q2*v2 - q3*v1, ... of q_i * v_j
_ROT_OUT = _sums(((9, -11), (10, -6), (5, -7)), 3)  # q2*t2 - q3*t1, q3*t0 - q1*t2, q1*t1 - q2*t0 of q_i * t_j


def rot_vec_quat(v: Tensor, q: Tensor) -> Tensor:
    """Rotate vector v [..., 3] by unit quaternion q [..., 4] (mju_rotVecQuat)."""
    t = _signed_sums(q, v, _ROT_T)
    return v + 2 * _signed_sums(q, t, _ROT_OUT)


# mju_quat2Mat: diagonal (q00 - q22) + (q11 - q33), ...; off-diagonal 2 (q12 - q03), ... of q_i * q_j
_MAT_DIAGONAL = _sums(((1, -11, 6, -16), (1, 11, -6, -16), (1, -11, -6, 16)), 4, pairwise=True)
_MAT_OFF_DIAGONAL = _sums(((7, -4), (8, 3), (7, 4), (12, -2), (8, -3), (12, 2)), 4)  # 01, 02, 10, 12, 20, 21
_MAT_LAYOUT = Literal.of((0, 3, 4, 5, 1, 6, 7, 8, 2))  # [diagonal, off-diagonal] -> row-major 3x3


def quat_to_mat(q: Tensor) -> Tensor:
    """Rotation matrix [..., 3, 3] of unit quaternion q [..., 4] (mju_quat2Mat)."""
    entries = torch.cat((_signed_sums(q, q, _MAT_DIAGONAL), 2 * _signed_sums(q, q, _MAT_OFF_DIAGONAL)), -1)
    return entries[..., _MAT_LAYOUT.tensor(device=q.device)].unflatten(-1, (3, 3))


def axis_angle_to_quat(axis: Tensor, angle: Tensor) -> Tensor:
    """Quaternion of a rotation by ``angle`` [...] about unit ``axis`` [..., 3]."""
    half = 0.5 * angle
    return torch.cat((torch.cos(half)[..., None], axis * torch.sin(half)[..., None]), -1)


def quat_to_vel(q: Tensor) -> Tensor:
    """Rotation vector (axis * angle, angle in (-pi, pi]) of quaternion q (mju_quat2Vel, dt=1).

    Near the identity the factor angle / sin(angle/2) tends to 2 / q0; it is
    evaluated in a form that keeps the gradient finite at exactly zero.
    """
    w = q[..., 0]
    xyz = q[..., 1:]
    s = safe_norm(xyz)
    small = s < MINVAL
    s_safe = torch.where(small, 1.0, s)
    angle = 2 * torch.atan2(s_safe, w)
    angle = torch.where(angle > math.pi, angle - 2 * math.pi, angle)
    w_safe = torch.where(w == 0, 1.0, w)
    factor = torch.where(small, 2 / w_safe, angle / s_safe)
    return xyz * factor[..., None]


def quat_sub(qa: Tensor, qb: Tensor) -> Tensor:
    """Rotation vector r with qb * quat(r) = qa (mju_subQuat). [..., 3]"""
    return quat_to_vel(quat_mul(quat_conj(qb), qa))


def quat_integrate(q: Tensor, vel: Tensor, scale: Tensor | float) -> Tensor:
    """Rotate q by the local angular velocity ``vel`` over time ``scale`` (mju_quatIntegrate).

    Uses sin(a/2)/|v| = (scale/2) sinc(a/2pi), finite and differentiable at v = 0.
    """
    speed = safe_norm(vel)
    angle = speed * scale
    xyz = vel * (0.5 * scale * torch.sinc(angle / (2 * math.pi)))[..., None]
    qrot = torch.cat((torch.cos(0.5 * angle)[..., None], xyz), -1)
    return quat_mul(quat_normalize(q), qrot)


def dot(a: Tensor, b: Tensor) -> Tensor:
    """3D dot product a0*b0 + a1*b1 + a2*b2, summed in mju_dot3's order. [...]"""
    return a[..., 0] * b[..., 0] + a[..., 1] * b[..., 1] + a[..., 2] * b[..., 2]


def mat_vec(mat: Tensor, v: Tensor) -> Tensor:
    """mat @ v for 3x3 mat [..., 3, 3] and v [..., 3], summed as mju_mulMatVec3."""
    return dot(mat, v[..., None, :])


def mat_t_vec(mat: Tensor, v: Tensor) -> Tensor:
    """mat^T @ v for 3x3 mat [..., 3, 3] and v [..., 3], summed as mju_mulMatTVec3."""
    return dot(mat.transpose(-1, -2), v[..., None, :])


_CROSS = _sums(((6, -8), (7, -3), (2, -4)), 3)  # a1*b2 - a2*b1, a2*b0 - a0*b2, a0*b1 - a1*b0 of a_i * b_j


def cross(a: Tensor, b: Tensor) -> Tensor:
    """3D cross product [..., 3] (torch.linalg.cross broadcasts less freely)."""
    return _signed_sums(a, b, _CROSS)


def cross_motion(vel: Tensor, v: Tensor) -> Tensor:
    """Spatial motion cross product vel x v, vectors [..., 6] = (angular, linear)."""
    w, u = vel[..., :3], vel[..., 3:]
    return torch.cat((cross(w, v[..., :3]), cross(w, v[..., 3:]) + cross(u, v[..., :3])), -1)


def cross_force(vel: Tensor, f: Tensor) -> Tensor:
    """Spatial force cross product vel x* f, vectors [..., 6] = (angular, linear)."""
    w, u = vel[..., :3], vel[..., 3:]
    return torch.cat((cross(w, f[..., :3]) + cross(u, f[..., 3:]), cross(w, f[..., 3:])), -1)


def inert_com(inertia: Tensor, mat: Tensor, offset: Tensor, mass: Tensor) -> Tensor:
    """Body inertia in the com-based frame as MuJoCo's 10-vector (mju_inertCom).

    inertia [..., 3] principal moments, mat [..., 3, 3] inertia frame, offset [..., 3]
    from subtree com to body com, mass [...]. Result [..., 10]:
    (I00, I11, I22, I01, I02, I12, m*c0, m*c1, m*c2, m).
    """
    rot = (mat * inertia[..., None, :]) @ mat.transpose(-1, -2)
    d0, d1, d2 = offset.unbind(-1)
    m = mass
    return torch.stack(
        (
            rot[..., 0, 0] + m * (d1 * d1 + d2 * d2),
            rot[..., 1, 1] + m * (d0 * d0 + d2 * d2),
            rot[..., 2, 2] + m * (d0 * d0 + d1 * d1),
            rot[..., 0, 1] - m * d0 * d1,
            rot[..., 0, 2] - m * d0 * d2,
            rot[..., 1, 2] - m * d1 * d2,
            m * d0,
            m * d1,
            m * d2,
            m,
        ),
        -1,
    )


# mju_mulInertVec: i0*v0 + i3*v1 + i4*v2 - i8*v4 + i7*v5, ... as 1 + index of i_a * v_b (_sums, width 6)
_INERT_ANGULAR = _sums(((1, 20, 27, -53, 48), (19, 8, 33, 52, -42), (25, 32, 15, -46, 41)), 6)
_INERT_LINEAR = _sums(((50, -45, 58), (39, -49, 59), (43, -38, 60)), 6)  # i8*v1 - i7*v2 + i9*v3, ...


def inert_mul(i: Tensor, v: Tensor) -> Tensor:
    """Multiply a motion vector v [..., 6] by the spatial inertia i [..., 10] (mju_mulInertVec)."""
    return torch.cat((_signed_sums(i, v, _INERT_ANGULAR), _signed_sums(i, v, _INERT_LINEAR)), -1)


def transform_motion(vec: Tensor, new_pos: Tensor, old_pos: Tensor) -> Tensor:
    """Shift a motion vector [..., 6] from ``old_pos`` to ``new_pos`` (no rotation)."""
    lin = vec[..., 3:] - cross(new_pos - old_pos, vec[..., :3])
    return torch.cat((vec[..., :3], lin), -1)


def transform_force(vec: Tensor, new_pos: Tensor, old_pos: Tensor) -> Tensor:
    """Shift a force vector [..., 6] from ``old_pos`` to ``new_pos`` (no rotation)."""
    ang = vec[..., :3] - cross(new_pos - old_pos, vec[..., 3:])
    return torch.cat((ang, vec[..., 3:]), -1)


def gather_blocks(x: Tensor, adr: Tensor, width: int) -> Tensor:
    """Contiguous blocks x[adr[k] : adr[k] + width] of a vector x, stacked: [k, width]."""
    return x[adr[:, None] + torch.arange(width, device=adr.device)]


def cholesky(a: Tensor) -> Tensor:
    """Lower Cholesky factor of symmetric positive definite a [..., n, n].

    Uses cholesky_ex: no error check, hence no host synchronisation, and none of
    the large fixed overhead linalg.cholesky has for small matrices on CPU.
    """
    return torch.linalg.cholesky_ex(a)[0]
