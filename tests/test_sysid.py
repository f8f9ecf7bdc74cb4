"""diffmj.optim.sysid: parameters recovered from data the model made, exact Jacobians, bounds, flags.

The recordings are short (20-30 steps) so that the whole file runs in about half a minute: every fit
below takes a few Jacobians, and the tests compare them with jacfwd of the whole rollout (~70 ms per
step on a CPU: PyTorch's forward-mode overhead per operation).
"""

from __future__ import annotations

import copy
import io
import itertools
import math

import mujoco
import mujoco.minimize
import numpy as np
import pytest
import scipy.stats
import torch

import diffmj
from diffmj.optim import sysid
from tests.conftest import TOL

# A mass on a slide joint with a spring, a damper and a motor; sensors read position and velocity.
SPRING = """
<mujoco><option timestep="0.02"/>
  <worldbody><body name="mass"><joint name="x" type="slide" axis="1 0 0" stiffness="10" damping="{damping}"/>
    <geom type="sphere" size=".1" mass="{mass}" contype="0" conaffinity="0"/></body>
    <body name="wall" pos="1 0 0"><geom type="box" size=".1 .1 .1" mass="3" contype="0" conaffinity="0"/></body>
  </worldbody>
  <actuator><motor name="motor" joint="x" gear="{gear}"/></actuator>
  <sensor><jointpos joint="x"/><jointvel joint="x"/></sensor></mujoco>"""
TRUE = dict(mass=2.0, damping=0.5, gear=1.5)

# A hinge pendulum under gravity whose rotor inertia (armature) is unknown.
PENDULUM = """
<mujoco><option timestep="0.01"/>
  <worldbody><body name="pole"><joint name="hinge" axis="0 1 0" armature="{armature}"/>
    <geom type="capsule" fromto="0 0 0 0 0 -.5" size=".02" mass="1" contype="0" conaffinity="0"/></body></worldbody>
</mujoco>"""

# A free box sliding on a plane: its sliding friction acts only through the contact. The floor's
# friction is lower, so the contact takes the box's (MuJoCo mixes geom frictions by max). The solver
# runs to roundoff (tolerance 1e-14) so that finite differences of the residual see the dynamics, not
# where the solver happened to stop.
SLIDING_BOX = """
<mujoco><option timestep="0.02" tolerance="1e-14" iterations="100"/>
  <worldbody><geom name="floor" type="plane" size="2 2 .1" friction="0.1"/>
    <body name="box" pos="0 0 0.1"><freejoint/>
      <geom name="box" type="box" size=".1 .1 .1" mass="1" friction="{friction} 0.005 0.0001"/></body>
  </worldbody></mujoco>"""

# recovered from noiseless data: LM stops at its tolerances with the residual at roundoff
RECOVERED = 1e-6


def _spring(dtype=torch.float64, **values) -> diffmj.Model:
    return diffmj.put_model(mujoco.MjModel.from_xml_string(SPRING.format(**{**TRUE, **values})), dtype=dtype)


def _spring_recording(m: diffmj.Model, horizon: int = 30) -> sysid.Recording:
    """Two sequences (batched): different initial positions and control signals."""
    d = diffmj.make_data(m, batch_shape=(2,))
    d = d.replace(qpos=torch.tensor([[0.1], [-0.2]], dtype=m.dtype))
    t = torch.arange(horizon, dtype=m.dtype) * 0.02
    ctrl = torch.stack((torch.sin(3 * t), torch.cos(5 * t)))[..., None]
    traj = diffmj.rollout(m, d, ctrl)
    return sysid.Recording(d, ctrl, sensordata=traj.sensordata)


SPRING_PARAMS = [
    sysid.Parameter("body_mass", "mass", initial=1.0, log=True),
    sysid.Parameter("dof_damping", "x", initial=0.1, lower=0.0, upper=5.0),
    sysid.Parameter("actuator_gear", "motor", index=0, initial=1.0),
]


@pytest.fixture(scope="module")
def spring_fit():
    m = _spring()
    data = _spring_recording(m)
    return m, data, sysid.fit(m, SPRING_PARAMS, data)


