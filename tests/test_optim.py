"""diffmj.optim: Gauss-Newton cost derivatives against autograd, iLQR against LQR and MuJoCo C's Jacobians."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj import optim
from diffmj.optim.ilqr import _jacobians_fd
from optim_examples import tasks
from tests.conftest import BENCHMARK_MODELS, mj_model, settled_state

# A point mass on two slide joints, no gravity, Euler with joint damping: one step is linear in
# (qpos, qvel, ctrl), MuJoCo's Euler treating the damping implicitly.
POINT_MASS = """
<mujoco><option timestep="0.05" integrator="Euler" gravity="0 0 0"/>
  <worldbody><body><joint name="x" type="slide" axis="1 0 0" damping="0.3"/>
    <joint name="y" type="slide" axis="0 1 0" damping="0.3"/>
    <geom type="sphere" size=".1" mass="{mass}" contype="0" conaffinity="0"/></body></worldbody>
  <actuator><motor joint="x"/><motor joint="y"/></actuator></mujoco>"""
MASS, DAMPING, DT = 2.0, 0.3, 0.05

# A planar two-link arm without gravity reaching for a point with its fingertip (a site).
ARM = """
<mujoco><option timestep="0.02" gravity="0 0 0"/>
  <default><geom contype="0" conaffinity="0"/><joint damping="0.05"/></default>
  <worldbody><body><joint name="shoulder" axis="0 0 1"/><geom type="capsule" fromto="0 0 0 .3 0 0" size=".02"/>
    <body pos=".3 0 0"><joint name="elbow" axis="0 0 1"/><geom type="capsule" fromto="0 0 0 .3 0 0" size=".02"/>
      <site name="tip" pos=".3 0 0"/></body></body></worldbody>
  <actuator><motor joint="shoulder" ctrlrange="-1 1"/><motor joint="elbow" ctrlrange="-1 1"/></actuator></mujoco>"""
TARGET = (0.1, 0.4, 0.0)


def _point_mass_linearisation() -> tuple[np.ndarray, np.ndarray]:
    """A, B of one Euler step of POINT_MASS by hand: (m + h b) v' = m v + h (u - b v) + h b v, x' = x + h v'."""
    h, mass, b = DT, MASS, DAMPING
    a = 1 - h * b / (mass + h * b)  # v' = a v + c u
    c = h / (mass + h * b)
    eye = np.eye(2)
    A = np.block([[eye, h * a * eye], [0 * eye, a * eye]])
    B = np.vstack((h * c * eye, c * eye))
    return A, B


def _lqr(A, B, Q, R, Q_end, x0, horizon):
    """Finite-horizon discrete LQR by the Riccati recursion: gains [T, nu, nx] and the open-loop controls."""
    P, gains = Q_end, []
    for _ in range(horizon):
        K = -np.linalg.solve(R + B.T @ P @ B, B.T @ P @ A)
        P = Q + A.T @ P @ (A + B @ K)
        gains.append(K)
    gains = gains[::-1]
    x, ctrl = x0, []
    for K in gains:
        ctrl.append(K @ x)
        x = A @ x + B @ ctrl[-1]
    return np.array(gains), np.array(ctrl)


