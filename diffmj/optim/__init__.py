"""What to do with gradients: costs (MJPC-style residual norms), planners (iLQR, gradient shooting,
sampling, MPC; each over one initial state or a batch of them)
and system identification (``diffmj.optim.sysid``).

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
    running_cost,
    trajectory_cost,
)
from diffmj.optim import sysid
from diffmj.optim.ilqr import BackwardPass, ILQRResult, IterationInfo, backward_pass, ilqr
from diffmj.optim.mpc import MPCPolicy, MPCResult, mpc, shift_ctrl
from diffmj.optim.shooting import ShootingInfo, ShootingResult, gradient_shooting
from diffmj.optim.mujoco_c import rollout_feedback_mujoco, rollout_mujoco
from diffmj.optim.sampling import SamplingResult, cem, mppi, predictive_sampling, rollout_costs
from diffmj.optim.spline import SPLINES, interpolate, knot_times, shift_knots, spline_ctrl

__all__ = [
    "L2",
    "BackwardPass",
    "Cosh",
    "Cost",
    "CostDerivatives",
    "ILQRResult",
    "IterationInfo",
    "MPCPolicy",
    "MPCResult",
    "Quadratic",
    "SPLINES",
    "SamplingResult",
    "ShootingInfo",
    "ShootingResult",
    "SmoothAbs",
    "Term",
    "backward_pass",
    "cem",
    "cost_derivatives",
    "gradient_shooting",
    "ilqr",
    "interpolate",
    "knot_times",
    "mpc",
    "mppi",
    "predictive_sampling",
    "rollout_costs",
    "rollout_feedback_mujoco",
    "rollout_mujoco",
    "running_cost",
    "shift_ctrl",
    "shift_knots",
    "spline_ctrl",
    "sysid",
    "trajectory_cost",
]
