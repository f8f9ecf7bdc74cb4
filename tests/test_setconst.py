"""set_const: the constants MuJoCo derives from parameters, against mj_setConst in MuJoCo C.

Each check changes parameters of an MjModel by hand, converts it (put_model copies the now stale
constants), calls mj_setConst on the MjModel and compares diffmj.set_const field by field; then
set_param's use of it in a contact step and in a system identification through contacts.
"""

from __future__ import annotations

import dataclasses

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj.optim import sysid
from diffmj.setconst import SET_CONST_INPUTS
from tests.conftest import BENCHMARK_MODELS, MODELS, TOL, assert_close, compare_rows, settled_state

DERIVED = ("body_invweight0", "dof_invweight0", "tendon_invweight0", "tendon_length0", "eq_data", "geom_rbound",
           "actuator_acc0")
MODEL_PATHS = sorted(MODELS.glob("*.xml")) + sorted(BENCHMARK_MODELS.glob("*.xml"))


def _normalized(q: np.ndarray) -> np.ndarray:
    return q / np.linalg.norm(q, axis=-1, keepdims=True)


def perturb(mjm: mujoco.MjModel, seed: int) -> None:
    """Change every input of the constants diffmj holds, in place, as a user would by hand.

    Simple bodies (body_simple > 0) keep their inertial frame: mj_setConst refuses to move it.
    """
    rng = np.random.default_rng(seed)
    nb = mjm.nbody - 1
    mjm.body_mass[1:] *= rng.uniform(0.5, 2.0, nb)
    mjm.body_inertia[1:] *= rng.uniform(0.5, 2.0, (nb, 1))  # one factor per body keeps it physical
    mjm.body_pos[1:] += 0.05 * rng.standard_normal((nb, 3))
    mjm.body_quat[1:] = _normalized(mjm.body_quat[1:] + 0.1 * rng.standard_normal((nb, 4)))
    general = np.flatnonzero(mjm.body_simple == 0)
    mjm.body_ipos[general] += 0.02 * rng.standard_normal((len(general), 3))
    mjm.body_iquat[general] = _normalized(mjm.body_iquat[general] + 0.1 * rng.standard_normal((len(general), 4)))
    mjm.jnt_pos[:] += 0.02 * rng.standard_normal(mjm.jnt_pos.shape)
    mjm.jnt_axis[:] = _normalized(mjm.jnt_axis + 0.1 * rng.standard_normal(mjm.jnt_axis.shape))
    mjm.dof_armature[:] += rng.uniform(0, 0.1, mjm.nv)
    mjm.tendon_armature[:] += rng.uniform(0, 0.05, mjm.ntendon)
    mjm.wrap_prm[:] *= rng.uniform(0.5, 1.5, mjm.nwrap)
    mjm.geom_size[:] *= rng.uniform(0.8, 1.2, mjm.geom_size.shape)
    mjm.site_pos[:] += 0.02 * rng.standard_normal(mjm.site_pos.shape)
    mjm.site_quat[:] = _normalized(mjm.site_quat + 0.1 * rng.standard_normal(mjm.site_quat.shape))
    mjm.actuator_gear[:] *= rng.uniform(0.5, 1.5, (mjm.nu, 1))
    for j, jtype in enumerate(mjm.jnt_type):
        adr = mjm.jnt_qposadr[j]
        if jtype == mujoco.mjtJoint.mjJNT_FREE:
            mjm.qpos0[adr : adr + 3] += 0.05 * rng.standard_normal(3)
            adr += 3
        if jtype in (mujoco.mjtJoint.mjJNT_FREE, mujoco.mjtJoint.mjJNT_BALL):
            mjm.qpos0[adr : adr + 4] = _normalized(mjm.qpos0[adr : adr + 4] + 0.2 * rng.standard_normal(4))
        else:
            mjm.qpos0[adr] += 0.1 * rng.standard_normal()
    connect = mjm.eq_type == mujoco.mjtEq.mjEQ_CONNECT
    mjm.eq_data[connect, :3] += 0.05 * rng.standard_normal((connect.sum(), 3))