def test_first_ilqr_iteration_on_a_linear_system_is_lqr(monkeypatch):
    m = diffmj.put_model(mujoco.MjModel.from_xml_string(POINT_MASS.format(mass=MASS)))
    A, B = _point_mass_linearisation()
    # the system really is that linear map (else the comparison below would not mean LQR)
    A_ad, B_ad, _, _ = diffmj.grad.transition_jacobians(m, diffmj.make_data(m))
    np.testing.assert_allclose(A_ad.numpy(), A, atol=1e-13)
    np.testing.assert_allclose(B_ad.numpy(), B, atol=1e-13)

    weights = dict(q=3.0, v=0.2, u=0.05, q_end=50.0, v_end=5.0)
    cost = optim.Cost(
        running=(optim.Term(lambda m, d: d.qpos, weights["q"]), optim.Term(lambda m, d: d.qvel, weights["v"]),
                 optim.Term(lambda m, d: d.ctrl, weights["u"])),
        terminal=(optim.Term(lambda m, d: d.qpos, weights["q_end"]), optim.Term(lambda m, d: d.qvel, weights["v_end"])))
    x0 = np.array([0.5, -0.3, 0.2, 0.4])
    d = diffmj.make_data(m).replace(qpos=torch.tensor(x0[:2]), qvel=torch.tensor(x0[2:]))
    horizon = 20
    result = optim.ilqr(m, d, torch.zeros(horizon, 2, dtype=m.dtype), cost, max_iterations=2, regularization=0.0)
    # one iteration (MPC's setting) linearises once: the plan it returns is not linearised again
    linearisations = []
    jacobians = diffmj.grad.transition_jacobians
    monkeypatch.setattr(diffmj.grad, "transition_jacobians", lambda *a, **k: linearisations.append(1) or jacobians(*a, **k))
    once = optim.ilqr(m, d, torch.zeros(horizon, 2, dtype=m.dtype), cost, max_iterations=1, regularization=0.0)
    assert len(linearisations) == 1 and once.iterations == 1 and not once.converged
    torch.testing.assert_close(once.ctrl, result.ctrl, rtol=0, atol=0)
    torch.testing.assert_close(once.gains, result.gains, rtol=0, atol=1e-12)  # a linear system's gains: the same

    Q = np.diag([weights["q"]] * 2 + [weights["v"]] * 2)
    Q_end = np.diag([weights["q_end"]] * 2 + [weights["v_end"]] * 2)
    gains, ctrl = _lqr(A, B, Q, weights["u"] * np.eye(2), Q_end, x0, horizon)
    assert result.iterations == 1 and result.converged  # one Newton step solves it; the second finds nothing to do
    np.testing.assert_allclose(result.ctrl.numpy(), ctrl, rtol=0, atol=1e-10 * np.abs(ctrl).max())
    np.testing.assert_allclose(result.gains.numpy(), gains, rtol=0, atol=1e-10 * np.abs(gains).max())
    # the cost LQR predicts: x0' P0 x0 / 2 with P0 from the same recursion
    x, total = x0, 0.0
    for u in ctrl:
        total += 0.5 * (x @ Q @ x + weights["u"] * u @ u)
        x = A @ x + B @ u
    total += 0.5 * x @ Q_end @ x
    assert result.cost.item() == pytest.approx(total, rel=1e-12)


def _lq_problem():
    """The point mass's LQ problem of the test above: the model, the cost, x0, the horizon and LQR's controls."""
    weights = dict(q=3.0, v=0.2, u=0.05, q_end=50.0, v_end=5.0)
    cost = optim.Cost(
        running=(optim.Term(lambda m, d: d.qpos, weights["q"]), optim.Term(lambda m, d: d.qvel, weights["v"]),
                 optim.Term(lambda m, d: d.ctrl, weights["u"])),
        terminal=(optim.Term(lambda m, d: d.qpos, weights["q_end"]), optim.Term(lambda m, d: d.qvel, weights["v_end"])))
    Q = np.diag([weights["q"]] * 2 + [weights["v"]] * 2)
    Q_end = np.diag([weights["q_end"]] * 2 + [weights["v_end"]] * 2)
    x0, horizon = np.array([0.5, -0.3, 0.2, 0.4]), 20
    A, B = _point_mass_linearisation()
    _, ctrl = _lqr(A, B, Q, weights["u"] * np.eye(2), Q_end, x0, horizon)
    return cost, x0, horizon, ctrl


