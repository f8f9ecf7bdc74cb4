"""Spatial tendons against MuJoCo C, float64: site paths, sphere and cylinder wrapping with and
without side sites, pulleys, and what reads a tendon (passive forces, limits, actuators, sensors).

Models are written here: ``WRAPS`` (every kind of span on a two-link arm and a free box; side sites outside and inside
the wrapping geoms) and
``BALL_IN_CUP`` (dm_control's ball-in-cup task, a string between a cup and a ball). Random states
are wide (scale 1) so that each wrap is made in some states and broken in others
(test_every_wrap_is_made_and_broken checks it).
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj.forward import fwd_position
from diffmj.smooth import com_pos, kinematics, tendon
from diffmj.wrap import wrap
from tests.conftest import TOL, assert_close, check_stage, compare_rows, match_efc, random_state
from tests.test_constraint import MAKE, REFERENCE
from tests.test_setconst import perturb

WRAPS = """
<mujoco>
  <option timestep="0.005"/>
  <worldbody>
    <site name="anchor" pos=".02 .06 1.1"/>
    <body name="upper" pos="0 0 1">
      <joint name="shoulder_y" axis="0 1 0" damping=".1"/>
      <joint name="shoulder_x" axis="1 0 0" damping=".1"/>
      <geom type="capsule" fromto="0 0 0 .5 0 0" size=".05"/>
      <geom name="ball" type="sphere" pos=".25 0 0" size=".08" contype="0" conaffinity="0"/>
      <geom name="drum" type="cylinder" pos=".25 0 0" size=".06 .1" zaxis="0 1 0" contype="0" conaffinity="0"/>
      <site name="side" pos=".25 0 .2"/>
      <site name="inside" pos=".25 .01 .02"/>
      <site name="upper" pos=".1 0 .1"/>
      <body name="lower" pos=".5 0 0">
        <joint name="elbow" axis="0 1 0" damping=".1"/>
        <joint name="extend" type="slide" axis="1 0 0" damping=".1" range="-.1 .1"/>
        <geom type="capsule" fromto="0 0 0 .5 0 0" size=".05"/>
        <site name="lower_mid" pos=".3 .04 .05"/>
        <site name="lower_tip" pos=".5 -.03 -.05"/>
      </body>
    </body>
    <body name="box" pos="1 0 .5">
      <freejoint/>
      <geom type="box" size=".1 .1 .1"/>
      <site name="box" pos="0 0 .1"/>
    </body>
  </worldbody>
  <tendon>
    <spatial name="sites" stiffness="30" damping="2" springlength=".5 .9" limited="true" range="0 1.6">
      <site site="anchor"/><site site="upper"/><site site="lower_mid"/><site site="box"/>
    </spatial>
    <spatial name="sphere" stiffness="20" damping="1">
      <site site="anchor"/><geom geom="ball"/><site site="lower_mid"/>
    </spatial>
    <spatial name="sphere_side">
      <site site="anchor"/><geom geom="ball" sidesite="side"/><site site="lower_tip"/>
    </spatial>
    <spatial name="cylinder_side" limited="true" range="0 1.3">
      <site site="anchor"/><geom geom="drum" sidesite="side"/><site site="lower_mid"/>
    </spatial>
    <spatial name="sphere_inside" stiffness="10">
      <site site="anchor"/><geom geom="ball" sidesite="inside"/><site site="lower_mid"/>
    </spatial>
    <spatial name="cylinder_inside">
      <site site="anchor"/><geom geom="drum" sidesite="inside"/><site site="lower_tip"/>
    </spatial>
    <spatial name="pulley" limited="true" range="0 1.1" frictionloss=".1">
      <site site="anchor"/><site site="upper"/>
      <pulley divisor="2"/>
      <site site="upper"/><site site="lower_mid"/>
      <pulley divisor="3"/>
      <site site="upper"/><geom geom="drum"/><site site="lower_tip"/>
    </spatial>
    <fixed name="fixed"><joint joint="shoulder_y" coef="1"/><joint joint="elbow" coef="-.5"/></fixed>
  </tendon>
  <actuator>
    <motor tendon="sphere" gear="2"/>
    <position tendon="pulley" kp="10"/>
    <motor tendon="cylinder_side"/>
  </actuator>
  <sensor>
    <tendonpos tendon="cylinder_side"/><tendonvel tendon="pulley"/><tendonactuatorfrc tendon="sphere"/>
    <tendonlimitpos tendon="sites"/>
  </sensor>
