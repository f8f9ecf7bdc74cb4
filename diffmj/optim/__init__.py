"""What to do with gradients: costs (MJPC-style residual norms), planners (iLQR) and system identification.

A layer above the engine, ``diffmj.grad`` and ``diffmj.rollout``: it uses diffmj's public API only,
and nothing below imports it.
"""

from diffmj.optim.cost import (
    L2,
    Cosh,
    Cost,
    CostDerivatives,
    Quadratic,
    SmoothAbs,
    Term,
    cost_derivatives,
    trajectory_cost,
)
from diffmj.optim import sysid
from diffmj.optim.ilqr import BackwardPass, ILQRResult, IterationInfo, backward_pass, ilqr

__all__ = [
    "L2",
    "BackwardPass",
    "Cosh",
    "Cost",
    "CostDerivatives",
    "ILQRResult",
    "IterationInfo",
    "Quadratic",
    "SmoothAbs",
    "Term",
    "backward_pass",
    "cost_derivatives",
    "ilqr",
    "sysid",
    "trajectory_cost",
]
