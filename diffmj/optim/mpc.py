"""Model-predictive control: plan from the current state, apply the plan's first control, repeat."""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

import mujoco
import torch
from torch import Tensor

from diffmj import Data, Model, get_data_into, put_data, step


class MPCResult(NamedTuple):
    """What ``mpc`` returns.

    ctrl [S, nu]: the controls applied. trajectory: Data [S], the plant's Data after each step (as
    ``diffmj.rollout``). plan_cost [S]: the cost of each step's plan (its ``cost``). plan_time [S]: seconds
    spent planning at each step. wall_time: seconds in all.
    """

    ctrl: Tensor
    trajectory: Data
    plan_cost: Tensor
    plan_time: Tensor
    wall_time: float


def shift_ctrl(plan: Any) -> Tensor:
    """The default warm start: the plan's controls [..., T, nu] one step later, the last one repeated."""
    return torch.cat((plan.ctrl[..., 1:, :], plan.ctrl[..., -1:, :]), -2)


class MPCPolicy:
    """A planner as a policy, as torchrl's planners (``CEMPlanner``, ``MPPIPlanner``) are: called with the
    current state it plans and returns the control to apply now, and it keeps the plan to warm-start the
    next call.

    planner(d, nominal) -> a plan with ``ctrl`` [T, nu] and ``cost`` [] (see ``mpc``). nominal: the first
    call's starting point, restored by ``reset()``. warm_start(plan) -> the next call's nominal (default:
    ``shift_ctrl``). After a call, ``plan`` is the plan it made and ``nominal`` the next call's start.
    """

    def __init__(self, planner: Callable[[Data, Tensor], Any], nominal: Tensor, *,
                 warm_start: Callable[[Any], Tensor] = shift_ctrl):
        self.planner, self.warm_start = planner, warm_start
        self.initial = nominal.detach().clone()
        self.reset()

    def reset(self, nominal: Tensor | None = None) -> None:
        """Forget the last plan; the next call starts from ``nominal`` (default: the one given at creation)."""
        self.nominal = self.initial if nominal is None else nominal.detach()
        self.plan = None

    def __call__(self, d: Data) -> Tensor:
        """Plan from d (batched or not); the plan's first control [..., nu], detached."""
        self.plan = self.planner(d, self.nominal)
        self.nominal = self.warm_start(self.plan)
        return self.plan.ctrl[..., 0, :].detach()


def mpc(m: Model, d: Data, planner: Callable[[Data, Tensor], Any], nominal: Tensor, steps: int, *,
        plant: mujoco.MjModel | None = None, warm_start: Callable[[Any], Tensor] = shift_ctrl) -> MPCResult:
    """Run ``steps`` control steps in closed loop from d (one unbatched Data), planning at every step with
    an ``MPCPolicy(planner, nominal, warm_start=warm_start)``.

    planner(d, nominal) -> a plan with ``ctrl`` [T, nu] (its first row is applied) and ``cost`` [] (any
    planner of ``diffmj.optim`` partially applied, e.g. ``lambda d, u: optim.ilqr(m, d, u, cost)``).
    nominal: the first plan's starting point; each next one is ``warm_start(plan)`` (default: the
    controls shifted one step, the last repeated; for knots K < T, ``lambda p: shift_knots(p.knots, T,
    spline)``). plant: step the system with MuJoCo C's ``mj_step`` on this MjModel (the one m was made
    from), its MjData copied back with ``put_data`` after each step, instead of ``diffmj.step``.
    """
    start = time.perf_counter()
    if not isinstance(d, Data) or d.batch_dims:
        raise ValueError("d must be one unbatched diffmj.Data (the initial state)")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if plant is not None:
        if (plant.nq, plant.nv, plant.na, plant.nu) != (m.nq, m.nv, m.na, m.nu):
            raise ValueError("plant's sizes (nq, nv, na, nu) differ from the model's")
        plant_data = mujoco.MjData(plant)
        get_data_into(plant_data, plant, d)
    policy = MPCPolicy(planner, nominal, warm_start=warm_start)
    applied, states, plan_cost, plan_time = [], [], [], []
    d = d.detach()
    for _ in range(steps):
        planned = time.perf_counter()
        u = policy(d)
        plan_time.append(time.perf_counter() - planned)
        if plant is None:
            with torch.no_grad():  # the plant needs no gradient (planners choose their own)
                d = step(m, d.replace(ctrl=u))
        else:
            plant_data.ctrl[:] = u.to("cpu", torch.float64).numpy()
            mujoco.mj_step(plant, plant_data)
            d = put_data(m, plant_data)
        applied.append(u)
        states.append(d)
        plan_cost.append(policy.plan.cost.detach())
    return MPCResult(ctrl=torch.stack(applied), trajectory=torch.stack(states), plan_cost=torch.stack(plan_cost),
                     plan_time=torch.tensor(plan_time, dtype=torch.float64), wall_time=time.perf_counter() - start)
