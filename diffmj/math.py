"""Small geometric helpers: quaternions, rotations, spatial algebra, safe forms.

Every function works on the trailing dimension(s) and broadcasts over any
leading dimensions, so it serves one body, all bodies of a tree level or a
vmapped batch alike. Formulas follow MuJoCo's ``engine_util_spatial.c``
term by term so that float64 results agree to rounding.

Singular points (zero-length vectors, zero rotation angles) use forms whose
value matches MuJoCo and whose gradient is finite: the unused branch of every
``torch.where`` is fed a harmless input.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

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


def quat_mul(a: Tensor, b: Tensor) -> Tensor:
    """Hamilton product a * b. [..., 4]"""
    a0, a1, a2, a3 = a.unbind(-1)
    b0, b1, b2, b3 = b.unbind(-1)
    return torch.stack(
        (
            a0 * b0 - a1 * b1 - a2 * b2 - a3 * b3,
            a0 * b1 + a1 * b0 + a2 * b3 - a3 * b2,
            a0 * b2 - a1 * b3 + a2 * b0 + a3 * b1,
            a0 * b3 + a1 * b2 - a2 * b1 + a3 * b0,
        ),
        -1,
    )


def quat_conj(q: Tensor) -> Tensor:
    """Conjugate (inverse of a unit quaternion). [..., 4]"""
    return q * q.new_tensor([1.0, -1.0, -1.0, -1.0])


def rot_vec_quat(v: Tensor, q: Tensor) -> Tensor:
    """Rotate vector v [..., 3] by unit quaternion q [..., 4] (mju_rotVecQuat)."""
    q0, q1, q2, q3 = q.unbind(-1)
    v0, v1, v2 = v.unbind(-1)
    t0 = q0 * v0 + q2 * v2 - q3 * v1
    t1 = q0 * v1 + q3 * v0 - q1 * v2
    t2 = q0 * v2 + q1 * v1 - q2 * v0
    return torch.stack(
        (
            v0 + 2 * (q2 * t2 - q3 * t1),
            v1 + 2 * (q3 * t0 - q1 * t2),
            v2 + 2 * (q1 * t1 - q2 * t0),
        ),
        -1,
    )


def quat_to_mat(q: Tensor) -> Tensor:
    """Rotation matrix [..., 3, 3] of unit quaternion q [..., 4] (mju_quat2Mat)."""
    q0, q1, q2, q3 = q.unbind(-1)
    q00, q01, q02, q03 = q0 * q0, q0 * q1, q0 * q2, q0 * q3
    q11, q12, q13 = q1 * q1, q1 * q2, q1 * q3
    q22, q23, q33 = q2 * q2, q2 * q3, q3 * q3
    rows = (
        q00 + q11 - q22 - q33, 2 * (q12 - q03), 2 * (q13 + q02),
        2 * (q12 + q03), q00 - q11 + q22 - q33, 2 * (q23 - q01),
        2 * (q13 - q02), 2 * (q23 + q01), q00 - q11 - q22 + q33,
    )
    return torch.stack(rows, -1).unflatten(-1, (3, 3))


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


def cross(a: Tensor, b: Tensor) -> Tensor:
    """3D cross product written out (torch.linalg.cross broadcasts less freely)."""
    a0, a1, a2 = a.unbind(-1)
    b0, b1, b2 = b.unbind(-1)
    return torch.stack((a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0), -1)


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


def inert_mul(i: Tensor, v: Tensor) -> Tensor:
    """Multiply a motion vector v [..., 6] by the spatial inertia i [..., 10] (mju_mulInertVec)."""
    i0, i1, i2, i3, i4, i5, i6, i7, i8, i9 = i.unbind(-1)
    v0, v1, v2, v3, v4, v5 = v.unbind(-1)
    return torch.stack(
        (
            i0 * v0 + i3 * v1 + i4 * v2 - i8 * v4 + i7 * v5,
            i3 * v0 + i1 * v1 + i5 * v2 + i8 * v3 - i6 * v5,
            i4 * v0 + i5 * v1 + i2 * v2 - i7 * v3 + i6 * v4,
            i8 * v1 - i7 * v2 + i9 * v3,
            i6 * v2 - i8 * v0 + i9 * v4,
            i7 * v0 - i6 * v1 + i9 * v5,
        ),
        -1,
    )


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