</mujoco>
"""

# dm_control's suite/ball_in_cup.xml with its materials and visual defaults left out
BALL_IN_CUP = """
<mujoco model="ball in cup">
  <option timestep="0.02"/>
  <default>
    <motor ctrllimited="true" ctrlrange="-1 1" gear="1"/>
    <default class="cup">
      <joint type="slide" damping="3" stiffness="20"/>
      <geom type="capsule" size=".008"/>
    </default>
  </default>
  <worldbody>
    <geom name="ground" type="plane" pos="0 0 0" size=".6 .2 10"/>
    <body name="cup" pos="0 0 .6" childclass="cup">
      <joint name="cup_x" axis="1 0 0"/>
      <joint name="cup_z" axis="0 0 1"/>
      <geom name="cup_part_0" fromto="-.05 0 0 -.05 0 -.075"/>
      <geom name="cup_part_1" fromto="-.05 0 -.075 -.025 0 -.1"/>
      <geom name="cup_part_2" fromto="-.025 0 -.1 .025 0 -.1"/>
      <geom name="cup_part_3" fromto=".025 0 -.1 .05 0 -.075"/>
      <geom name="cup_part_4" fromto=".05 0 -.075 .05 0 0"/>
      <site name="cup" pos="0 0 -.108" size=".005"/>
    </body>
    <body name="ball" pos="0 0 .2">
      <joint name="ball_x" type="slide" axis="1 0 0"/>
      <joint name="ball_z" type="slide" axis="0 0 1"/>
      <geom name="ball" type="sphere" size=".025"/>
      <site name="ball" size=".005"/>
    </body>
  </worldbody>
  <actuator>
    <motor name="x" joint="cup_x"/>
    <motor name="z" joint="cup_z"/>
  </actuator>
  <tendon>
    <spatial name="string" limited="true" range="0 0.3" width="0.001">
      <site site="cup"/>
      <site site="ball"/>
    </spatial>
  </tendon>
