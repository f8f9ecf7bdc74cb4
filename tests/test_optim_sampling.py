"""diffmj.optim's sampling planners: knot splines, predictive sampling, MPPI, CEM, both rollout backends, MPC."""

from __future__ import annotations

import dataclasses

import mujoco
import pytest
import torch

import diffmj
from diffmj import optim
from tests.test_optim import _reach

SAMPLERS = [optim.predictive_sampling, optim.mppi, optim.cem]


def _knots(batch=(3,), num_knots=5, nu=2, seed=0):
    return torch.randn(*batch, num_knots, nu, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("spline", optim.SPLINES)
def test_splines_pass_through_their_knots(spline):
    knots = _knots()
    # 5 knots over 13 steps sit at steps 0, 3, 6, 9, 12
    ctrl = optim.spline_ctrl(knots, 13, spline)
    assert ctrl.shape == (3, 13, 2)
    torch.testing.assert_close(ctrl[:, ::3], knots, rtol=0, atol=1e-15)
    # one knot per step: the controls are the knots
    torch.testing.assert_close(optim.spline_ctrl(knots, 5, spline), knots, rtol=0, atol=1e-15)
    # and between knots the splines differ as they should: zero holds the knot before, linear is the mean halfway
    between = optim.interpolate(knots, optim.knot_times(5, 13), torch.tensor([1.5], dtype=torch.float64), spline)
    if spline == "zero":
        torch.testing.assert_close(between[:, 0], knots[:, 0], rtol=0, atol=0)
    elif spline == "linear":
        torch.testing.assert_close(between[:, 0], 0.5 * (knots[:, 0] + knots[:, 1]), rtol=0, atol=1e-15)


def _one_sided_slopes(spline):
    """d ctrl / d t just before and at each inner knot (autograd within the two intervals), [K - 2, 3, nu] each."""
    knots, times = _knots(), optim.knot_times(5, 13)
    inner = times[1:-1]

    def slope(at):
        return torch.func.jacrev(lambda t: optim.interpolate(knots, times, t, spline))(at).diagonal(0, 1, 3)

    # the left interval's slope at its end: its cubic evaluated a hair before the knot
    return slope(inner - 1e-9), slope(inner)


def test_cubic_spline_is_c1_and_linear_is_not():
    left, right = _one_sided_slopes("cubic")
    torch.testing.assert_close(left, right, rtol=0, atol=1e-7)
    left, right = _one_sided_slopes("linear")
    assert (left - right).abs().max() > 0.1  # the check sees kinks where there are some


def test_shift_knots_is_the_plan_one_step_later():
    knots = _knots(batch=())
    for spline in optim.SPLINES:
        shifted = optim.shift_knots(knots, 13, spline)
        later = optim.spline_ctrl(knots, 13, spline)[1:]
        # the shifted knots sit one step after the old ones, and the last control is held
        torch.testing.assert_close(shifted[:-1], later[::3][: 4], rtol=0, atol=1e-15)
        torch.testing.assert_close(shifted[-1], knots[-1], rtol=0, atol=1e-15)
    # per-step controls: shifted by one, the last repeated
    torch.testing.assert_close(optim.shift_knots(knots, 5, "zero"), torch.cat((knots[1:], knots[-1:])), rtol=0, atol=0)


def _plan(planner, dtype=torch.float64, mujoco_backend=True, nominal=None, **options):
    """A planner on the two-link reach of tests/test_optim.py: 4 knots over 20 steps, from zero by default."""
    mjm, m, d, cost, tip, target = _reach(dtype)
    settings = dict(num_samples=16, noise=0.5, iterations=3, horizon=20, spline="cubic", generator=1,
                    mj_model=mjm if mujoco_backend else None)
    settings.update(options)
    nominal = torch.zeros(4, m.nu, dtype=dtype) if nominal is None else nominal
    return m, d, cost, planner(m, d, nominal, cost, **settings)


@pytest.mark.parametrize("planner", SAMPLERS, ids=lambda f: f.__name__)
def test_samplers_decrease_the_cost(planner):
    m, d, cost, result = _plan(planner, mujoco_backend=False)
    history = result.cost_history
    assert history.shape == (4,) and history[-1] < 0.35 * history[0]  # measured 0.16, 0.15, 0.21
    assert result.ctrl.shape == (20, m.nu) and result.knots.shape == (4, m.nu)
    assert (result.ctrl.abs() <= 1).all() and (result.knots.abs() <= 1).all()
    # the result is the plan's: its controls are the knots' spline, its cost and trajectory their rollout
    torch.testing.assert_close(result.ctrl, optim.spline_ctrl(result.knots, 20, "cubic").clamp(-1, 1), rtol=0, atol=0)
    total, trajectory = optim.rollout_costs(m, d, result.ctrl, cost)
    torch.testing.assert_close(result.cost, total, rtol=1e-14, atol=0)
    torch.testing.assert_close(result.trajectory.qpos, trajectory.qpos, rtol=0, atol=1e-14)


@pytest.mark.parametrize("planner", SAMPLERS, ids=lambda f: f.__name__)
def test_zero_noise_returns_the_nominal(planner):
    nominal = (0.5 * _knots(batch=(), num_knots=4)).clamp(-1, 1)  # within ctrlrange: knots are clamped
    options = dict(min_noise=0.0) if planner is optim.cem else {}
    _, _, _, result = _plan(planner, noise=0.0, nominal=nominal, **options)
    torch.testing.assert_close(result.knots, nominal, rtol=0, atol=1e-15)
    torch.testing.assert_close(result.cost_history, result.cost_history[:1].expand(4), rtol=1e-14, atol=0)


def test_predictive_sampling_never_returns_worse_than_the_nominal():
    # a good nominal (after 20 iterations), then perturbations so large that none of them is better
    m, d, cost, good = _plan(optim.predictive_sampling, iterations=20)
    _, _, _, result = _plan(optim.predictive_sampling, nominal=good.knots, noise=1.0, generator=2)
    assert result.cost == good.cost
    torch.testing.assert_close(result.knots, good.knots, rtol=0, atol=0)
    # with smaller noise it improves, and its history never rises
    _, _, _, result = _plan(optim.predictive_sampling, nominal=good.knots, noise=0.05, iterations=5, generator=2)
    assert result.cost < good.cost
    assert (result.cost_history[1:] <= result.cost_history[:-1]).all()


def test_mppi_at_low_temperature_picks_the_best_sample():
    _, _, _, best = _plan(optim.predictive_sampling, iterations=1)
    _, _, _, result = _plan(optim.mppi, iterations=1, temperature=1e-12)
    torch.testing.assert_close(result.knots, best.knots, rtol=0, atol=0)
    assert result.cost == best.cost
    # at a usual temperature the average is no single sample
    _, _, _, averaged = _plan(optim.mppi, iterations=1, temperature=1.0)
    assert (averaged.knots - best.knots).abs().max() > 1e-3


@pytest.mark.parametrize("planner", SAMPLERS, ids=lambda f: f.__name__)
def test_planners_are_deterministic_given_a_generator(planner):
    runs = [_plan(planner, generator=torch.Generator().manual_seed(seed))[3] for seed in (7, 7, 8)]
    torch.testing.assert_close(runs[0].knots, runs[1].knots, rtol=0, atol=0)
    torch.testing.assert_close(runs[0].cost_history, runs[1].cost_history, rtol=0, atol=0)
    assert (runs[0].knots - runs[2].knots).abs().max() > 1e-3


def test_mujoco_backend_gives_diffmj_costs():
    mjm, m, d, cost, tip, target = _reach()
    # user inputs reach MuJoCo C too: a generalised force on the elbow
    d = d.replace(qfrc_applied=torch.tensor([0.0, 0.3], dtype=m.dtype), qvel=torch.tensor([0.5, -1.0], dtype=m.dtype))
    ctrl = 0.7 * torch.randn(6, 20, m.nu, generator=torch.Generator().manual_seed(3), dtype=m.dtype)
    costs, trajectory = optim.rollout_costs(m, d, ctrl, cost)
    costs_c, trajectory_c = optim.rollout_costs(m, d, ctrl, cost, mj_model=mjm, threads=2)
    torch.testing.assert_close(costs_c, costs, rtol=1e-9, atol=0)  # measured 6e-16
    for field in ("qpos", "qvel", "time", "ctrl"):
        torch.testing.assert_close(getattr(trajectory_c, field), getattr(trajectory, field), rtol=0, atol=1e-9)
    # the planners see the same costs through either backend
    _, _, _, on_c = _plan(optim.cem, mujoco_backend=True)
    _, _, _, on_diffmj = _plan(optim.cem, mujoco_backend=False)
    torch.testing.assert_close(on_c.cost_history, on_diffmj.cost_history, rtol=1e-9, atol=0)


@pytest.mark.parametrize("planner", SAMPLERS, ids=lambda f: f.__name__)
def test_planners_run_in_float32(planner):
    # float32 draws other samples than float64; CEM's 2 elites of 16 (the default 10%) collapse early on
    # them (0.78 of the first cost): 4 elites reach 0.42
    options = dict(elite_fraction=0.25) if planner is optim.cem else {}
    for mujoco_backend in (False, True):
        m, d, cost, result = _plan(planner, dtype=torch.float32, mujoco_backend=mujoco_backend, **options)
        assert result.ctrl.dtype == result.cost.dtype == result.trajectory.qpos.dtype == torch.float32
        assert result.cost_history[-1] < 0.5 * result.cost_history[0]  # measured 0.28, 0.27, 0.42


def _reach_mpc(steps, plant, generator=0):
    """Predictive sampling in closed loop on the reach, with a running tip cost: the result, the tip error after
    each step and each step's (nominal, plan)."""
    mjm, m, d, cost, tip, target = _reach()
    running = optim.Cost(running=(optim.Term(lambda m, d: d.ctrl, 0.01),
                                  optim.Term(lambda m, d: d.site_xpos[tip] - target, 1.0, optim.L2(0.01)),
                                  optim.Term(lambda m, d: d.qvel, 0.01)),
                         terminal=cost.terminal, forward=True)
    horizon, g, calls = 30, torch.Generator().manual_seed(generator), []

    def planner(d, nominal):
        plan = optim.predictive_sampling(m, d, nominal, running, num_samples=64, noise=0.3, iterations=2,
                                         horizon=horizon, spline="cubic", generator=g, mj_model=mjm)
        calls.append((nominal, plan))
        return plan

    result = optim.mpc(m, d, planner, torch.zeros(4, m.nu, dtype=m.dtype), steps, plant=mjm if plant else None,
                       warm_start=lambda plan: optim.shift_knots(plan.knots, horizon, "cubic"))
    tip_error = (torch.vmap(diffmj.forward, in_dims=(None, 0))(m, result.trajectory).site_xpos[:, tip] - target)
    return result, tip_error.norm(dim=-1), calls


def test_mpc_with_the_mujoco_plant_reaches_the_target():
    result, error, _ = _reach_mpc(60, plant=True)
    assert result.ctrl.shape == (60, 2) and result.plan_time.shape == result.plan_cost.shape == (60,)
    assert error[0] > 0.45 and (error[-15:] < 0.04).all()  # measured 0.48 at the start, 0.026 at most over the last 15 steps, 0.014 at the end


def test_mpc_plants_agree():
    mujoco_plant, _, calls = _reach_mpc(5, plant=True)
    diffmj_plant, _, _ = _reach_mpc(5, plant=False)
    torch.testing.assert_close(mujoco_plant.ctrl, diffmj_plant.ctrl, rtol=0, atol=1e-9)
    torch.testing.assert_close(mujoco_plant.trajectory.qpos, diffmj_plant.trajectory.qpos, rtol=0, atol=1e-9)
    # each plan starts from the last one shifted, and its first control is applied
    for (_, plan), (nominal, _) in zip(calls, calls[1:]):
        torch.testing.assert_close(nominal, optim.shift_knots(plan.knots, 30, "cubic"), rtol=0, atol=0)
    torch.testing.assert_close(mujoco_plant.ctrl, torch.stack([plan.ctrl[0] for _, plan in calls]), rtol=0, atol=0)


def test_mpc_takes_any_planner():
    """iLQR in the loop, warm started by default with its controls shifted one step, the last repeated; and a
    planner that takes a gradient with autograd (mpc leaves gradients on around the planner)."""
    mjm, m, d, cost, _, _ = _reach()
    calls = []

    def planner(d, nominal):
        calls.append((nominal, optim.ilqr(m, d, nominal, cost, max_iterations=2)))
        return calls[-1][1]

    result = optim.mpc(m, d, planner, torch.zeros(10, m.nu, dtype=m.dtype), 2)
    (_, first), (second_nominal, second) = calls
    torch.testing.assert_close(second_nominal, torch.cat((first.ctrl[1:], first.ctrl[-1:])), rtol=0, atol=0)
    torch.testing.assert_close(result.ctrl, torch.stack((first.ctrl[0], second.ctrl[0])), rtol=0, atol=0)
    assert first.cost_history[-1] < first.cost_history[0]
    torch.testing.assert_close(result.plan_cost, torch.stack((first.cost, second.cost)), rtol=0, atol=0)
    # the diffmj plant stepped the first plan's control from d
    torch.testing.assert_close(result.trajectory.qpos[0], diffmj.step(m, d.replace(ctrl=first.ctrl[0])).qpos,
                               rtol=0, atol=0)

    def gradient_step(d, nominal):
        ctrl = nominal.clone().requires_grad_()
        total = optim.trajectory_cost(m, cost, torch.cat((d[None], diffmj.rollout(m, d, ctrl))), ctrl).sum()
        (gradient,) = torch.autograd.grad(total, ctrl)
        return optim.ILQRResult(ctrl - gradient, None, None, total.detach(), None, 1, False, 0.0, 0.0)

    result = optim.mpc(m, d, gradient_step, torch.zeros(5, m.nu, dtype=m.dtype), 1)
    assert result.ctrl.abs().max() > 0


def test_mpc_policy_carries_the_warm_start():
    """MPCPolicy, torchrl-style: each call plans from the last plan shifted, returns its first control;
    reset() goes back to the first nominal."""
    mjm, m, d, cost, _, _ = _reach()
    nominals = []

    def planner(d, nominal):
        nominals.append(nominal)
        return optim.ILQRResult(nominal + 1, None, None, nominal.sum(), None, 0, False, 0.0, 0.0)

    start = torch.arange(6, dtype=m.dtype).reshape(3, m.nu)
    policy = optim.MPCPolicy(planner, start)
    first, second = policy(d), policy(d)
    torch.testing.assert_close(first, start[0] + 1, rtol=0, atol=0)
    torch.testing.assert_close(nominals[1], optim.shift_ctrl(optim.ILQRResult(start + 1, *[None] * 8)), rtol=0, atol=0)
    torch.testing.assert_close(second, start[1] + 2, rtol=0, atol=0)
    policy.reset()
    torch.testing.assert_close(policy(d), first, rtol=0, atol=0)
    torch.testing.assert_close(nominals[2], start, rtol=0, atol=0)
    batched = optim.MPCPolicy(planner, torch.stack((start, -start)))  # plans [2, T, nu]: time is the last but one
    torch.testing.assert_close(batched(d), torch.stack((start[0], -start[0])) + 1, rtol=0, atol=0)
    torch.testing.assert_close(batched(d), torch.stack((start[1], -start[1])) + 2, rtol=0, atol=0)


def test_bad_input_is_refused():
    mjm, m, d, cost, _, _ = _reach()
    nominal = torch.zeros(4, m.nu, dtype=m.dtype)
    with pytest.raises(ValueError, match="spline must be"):
        optim.predictive_sampling(m, d, nominal, cost, spline="quadratic")
    with pytest.raises(ValueError, match="nominal knots must be"):
        optim.mppi(m, d, torch.zeros(4, 3, dtype=m.dtype), cost)
    with pytest.raises(ValueError, match="float32"):
        optim.cem(m, d, nominal.float(), cost)
    with pytest.raises(ValueError, match="noise must be"):
        optim.predictive_sampling(m, d, nominal, cost, noise=-1.0)
    with pytest.raises(ValueError, match="temperature"):
        optim.mppi(m, d, nominal, cost, temperature=0.0)
    with pytest.raises(ValueError, match="elite_fraction"):
        optim.cem(m, d, nominal, cost, elite_fraction=0.0)
    with pytest.raises(ValueError, match="batch shape \\(3,\\), the initial states \\(2,\\)"):
        optim.predictive_sampling(m, diffmj.make_data(m, batch_shape=(2,)), nominal.expand(3, 4, m.nu), cost)
    with pytest.raises(ValueError, match="sizes"):
        optim.rollout_mujoco(mujoco.MjModel.from_xml_string("<mujoco/>"), m, d, nominal[None])
    with pytest.raises(ValueError, match="steps"):
        optim.mpc(m, d, lambda d, u: None, nominal, 0)


@pytest.mark.parametrize("planner", SAMPLERS, ids=lambda f: f.__name__)
def test_a_batch_of_initial_states_equals_a_loop(planner):
    """Each element planned on its own, given the generator as passed: a seed gives every element the same
    draws, a torch.Generator is drawn from by the elements in turn."""
    mjm, m, d, cost, _, _ = _reach()
    states = torch.stack([d, d.replace(qvel=torch.tensor([1.0, -0.5], dtype=m.dtype))])
    nominal = torch.zeros(4, m.nu, dtype=m.dtype)
    settings = dict(num_samples=16, noise=0.5, iterations=2, horizon=20, spline="cubic", mj_model=mjm)

    def same(batch, loop):
        for name in ("ctrl", "knots", "cost", "cost_history"):
            torch.testing.assert_close(getattr(batch, name), torch.stack([getattr(r, name) for r in loop]),
                                       rtol=0, atol=0)
        torch.testing.assert_close(batch.trajectory.qpos, torch.stack([r.trajectory.qpos for r in loop]),
                                   rtol=0, atol=0)

    seeded = planner(m, states, nominal, cost, generator=3, **settings)
    same(seeded, [planner(m, states[i], nominal, cost, generator=3, **settings) for i in range(2)])
    shared = planner(m, states, nominal, cost, generator=torch.Generator().manual_seed(3), **settings)
    generator = torch.Generator().manual_seed(3)
    same(shared, [planner(m, states[i], nominal, cost, generator=generator, **settings) for i in range(2)])
    # the first element draws the same in both; the second draws anew from the shared generator
    torch.testing.assert_close(shared.knots[0], seeded.knots[0], rtol=0, atol=0)
    assert (shared.knots[1] - seeded.knots[1]).abs().max() > 1e-3


@pytest.mark.parametrize("planner", SAMPLERS, ids=lambda f: f.__name__)
def test_candidates_whose_cost_is_nan_are_never_chosen(planner):
    """A candidate whose rollout blew up costs NaN (here: a residual that is NaN where a control exceeds 0.4, about
    a third of the candidates). torch's argmin and softmax take NaN as the best; the planners take it as the worst,
    so the plan's cost stays finite."""
    mjm, m, d, cost, _, _ = _reach()
    blow_up = optim.Term(lambda m, d: torch.where(d.ctrl > 0.4, torch.nan, 0.0), 1.0)
    cost = dataclasses.replace(cost, running=cost.running + (blow_up,))
    knots = torch.zeros(4, m.nu, dtype=m.dtype)
    plan = planner(m, d, knots, cost, num_samples=16, noise=0.3, iterations=3, horizon=20, spline="cubic",
                   generator=5, mj_model=mjm)
    costs = optim.rollout_costs(m, d, optim.spline_ctrl(knots + 0.3 * torch.randn(
        16, 4, m.nu, generator=torch.Generator().manual_seed(5), dtype=m.dtype), 20, "cubic"), cost)[0]
    assert costs.isnan().sum() >= 3  # NaN candidates are exercised
    assert torch.isfinite(plan.cost) and torch.isfinite(plan.cost_history).all()
