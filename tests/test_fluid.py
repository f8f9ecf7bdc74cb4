"""Fluid forces (MuJoCo's inertia-box and ellipsoid models) against MuJoCo C, and their invariants.

Models: ``fluid_swimmer`` (ellipsoid model on a chain of every geom type, one inertia-box
body, a standalone free body, a current) and ``fluid_box`` (inertia-box model in a strong
wind), plus seeded random models in a fluid (``random_mjcf(seed, fluid=True)``).
"""

from __future__ import annotations

import mujoco
import pytest
import torch

import diffmj
from diffmj.passive import passive
from tests.conftest import TOL, assert_close, check_stage, mj_model, random_state
from tests.mjcf_random import INTEGRATORS, random_mjcf

MODELS = ("fluid_swimmer", "fluid_box")
WRITES = ("qfrc_spring", "qfrc_damper", "qfrc_gravcomp", "qfrc_fluid", "qfrc_passive")
NSTEP = 10


def _stage(mjm: mujoco.MjModel, seed: int) -> diffmj.Data:
    m = diffmj.put_model(mjm)
    mjd = random_state(mjm, seed)
    mujoco.mj_forward(mjm, mjd)
    out = check_stage(passive, m, mjd, WRITES)
    return out


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", MODELS)
def test_passive_stage_matches_mujoco(name, seed):
    out = _stage(mj_model(name), seed)
    assert out.qfrc_fluid.abs().max() > 0.1, "fluid forces too small to test anything"


# a thin plate under the ellipsoid model (MuJoCo's cards demo): |v| proj_denom of the Kutta lift is below mjMINVAL
THIN_PLATE_XML = """<mujoco><option density="1.225" viscosity="1.8e-5"/><worldbody><body><freejoint/>
  <geom type="box" size="0.000125 0.032 0.047" fluidshape="ellipsoid" mass="0.0002"/></body></worldbody></mujoco>"""


@pytest.mark.parametrize("scale", [1.0, 1e-3, 0.0])
def test_thin_plate_lift_matches_mujoco(scale):
    """The Kutta lift's cosine is divided by |v| proj_denom without a floor at mjMINVAL, as MuJoCo 4.0.0 does
    (the lift scales as v^2 down to rest); with the floor it was half of MuJoCo's at these speeds."""
    mjm = mujoco.MjModel.from_xml_string(THIN_PLATE_XML)
    mjd = mujoco.MjData(mjm)
    mjd.qvel[:] = scale * torch.tensor([0.021, 0.176, 0.147, -0.03, 0.21, -0.035]).numpy()
    mujoco.mj_forward(mjm, mjd)
    out = check_stage(passive, diffmj.put_model(mjm), mjd, WRITES)
    assert scale == 0 or out.qfrc_fluid.abs().max() > 1e-6 * scale ** 2


@pytest.mark.parametrize("flags", ["spring", "damper", "spring damper"])
def test_disable_flags(flags):
    """Fluid forces stay on unless both springs and dampers are disabled, as in mj_passive."""
    mjm = mj_model("fluid_swimmer")
    for flag in flags.split():
        mjm.opt.disableflags |= getattr(mujoco.mjtDisableBit, f"mjDSBL_{flag.upper()}")
    out = _stage(mjm, 0)
    assert bool(out.qfrc_fluid.abs().max() > 0) == (flags != "spring damper")


def _check_steps(mjm: mujoco.MjModel, mjd: mujoco.MjData, label: str) -> None:
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, mjd)
    for k in range(1, NSTEP + 1):
        mujoco.mj_step(mjm, mjd)
        d = diffmj.step(m, d)
        for field in ("qpos", "qvel"):
            assert_close(f"{label} step {k} {field}", getattr(d, field), getattr(mjd, field), TOL["rollout"])


@pytest.mark.parametrize("integrator", INTEGRATORS)
@pytest.mark.parametrize("name", MODELS)
def test_steps_match_mujoco(name, integrator):
    """Whole steps; implicit and implicitfast add the fluid derivative to qDeriv as mjd_passive_vel
    does (implicitfast symmetrised, except on the swimmer's standalone free fish)."""
    mjm = mj_model(name)
    mjm.opt.integrator = getattr(mujoco.mjtIntegrator, f"mjINT_{integrator.upper()}")
    _check_steps(mjm, random_state(mjm, 1), f"{name} {integrator}")