def mj_set_const(mjm: mujoco.MjModel) -> None:
    mujoco.mj_setConst(mjm, mujoco.MjData(mjm))


@pytest.mark.parametrize("path", MODEL_PATHS, ids=lambda p: p.stem)
def test_set_const_equals_mj_setconst_after_parameters_change(path):
    mjm = mujoco.MjModel.from_xml_path(str(path))
    perturb(mjm, seed=0)
    m = diffmj.put_model(mjm)  # copies MuJoCo's constants of the parameters before the change
    mj_set_const(mjm)
    new = diffmj.set_const(m)
    has = {"tendon_invweight0": mjm.ntendon, "tendon_length0": mjm.ntendon,
           "eq_data": np.any(mjm.eq_type == mujoco.mjtEq.mjEQ_CONNECT), "actuator_acc0": mjm.nu}
    for field in DERIVED:
        expected = getattr(mjm, field).reshape(getattr(m, field).shape)
        # the constants changed (the comparison means something), where the model has them
        if has.get(field, True):
            assert not np.allclose(getattr(m, field).numpy(), expected, rtol=1e-3, atol=0), field
        # M^-1 at qpos0 rounds with M's condition number (TOL's note)
        assert_close(field, getattr(new, field), expected, TOL["setconst"], empty_ok=True)
    for field in dataclasses.fields(m):  # nothing else changed
        if field.name not in DERIVED and isinstance(getattr(m, field.name), torch.Tensor):
            assert getattr(new, field.name) is getattr(m, field.name), field.name


def test_set_const_of_an_unchanged_model_gives_its_constants():
    """Every benchmark and test model as compiled: set_const reproduces what put_model copied."""
    for path in MODEL_PATHS:
        m = diffmj.load(path)
        new = diffmj.set_const(m)
        for field in DERIVED:
            assert_close(f"{path.stem} {field}", getattr(new, field), getattr(m, field), TOL["setconst"], empty_ok=True)


def test_simple_sliding_body_takes_one_over_its_mass():
    """chain.xml's last body is simple with slide joints only (body_simple 2): MuJoCo's shortcut 1 / mass,
    which is not the mean of M^-1 J' (armature, one axis only)."""
    mjm = mujoco.MjModel.from_xml_path(str(MODELS / "chain.xml"))
    body = int(np.flatnonzero(mjm.body_simple == 2)[0])
    mjm.body_mass[body] = 0.7
    mjm.dof_armature[mjm.body_dofadr[body]] += 0.5
    m = diffmj.put_model(mjm)
    mj_set_const(mjm)
    new = diffmj.set_const(m)
    assert new.body_invweight0[body].tolist() == [1 / 0.7, 0.0] == mjm.body_invweight0[body].tolist()
    dofs = slice(mjm.body_dofadr[body], mjm.body_dofadr[body] + mjm.body_dofnum[body])
    assert (new.dof_invweight0[dofs] == 1 / 0.7).all()


def test_gradient_through_set_const_equals_central_differences():
    """d(derived constants)/d(mass, inertia, armature, body position, qpos0, connect anchor) by autograd
    against central differences, on the model with a free body, a ball, tendons and a connect."""
    m = diffmj.load(MODELS / "constraints.xml")
    inputs = ("body_mass", "body_inertia", "dof_armature", "body_pos", "qpos0", "eq_data", "wrap_prm")
    generator = torch.Generator().manual_seed(0)
    weights = {f: torch.randn(getattr(m, f).shape, generator=generator, dtype=m.dtype) for f in DERIVED}

    def loss(*values):
        out = diffmj.set_const(m.replace(**dict(zip(inputs, values))))
        return sum((weights[f] * getattr(out, f)).sum() for f in DERIVED)

    values = tuple(getattr(m, f) for f in inputs)
    grads = torch.func.grad(loss, argnums=tuple(range(len(inputs))))(*values)
    # relative directions: an inertia of 1e-5 moves its invweight0 at 1e10 per unit
    directions = tuple(torch.randn(v.shape, generator=generator, dtype=m.dtype) * (v.abs() + 1e-2) for v in values)
    eps = 1e-6
    plus = loss(*(v + eps * u for v, u in zip(values, directions)))
    minus = loss(*(v - eps * u for v, u in zip(values, directions)))
    numeric = (plus - minus) / (2 * eps)
    exact = sum((g * u).sum() for g, u in zip(grads, directions))
    assert all(torch.isfinite(g).all() for g in grads)
    assert abs(exact) > 1  # the constants move with the inputs: the comparison means something
    assert_close("directional derivative", exact, numeric, TOL["finite_difference"])