@pytest.mark.parametrize("jacobians", ["exact", "mjd_transitionFD"])
def test_ilqr_from_controls_at_their_bounds_takes_the_lqr_step(jacobians):
    """Controls at a bound move inward at the full rate B: one iteration from a plan saturated at +L (each
    control's gradient pointing inward) lands on LQR's interior solution. mjd_transitionFD differentiates
    one-sided into the range there; diffmj's exact B was half of it (torch.minimum / maximum split a tie's
    gradient), and its step missed LQR's controls by 6.9."""
    cost, x0, horizon, lqr_ctrl = _lq_problem()
    bound = 1.5 * np.abs(lqr_ctrl).max()  # LQR's solution is interior
    motors = f'<motor joint="x" ctrlrange="-{bound} {bound}"/><motor joint="y" ctrlrange="-{bound} {bound}"/>'
    mjm = mujoco.MjModel.from_xml_string(POINT_MASS.format(mass=MASS).replace(
        '<motor joint="x"/><motor joint="y"/>', motors))
    m = diffmj.put_model(mjm)
    d = diffmj.make_data(m).replace(qpos=torch.tensor(x0[:2]), qvel=torch.tensor(x0[2:]))
    at_bound = d.replace(ctrl=torch.tensor([bound, -bound], dtype=m.dtype))
    _, B, _, _ = diffmj.grad.transition_jacobians(m, at_bound)
    B_fd = np.zeros((4, 2))
    mjd = mujoco.MjData(mjm)
    diffmj.get_data_into(mjd, mjm, at_bound)
    mujoco.mjd_transitionFD(mjm, mjd, 1e-6, True, None, B_fd, None, None)
    np.testing.assert_allclose(B.numpy(), B_fd, rtol=1e-6, atol=1e-9)
    result = optim.ilqr(m, d, torch.full((horizon, 2), bound, dtype=m.dtype), cost, max_iterations=1, regularization=0.0,
                        fd_model=mjm if jacobians == "mjd_transitionFD" else None)
    assert result.iterations == 1
    np.testing.assert_allclose(result.ctrl.numpy(), lqr_ctrl, rtol=0, atol=1e-6 * np.abs(lqr_ctrl).max())


def _pendulum_problem(norm):
    """The pendulum model (hinges and a ball joint) on a random trajectory, and a cost over it."""
    mjm = mj_model("pendulum")
    m = diffmj.put_model(mjm)
    generator = torch.Generator().manual_seed(0)
    d = diffmj.make_data(m).replace(qvel=torch.randn(m.nv, generator=generator, dtype=m.dtype))
    ctrl = 0.5 * torch.randn(4, m.nu, generator=generator, dtype=m.dtype)
    states = torch.cat((d[None], diffmj.rollout(m, d, ctrl)))
    return m, states, ctrl


def _perturbed_cost(m, cost, states, ctrl):
    """The total cost as a function of tangent perturbations dx [T+1, ns] of every state and of the controls."""
    nv = m.nv

    def total(dx, u):
        moved = states.replace(qpos=diffmj.integrate_pos(m, states.qpos, dx[:, :nv], 1.0),
                               qvel=states.qvel + dx[:, nv : 2 * nv], act=states.act + dx[:, 2 * nv :])
        return optim.trajectory_cost(m, cost, moved, u).sum()

    return total, torch.zeros(states.batch_size[0], 2 * nv + m.na, dtype=m.dtype)


NORMS = [optim.Quadratic(), optim.L2(0.3), optim.SmoothAbs(0.2), optim.Cosh(0.7)]