</mujoco>
"""

MODELS = {"wraps": WRAPS, "ball_in_cup": BALL_IN_CUP}
SEEDS = range(10)
SCALE = 1.0  # random_state's pose scale: wide enough to make and break every wrap
FORWARD_FIELDS = ("ten_length", "ten_J", "ten_velocity", "actuator_length", "actuator_moment",
                  "actuator_velocity", "qfrc_spring", "qfrc_damper", "qfrc_passive", "qfrc_actuator", "qM")


def _model(name: str) -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_string(MODELS[name])


def _state(mjm: mujoco.MjModel, seed: int) -> mujoco.MjData:
    mjd = random_state(mjm, seed, scale=SCALE)
    mujoco.mj_forward(mjm, mjd)
    return mjd


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", MODELS)
def test_tendon_stage_matches_mujoco(name, seed):
    mjm = _model(name)
    check_stage(tendon, diffmj.put_model(mjm), _state(mjm, seed), ("ten_length", "ten_J"))


def test_every_wrap_is_made_and_broken():
    """Over the test states, each wrapping tendon passes its geom in some and goes straight in others."""
    mjm = _model("wraps")
    wrapped = np.array([_state(mjm, seed).ten_wrapnum for seed in SEEDS])  # path points per tendon
    for name in ("sphere", "sphere_side", "cylinder_side", "sphere_inside", "cylinder_inside"):
        t = mujoco.mj_name2id(mjm, mujoco.mjtObj.mjOBJ_TENDON, name)
        assert set(wrapped[:, t]) == {2, 4}, f"{name}: path points {wrapped[:, t]}"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", MODELS)
def test_forward_matches_mujoco(name, seed):
    """What reads the tendons: transmissions, springs and dampers (the deadband of springlength),
    limit and friction rows, sensors, and the constrained acceleration."""
    mjm = _model(name)
    m = diffmj.put_model(mjm)
    mjd = _state(mjm, seed)
    out = diffmj.forward(m, diffmj.put_data(m, mjd))
    ref = diffmj.put_data(m, mjd)
    for field in FORWARD_FIELDS:
        assert_close(field, getattr(out, field), getattr(ref, field))
    assert_close("sensordata", out.sensordata, mjd.sensordata, TOL["sensor"], empty_ok=True)
    compare_rows(m, out, mjd, MAKE + REFERENCE, TOL["rows"])
    ours, theirs = match_efc(m, out, mjd)
    scale = max(1.0, np.abs(mjd.qacc).max())
    assert_close("qacc", out.qacc / scale, mjd.qacc / scale, TOL["solver"])
    scale = max(1.0, np.abs(mjd.efc_force).max(initial=0))
    assert_close("efc_force", out.efc_force[ours] / scale, mjd.efc_force[theirs] / scale, TOL["solver"], empty_ok=True)


def test_tendon_rows_are_tested():
    """The states above activate tendon limits (and ball_in_cup's string pulls)."""
    for name in MODELS:
        mjm = _model(name)
        limits = [np.sum(_state(mjm, s).efc_type == mujoco.mjtConstraint.mjCNSTR_LIMIT_TENDON) for s in SEEDS]
        assert max(limits) > 0, name


@pytest.mark.parametrize("name", MODELS)
def test_steps_match_mujoco(name):
    """Each step from MuJoCo's state, then diffmj's own rollout of a few steps."""
    mjm = _model(name)
    m = diffmj.put_model(mjm)
    mjd = _state(mjm, 0)
    d = diffmj.put_data(m, mjd)
    for k in range(5):
        stepped = diffmj.step(m, diffmj.put_data(m, mjd))
        d = diffmj.step(m, d)
        mujoco.mj_step(mjm, mjd)
        for field in ("qpos", "qvel"):
            assert_close(f"step {k} {field}", getattr(stepped, field), getattr(mjd, field), TOL["solver"])
            assert_close(f"rollout {k} {field}", getattr(d, field), getattr(mjd, field), TOL["solver"])


@pytest.mark.parametrize("integrator", ["euler", "implicit", "implicitfast", "rk4"])
def test_steps_match_mujoco_every_integrator(integrator):
    """Tendon damping enters the implicit integrators' velocity derivative through ten_J."""
    mjm = _model("wraps")
    mjm.opt.integrator = getattr(mujoco.mjtIntegrator, f"mjINT_{integrator.upper()}")
    m = diffmj.put_model(mjm)
    mjd = _state(mjm, 1)
    for k in range(3):
        stepped = diffmj.step(m, diffmj.put_data(m, mjd))
        mujoco.mj_step(mjm, mjd)
        for field in ("qpos", "qvel"):
            assert_close(f"step {k} {field}", getattr(stepped, field), getattr(mjd, field), TOL["solver"])


def test_set_const_equals_mj_setconst():
    """tendon_length0, tendon_invweight0 and actuator_acc0 of spatial tendons after the geometry changed
    (test_setconst's perturbation; side-site ids and armature, which spatial tendons refuse, kept)."""
    mjm = _model("wraps")
    side_ids, armature = mjm.wrap_prm.copy(), mjm.tendon_armature.copy()
    perturb(mjm, seed=0)
    sides = np.isin(mjm.wrap_type, (mujoco.mjtWrap.mjWRAP_SPHERE, mujoco.mjtWrap.mjWRAP_CYLINDER))
    mjm.wrap_prm[sides] = side_ids[sides]
    mjm.tendon_armature[:] = armature
    m = diffmj.put_model(mjm)
    mujoco.mj_setConst(mjm, mujoco.MjData(mjm))
    new = diffmj.set_const(m)
    for field in ("tendon_length0", "tendon_invweight0", "actuator_acc0"):
        expected = getattr(mjm, field).reshape(getattr(m, field).shape)
        # the constants changed (the comparison means something), as in test_setconst
        assert not np.allclose(getattr(m, field).numpy(), expected, rtol=1e-3, atol=0), field
        assert_close(field, getattr(new, field), expected, TOL["setconst"])


def _batch(mjm: mujoco.MjModel, m: diffmj.Model, seeds) -> diffmj.Data:
    """Data [len(seeds)] at random_state's states (pose, velocity, controls)."""
    states = [random_state(mjm, seed, scale=SCALE) for seed in seeds]
    return diffmj.make_data(m, (len(states),)).replace(**{
        name: torch.as_tensor(np.stack([getattr(s, name) for s in states]), dtype=m.dtype)
        for name in ("qpos", "qvel", "ctrl")
    })


def test_vmap_equals_loop():
    mjm = _model("wraps")
    m = diffmj.put_model(mjm)
    batch = _batch(mjm, m, range(4))
    out = torch.vmap(diffmj.forward, in_dims=(None, 0))(m, batch)
    for k in range(4):
        one = diffmj.forward(m, batch[k])
        for field in ("ten_length", "ten_J", "qfrc_passive", "qacc"):
            assert_close(f"{k} {field}", getattr(out, field)[k], getattr(one, field), TOL["batch"])


@pytest.mark.slow
def test_compiled_tendon_stage_equals_eager():
    """The tendon stage vmapped over a batch of states, compiled (fullgraph) and eager."""
    mjm = _model("wraps")
    m = diffmj.put_model(mjm)
    batch = torch.vmap(fwd_position, in_dims=(None, 0))(m, _batch(mjm, m, range(4)))

    def stage(m, d):
        out = tendon(m, d)
        return out.ten_length, out.ten_J

    compiled = torch.compile(torch.vmap(stage, in_dims=(None, 0)), fullgraph=True)(m, batch)
    eager = torch.vmap(stage, in_dims=(None, 0))(m, batch)
    for name, a, b in zip(("ten_length", "ten_J"), compiled, eager):
        assert_close(name, a, b, TOL["compiled"])


@pytest.mark.parametrize("sphere", [True, False])
def test_compiled_wrap_traces_as_one_graph(sphere):
    """The wrap geometry, vmapped over random spans (outside, side-site and inside wraps, misses),
    traces as one graph (aot_eager runs it without inductor: eager's bits, in seconds; the whole
    stage compiled by inductor is a slow test)."""
    gen = torch.Generator().manual_seed(0)
    dtype = torch.float64

    def rand(*shape, scale=1.0):
        return scale * torch.randn(*shape, dtype=dtype, generator=gen)

    ends0, ends1, sides = rand(16, 3, 3), rand(16, 3, 3), rand(16, 3, 3, scale=0.3)
    pos, mat = rand(3, 3, scale=0.1), torch.linalg.qr(rand(3, 3, 3))[0]
    radius, has_side = torch.tensor([0.3, 0.4, 0.5], dtype=dtype), torch.tensor([True, False, True])

    def wrap_spans(x0, x1, side):
        return wrap(x0, x1, pos, mat, radius, side, has_side, sphere)

    compiled = torch.compile(torch.vmap(wrap_spans), fullgraph=True, backend="aot_eager")(ends0, ends1, sides)
    eager = torch.vmap(wrap_spans)(ends0, ends1, sides)
    assert compiled[0].any() and not compiled[0].all()
    for name, a, b in zip(("wrapped", "length", "point0", "point1"), compiled, eager):
        assert_close(name, a.double(), b.double(), TOL["batch"])


@pytest.mark.slow
def test_compiled_step_equals_eager():
    mjm = _model("wraps")
    m = diffmj.put_model(mjm)
    batch = _batch(mjm, m, range(4))
    compiled = torch.compile(torch.vmap(diffmj.step, in_dims=(None, 0)), fullgraph=True)(m, batch)
    eager = torch.vmap(diffmj.step, in_dims=(None, 0))(m, batch)
    for name in ("qpos", "qvel"):
        assert_close(name, getattr(compiled, name), getattr(eager, name), TOL["compiled"])


# The inside wrap's point solves its equation to MuJoCo's tolerance (|g| <= 1e-6) only, so the length
# is stationary in that point to that order: its derivative differs from ten_J by up to this much
# (measured 3e-8); every other span's derivative is ten_J to rounding (measured 2.4e-14).
INSIDE_STATIONARITY = 1e-6


def _length_and_data(m: diffmj.Model, qpos: torch.Tensor, d: diffmj.Data):
    d = tendon(m, com_pos(m, kinematics(m, d.replace(qpos=qpos))))
    return d.ten_length, d


def test_length_derivative_is_the_tendon_jacobian():
    """d ten_length / d qpos by autograd equals ten_J (hinge and slide dofs, where qpos and qvel agree):
    MuJoCo's Jacobian, which moves each path point with its body, is the exact derivative of the length."""
    mjm = _model("wraps")
    m = diffmj.put_model(mjm)
    scalar = [mjm.jnt_dofadr[j] for j in range(mjm.njnt) if mjm.jnt_type[j] in (2, 3)]  # slide, hinge
    inside = [mujoco.mj_name2id(mjm, mujoco.mjtObj.mjOBJ_TENDON, n) for n in ("sphere_inside", "cylinder_inside")]
    for seed in SEEDS:
        d = diffmj.put_data(m, random_state(mjm, seed, scale=SCALE))
        derivative, out = torch.func.jacrev(_length_and_data, argnums=1, has_aux=True)(m, d.qpos, d)
        for t in range(mjm.ntendon):
            tol = INSIDE_STATIONARITY if t in inside else TOL["smooth"]
            assert_close(f"seed {seed} tendon {t}", derivative[t, scalar], out.ten_J[t, scalar], tol)


def _boundary_states(mjm: mujoco.MjModel, tendon_id: int, pairs: int = 4, tol: float = 1e-12):
    """qpos pairs a hair (tol) apart on either side of where MuJoCo makes / breaks the tendon's wrap."""
    mjd = mujoco.MjData(mjm)

    def wraps(qpos):  # the number of path points: which spans wrap
        mjd.qpos[:] = qpos
        mujoco.mj_kinematics(mjm, mjd)
        mujoco.mj_tendon(mjm, mjd)
        return mjd.ten_wrapnum[tendon_id]

    found = []
    for seed in range(50):
        a, b = random_state(mjm, seed, scale=SCALE).qpos.copy(), random_state(mjm, seed + 100, scale=SCALE).qpos.copy()
        if wraps(a) == wraps(b):
            continue
        lo, hi = 0.0, 1.0
        while hi - lo > tol:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if wraps((1 - mid) * a + mid * b) == wraps(a) else (lo, mid)
        found += [(1 - lo) * a + lo * b, (1 - hi) * a + hi * b]
        if len(found) >= 2 * pairs:
            break
    assert found, "no state pair with the wrap made in one and broken in the other"
    return found


def test_gradients_are_finite_where_wraps_make_and_break():
    """Gradients of lengths, Jacobians and the next state in qpos, site and geom parameters, at states
    on either side of each wrap's make / break, and at wide random poses (sites inside the wrapping
    circles among them; the free box's quaternion is left unnormalised)."""
    mjm = _model("wraps")
    m = diffmj.put_model(mjm)
    params = ("site_pos", "geom_size", "geom_pos", "wrap_prm")

    def loss(qpos, values, d):
        mm = m.replace(**dict(zip(params, values)))
        out = diffmj.step(mm, d.replace(qpos=qpos))
        return out.ten_length.sum() + out.ten_J.square().sum() + out.qvel.square().sum()

    grad = torch.func.grad(loss, argnums=(0, 1))
    d = diffmj.make_data(m)
    states = {f"random {seed}": random_state(mjm, seed, scale=3.0).qpos for seed in range(10)}
    folded = mjm.qpos0.copy()
    folded[[mjm.jnt_qposadr[mjm.joint(j).id] for j in ("elbow", "extend")]] = np.pi, -0.05
    states["lower_mid inside the ball and the drum"] = folded
    for name in ("sphere", "sphere_side", "cylinder_side", "sphere_inside", "cylinder_inside", "pulley"):
        t = mujoco.mj_name2id(mjm, mujoco.mjtObj.mjOBJ_TENDON, name)
        states.update({f"{name} boundary {k}": q for k, q in enumerate(_boundary_states(mjm, t, pairs=2))})
    for label, qpos in states.items():
        g_qpos, g_params = grad(torch.as_tensor(qpos, dtype=m.dtype), tuple(getattr(m, p) for p in params), d)
        assert torch.isfinite(g_qpos).all(), label
        for p, g in zip(params, g_params):
            assert torch.isfinite(g).all(), f"{label}: d loss / d {p}"