# A box on a plane, pushed by a motor at its centre (MuJoCo C's multi-contact, pyramidal friction).
PUSHED_BOX = """
<mujoco><option timestep="0.01" tolerance="1e-14" iterations="100"/>
  <worldbody><geom name="floor" type="plane" size="2 2 .1"/>
    <body name="box" pos="0 0 0.1"><freejoint/>
      <geom name="box" type="box" size=".1 .1 .1" mass="2" friction="0.5 0.005 0.0001"/><site name="push"/></body>
  </worldbody>
  <actuator><motor name="push" site="push" gear="1 0 0 0 0 0"/></actuator></mujoco>"""
TRUE_MASS = 1.0  # the compiled model has 2


def _pushed_box_with_mass(mass: float) -> tuple[mujoco.MjModel, mujoco.MjData]:
    """MuJoCo C's box model with body_mass set by hand and mj_setConst called, settled on the floor."""
    mjm = mujoco.MjModel.from_xml_string(PUSHED_BOX)
    mjm.body_mass[mjm.body("box").id] = mass
    mj_set_const(mjm)
    return mjm, settled_state(mjm, steps=100, ctrl_scale=0.0)


def test_set_param_mass_then_step_matches_mujoco_after_mj_setconst():
    mjm, mjd = _pushed_box_with_mass(TRUE_MASS)
    mjd.ctrl[:] = 8.0  # beyond sliding friction (0.5 m g = 4.9 N)
    compiled = diffmj.put_model(mujoco.MjModel.from_xml_string(PUSHED_BOX))
    m = diffmj.set_param(compiled, "body_mass", TRUE_MASS, "box")
    d = diffmj.put_data(m, mjd)
    mujoco.mj_forward(mjm, mjd)
    out = diffmj.forward(m, d)
    assert out.efc_active.sum() >= 12  # four contacts, pyramidal
    compare_rows(m, out, mjd, ("efc_J", "efc_diagA", "efc_R", "efc_D", "efc_aref"), TOL["impedance"])
    stale = diffmj.forward(compiled.replace(body_mass=m.body_mass), d)  # a raw replace keeps mass 2's R
    active = out.efc_active
    assert ((stale.efc_R - out.efc_R)[active].abs() > 0.1 * out.efc_R[active].abs()).all()
    d = diffmj.step(m, d)
    mujoco.mj_step(mjm, mjd)
    assert_close("qpos, qvel", torch.cat((d.qpos, d.qvel)), np.concatenate((mjd.qpos, mjd.qvel)), TOL["smooth"])


def test_mass_changes_contact_regularisation_through_set_param():
    """The gradient of efc_R with respect to a mass set by set_param is that of central differences."""
    compiled = diffmj.put_model(mujoco.MjModel.from_xml_string(PUSHED_BOX))
    mjm, mjd = _pushed_box_with_mass(TRUE_MASS)
    d = diffmj.put_data(compiled, mjd)

    def regularisation(mass):
        out = diffmj.forward(diffmj.set_param(compiled, "body_mass", mass, "box"), d)
        return torch.where(out.efc_active, out.efc_R, 0.0).sum()

    mass = torch.tensor(TRUE_MASS, dtype=compiled.dtype)
    exact = torch.func.grad(regularisation)(mass)
    eps = 1e-6
    numeric = (regularisation(mass + eps) - regularisation(mass - eps)) / (2 * eps)
    assert torch.isfinite(exact) and exact.abs() > 1e-3
    assert_close("d sum(efc_R) / d mass", exact, numeric, TOL["finite_difference"])