def test_mass_damping_and_gear_recovered(spring_fit):
    m, data, result = spring_fit
    assert result.converged, result.status
    got = [result.params[p.label].item() for p in SPRING_PARAMS]
    np.testing.assert_allclose(got, [TRUE["mass"], TRUE["damping"], TRUE["gear"]], rtol=0, atol=RECOVERED)
    assert result.cost < 1e-20
    # the history is monotone: rejected steps repeat the cost, accepted ones lower it
    assert len(result.cost_history) == result.iterations + 1
    assert (result.cost_history.diff() <= 0).all()
    assert not result.singular and result.unidentified == ()
    for label, (low, high) in result.confidence.items():
        assert low <= result.params[label] <= high and torch.isfinite(high)
    # the Jacobian kept by the fit (chained along its last accepted rollout) is jacfwd's at its x
    expected = sysid.jacobian(m, SPRING_PARAMS, data, result.x, mode="forward")
    np.testing.assert_allclose(result.jacobian.numpy(), expected.numpy(), rtol=0,
                               atol=1e-10 * (1 + expected.abs().max().item()))


def test_confidence_intervals_follow_the_formula(spring_fit):
    """Half-widths t_{nr-n}(0.975) sqrt(s^2 (J'J)^-1_ii), s^2 = |r|^2 / (nr - n), in x (log for the mass)."""
    m, data, result = spring_fit
    J = result.jacobian.numpy()
    r = sysid.residual(m, SPRING_PARAMS, data, result.x).numpy()
    nr, n = J.shape
    s2 = r @ r / (nr - n)
    half = scipy.stats.t.ppf(0.975, nr - n) * np.sqrt(s2 * np.diag(np.linalg.inv(J.T @ J)))
    # the half-widths in x (log for the mass), which are ~1e-11 here: compare them, not the endpoints
    low = np.array([result.confidence[p.label][0].item() for p in SPRING_PARAMS])
    got = result.x.numpy() - np.array([math.log(low[0]), low[1], low[2]])
    # the endpoints round at 1e-16 |x|, about 1e-5 of a half-width (measured 5e-5)
    np.testing.assert_allclose(got, half, rtol=1e-3)


def test_jacobian_equals_central_differences_in_every_mode():
    m = _spring()
    data = _spring_recording(m, horizon=15)
    x = sysid.initial_vector(m, SPRING_PARAMS)
    forward = sysid.jacobian(m, SPRING_PARAMS, data, x, mode="forward")
    for mode in ("reverse", "steps"):
        other = sysid.jacobian(m, SPRING_PARAMS, data, x, mode=mode)
        np.testing.assert_allclose(forward.numpy(), other.numpy(), rtol=0, atol=TOL["batch"] * (1 + forward.abs().max()))
    eps = 1e-6
    columns = []
    for i in range(x.shape[0]):
        e = torch.zeros_like(x)
        e[i] = eps
        columns.append((sysid.residual(m, SPRING_PARAMS, data, x + e) - sysid.residual(m, SPRING_PARAMS, data, x - e)) / (2 * eps))
    # central differences: truncation eps^2 |r'''| plus rounding 1e-16 |r| / eps, both < 1e-9 here
    np.testing.assert_allclose(forward.numpy(), torch.stack(columns, 1).numpy(), rtol=0, atol=1e-8)
    assert (forward.abs().max(0).values > 1e-2).all()  # every parameter is seen: the comparison means something


def test_mujoco_least_squares_checks_and_uses_the_exact_jacobian():
    m = _spring()
    data = _spring_recording(m, horizon=20)
    x0, residual, jacobian, bounds = sysid.least_squares_functions(m, SPRING_PARAMS, data)
    assert bounds is not None and np.all(bounds[0] < bounds[1])
    out = io.StringIO()
    x, trace = mujoco.minimize.least_squares(x0, residual, jacobian=jacobian, bounds=bounds, check_derivatives=True,
                                             output=out, verbose=0)
    assert "matches finite-differences" in out.getvalue()
    np.testing.assert_allclose([math.exp(x[0]), x[1], x[2]], [TRUE["mass"], TRUE["damping"], TRUE["gear"]], atol=RECOVERED)
    # a wrong Jacobian is caught by the same check
    with pytest.raises(ValueError, match="does not match"):
        mujoco.minimize.least_squares(x0, residual, jacobian=lambda x, r: 1.1 * jacobian(x, r), bounds=bounds,
                                      check_derivatives=True, output=out, verbose=0, max_iter=1)