def _check_random(seed: int) -> None:
    mjm = mujoco.MjModel.from_xml_string(random_mjcf(seed, fluid=True))
    mjd = random_state(mjm, seed)
    mujoco.mj_forward(mjm, mjd)
    m = diffmj.put_model(mjm)
    out = diffmj.forward(m, diffmj.put_data(m, mjd))
    for field in ("qfrc_fluid", "qfrc_passive", "qacc"):
        assert_close(f"seed {seed} {field}", getattr(out, field), getattr(mjd, field))
    _check_steps(mjm, random_state(mjm, seed), f"seed {seed}")


@pytest.mark.parametrize("seed", range(10))
def test_random_fluid_models_match_mujoco(seed):
    """Random models in a fluid (both models, random coefficients, density or viscosity alone, wind)."""
    _check_random(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10, 210))
def test_random_fluid_models_match_mujoco_sweep(seed):
    _check_random(seed)


def test_random_fluid_models_cover_both_models():
    plans = [diffmj.put_model(mujoco.MjModel.from_xml_string(random_mjcf(s, fluid=True))).fluid_plan
             for s in range(10)]
    assert sum(p.box_body.shape[0] for p in plans) and sum(p.geom.shape[0] for p in plans)
    assert random_mjcf(3, fluid=False) == random_mjcf(3)


@pytest.mark.parametrize(
    "name, value, obj",
    [("opt.density", 700.0, None), ("opt.viscosity", 0.3, None), ("opt.wind", [1.0, -2.0, 0.5], None),
     ("geom_fluid", [0.5, 0.9, 0.1, 0.5, 2.0, 1.5, 1e-3, 2e-3, 3e-3, 1e-6, 2e-6, 3e-6], 0),
     ("body_inertia", [0.02, 0.03, 0.01], "tail")],
)
def test_set_param_changes_fluid_as_in_mujoco(name, value, obj):
    """set_param's value gives MuJoCo's forces for the model with that value (sysid of drag)."""
    mjm = mj_model("fluid_swimmer")
    mjd = random_state(mjm, 2)
    m = diffmj.set_param(diffmj.put_model(mjm), name, value, obj)
    if name.startswith("opt."):
        setattr(mjm.opt, name[4:], value)
    else:
        row = mjm.body(obj).id if isinstance(obj, str) else obj
        getattr(mjm, name)[row] = value
    mujoco.mj_forward(mjm, mjd)
    out = diffmj.forward(m, diffmj.put_data(diffmj.put_model(mjm), mjd))
    assert_close(f"{name} qfrc_fluid", out.qfrc_fluid, mjd.qfrc_fluid)


def test_fluid_params_refused_without_fluid():
    m = diffmj.put_model(mj_model("chain"))
    assert not m.fluid_plan.enabled
    for name in diffmj.params.FLUID_PARAMS:
        with pytest.raises(ValueError, match="without fluid forces"):
            diffmj.set_param(m, name, 1.0)


def _batch(mjm: mujoco.MjModel, m: diffmj.Model, n: int, dtype=torch.float64) -> diffmj.Data:
    """n states: random ones, at rest in still fluid (relative velocity exactly zero), fast ones."""
    states = [diffmj.put_data(m, random_state(mjm, s)) for s in range(n)]
    states[0] = states[0].replace(qvel=torch.zeros_like(states[0].qvel))
    states[1] = states[1].replace(qvel=10 * states[1].qvel)
    return torch.stack(states).to(dtype)