def test_sysid_recovers_box_mass_from_mujoco_data_through_contacts():
    """MuJoCo C's recording of the pushed box with mass 1 (set by hand + mj_setConst); the fit starts
    from the compiled model (mass 2). With the constants left at mass 2's the residual at mass 1 was
    0.16 and LM stalled at 1.055 after 49 iterations; now the residual there is 1e-15 and the fit
    lands within 1e-12 (6 iterations)."""
    horizon = 4
    mjm, mjd = _pushed_box_with_mass(TRUE_MASS)
    m = diffmj.put_model(mujoco.MjModel.from_xml_string(PUSHED_BOX))
    d0 = diffmj.put_data(m, mjd)
    ctrl = 15 + 3 * np.sin(0.5 * np.arange(horizon))  # beyond sliding friction at any mass in [1, 2]
    qpos, qvel = [], []
    for t in range(horizon):
        mjd.ctrl[:] = ctrl[t]
        mujoco.mj_step(mjm, mjd)
        qpos.append(mjd.qpos.copy())
        qvel.append(mjd.qvel.copy())
    data = sysid.Recording(d0, torch.tensor(ctrl)[:, None], qpos=torch.tensor(np.array(qpos)),
                           qvel=torch.tensor(np.array(qvel)))
    params = [sysid.Parameter("body_mass", "box", log=True)]
    at_truth = sysid.residual(m, params, data, torch.tensor([np.log(TRUE_MASS)], dtype=m.dtype))
    assert at_truth.abs().max() < 1e-12
    result = sysid.fit(m, params, data)
    assert result.converged, result.status
    assert abs(result.params["body_mass[box]"].item() - TRUE_MASS) <= 1e-6


def test_set_param_recomputes_only_for_inputs_and_replace_never():
    m = diffmj.load(MODELS / "constraints.xml")
    heavier = diffmj.set_param(m, "body_mass", 3.0, "floating")
    expected = diffmj.set_const(m.replace(body_mass=heavier.body_mass))
    for field in DERIVED:
        assert torch.equal(getattr(heavier, field), getattr(expected, field)), field
    assert not torch.equal(heavier.body_invweight0, m.body_invweight0)
    assert torch.equal(m.replace(body_mass=heavier.body_mass).body_invweight0, m.body_invweight0)
    damped = diffmj.set_param(m, "dof_damping", 3.0)  # not an input: the constants are m's own
    assert all(getattr(damped, f) is getattr(m, f) for f in DERIVED)
    # every input named is a parameter of the Model, and the derived fields are not inputs
    assert SET_CONST_INPUTS <= {f.name for f in dataclasses.fields(m)} and not SET_CONST_INPUTS & set(DERIVED[:4])


def test_set_const_under_vmap_equals_each_model_alone():
    m = diffmj.load(MODELS / "constraints.xml")
    masses = torch.linspace(0.5, 2.0, 3, dtype=m.dtype)
    batched = torch.vmap(lambda v: diffmj.set_param(m, "body_mass", v, "hand").dof_invweight0)(masses)
    for k in range(3):
        one = diffmj.set_param(m, "body_mass", masses[k], "hand").dof_invweight0
        assert_close("vmapped set_const", batched[k], one, TOL["batch"])


def test_set_const_writes_only_its_outputs():
    """set_const replaces exactly the fields ``SET_CONST_OUTPUTS`` names, which ``diffmj.set_params`` relies on
    (it recomputes before a change to one of them): every tensor field of a model whose masses and geom
    sizes changed, set_const's result against its input, differs only there (and does differ there)."""
    from diffmj.setconst import SET_CONST_OUTPUTS

    m = diffmj.load(MODELS / "constraints.xml")
    m = m.replace(body_mass=m.body_mass * 1.5, geom_size=m.geom_size * 1.1)
    derived = diffmj.set_const(m)
    changed = {f.name for f in dataclasses.fields(m)
               if isinstance(getattr(m, f.name), torch.Tensor) and not torch.equal(getattr(m, f.name),
                                                                                    getattr(derived, f.name))}
    assert changed <= SET_CONST_OUTPUTS and {"body_invweight0", "dof_invweight0", "geom_rbound"} <= changed