def test_armature_of_a_pendulum_from_positions_and_velocities():
    true = 0.05
    m_true = diffmj.put_model(mujoco.MjModel.from_xml_string(PENDULUM.format(armature=true)))
    d = diffmj.make_data(m_true).replace(qpos=torch.tensor([1.0], dtype=torch.float64))
    ctrl = torch.zeros(20, 0, dtype=torch.float64)
    traj = diffmj.rollout(m_true, d, ctrl)
    m = diffmj.put_model(mujoco.MjModel.from_xml_string(PENDULUM.format(armature=0.5)))  # a wrong model
    data = sysid.Recording(d, ctrl, qpos=traj.qpos, qvel=traj.qvel, weights={"qvel": 0.1})
    x = torch.tensor([0.0], dtype=torch.float64)
    plain = sysid.residual(m, [sysid.Parameter("dof_armature", "hinge")], data._replace(weights=None), x)
    weighted = sysid.residual(m, [sysid.Parameter("dof_armature", "hinge")], data, x)
    torch.testing.assert_close(weighted, torch.cat((plain[:20], 0.1 * plain[20:])), rtol=0, atol=0)
    result = sysid.fit(m, [sysid.Parameter("dof_armature", "hinge", log=True)], data)  # starts at the model's 0.5
    assert result.converged, result.status
    assert abs(result.params["dof_armature[hinge]"].item() - true) <= RECOVERED


def test_log_parameter_stays_positive_where_a_plain_one_goes_negative():
    """From far above, the first Gauss-Newton step on the damping overshoots below zero in plain
    coordinates; in log coordinates every iterate stays positive and the fit still lands."""
    m = _spring(damping=0.05)
    data = _spring_recording(m, horizon=20)
    start = [sysid.Parameter("dof_damping", "x", initial=3.0)]
    x0 = sysid.initial_vector(m, start)
    J = sysid.jacobian(m, start, data, x0)
    r = sysid.residual(m, start, data, x0)
    gauss_newton = x0 - torch.linalg.lstsq(J, r[:, None]).solution[:, 0]
    assert gauss_newton.item() < 0  # the plain step would leave the positive values

    seen = []
    params = [sysid.Parameter("dof_damping", "x", initial=3.0, log=True)]
    result = sysid.fit(m, params, data, callback=lambda i, cost, x: seen.append(sysid.values(m, params, x)["dof_damping[x]"].item()))
    assert min(seen) > 0
    assert abs(result.params["dof_damping[x]"].item() - 0.05) <= RECOVERED


def test_bounds_are_respected():
    """The true damping 0.5 lies above the upper bound 0.3: the fit stops on the bound, never beyond."""
    m = _spring()
    data = _spring_recording(m, horizon=20)
    params = [sysid.Parameter("dof_damping", "x", initial=0.1, lower=0.0, upper=0.3)]
    seen = []
    result = sysid.fit(m, params, data, callback=lambda i, cost, x: seen.append(x.item()))
    assert max(seen) <= 0.3
    assert result.params["dof_damping[x]"].item() == 0.3
    assert result.converged and result.status == "gradient"


def test_box_qp_equals_the_best_vertex_face_or_interior_point():
    """fit's step solves its quadratic model within the bounds: box_qp against enumerating which bound (or
    none) each component sits on, on random positive definite problems with some bounds infinite."""
    generator = torch.Generator().manual_seed(0)
    n = 4
    for trial in range(30):
        A = torch.randn(n, n, dtype=torch.float64, generator=generator)
        M = A @ A.mT + 0.1 * torch.eye(n, dtype=torch.float64)
        g = 3 * torch.randn(n, dtype=torch.float64, generator=generator)
        low = -torch.rand(n, dtype=torch.float64, generator=generator)
        high = torch.rand(n, dtype=torch.float64, generator=generator)
        low[0], high[1] = (-math.inf if trial % 2 else low[0]), (math.inf if trial % 3 else high[1])
        low[2], high[3] = (0.0 if trial % 4 == 1 else low[2]), (0.0 if trial % 4 == 2 else high[3])  # on a bound
        best, best_value = None, math.inf
        for faces in itertools.product((0, 1, 2), repeat=n):  # free, at low, at high
            face = torch.tensor(faces)
            d = torch.where(face == 1, low, torch.where(face == 2, high, 0.0))
            free = face == 0
            if d.isinf().any():
                continue
            if free.any():
                d[free] = torch.linalg.solve(M[free][:, free], -(g[free] + M[free][:, ~free] @ d[~free]))
            value = 0.5 * d @ M @ d + g @ d
            if (d >= low - 1e-12).all() and (d <= high + 1e-12).all() and value < best_value:
                best, best_value = d, value.item()
        np.testing.assert_allclose(sysid.box_qp(M, g, low, high).numpy(), best.numpy(), rtol=0, atol=1e-12)
    # every component at a bound it is pushed against: nothing moves
    zeros, ones = torch.zeros(n, dtype=torch.float64), torch.ones(n, dtype=torch.float64)
    assert torch.equal(sysid.box_qp(torch.eye(n, dtype=torch.float64), ones, zeros, ones), zeros)