@pytest.mark.parametrize("integrator", ["Euler", "implicitfast"])
def test_vmap_equals_each_element(integrator):
    mjm = mj_model("fluid_swimmer")
    mjm.opt.integrator = getattr(mujoco.mjtIntegrator, f"mjINT_{integrator.upper()}")
    m = diffmj.put_model(mjm)
    batch = _batch(mjm, m, 4)
    out = diffmj.step(m, batch)
    for i in range(4):
        one = diffmj.step(m, batch[i])
        for field in ("qvel", "qfrc_fluid"):
            assert_close(f"element {i} {field}", getattr(out, field)[i], getattr(one, field), TOL["batch"])


@pytest.mark.slow  # an inductor compile of the fluid derivative's jvps: 6 min on the loaded 2-core machine
def test_compiled_step_equals_eager():
    """torch.compile(fullgraph=True) of an implicitfast step (fluid forces and their jvp derivative)."""
    mjm = mj_model("fluid_swimmer")
    mjm.opt.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, random_state(mjm, 3))
    compiled = torch.compile(diffmj.step, fullgraph=True)(m, d)
    eager = diffmj.step(m, d)
    for field in ("qpos", "qvel", "qfrc_fluid"):
        assert_close(field, getattr(compiled, field), getattr(eager, field), TOL["compiled"])


FLUID_LEAVES = ("opt.density", "opt.viscosity", "opt.wind", "geom_fluid", "body_mass", "body_inertia", "geom_size")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("integrator", ["Euler", "implicitfast"])
@pytest.mark.parametrize("name", MODELS)
def test_gradients_finite(name, integrator, dtype):
    """Gradients of a batched step to the state and the fluid parameters, zero relative velocity included."""
    mjm = mj_model(name)
    mjm.opt.integrator = getattr(mujoco.mjtIntegrator, f"mjINT_{integrator.upper()}")
    mjm.opt.wind[:] = 0.0  # so that the state at rest has exactly zero velocity relative to the fluid
    m = diffmj.put_model(mjm, dtype=dtype)
    batch = _batch(mjm, m, 6, dtype)
    leaves = {k: diffmj.get_param(m, k).clone().requires_grad_(True) for k in FLUID_LEAVES}
    leaves["qpos"], leaves["qvel"] = batch.qpos.clone().requires_grad_(True), batch.qvel.clone().requires_grad_(True)
    model = m
    for key in FLUID_LEAVES:
        model = diffmj.set_param(model, key, leaves[key])
    out = diffmj.step(model, batch.replace(qpos=leaves["qpos"], qvel=leaves["qvel"]))
    loss = (out.qvel**2).sum() + (out.qfrc_fluid**2).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True, materialize_grads=True)
    for key, g in zip(leaves, grads):
        assert torch.isfinite(g).all(), f"non-finite gradient w.r.t. {key}"
    assert grads[0].abs() > 0, "no gradient reaches opt.density"


@pytest.mark.parametrize("name", MODELS)
def test_fluid_parameter_gradients_match_finite_differences(name):
    """d (qvel after 3 implicit steps) / d (density, viscosity, wind): autograd against central differences."""
    mjm = mj_model(name)
    mjm.opt.integrator = mujoco.mjtIntegrator.mjINT_IMPLICIT
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, random_state(mjm, 4))
    weights = torch.linspace(-1.0, 1.0, m.nv, dtype=torch.float64)

    def loss(param: str, value: torch.Tensor) -> torch.Tensor:
        x = d
        model = diffmj.set_param(m, param, value)
        for _ in range(3):
            x = diffmj.step(model, x)
        return (weights * x.qvel).sum()

    for param in ("opt.density", "opt.viscosity", "opt.wind"):
        value = diffmj.get_param(m, param).clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(loss(param, value), value)
        eps = 1e-6 * (1 + value.detach().abs())
        fd = torch.zeros_like(value)
        for i in range(value.numel()):
            step = torch.zeros_like(value).reshape(-1)
            step[i] = eps.reshape(-1)[i]
            step = step.reshape(value.shape)
            fd.reshape(-1)[i] = (loss(param, value.detach() + step) - loss(param, value.detach() - step)) / (
                2 * step.reshape(-1)[i])
        assert grad.abs().max() > 0, f"{param}: zero gradient"
        assert_close(f"{name} d loss / d {param}", grad, fd, TOL["finite_difference"])
