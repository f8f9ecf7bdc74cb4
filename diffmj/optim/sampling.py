"""Sampling planners (MJPC's): predictive sampling, MPPI and the cross-entropy method, on knot splines.

Each iteration perturbs the nominal knots with Gaussian noise, rolls every candidate out (the nominal
itself is candidate 0, unperturbed), scores it with a ``Cost`` and updates the nominal:

    predictive sampling  the best candidate (never worse than the nominal, which is a candidate)
    MPPI                 the average of the candidates weighted by exp(-(cost - min cost) / temperature)
    CEM                  the mean of the elite fraction; the noise becomes the elites' standard deviation,
                         kept above a minimum

Knots are clamped to ``actuator_ctrlrange`` (ctrl-limited actuators) after perturbation, and the
controls after interpolation (a cubic spline may overshoot its knots). No gradient is taken:
rollouts run under ``torch.no_grad`` in diffmj (batched with vmap) or, given the MjModel, in MuJoCo
C's ``mujoco.rollout`` (``mujoco_c.rollout_mujoco``: CPU threads, the same physics); the costs are
diffmj's either way.
"""

from __future__ import annotations

import math
import time
from typing import Callable, NamedTuple

import mujoco
import torch
from torch import Tensor

from diffmj import Data, Model, rollout
from diffmj.optim.cost import Cost, trajectory_cost
from diffmj.optim.mujoco_c import rollout_mujoco
from diffmj.optim.spline import SPLINES, spline_ctrl
from diffmj.optim.batch import over_initial_states
from diffmj.optim.validate import check_start, ctrl_bounds


class SamplingResult(NamedTuple):
    """What the sampling planners return (with leading batch dimensions S for a batch of initial states, as
    ``diffmj.optim.batch`` describes).

    ctrl [T, nu]: the plan's controls (clamped). knots [K, nu]: the plan's knots. trajectory: Data [T],
    the Data after each step of the plan (from ``mujoco.rollout``: only the state, FULLPHYSICS, and ctrl
    are the plan's; other fields are d's). cost: [] the plan's total cost. cost_history
    [iterations + 1]: the nominal's cost before the first and after each iteration. wall_time: seconds.
    """

    ctrl: Tensor
    knots: Tensor
    trajectory: Data
    cost: Tensor
    cost_history: Tensor
    wall_time: float


@torch.no_grad()
def rollout_costs(m: Model, d: Data, ctrl: Tensor, cost: Cost, *, mj_model: mujoco.MjModel | None = None,
                  threads: int = 1) -> tuple[Tensor, Data]:
    """The total cost [...] of each control sequence ctrl [..., T, nu] from d, and the trajectories [..., T].

    Rolled out by ``diffmj.rollout`` (vmapped, no gradient), or by ``rollout_mujoco`` when mj_model is
    given; the cost is ``trajectory_cost`` summed over the T + 1 states either way.
    """
    if mj_model is None:
        trajectory = rollout(m, d, ctrl, checkpoint=None)
    else:
        trajectory = rollout_mujoco(mj_model, m, d, ctrl, threads=threads)
    batch = ctrl.shape[:-2]
    states = torch.cat((d.detach().expand(*batch, 1), trajectory), len(batch))
    return trajectory_cost(m, cost, states, ctrl).sum(-1), trajectory


# update(candidates [N, K, nu], costs [N], std [K, nu]) -> (new nominal knots [K, nu], new std, index of
# the new nominal among the candidates or None when it is none of them)
_Update = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor, int | None]]


@over_initial_states
def _plan(m: Model, d: Data, nominal: Tensor, cost: Cost, update: _Update, num_samples: int, noise: float | Tensor,
          iterations: int, horizon: int | None, spline: str, generator: torch.Generator | int | None,
          mj_model: mujoco.MjModel | None, threads: int) -> SamplingResult:
    """The loop the three planners share: sample around the nominal, roll out, score, update."""
    start = time.perf_counter()
    check_start(m, d, nominal, "nominal knots")
    if not isinstance(cost, Cost):
        raise ValueError(f"cost must be a diffmj.optim.Cost, got {type(cost).__name__}")
    if spline not in SPLINES:
        raise ValueError(f"spline must be one of {SPLINES}, got {spline!r}")
    if num_samples < 1 or iterations < 0:
        raise ValueError(f"need num_samples >= 1 and iterations >= 0, got {num_samples} and {iterations}")
    horizon = nominal.shape[0] if horizon is None else horizon
    if horizon < 1:
        raise ValueError(f"horizon must be at least one step, got {horizon}")
    std = torch.as_tensor(noise, dtype=m.dtype, device=m.device)
    if std.dim() > 1 or (std.dim() == 1 and std.shape[0] != m.nu) or (std < 0).any():
        raise ValueError(f"noise must be a standard deviation >= 0, a scalar or [nu={m.nu}], got {noise!r}")
    std = std.expand(nominal.shape).clone()
    if isinstance(generator, int):
        generator = torch.Generator(m.device).manual_seed(generator)
    lower, upper = ctrl_bounds(m)

    def evaluate(knots: Tensor) -> tuple[Tensor, Tensor, Data]:
        ctrl = torch.minimum(torch.maximum(spline_ctrl(knots, horizon, spline), lower), upper)
        costs, trajectory = rollout_costs(m, d, ctrl, cost, mj_model=mj_model, threads=threads)
        # a rollout that blew up costs NaN: the worst, not (as argmin and softmax take NaN) the best
        return costs.nan_to_num(nan=torch.inf), ctrl, trajectory

    d = d.detach()
    knots = torch.minimum(torch.maximum(nominal.detach(), lower), upper)
    history, best = [], None
    for _ in range(iterations):
        noise_samples = torch.randn(num_samples - 1, *knots.shape, generator=generator, dtype=m.dtype,
                                    device=m.device)
        candidates = torch.cat((knots[None], torch.minimum(torch.maximum(knots + std * noise_samples, lower), upper)))
        costs, ctrl, trajectory = evaluate(candidates)
        history.append(costs[0])  # candidate 0 is the nominal
        knots, std, chosen = update(candidates, costs, std)
        best = None if chosen is None else (costs[chosen], ctrl[chosen], trajectory[chosen])
    if best is None:  # the new nominal was not among the candidates (or there was no iteration)
        costs, ctrl, trajectory = evaluate(knots[None])
        best = (costs[0], ctrl[0], trajectory[0])
    history.append(best[0])
    return SamplingResult(ctrl=best[1], knots=knots, trajectory=best[2], cost=best[0],
                          cost_history=torch.stack(history), wall_time=time.perf_counter() - start)