def test_a_parameter_the_residual_does_not_see_is_flagged():
    m = _spring()
    data = _spring_recording(m, horizon=20)
    params = [sysid.Parameter("body_mass", "mass", initial=1.5), sysid.Parameter("body_mass", "wall", initial=2.0)]
    with pytest.warns(RuntimeWarning, match=r"singular.*body_mass\[wall\]"):
        result = sysid.fit(m, params, data)
    assert result.singular and result.unidentified == ("body_mass[wall]",)
    low, high = result.confidence["body_mass[wall]"]
    assert low == -math.inf and high == math.inf
    assert torch.isfinite(torch.stack(result.confidence["body_mass[mass]"])).all()
    assert abs(result.params["body_mass[mass]"].item() - TRUE["mass"]) <= RECOVERED


def test_float32():
    m = _spring(dtype=torch.float32)
    data = _spring_recording(m, horizon=20)
    params = SPRING_PARAMS[:2]
    m = _spring(dtype=torch.float32, mass=1.0, damping=0.1)
    result = sysid.fit(m, params, data, gtol=1e-7)
    assert result.x.dtype == torch.float32 and result.jacobian.dtype == torch.float32
    # float32 rounding of a 20-step rollout (~1e-6 relative) limits the recovery (measured 4.6e-6)
    np.testing.assert_allclose([result.params[p.label].item() for p in params], [TRUE["mass"], TRUE["damping"]], rtol=1e-4)


def test_bad_input_raises_value_error():
    m = _spring()
    data = _spring_recording(m, horizon=5)
    x = torch.zeros(1, dtype=torch.float64)
    bad_params = {
        "unknown model parameter": [sysid.Parameter("body_mas", "mass")],
        "no body": [sysid.Parameter("body_mass", "nope")],
        "lower < upper": [sysid.Parameter("dof_damping", "x", lower=1.0, upper=1.0)],
        "outside the bounds": [sysid.Parameter("dof_damping", "x", initial=2.0, upper=1.0)],
        "must start positive": [sysid.Parameter("dof_damping", "x", initial=0.0, log=True)],
        "index must pick": [sysid.Parameter("actuator_gear", "motor", index=6)],
        "does not broadcast": [sysid.Parameter("dof_damping", "x", initial=[1.0, 2.0])],
        "listed twice": [sysid.Parameter("dof_damping", "x"), sysid.Parameter("dof_damping", "x")],
        "no parameters": [],
    }
    for message, params in bad_params.items():
        with pytest.raises(ValueError, match=message):
            sysid.initial_vector(m, params)
    damping = [sysid.Parameter("dof_damping", "x")]
    bad_data = {
        "sensordata must be": data._replace(sensordata=data.sensordata[..., :1]),
        "ctrl must be": data._replace(ctrl=data.ctrl[..., :0]),
        "no measurements": data._replace(sensordata=None),
        "do not broadcast": data._replace(sensordata=data.sensordata.expand(3, 2, 5, 2)[:, 0]),
        "float32": data._replace(sensordata=data.sensordata.float()),
        "not measured": data._replace(weights={"qvel": 1.0}),
    }
    for message, bad in bad_data.items():
        with pytest.raises(ValueError, match=message):
            sysid.residual(m, damping, bad, x)
    with pytest.raises(ValueError, match="mode must be"):
        sysid.jacobian(m, damping, data, x, mode="central")
    with pytest.raises(ValueError, match="x must have shape"):
        sysid.residual(m, damping, data, torch.zeros(2, dtype=torch.float64))