@pytest.mark.parametrize("norm", NORMS, ids=lambda n: type(n).__name__)
def test_gauss_newton_gradient_equals_autograd(norm):
    """Any residual (here through the ball joint's quaternion and forward kinematics): the gradient is exact."""
    m, states, ctrl = _pendulum_problem(norm)
    bob = 3
    cost = optim.Cost(
        running=(optim.Term(lambda m, d: d.xpos[bob] - torch.tensor([0.2, 0.0, 0.3], dtype=m.dtype), 2.0, norm),
                 optim.Term(lambda m, d: torch.cat((torch.sin(d.qvel), d.ctrl**2)), 0.5, norm)),
        terminal=(optim.Term(lambda m, d: d.xquat[bob, 1:] * d.qvel[:3], 3.0, norm),),
        forward=True)
    derivatives = optim.cost_derivatives(m, cost, states, ctrl)
    total, dx = _perturbed_cost(m, cost, states, ctrl)
    grad_x, grad_u = torch.func.grad(total, argnums=(0, 1))(dx, ctrl)
    torch.testing.assert_close(derivatives.grad_x, grad_x, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(derivatives.grad_u, grad_u, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(derivatives.value, optim.trajectory_cost(m, cost, states, ctrl), rtol=1e-14, atol=0)


def test_running_cost_is_trajectory_costs_step():
    """running_cost of a Data batch [2, 4] (states at their step's ctrl) equals trajectory_cost's running
    values, the batch and one state alone, with forward=True residuals (xpos); its gradient in ctrl is the
    quadratic term's, weight * ctrl."""
    m, states, ctrl = _pendulum_problem(optim.SmoothAbs(0.2))
    cost = optim.Cost(running=(optim.Term(lambda m, d: d.xpos[3], 2.0, optim.SmoothAbs(0.2)),
                               optim.Term(lambda m, d: d.ctrl, 0.5)), forward=True)
    batch = torch.stack([states, states])
    controls = torch.stack([ctrl, 2 * ctrl])
    want = optim.trajectory_cost(m, cost, batch, controls)[:, :-1]
    at_ctrl = batch[:, :-1].replace(ctrl=controls)
    torch.testing.assert_close(optim.running_cost(m, cost, at_ctrl), want, rtol=1e-14, atol=0)
    torch.testing.assert_close(optim.running_cost(m, cost, at_ctrl[1, 2]), want[1, 2], rtol=1e-14, atol=0)
    ctrl_leaf = controls.clone().requires_grad_(True)
    optim.running_cost(m, cost, at_ctrl.replace(ctrl=ctrl_leaf)).sum().backward()
    torch.testing.assert_close(ctrl_leaf.grad, 0.5 * controls, rtol=1e-14, atol=0)
    with pytest.raises(ValueError, match="diffmj.optim.Cost"):
        optim.running_cost(m, cost.running, at_ctrl)


@pytest.mark.parametrize("norm", NORMS, ids=lambda n: type(n).__name__)
def test_gauss_newton_hessian_equals_autograd_for_affine_residuals(norm):
    """Residuals affine in (dx, u) have no curvature of their own: the Gauss-Newton Hessian is the Hessian."""
    m, states, ctrl = _pendulum_problem(norm)
    offset = torch.tensor([0.3, -0.2], dtype=m.dtype)
    cost = optim.Cost(
        running=(optim.Term(lambda m, d: d.qpos[:2] - offset, 2.0, norm),
                 optim.Term(lambda m, d: torch.cat((d.qvel, d.ctrl - 0.1)), 0.5, norm)),
        terminal=(optim.Term(lambda m, d: d.qvel[2:] + 0.3 * d.qpos[1], 3.0, norm),))
    derivatives = optim.cost_derivatives(m, cost, states, ctrl)
    total, dx = _perturbed_cost(m, cost, states, ctrl)
    (hxx, hxu), (hux, huu) = torch.func.hessian(total, argnums=(0, 1))(dx, ctrl)
    T = ctrl.shape[0]
    steps = torch.arange(T)
    torch.testing.assert_close(derivatives.hess_xx, hxx[torch.arange(T + 1), :, torch.arange(T + 1)],
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(derivatives.hess_uu, huu[steps, :, steps], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(derivatives.hess_ux, hux[steps, :, steps], rtol=1e-12, atol=1e-12)
    # the cost has no cross-step terms: everything off the time diagonal is zero
    assert hxx.abs().sum() == pytest.approx(hxx[torch.arange(T + 1), :, torch.arange(T + 1)].abs().sum())


def _reach(dtype=torch.float64):
    mjm = mujoco.MjModel.from_xml_string(ARM)
    m = diffmj.put_model(mjm, dtype=dtype)
    tip = mujoco.mj_name2id(mjm, mujoco.mjtObj.mjOBJ_SITE, "tip")
    target = torch.tensor(TARGET, dtype=dtype)
    cost = optim.Cost(
        running=(optim.Term(lambda m, d: d.ctrl, 0.01),),
        terminal=(optim.Term(lambda m, d: d.site_xpos[tip] - target, 10.0, optim.L2(0.01)),
                  optim.Term(lambda m, d: d.qvel, 0.1)),
        forward=True)
    d = diffmj.make_data(m).replace(qpos=torch.tensor([0.3, 0.2], dtype=dtype))
    return mjm, m, d, cost, tip, target


def _tip_error(m, result, tip, target):
    final = diffmj.forward(m, result.trajectory[-1])
    return (final.site_xpos[tip] - target).norm().item()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_ilqr_reaches_with_a_monotone_cost(dtype):
    mjm, m, d, cost, tip, target = _reach(dtype)
    start_error = (diffmj.forward(m, d).site_xpos[tip] - target).norm().item()
    result = optim.ilqr(m, d, torch.zeros(30, m.nu, dtype=dtype), cost, max_iterations=30)
    history = result.cost_history
    assert result.ctrl.dtype == dtype and result.gains.shape == (30, m.nu, 2 * m.nv + m.na)
    assert (history[1:] <= history[:-1]).all()
    assert history[-1] < 0.05 * history[0]
    assert _tip_error(m, result, tip, target) < 0.01 < start_error
    assert (result.ctrl.abs() <= 1).all()
    # the returned trajectory is the plan's rollout
    torch.testing.assert_close(result.trajectory.qpos, diffmj.rollout(m, d, result.ctrl).qpos, rtol=0, atol=0)


def test_exact_and_finite_difference_jacobians_give_the_same_plan():
    """Both runs converge to the same local optimum, whose conditions (zero gradient of the true cost) do not
    involve the Jacobians' error (here 5e-10 apart). A plan stops when its predicted decrease
    0.5 g' H^-1 g < tol (1 + cost), ~1e-12, so it lies within sqrt(2e-12 / lambda_min(H)) ~ 1.4e-5 of the
    optimum (lambda_min >= 0.01, the control weight): 3e-5 for the two (measured 3.3e-6). Iterates before
    convergence are not compared: the line search's choices amplify 1e-9 differences to 1e-2 in a few steps."""
    mjm, m, d, cost, tip, target = _reach()
    start = torch.zeros(30, m.nu, dtype=m.dtype)
    exact = optim.ilqr(m, d, start, cost, max_iterations=50, tolerance=1e-12)
    fd = optim.ilqr(m, d, start, cost, max_iterations=50, tolerance=1e-12, fd_model=mjm)
    assert exact.converged and fd.converged
    torch.testing.assert_close(fd.ctrl, exact.ctrl, rtol=0, atol=3e-5)
    assert fd.cost.item() == pytest.approx(exact.cost.item(), rel=1e-9)


def test_finite_difference_linearisation_is_mujoco_cs_own_at_each_step():
    """ilqr(fd_model=)'s A_t, B_t are mjd_transitionFD's at each step of the rollout as MuJoCo C itself steps it,
    bit for bit: the hopper (contacts, where the warm start moves the solution and the differences divide that
    by eps) from the rollout's states, warm starts and controls."""
    mjm, m, d = tasks.load(tasks.hopper())
    ctrl = 0.6 * torch.rand(15, m.nu, generator=torch.Generator().manual_seed(3), dtype=m.dtype) - 0.3
    states = torch.cat((d[None], optim.rollout_feedback_mujoco(mjm, m, d, ctrl, None, None)))
    A, B = _jacobians_fd(mjm, m, states, ctrl, 1e-6)
    ns = 2 * m.nv + m.na
    expected_A, expected_B = np.zeros((ns, ns)), np.zeros((ns, m.nu))
    mjd, contacts = mujoco.MjData(mjm), 0
    diffmj.get_data_into(mjd, mjm, d)
    for t in range(ctrl.shape[0]):
        mjd.ctrl[:] = ctrl[t].numpy()
        mujoco.mjd_transitionFD(mjm, mjd, 1e-6, True, expected_A, expected_B, None, None)
        assert (A[t].numpy() == expected_A).all() and (B[t].numpy() == expected_B).all()
        mujoco.mj_step(mjm, mjd)
        contacts += mjd.ncon
    assert contacts > 0


def test_mujoco_feedback_rollout_equals_diffmjs():
    """rollout_feedback_mujoco: MuJoCo C's mj_step under iLQR's feedback law equals diffmj.rollout_feedback to
    rounding, on the ant (dx through the free joint's quaternion, contacts, the clamp exercised, a generalised
    force among the user inputs), for a batch of feedforward controls, and open loop (no gains) equals
    diffmj.rollout; its states carry each step's warm start (the qacc MuJoCo C will start from)."""
    mjm = mujoco.MjModel.from_xml_path(str(BENCHMARK_MODELS / "ant.xml"))
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, settled_state(mjm, 60))
    d = d.replace(qfrc_applied=torch.linspace(-0.5, 0.5, m.nv, dtype=m.dtype))
    horizon, gen = 6, torch.Generator().manual_seed(2)
    reference = torch.cat((d[None], diffmj.rollout(m, d, 0.1 * torch.ones(horizon, m.nu, dtype=m.dtype))[:-1]))
    ctrl = 0.4 * torch.rand(2, horizon, m.nu, generator=gen, dtype=m.dtype) - 0.2
    gains = 2.0 * torch.randn(horizon, m.nu, 2 * m.nv + m.na, generator=gen, dtype=m.dtype)
    bounds = (-0.3 * torch.ones(m.nu, dtype=m.dtype), 0.3 * torch.ones(m.nu, dtype=m.dtype))
    on_c = optim.rollout_feedback_mujoco(mjm, m, d, ctrl, gains, reference, ctrl_range=bounds)
    on_diffmj = diffmj.rollout_feedback(m, d, ctrl, gains, reference, ctrl_range=bounds)
    assert on_c.batch_size == (2, horizon) and (on_c.ctrl.abs() == 0.3).any()
    for name in ("qpos", "qvel", "ctrl", "time", "qacc_warmstart"):
        torch.testing.assert_close(getattr(on_c, name), getattr(on_diffmj, name), rtol=0, atol=1e-9)
    open_loop = optim.rollout_feedback_mujoco(mjm, m, d, ctrl[0], None, None)
    torch.testing.assert_close(open_loop.qvel, diffmj.rollout(m, d, ctrl[0]).qvel, rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match="both gains and reference"):
        optim.rollout_feedback_mujoco(mjm, m, d, ctrl, gains, None)
    with pytest.raises(ValueError, match="gains must be"):
        optim.rollout_feedback_mujoco(mjm, m, d, ctrl, gains[1:], reference)


def test_mujoco_rollouts_record_sensordata_and_take_a_start_per_trial():
    """Both C rollouts return each step's sensordata (read before the step, as diffmj.rollout's), and
    rollout_feedback_mujoco takes one start per trial (a batched d as ctrl's leading dims)."""
    mjm = mujoco.MjModel.from_xml_string(ARM.replace(
        "</actuator>", "</actuator><sensor><jointpos joint='shoulder'/><jointvel joint='elbow'/><actuatorfrc "
        "actuator='elbow_motor'/></sensor>").replace('<motor joint="elbow"', '<motor name="elbow_motor" joint="elbow"'))
    m = diffmj.put_model(mjm)
    starts = diffmj.make_data(m, batch_shape=(3,)).replace(qpos=torch.tensor([[0.3, 0.2], [-0.5, 1.0], [1.0, 0.0]],
                                                                             dtype=m.dtype))
    ctrl = 0.5 * torch.randn(3, 10, m.nu, generator=torch.Generator().manual_seed(4), dtype=m.dtype)
    expected = diffmj.rollout(m, starts, ctrl)
    per_trial = optim.rollout_feedback_mujoco(mjm, m, starts, ctrl, None, None)
    from_one = optim.rollout_mujoco(mjm, m, starts[1], ctrl)
    for name in ("qpos", "qvel", "sensordata"):
        torch.testing.assert_close(getattr(per_trial, name), getattr(expected, name), rtol=0, atol=1e-12)
        torch.testing.assert_close(getattr(from_one, name), getattr(diffmj.rollout(m, starts[1], ctrl), name),
                                   rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="or a batch"):
        optim.rollout_feedback_mujoco(mjm, m, starts[:2], ctrl, None, None)
    with pytest.raises(ValueError, match="unbatched"):
        optim.rollout_mujoco(mjm, m, starts, ctrl)


@pytest.mark.parametrize("task, timestep, horizon", [("cartpole", 0.02, 60), ("hopper", None, 30)])
def test_ilqr_forward_passes_in_mujoco_give_the_same_plan(task, timestep, horizon):
    """ilqr(mj_model=...): the forward passes (initial rollout, the line search's trials) in MuJoCo C give the
    plan, gains and costs of diffmj's forward passes to rounding (the same physics; the hopper through its
    contacts), with the Jacobians diffmj's either way."""
    spec = getattr(tasks, task)()
    mjm, m, d = tasks.load(spec, torch.float64, timestep)
    start = torch.full((horizon, m.nu), 0.1, dtype=m.dtype)
    in_diffmj = optim.ilqr(m, d, start, spec.cost, max_iterations=3)
    in_c = optim.ilqr(m, d, start, spec.cost, max_iterations=3, mj_model=mjm)
    assert in_c.iterations == in_diffmj.iterations == 3
    torch.testing.assert_close(in_c.ctrl, in_diffmj.ctrl, rtol=0, atol=1e-8)
    torch.testing.assert_close(in_c.gains, in_diffmj.gains, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(in_c.cost_history, in_diffmj.cost_history, rtol=1e-10, atol=0)
    torch.testing.assert_close(in_c.trajectory.qpos, in_diffmj.trajectory.qpos, rtol=0, atol=1e-9)
    # the C run's Data hold the states only (other fields are d's): it did not roll out in diffmj
    assert (in_c.trajectory.qacc == d.qacc).all() and not (in_diffmj.trajectory.qacc == d.qacc).all()
    with pytest.raises(ValueError, match="compile"):
        optim.ilqr(m, d, start, spec.cost, mj_model=mjm, compile=True)


def test_bad_input_is_refused():
    mjm, m, d, cost, _, _ = _reach()
    with pytest.raises(ValueError, match="ctrl must be"):
        optim.ilqr(m, d, torch.zeros(10, 3, dtype=m.dtype), cost)
    with pytest.raises(ValueError, match="batch shape \\(3,\\), the initial states \\(2,\\)"):
        optim.ilqr(m, diffmj.make_data(m, batch_shape=(2,)), torch.zeros(3, 10, 2, dtype=m.dtype), cost)
    with pytest.raises(ValueError, match="float32"):
        optim.ilqr(m, d, torch.zeros(10, 2, dtype=torch.float32), cost)
    with pytest.raises(ValueError, match="positive"):
        optim.L2(0.0)
    with pytest.raises(ValueError, match="T \\+ 1 states"):
        optim.trajectory_cost(m, cost, torch.stack([d, d]), torch.zeros(3, 2, dtype=m.dtype))


def test_ilqr_over_a_batch_of_initial_states_equals_a_loop():
    """Initial states [2, 2], each planned on its own from its own controls. On the linear point mass one
    unregularised iteration solves a start from zero controls, and none is needed from the optimum, so the
    histories differ in length: the shorter one repeats its final cost."""
    m = diffmj.put_model(mujoco.MjModel.from_xml_string(POINT_MASS.format(mass=MASS)))
    cost = optim.Cost(running=(optim.Term(lambda m, d: d.qpos, 3.0), optim.Term(lambda m, d: d.ctrl, 0.05)),
                      terminal=(optim.Term(lambda m, d: d.qvel, 5.0),))
    qvel = torch.tensor([[[0.2, 0.4], [0.5, 0.0]], [[-0.3, 0.1], [1.0, -1.0]]], dtype=m.dtype)
    states = diffmj.make_data(m, batch_shape=(2, 2)).replace(qvel=qvel)
    ctrl = torch.zeros(2, 2, 8, m.nu, dtype=m.dtype)
    ctrl[0, 1] = optim.ilqr(m, states[0, 1], ctrl[0, 1], cost, regularization=0.0).ctrl
    batch = optim.ilqr(m, states, ctrl, cost, regularization=0.0)
    loop = [optim.ilqr(m, states[i, j], ctrl[i, j], cost, regularization=0.0) for i in range(2) for j in range(2)]
    assert batch.ctrl.shape == (2, 2, 8, m.nu) and batch.trajectory.batch_size == (2, 2, 8)
    assert batch.iterations.tolist() == [[1, 0], [1, 1]] == [[r.iterations for r in loop[:2]],
                                                              [r.iterations for r in loop[2:]]]
    for name in ("ctrl", "gains", "cost", "regularization", "converged"):
        expected = torch.stack([torch.as_tensor(getattr(r, name)) for r in loop]).reshape(getattr(batch, name).shape)
        torch.testing.assert_close(getattr(batch, name), expected, rtol=0, atol=0, check_dtype=False)
    torch.testing.assert_close(batch.trajectory.qpos.reshape(4, 8, 2), torch.stack([r.trajectory.qpos for r in loop]),
                               rtol=0, atol=0)
    at_optimum = loop[1].cost_history
    assert at_optimum.shape == (1,) and at_optimum[0] > 0
    torch.testing.assert_close(batch.cost_history[0, 1], at_optimum.expand(2), rtol=0, atol=0)
    torch.testing.assert_close(batch.cost_history[1, 0], loop[2].cost_history, rtol=0, atol=0)


def test_ilqr_regularisation_follows_mjpc_schedule():
    """MJPC's schedule (``iLQGBackwardPass::UpdateRegularization``): an accepted step of length above 0.3 lowers
    the regularisation. Raising it after every accepted step shorter than 1 instead (the bug this checks) made
    mu grow geometrically on the acrobot's swing-up over a run of half steps (3 s at 0.02 s: mu 4e6 after 21
    iterations), the regularised steps then predicted almost no decrease and iLQR stopped as "converged" at
    cost 39068 where the schedule's run goes on to 37505."""
    task = tasks.acrobot()
    _, m, d = tasks.load(task, torch.float64, 0.1)
    steps: list[optim.IterationInfo] = []
    optim.ilqr(m, d, torch.full((30, m.nu), 0.1, dtype=m.dtype), task.cost, max_iterations=12, callback=steps.append)
    long_steps = [(before, after) for before, after in zip(steps, steps[1:]) if after.alpha > 0.3]
    assert any(after.alpha < 1 for _, after in long_steps)  # the case the bug was in is exercised
    for before, after in long_steps:
        assert after.regularization <= before.regularization


def test_parallel_and_sequential_line_searches_give_the_same_plan():
    """The parallel line search rolls every alpha out as one batch and accepts the first in order that passes
    the test, as the sequential one does: the same alphas, the same plan and history (to the batched step's
    roundoff), on the acrobot's swing-up where steps shorter than 1 are accepted (unregularised at the start:
    from MJPC's mu = 1 every step there is whole)."""
    task = tasks.acrobot()
    _, m, d = tasks.load(task, torch.float64, 0.1)
    start = torch.full((30, m.nu), 0.1, dtype=m.dtype)
    runs = {}
    for line_search in ("sequential", "parallel"):
        steps: list[optim.IterationInfo] = []
        result = optim.ilqr(m, d, start, task.cost, max_iterations=8, regularization=0.0, line_search=line_search,
                            callback=steps.append)
        runs[line_search] = result, [info.alpha for info in steps]
    (sequential, alphas), (parallel, parallel_alphas) = runs["sequential"], runs["parallel"]
    assert parallel_alphas == alphas and 0 < min(alphas) < 1  # steps after rejected trials are exercised
    torch.testing.assert_close(parallel.ctrl, sequential.ctrl, rtol=0, atol=1e-12)
    torch.testing.assert_close(parallel.gains, sequential.gains, rtol=0, atol=1e-12)
    torch.testing.assert_close(parallel.cost_history, sequential.cost_history, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="line_search"):
        optim.ilqr(m, d, start, task.cost, line_search="backtracking")


@pytest.mark.slow
def test_compiled_ilqr_equals_eager():
    """compile=True: the forward passes' steps (all alphas as one batch) run as compiled graphs, the loop over
    time in Python; the plan equals eager's (inductor may reorder sums: roundoff)."""
    mjm, m, d, cost, tip, target = _reach()
    start = torch.zeros(20, m.nu, dtype=m.dtype)
    eager = optim.ilqr(m, d, start, cost, max_iterations=4)
    compiled = optim.ilqr(m, d, start, cost, max_iterations=4, compile=True)
    assert compiled.iterations == eager.iterations == 4
    torch.testing.assert_close(compiled.ctrl, eager.ctrl, rtol=0, atol=1e-10)
    torch.testing.assert_close(compiled.gains, eager.gains, rtol=0, atol=1e-10)
    torch.testing.assert_close(compiled.cost_history, eager.cost_history, rtol=1e-10, atol=0)


# the census's hinge: a stiffness that turns a 1 cm deflection into a qacc over 1e10, which MuJoCo C resets
UNSTABLE = """<mujoco><worldbody><body><joint name="hinge" stiffness="1e14"/><geom size=".1" pos="0 0 .5"/></body>
  </worldbody><actuator><motor joint="hinge"/></actuator></mujoco>"""


def test_mujoco_rollouts_keep_a_blown_up_state():
    """mj_step puts a state that went bad back at qpos0 and goes on, which would score a blown-up rollout as a
    harmless one; the planners' MuJoCo C rollouts keep it bad, as diffmj's rollout does."""
    mjm = mujoco.MjModel.from_xml_string(UNSTABLE)
    m = diffmj.put_model(mjm)
    d = diffmj.make_data(m).replace(qpos=torch.tensor([0.01], dtype=m.dtype))
    ctrl = torch.zeros(2, 5, m.nu, dtype=m.dtype)
    for trajectory in (diffmj.rollout(m, d, ctrl), optim.rollout_mujoco(mjm, m, d, ctrl),
                       optim.rollout_feedback_mujoco(mjm, m, d, ctrl, None, None)):
        assert not (trajectory.qvel[:, -1].abs() < 1e10).any()
    assert mjm.opt.disableflags == 0  # the caller's model gets its own flags back