def predictive_sampling(m: Model, d: Data, nominal: Tensor, cost: Cost, *, num_samples: int = 32,
                        noise: float | Tensor = 0.1, iterations: int = 1, horizon: int | None = None,
                        spline: str = "zero", generator: torch.Generator | int | None = None,
                        mj_model: mujoco.MjModel | None = None, threads: int = 1) -> SamplingResult:
    """Predictive sampling (MJPC): each iteration keeps the best of the nominal and num_samples - 1
    perturbations of it, so the cost never increases.

    m, d: the model and the initial Data. nominal: knots [K, nu] (model dtype) spread over
    ``horizon`` steps (default K: one knot per step), interpolated by ``spline`` ("zero", "linear",
    "cubic"). noise: the perturbation's standard deviation, scalar or [nu], in control units.
    generator: a torch.Generator or a seed (None: torch's global generator). mj_model: roll out in MuJoCo
    C (``rollout_mujoco``) with ``threads`` threads instead of diffmj.

    A batch of initial states d [*S] (nominal [K, nu] or [*S, K, nu]) is planned element by element
    (``diffmj.optim.batch``), each call given ``generator`` as passed: a seed gives every element the same
    draws (common random numbers), a torch.Generator (or the global one) is drawn from by the elements in
    turn, as a Python loop over them would.
    """

    def best(candidates: Tensor, costs: Tensor, std: Tensor) -> tuple[Tensor, Tensor, int]:
        # argmin returns the first minimum: on ties the nominal (candidate 0) stays
        index = int(torch.argmin(costs))
        return candidates[index], std, index

    return _plan(m, d, nominal, cost, best, num_samples, noise, iterations, horizon, spline, generator, mj_model,
                 threads)


def mppi(m: Model, d: Data, nominal: Tensor, cost: Cost, *, temperature: float = 1.0, num_samples: int = 32,
         noise: float | Tensor = 0.1, iterations: int = 1, horizon: int | None = None, spline: str = "zero",
         generator: torch.Generator | int | None = None, mj_model: mujoco.MjModel | None = None,
         threads: int = 1) -> SamplingResult:
    """MPPI: the new nominal is the average of the candidates (the nominal and num_samples - 1
    perturbations) weighted by exp(-(cost - min cost) / temperature); temperature -> 0 picks the best.

    Other arguments as ``predictive_sampling``. The returned plan is the final average, rolled out once more.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")

    def average(candidates: Tensor, costs: Tensor, std: Tensor) -> tuple[Tensor, Tensor, None]:
        weights = torch.softmax(-(costs - costs.min()) / temperature, 0)
        return torch.einsum("n,nkj->kj", weights, candidates), std, None

    return _plan(m, d, nominal, cost, average, num_samples, noise, iterations, horizon, spline, generator, mj_model,
                 threads)


def cem(m: Model, d: Data, nominal: Tensor, cost: Cost, *, elite_fraction: float = 0.1, min_noise: float = 0.01,
        num_samples: int = 32, noise: float | Tensor = 0.1, iterations: int = 1, horizon: int | None = None,
        spline: str = "zero", generator: torch.Generator | int | None = None,
        mj_model: mujoco.MjModel | None = None, threads: int = 1) -> SamplingResult:
    """The cross-entropy method: the new nominal is the mean of the best ceil(elite_fraction num_samples)
    candidates and the noise their standard deviation per knot and control, at least ``min_noise``.

    ``noise`` is the initial standard deviation; other arguments as ``predictive_sampling``. The
    returned plan is the final mean, rolled out once more.
    """
    if not 0 < elite_fraction <= 1 or min_noise < 0:
        raise ValueError(f"need 0 < elite_fraction <= 1 and min_noise >= 0, got {elite_fraction} and {min_noise}")
    num_elites = math.ceil(elite_fraction * num_samples)

    def refit(candidates: Tensor, costs: Tensor, std: Tensor) -> tuple[Tensor, Tensor, None]:
        elites = candidates[torch.argsort(costs, stable=True)[:num_elites]]
        return elites.mean(0), elites.std(0, correction=0).clamp_min(min_noise), None

    return _plan(m, d, nominal, cost, refit, num_samples, noise, iterations, horizon, spline, generator, mj_model,
                 threads)