SLIDING_FRICTION = [sysid.Parameter("geom_friction", "box", index=0, initial=0.3)]


def _sliding_box_recording(friction: float, horizon: int = 6) -> sysid.Recording:
    """MuJoCo C's qpos / qvel of two throws of the box (no actuators), the second one spinning."""
    mjm = mujoco.MjModel.from_xml_string(SLIDING_BOX.format(friction=friction))
    qvel0 = np.array([[2.0, 0, 0, 0, 0, 0], [1.0, 1.0, 0, 0, 0, 0.5]])
    qpos, qvel = np.zeros((2, horizon, mjm.nq)), np.zeros((2, horizon, mjm.nv))
    for b in range(2):
        mjd = mujoco.MjData(mjm)
        mjd.qvel[:] = qvel0[b]
        for t in range(horizon):
            mujoco.mj_step(mjm, mjd)
            qpos[b, t], qvel[b, t] = mjd.qpos, mjd.qvel
    m = diffmj.put_model(mjm)
    d0 = diffmj.make_data(m, batch_shape=(2,)).replace(qvel=torch.tensor(qvel0))
    return sysid.Recording(d0, torch.zeros(2, horizon, 0, dtype=m.dtype), qpos=torch.tensor(qpos),
                           qvel=torch.tensor(qvel))


def test_contact_jacobian_equals_central_differences():
    """The Jacobian through the contacts' solver (the implicit adjoint's jvp under vmap: two sequences;
    no actuators)."""
    m = diffmj.put_model(mujoco.MjModel.from_xml_string(SLIDING_BOX.format(friction=0.3)))
    data = _sliding_box_recording(0.5)
    x = sysid.initial_vector(m, SLIDING_FRICTION)
    J = sysid.jacobian(m, SLIDING_FRICTION, data, x)
    eps = 1e-6
    plus, minus = (sysid.residual(m, SLIDING_FRICTION, data, x + e) for e in (eps, -eps))
    # central differences: truncation eps^2 |r'''| plus rounding ~1e-16 |r| / eps, both < 1e-9 here
    np.testing.assert_allclose(J[:, 0].numpy(), ((plus - minus) / (2 * eps)).numpy(), rtol=0, atol=1e-8)
    assert J.abs().max() > 1  # the friction is seen: the comparison means something


def test_sliding_friction_recovered_through_contacts():
    """From MuJoCo C's recording with friction 0.5 (the floor's is 0.1), starting at 0.3."""
    m = diffmj.put_model(mujoco.MjModel.from_xml_string(SLIDING_BOX.format(friction=0.3)))  # a wrong model
    data = _sliding_box_recording(0.5)
    result = sysid.fit(m, SLIDING_FRICTION, data)
    assert result.converged, result.status
    assert abs(result.params["geom_friction[box][0]"].item() - 0.5) <= RECOVERED * 0.5
    # at the generating friction |r| is 4e-14 (diffmj follows MuJoCo C through the contacts to roundoff);
    # LM stops once a step is below xtol (1e-10 relative), here with |r| 1.6e-10 left
    truth = sysid.residual(m, SLIDING_FRICTION, data, torch.tensor([0.5], dtype=m.dtype))
    assert truth.abs().max() < 1e-12
    assert result.cost < 1e-18 and result.status == "step"


def _assert_joint_equals_separate(m, params, data, x):
    """residual_and_jacobian_function (stepwise tangents) and jacobian(mode="steps") (chained per-step Jacobians)
    against residual and jacfwd of the whole rollout."""
    r, J = sysid.residual_and_jacobian_function(m, params, data)(x)
    chained = sysid.jacobian(m, params, data, x, mode="steps")
    with torch.no_grad():
        expected_r = sysid.residual(m, params, data, x)
    expected_J = sysid.jacobian(m, params, data, x, mode="forward")
    assert J.shape == expected_J.shape and (expected_J.abs().max(0).values > 1e-3).all()  # every column is seen
    np.testing.assert_allclose(r.numpy(), expected_r.numpy(), rtol=0, atol=1e-12)
    for got in (J, chained):
        np.testing.assert_allclose(got.numpy(), expected_J.numpy(), rtol=0,
                                   atol=1e-10 * (1 + expected_J.abs().max().item()))


