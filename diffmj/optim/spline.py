"""Controls parameterised by knots, as MJPC's sampling planners do: K knots spread evenly over T steps.

Knot k sits at step t_k = k (T - 1) / (K - 1) (one knot: at step 0, held throughout); the control of
step t is the spline through the knots evaluated at t. Splines (MJPC's ``kZero``, ``kLinear``, ``kCubic``):

    zero    zero-order hold: the last knot at or before t
    linear  linear interpolation between the two knots around t
    cubic   cubic Hermite interpolation, slopes by finite differences (centred inside, one-sided at
            the ends): C1, and linear for two knots

With K = T every step has its own knot and every spline gives ctrl = knots. Beyond the last knot
(``shift_knots``) every spline holds the last knot's value.
"""

from __future__ import annotations

import torch
from torch import Tensor

SPLINES = ("zero", "linear", "cubic")


def knot_times(num_knots: int, horizon: int, *, dtype: torch.dtype = torch.float64,
               device: torch.device | str | None = None) -> Tensor:
    """The step at which each knot sits, [K]: evenly from 0 to T - 1."""
    if num_knots < 1 or horizon < 1:
        raise ValueError(f"need at least one knot and one step, got {num_knots} knots over {horizon} steps")
    if num_knots == 1:
        return torch.zeros(1, dtype=dtype, device=device)
    return torch.linspace(0, horizon - 1, num_knots, dtype=dtype, device=device)


def interpolate(knots: Tensor, times: Tensor, at: Tensor, spline: str) -> Tensor:
    """The spline through knots [..., K, nu] at times [K] (increasing), evaluated at ``at`` [S]: [..., S, nu].

    Differentiable in the knots (and, within an interval, in ``at``). Outside [times[0], times[-1]]
    the end knots are held.
    """
    if spline not in SPLINES:
        raise ValueError(f"spline must be one of {SPLINES}, got {spline!r}")
    if not isinstance(knots, Tensor) or knots.dim() < 2 or times.shape != knots.shape[-2:-1]:
        shape = tuple(knots.shape) if isinstance(knots, Tensor) else type(knots).__name__
        raise ValueError(f"knots must be a tensor [..., K, nu] with times [K], got {shape} and {tuple(times.shape)}")
    num_knots = knots.shape[-2]
    at = at.clamp(times[0], times[-1])
    if num_knots == 1:
        return knots.expand(*knots.shape[:-2], at.shape[0], knots.shape[-1])
    # the interval [times[i], times[i + 1]] holding each time; at == times[k] falls in interval k
    lower = (torch.searchsorted(times, at, right=True) - 1).clamp(0, num_knots - 2)
    if spline == "zero":
        # the last knot itself sits at the end of the last interval
        held = torch.where(at >= times[-1], num_knots - 1, lower)
        return knots[..., held, :]
    width = times[lower + 1] - times[lower]
    s = ((at - times[lower]) / width)[:, None]
    p0, p1 = knots[..., lower, :], knots[..., lower + 1, :]
    if spline == "linear":
        return p0 + s * (p1 - p0)
    secants = (knots[..., 1:, :] - knots[..., :-1, :]) / (times[1:] - times[:-1])[:, None]
    # slopes at the knots: the mean of the neighbouring secants inside, the one secant at either end
    slopes = torch.cat((secants[..., :1, :], 0.5 * (secants[..., 1:, :] + secants[..., :-1, :]), secants[..., -1:, :]),
                       -2)
    m0, m1 = slopes[..., lower, :] * width[:, None], slopes[..., lower + 1, :] * width[:, None]
    s2, s3 = s * s, s * s * s
    return (2 * s3 - 3 * s2 + 1) * p0 + (s3 - 2 * s2 + s) * m0 + (-2 * s3 + 3 * s2) * p1 + (s3 - s2) * m1


def spline_ctrl(knots: Tensor, horizon: int, spline: str) -> Tensor:
    """The controls [..., T, nu] of knots [..., K, nu] spread over ``horizon`` = T steps."""
    times = knot_times(knots.shape[-2], horizon, dtype=knots.dtype, device=knots.device)
    return interpolate(knots, times, torch.arange(horizon, dtype=knots.dtype, device=knots.device), spline)


def shift_knots(knots: Tensor, horizon: int, spline: str, steps: int = 1) -> Tensor:
    """Knots [..., K, nu] of the same plan started ``steps`` later (MPC's warm start): the spline evaluated
    ``steps`` past each knot time, the last control held beyond the horizon."""
    times = knot_times(knots.shape[-2], horizon, dtype=knots.dtype, device=knots.device)
    return interpolate(knots, times, times + steps, spline)
