"""diffmj.optim.gradient_shooting: the LQR optimum by L-BFGS, Adam, control limits, batches of initial states, MPC."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj import optim
from tests.test_optim import MASS, POINT_MASS, _lqr, _point_mass_linearisation, _reach

WEIGHTS = dict(q=3.0, v=0.2, u=0.05, q_end=50.0, v_end=5.0)
HORIZON = 10


def _lbfgs(params):
    return torch.optim.LBFGS(params, line_search_fn="strong_wolfe", tolerance_grad=0.0, tolerance_change=0.0)


def _point_mass(x0=(0.5, -0.3, 0.2, 0.4)):
    """The linear point mass of tests/test_optim.py (two damped slides, motors, Euler) with a quadratic cost."""
    m = diffmj.put_model(mujoco.MjModel.from_xml_string(POINT_MASS.format(mass=MASS)))
    w = WEIGHTS
    cost = optim.Cost(
        running=(optim.Term(lambda m, d: d.qpos, w["q"]), optim.Term(lambda m, d: d.qvel, w["v"]),
                 optim.Term(lambda m, d: d.ctrl, w["u"])),
        terminal=(optim.Term(lambda m, d: d.qpos, w["q_end"]), optim.Term(lambda m, d: d.qvel, w["v_end"])))
    d = diffmj.make_data(m).replace(qpos=torch.tensor(x0[:2], dtype=m.dtype), qvel=torch.tensor(x0[2:], dtype=m.dtype))
    return m, d, cost, np.array(x0)


def _quadratic_program(x0):
    """The point mass's problem as a QP in the stacked controls u [T nu]: states x = Sx x0 + Su u, cost
    0.5 x'Qx + 0.5 w_u u'u = 0.5 u'Hu + u'b + c. Returns the minimiser, the minimum and H."""
    A, B = _point_mass_linearisation()
    nx, nu = B.shape
    Sx, Su = np.zeros(((HORIZON + 1) * nx, nx)), np.zeros(((HORIZON + 1) * nx, HORIZON * nu))
    Sx[:nx] = np.eye(nx)
    for t in range(HORIZON):
        rows, previous = slice((t + 1) * nx, (t + 2) * nx), slice(t * nx, (t + 1) * nx)
        Sx[rows], Su[rows] = A @ Sx[previous], A @ Su[previous]
        Su[rows, t * nu : (t + 1) * nu] += B
    w = WEIGHTS
    Q = np.kron(np.eye(HORIZON + 1), np.diag([w["q"]] * 2 + [w["v"]] * 2))
    Q[-nx:, -nx:] = np.diag([w["q_end"]] * 2 + [w["v_end"]] * 2)
    H = Su.T @ Q @ Su + w["u"] * np.eye(HORIZON * nu)
    b = Su.T @ Q @ Sx @ x0
    u = -np.linalg.solve(H, b)
    minimum = 0.5 * u @ H @ u + u @ b + 0.5 * x0 @ Sx.T @ Q @ Sx @ x0
    return u.reshape(HORIZON, nu), minimum, H


def test_lbfgs_reaches_the_lqr_optimum():
    m, d, cost, x0 = _point_mass()
    best, minimum, H = _quadratic_program(x0)
    # the QP and the Riccati recursion agree (two independent derivations of the same optimum)
    A, B = _point_mass_linearisation()
    w = WEIGHTS
    _, riccati = _lqr(A, B, np.diag([w["q"]] * 2 + [w["v"]] * 2), w["u"] * np.eye(2),
                      np.diag([w["q_end"]] * 2 + [w["v_end"]] * 2), x0, HORIZON)
    np.testing.assert_allclose(riccati, best, rtol=0, atol=1e-12 * np.abs(best).max())

    result = optim.gradient_shooting(m, d, torch.zeros(HORIZON, 2, dtype=m.dtype), cost, optimizer=_lbfgs,
                                     iterations=5, tolerance=0.0)
    # L-BFGS stops when its line search can no longer see a decrease: the cost is known to eps |f| and
    # f(u) - f* >= 0.5 lambda_min(H) |u - u*|^2, so it gets within sqrt(2 eps |f*| / lambda_min) = 3.1e-7
    # of the optimum but not reliably closer (measured 4.6e-8, after 2 outer iterations)
    resolution = np.sqrt(2 * np.finfo(np.float64).eps * minimum / np.linalg.eigvalsh(H).min())
    np.testing.assert_allclose(result.ctrl.numpy(), best, rtol=0, atol=resolution)
    assert result.cost.item() == pytest.approx(minimum, rel=1e-13)
    assert result.iterations < 5 and not result.converged  # stopped by the line search, not by the tolerance
    # its last step did not move the plan
    assert result.cost_history[-1] == result.cost_history[-2]


def test_adam_decreases_the_cost():
    m, d, cost, _ = _point_mass()
    result = optim.gradient_shooting(m, d, torch.zeros(HORIZON, 2, dtype=m.dtype), cost, iterations=8)
    history = result.cost_history
    assert result.iterations == 8 and history.shape == (9,)
    assert (history[1:] < history[:-1]).all()
    # the result is the plan's: its cost and trajectory are its rollout's
    rollout = diffmj.rollout(m, d, result.ctrl)
    torch.testing.assert_close(result.trajectory.qpos, rollout.qpos, rtol=0, atol=0)
    total = optim.trajectory_cost(m, cost, torch.cat((d[None], rollout)), result.ctrl).sum()
    torch.testing.assert_close(result.cost, total, rtol=1e-14, atol=0)
    assert history[-1] == result.cost


def _reach_shooting(dtype=torch.float64, **options):
    """Adam on the two-link reach of tests/test_optim.py: 4 cubic knots over 15 steps, ctrlrange [-1, 1]."""
    _, m, d, cost, _, _ = _reach(dtype)
    settings = dict(horizon=15, spline="cubic", iterations=6,
                    optimizer=lambda p: torch.optim.Adam(p, lr=0.5))
    settings.update(options)
    return m, d, cost, optim.gradient_shooting(m, d, torch.zeros(4, m.nu, dtype=dtype), cost, **settings)


def test_controls_stay_in_their_range():
    """lr 0.5 pushes knots past [-1, 1] within two steps; they are projected onto the bound and the cubic's
    overshoot between knots is clamped."""
    m, d, cost, result = _reach_shooting()
    lower, upper = m.actuator_ctrlrange[:, 0], m.actuator_ctrlrange[:, 1]
    assert ((result.knots >= lower) & (result.knots <= upper)).all()
    assert ((result.knots == lower) | (result.knots == upper)).any()  # the bounds were hit
    torch.testing.assert_close(result.ctrl, optim.spline_ctrl(result.knots, 15, "cubic").clamp(lower, upper),
                               rtol=0, atol=0)
    assert result.cost_history[-1] < 0.5 * result.cost_history[0]


def test_float32():
    m, d, cost, result = _reach_shooting(torch.float32)
    assert result.ctrl.dtype == result.knots.dtype == result.cost.dtype == result.trajectory.qpos.dtype == torch.float32
    assert result.cost_history[-1] < 0.5 * result.cost_history[0]


def test_callback_sees_every_iteration():
    infos = []
    m, d, cost, result = _reach_shooting(iterations=3, callback=infos.append)
    assert [info.iteration for info in infos] == [1, 2, 3]
    torch.testing.assert_close(torch.stack([info.cost for info in infos]), result.cost_history[1:], rtol=0, atol=0)
    assert all(info.gradient > 0 for info in infos)
    assert [info.wall_time for info in infos] == sorted(info.wall_time for info in infos)


def test_tolerance_stops():
    m, d, cost, _ = _point_mass()
    result = optim.gradient_shooting(m, d, torch.zeros(HORIZON, 2, dtype=m.dtype), cost, tolerance=1e3)
    assert result.converged and result.iterations == 0 and result.cost_history.shape == (1,)


class _Diverging(torch.optim.Optimizer):
    """A step that evaluates the closure and then leaves NaN in the parameters (what L-BFGS's strong-Wolfe
    search did on the acrobot, every knot past its bound and the clamped cost flat)."""

    def __init__(self, params):
        super().__init__(params, {})

    def step(self, closure):
        closure()
        for group in self.param_groups:
            for p in group["params"]:
                p.data.fill_(float("nan"))


def test_a_step_to_non_finite_knots_is_undone_and_stops():
    m, d, cost, _ = _point_mass()
    nominal = torch.full((HORIZON, 2), 0.1, dtype=m.dtype)
    result = optim.gradient_shooting(m, d, nominal, cost, optimizer=_Diverging, iterations=5)
    assert torch.equal(result.knots, nominal) and torch.isfinite(result.cost)
    assert result.iterations == 1 and not result.converged  # the undone step left the plan unchanged: stop


def _initial_states(m, d, count=3):
    """count initial states: d with different velocities."""
    qvel = torch.linspace(-1, 1, count, dtype=m.dtype)[:, None] * torch.tensor([0.5, 1.0], dtype=m.dtype)
    return torch.stack([d.replace(qvel=v) for v in qvel])


@pytest.mark.parametrize("optimizer", ["adam", "lbfgs"])
def test_a_batch_of_initial_states_equals_a_loop(optimizer):
    """Every element has its own optimiser: the batched run (costs and gradients from one vmapped rollout)
    gives each element's own plan to rounding; L-BFGS's line searches run per element."""
    few_evaluations = lambda p: torch.optim.LBFGS(p, line_search_fn="strong_wolfe", max_iter=2)  # noqa: E731
    options = dict(optimizer=few_evaluations) if optimizer == "lbfgs" else {}
    _, m, d, cost, _, _ = _reach()
    states = _initial_states(m, d)
    nominal = torch.zeros(3, 4, m.nu, dtype=m.dtype)
    nominal[1] = 0.3  # one plan per element
    settings = dict(horizon=10, spline="linear", iterations=2, **options)
    batch = optim.gradient_shooting(m, states, nominal, cost, **settings)
    loop = [optim.gradient_shooting(m, states[i], nominal[i], cost, **settings) for i in range(3)]
    assert batch.ctrl.shape == (3, 10, m.nu) and batch.trajectory.batch_size == (3, 10)
    for name in ("ctrl", "knots", "cost", "cost_history"):
        torch.testing.assert_close(getattr(batch, name), torch.stack([getattr(r, name) for r in loop]),
                                   rtol=0, atol=1e-12)
    torch.testing.assert_close(batch.trajectory.qpos, torch.stack([r.trajectory.qpos for r in loop]),
                               rtol=0, atol=1e-12)
    assert batch.iterations.tolist() == [r.iterations for r in loop]
    assert batch.converged.tolist() == [r.converged for r in loop]
    # the elements differ (else the comparison would not show that they are kept apart)
    assert (batch.ctrl[0] - batch.ctrl[1]).abs().max() > 1e-2


def test_batched_elements_stop_on_their_own():
    """An element that converges stops (its history repeats its final cost) while the others go on."""
    m, d, cost, _ = _point_mass()
    states = torch.stack([d, d.replace(qpos=torch.zeros(2, dtype=m.dtype), qvel=torch.zeros(2, dtype=m.dtype))])
    # the second starts at rest at the origin: zero controls are optimal, its gradient is zero
    result = optim.gradient_shooting(m, states, torch.zeros(HORIZON, 2, dtype=m.dtype), cost, iterations=3)
    assert result.iterations.tolist() == [3, 0] and result.converged.tolist() == [False, True]
    assert result.cost_history.shape == (2, 4) and (result.cost_history[1] == 0).all()
    assert (result.ctrl[1] == 0).all()


def test_shooting_in_mpc():
    """gradient_shooting is a planner for optim.mpc, warm started by its shifted controls."""
    mjm, m, d, cost, _, _ = _reach()
    calls = []

    def planner(d, nominal):
        calls.append((nominal, optim.gradient_shooting(m, d, nominal, cost, iterations=2)))
        return calls[-1][1]

    result = optim.mpc(m, d, planner, torch.zeros(8, m.nu, dtype=m.dtype), 2, plant=mjm)
    (_, first), (second_nominal, second) = calls
    torch.testing.assert_close(second_nominal, torch.cat((first.ctrl[1:], first.ctrl[-1:])), rtol=0, atol=0)
    torch.testing.assert_close(result.ctrl, torch.stack((first.ctrl[0], second.ctrl[0])), rtol=0, atol=0)
    assert first.cost < first.cost_history[0]


def test_bad_input_is_refused():
    _, m, d, cost, _, _ = _reach()
    nominal = torch.zeros(4, m.nu, dtype=m.dtype)
    with pytest.raises(ValueError, match="nominal knots must be"):
        optim.gradient_shooting(m, d, torch.zeros(4, 3, dtype=m.dtype), cost)
    with pytest.raises(ValueError, match="float32"):
        optim.gradient_shooting(m, d, nominal.float(), cost)
    with pytest.raises(ValueError, match="spline must be"):
        optim.gradient_shooting(m, d, nominal, cost, spline="quadratic")
    with pytest.raises(ValueError, match="cost must be"):
        optim.gradient_shooting(m, d, nominal, lambda m, d: d.qpos)
    with pytest.raises(ValueError, match="iterations >= 0"):
        optim.gradient_shooting(m, d, nominal, cost, iterations=-1)
    with pytest.raises(ValueError, match="horizon"):
        optim.gradient_shooting(m, d, nominal, cost, horizon=0)
    with pytest.raises(ValueError, match="torch.optim.Optimizer"):
        optim.gradient_shooting(m, d, nominal, cost, optimizer=lambda params: params)
    with pytest.raises(ValueError, match="batch shape \\(3,\\), the initial states \\(2,\\)"):
        optim.gradient_shooting(m, _initial_states(m, d, 2), nominal.expand(3, 4, m.nu), cost)
    with pytest.raises(ValueError, match="diffmj.Data"):
        optim.gradient_shooting(m, d.qpos, nominal, cost)