def test_stepwise_jacobian_equals_jacfwd_of_the_rollout():
    """Two sequences, a log parameter, an indexed one and one set_const derives constants from (the mass);
    an actuator with activation dynamics (a state of its own, na = 1) whose time constant is fitted;
    sensors that read the parameters within the step (the joint's actuator force: the gear; an accelerometer:
    mass, damping and gear through qacc); qpos on the manifold and contacts on the sliding box."""
    reads_params = SPRING.replace('<geom type="sphere"', '<site name="s"/><geom type="sphere"').replace(
        "</sensor>", '<jointactuatorfrc joint="x"/><accelerometer site="s"/></sensor>').replace(
        '<motor name="motor" joint="x" gear="{gear}"/>',
        '<general name="motor" joint="x" gear="{gear}" dyntype="filter" dynprm="0.1"/>')
    m, true = (diffmj.put_model(mujoco.MjModel.from_xml_string(reads_params.format(**{**TRUE, **values})))
               for values in (dict(mass=1.0, damping=0.1, gear=1.0), {}))
    assert m.na == 1
    data = _spring_recording(true, horizon=8)
    params = SPRING_PARAMS + [sysid.Parameter("actuator_dynprm", "motor", index=0, initial=0.05)]
    _assert_joint_equals_separate(m, params, data, sysid.initial_vector(m, params))
    box = diffmj.put_model(mujoco.MjModel.from_xml_string(SLIDING_BOX.format(friction=0.3)))
    box_params = SLIDING_FRICTION + [sysid.Parameter("body_mass", "box", initial=0.8)]
    _assert_joint_equals_separate(box, box_params, _sliding_box_recording(0.5, horizon=4),
                                  sysid.initial_vector(box, box_params))


@pytest.mark.slow  # minutes of compile; test_stepwise_jacobian_equals_jacfwd_of_the_rollout covers the same maths eager
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_fit(backend):
    """Each step one compiled graph (aot_eager: inductor's input, run by ATen); the fit lands where the eager
    one does and its last Jacobian is the eager one's. One compile (minutes on loaded cores for inductor)."""
    m = _spring(mass=1.0, damping=0.1, gear=1.0)
    data = _spring_recording(_spring(), horizon=8)
    result = sysid.fit(m, SPRING_PARAMS, data, compile={"backend": backend})
    assert result.converged, result.status
    got = [result.params[p.label].item() for p in SPRING_PARAMS]
    np.testing.assert_allclose(got, [TRUE["mass"], TRUE["damping"], TRUE["gear"]], rtol=0, atol=RECOVERED)
    expected = sysid.jacobian(m, SPRING_PARAMS, data, result.x, mode="forward")
    assert (expected.abs().max(0).values > 1e-3).all()
    np.testing.assert_allclose(result.jacobian.numpy(), expected.numpy(), rtol=0,
                               atol=1e-10 * (1 + expected.abs().max().item()))
    with pytest.raises(ValueError, match="forward mode"):
        sysid.fit(m, SPRING_PARAMS, data, compile=True, mode="reverse")


# A horizontal bar on a vertical hinge (gravity exerts no torque) thrown or pushed by its motor into its joint limit.
LIMITED_PENDULUM = """
<mujoco><compiler angle="radian"/><option timestep="0.01" integrator="{integrator}" cone="{cone}"><flag warmstart="{warmstart}"/></option>
  <worldbody><body name="bar"><joint name="hinge" axis="0 0 1" range="-0.3 0.3" limited="true" damping="0.1"/>
    <geom type="capsule" fromto="0 0 0 .5 0 0" size=".02" mass="1" contype="0" conaffinity="0"/></body></worldbody>
  <actuator><motor name="motor" joint="hinge"/></actuator>
  <sensor><jointpos joint="hinge"/><jointvel joint="hinge"/></sensor></mujoco>"""


@pytest.mark.parametrize("integrator, cone, warmstart", [
    ("implicitfast", "pyramidal", "enable"),  # as mujoco.sysid's arm
    ("Euler", "elliptic", "enable"),
    ("Euler", "pyramidal", "disable"),  # the tangents' step still starts from the solution
    ("RK4", "pyramidal", "enable"),  # its stages solve at other states: the solver iterates under jvp
])
def test_stepwise_jacobian_through_the_constraint_solver(integrator, cone, warmstart):
    """Two starts past the limit, one moving into it, one at rest pushed into it by the motor: each step
    solves without tangents, then takes the solution's tangent under jvp (residual_and_jacobian_function)."""
    xml = LIMITED_PENDULUM.format(integrator=integrator, cone=cone, warmstart=warmstart)
    m = diffmj.put_model(mujoco.MjModel.from_xml_string(xml))
    d0 = diffmj.make_data(m, batch_shape=(2,)).replace(qpos=torch.tensor([[0.31], [0.305]], dtype=m.dtype),
                                                       qvel=torch.tensor([[3.0], [0.0]], dtype=m.dtype))
    ctrl = torch.full((2, 6, 1), 2.0, dtype=m.dtype)
    traj = diffmj.rollout(m, d0, ctrl)
    assert (traj.efc_force.abs().sum(-1) > 1).all()  # the limit pushes back at every step of both starts
    params = [sysid.Parameter("dof_armature", "hinge", initial=0.05),
              sysid.Parameter("jnt_solref", "hinge", index=0, initial=0.03)]
    data = sysid.Recording(d0, ctrl, sensordata=traj.sensordata)
    _assert_joint_equals_separate(m, params, data, sysid.initial_vector(m, params))


def _limited_pendulum_problem():
    """LIMITED_PENDULUM (implicitfast, pyramidal) pushed into its limit, recorded at armature 0.02 and solref 0.02:
    the MjModel, its diffmj Model, parameters whose change moves the constraint rows' regularisation (armature
    through dof_invweight0, which mj_setConst recomputes) and the recording."""
    mjm = mujoco.MjModel.from_xml_string(LIMITED_PENDULUM.format(integrator="implicitfast", cone="pyramidal",
                                                                 warmstart="enable"))
    m = diffmj.put_model(mjm)
    d0 = diffmj.make_data(m, batch_shape=(2,)).replace(qpos=torch.tensor([[0.31], [0.2]], dtype=m.dtype),
                                                       qvel=torch.tensor([[3.0], [0.0]], dtype=m.dtype))
    ctrl = torch.full((2, 8, 1), 2.0, dtype=m.dtype)
    params = [sysid.Parameter("dof_armature", "hinge", initial=0.05, lower=0.0, upper=1.0),
              sysid.Parameter("jnt_solref", "hinge", index=0, initial=0.03, lower=0.005, upper=0.1)]
    truth = sysid.apply(m, params, torch.tensor([0.02, 0.02], dtype=m.dtype))
    return mjm, m, params, sysid.Recording(d0, ctrl, sensordata=diffmj.rollout(truth, d0, ctrl).sensordata)


def _spring_problem():
    mjm = mujoco.MjModel.from_xml_string(SPRING.format(**TRUE))
    m = diffmj.put_model(mjm)
    return mjm, m, SPRING_PARAMS, _spring_recording(m)


@pytest.mark.parametrize("problem", [_spring_problem, _limited_pendulum_problem])
def test_fit_with_rollouts_in_mujoco_equals_diffmjs(problem):
    """fit(mj_model=): the residual's rollouts in MuJoCo C, the parameters written into a copy of the MjModel
    (mj_setConst after a mass, gear or armature), equal diffmj's rollouts at a point away from the model's
    values, constraint forces included; the fit takes the same steps to the same parameters."""
    mjm, m, params, data = problem()
    x = sysid.initial_vector(m, params) * 1.1
    ours = sysid._trajectory(m, params, data, x)
    theirs = sysid._trajectory_mujoco(mjm, m, params, data, x)
    assert set(theirs) == set(ours)
    for name in ours:
        torch.testing.assert_close(theirs[name], ours[name], rtol=0, atol=1e-11, msg=name)
    eager = sysid.fit(m, params, data)
    on_c = sysid.fit(m, params, data, mj_model=mjm)
    assert eager.converged and on_c.iterations == eager.iterations
    torch.testing.assert_close(on_c.x, eager.x, rtol=0, atol=1e-9)
    torch.testing.assert_close(on_c.cost_history, eager.cost_history, rtol=1e-6, atol=1e-20)
    # the same functions for mujoco.minimize: residuals and Jacobians along MuJoCo C's rollouts
    x0, residual, jacobian, _ = sysid.least_squares_functions(m, params, data, mj_model=mjm)
    _, residual_diffmj, jacobian_diffmj, _ = sysid.least_squares_functions(m, params, data)
    points = np.stack([x0, x0 * 1.1], 1)
    np.testing.assert_allclose(residual(points), residual_diffmj(points), rtol=0, atol=1e-11)
    expected = jacobian_diffmj(x0[:, None], None)
    np.testing.assert_allclose(jacobian(x0[:, None], None), expected, rtol=0, atol=1e-9 * np.abs(expected).max())
    with pytest.raises(ValueError, match="compile=False"):
        sysid.fit(m, params, data, mj_model=mjm, compile=True)
    other = copy.copy(mjm)  # MuJoCo C's model is the one stepped: a change diffmj's model lacks shows
    other.opt.timestep = 1.5 * mjm.opt.timestep
    assert np.abs(sysid.least_squares_functions(m, params, data, mj_model=other)[1](points) - residual(points)).max() > 1e-3
    with pytest.raises(ValueError, match="compile=False"):
        sysid.least_squares_functions(m, params, data, mode="forward", mj_model=mjm)
    with pytest.raises(ValueError, match="sizes"):
        sysid.fit(m, params, data, mj_model=mujoco.MjModel.from_xml_string(PENDULUM.format(armature=0.1)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_mujoco_model_holds_what_apply_sets(dtype):
    """mujoco_model writes each parameter as apply sets it: scalar and vector options, one component of a
    row, a mass (mj_setConst's derived constants follow), a derived constant fitted after it (kept, as apply
    keeps it); entries the parameters leave alone keep mj_model's float64 values, also for a float32 model."""
    mjm = mujoco.MjModel.from_xml_string(SLIDING_BOX.format(friction=0.3))
    m = diffmj.put_model(mjm, dtype=dtype)
    params = [sysid.Parameter("opt.timestep", initial=0.015), sysid.Parameter("opt.gravity", index=2, initial=-9.0),
              sysid.Parameter("geom_friction", "box", index=0, initial=0.7),
              sysid.Parameter("body_mass", "box", initial=2.5), sysid.Parameter("geom_rbound", "box", initial=0.5),
              sysid.Parameter("stat_meaninertia", initial=0.3)]
    x = sysid.initial_vector(m, params)
    model = sysid.mujoco_model(mjm, m, params, x)
    applied = sysid.apply(m, params, x)
    box = mujoco.mj_name2id(mjm, mujoco.mjtObj.mjOBJ_GEOM, "box")
    body = mujoco.mj_name2id(mjm, mujoco.mjtObj.mjOBJ_BODY, "box")
    assert model.opt.timestep == pytest.approx(0.015, rel=1e-7) and model.opt.gravity[2] == pytest.approx(-9.0)
    assert model.geom_friction[box, 0] == pytest.approx(0.7) and model.body_mass[body] == pytest.approx(2.5)
    assert model.geom_rbound[box] == pytest.approx(0.5) and model.stat.meaninertia == pytest.approx(0.3)
    # mj_setConst after the mass: its derived constants are diffmj's set_const's
    np.testing.assert_allclose(model.body_invweight0, applied.body_invweight0.double().numpy(),
                               rtol=1e-6 if dtype == torch.float32 else 1e-12)
    # untouched entries: mj_model's, bit for bit, even where the model is float32
    assert model.geom_friction[box, 1:].tolist() == mjm.geom_friction[box, 1:].tolist()
    assert model.opt.gravity[:2].tolist() == mjm.opt.gravity[:2].tolist()
    assert mjm.body_mass[body] == 1.0  # the caller's model is unchanged
    with pytest.raises(ValueError, match="mj_model holds it as"):
        sysid.mujoco_model(mjm, m.replace(opt=m.opt.replace(gravity=torch.zeros(4, dtype=dtype))),
                           [sysid.Parameter("opt.gravity", initial=0.0)], torch.zeros(4, dtype=dtype))
