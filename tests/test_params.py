"""get_param / set_param: MuJoCo's field and object names, against MuJoCo C's arrays and physics."""

from __future__ import annotations

import dataclasses

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from tests.conftest import MODELS, TOL, assert_close, mj_model, random_state

KINDS = {"body": "body", "jnt": "joint", "geom": "geom", "site": "site", "tendon": "tendon",
         "actuator": "actuator", "sensor": "sensor", "eq": "equality", "pair": "pair"}
JOINT_NQ = {0: 7, 1: 4, 2: 1, 3: 1}
JOINT_NV = {0: 6, 1: 3, 2: 1, 3: 1}


def mj_rows(mjm: mujoco.MjModel, field: str, i: int) -> np.ndarray:
    """MuJoCo's rows of ``field`` for object i (a joint's qpos / dof block for qpos0 / dof_*)."""
    array = getattr(mjm, field)
    if field in ("qpos0", "qpos_spring"):
        start = mjm.jnt_qposadr[i]
        return array[start : start + JOINT_NQ[mjm.jnt_type[i]]]
    if field.startswith("dof_"):
        start = mjm.jnt_dofadr[i]
        return array[start : start + JOINT_NV[mjm.jnt_type[i]]]
    return array[i : i + 1]


@pytest.mark.parametrize("name", ["chain", "actuators", "constraints", "contacts", "sensors"])
def test_every_named_row_matches_mujoco(name):
    mjm = mj_model(name)
    m = diffmj.put_model(mjm)
    checked = 0
    for field in dataclasses.fields(m):
        value = getattr(m, field.name)
        if not isinstance(value, torch.Tensor):
            continue
        np.testing.assert_array_equal(diffmj.get_param(m, field.name).numpy(), value.numpy())
        kind = "jnt" if field.name.startswith("dof_") or field.name.startswith("qpos") else field.name.split("_")[0]
        if kind not in KINDS:  # stat_meaninertia, wrap_prm: no named objects
            continue
        for i in range(getattr(mjm, f"n{'u' if kind == 'actuator' else kind}")):
            obj = mujoco.mj_id2name(mjm, getattr(mujoco.mjtObj, f"mjOBJ_{KINDS[kind].upper()}"), i) or i
            expected = mj_rows(mjm, field.name, i)
            actual = diffmj.get_param(m, field.name, obj)
            np.testing.assert_array_equal(actual.numpy().ravel(), np.ravel(expected), f"{field.name}[{obj!r}]")
            checked += 1
    assert checked > 100
    assert diffmj.get_param(m, "opt.timestep").item() == mjm.opt.timestep
    np.testing.assert_array_equal(diffmj.get_param(m, "opt.gravity").numpy(), mjm.opt.gravity)


def test_named_views_match_mujoco():
    mjm = mj_model("chain")
    m = diffmj.put_model(mjm)
    assert diffmj.get_param(m, "body_mass", "torso").item() == mjm.body("torso").mass[0]
    np.testing.assert_array_equal(diffmj.get_param(m, "dof_damping", "shoulder").numpy(), mjm.joint("shoulder").damping)
    np.testing.assert_array_equal(diffmj.get_param(m, "qpos0", "spin").numpy(), mjm.joint("spin").qpos0)
    np.testing.assert_array_equal(diffmj.get_param(m, "site_pos", "tip").numpy(), mjm.site("tip").pos)
    assert diffmj.get_param(m, "tendon_damping", "coupling").item() == mjm.tendon_damping[mjm.tendon("coupling").id]


def step_both(mjm: mujoco.MjModel, m: diffmj.Model, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    mjd = random_state(mjm, seed)
    d = diffmj.step(m, diffmj.put_data(m, mjd))
    mujoco.mj_step(mjm, mjd)
    return np.concatenate((d.qpos.numpy(), d.qvel.numpy())), np.concatenate((mjd.qpos, mjd.qvel))


@pytest.mark.parametrize("field, obj, value", [
    ("body_mass", "torso", 3.5),
    ("dof_damping", "shoulder", [0.5, 1.0, 1.5]),
    ("jnt_stiffness", "elbow", 7.0),
    ("tendon_damping", "coupling", 2.0),
    ("opt.timestep", None, 0.005),
    ("opt.gravity", None, [1.0, 0.5, -3.0]),
    ("body_gravcomp", "torso", 0.7),  # zero at put_model (the slab's is not): MuJoCo compensates it too
])
def test_set_param_then_step_matches_mujoco(field, obj, value):
    mjm = mj_model("chain")
    m = diffmj.put_model(mjm)
    changed = diffmj.set_param(m, field, value, obj)
    owner, attr = (mjm.opt, field[4:]) if field.startswith("opt.") else (mjm, field)
    if obj is None:
        setattr(owner, attr, value)
    else:
        kind = "joint" if field.startswith("dof_") else KINDS[field.split("_")[0]]
        i = mujoco.mj_name2id(mjm, getattr(mujoco.mjtObj, f"mjOBJ_{kind.upper()}"), obj)
        mj_rows(mjm, field, i)[...] = value
    mujoco.mj_setConst(mjm, mujoco.MjData(mjm))  # what set_param does for inputs of derived constants
    assert not torch.equal(diffmj.get_param(changed, field, obj), diffmj.get_param(m, field, obj))
    np.testing.assert_array_equal(diffmj.get_param(changed, field, obj).numpy().ravel(), np.ravel(value))
    actual, expected = step_both(mjm, changed)
    assert_close(f"step after set_param {field}", actual, expected, TOL["smooth"])


def test_gradient_flows_through_set_param():
    m = diffmj.load(MODELS / "chain.xml")
    d = diffmj.make_data(m)

    def speed(mass, timestep):
        changed = diffmj.set_param(diffmj.set_param(m, "body_mass", mass, "upper"), "opt.timestep", timestep)
        return diffmj.step(changed, d).qvel.square().sum()

    mass = diffmj.get_param(m, "body_mass", "upper")
    grads = torch.func.grad(speed, argnums=(0, 1))(mass, m.opt.timestep)
    assert all(torch.isfinite(g) and g != 0 for g in grads)
    # a batch of differently parameterised models, one per mass
    masses = mass * torch.linspace(0.5, 2, 3, dtype=mass.dtype)
    batched = torch.vmap(lambda v: diffmj.step(diffmj.set_param(m, "body_mass", v, "upper"), d).qvel)(masses)
    for k in range(3):
        one = diffmj.step(diffmj.set_param(m, "body_mass", masses[k], "upper"), d).qvel
        assert_close("vmapped set_param", batched[k], one, TOL["batch"])


def test_set_params_equals_set_param_in_turn():
    """set_params recomputes the derived constants once, yet gives the model set_param gives change by change:
    two masses and a geom size (inputs of set_const), then a derived constant set by hand after them (kept, as
    set_param keeps it), then a damping (no input)."""
    m = diffmj.load(MODELS / "chain.xml")
    changes = [("body_mass", 2.5, "upper"), ("body_mass", 0.7, "lower"), ("geom_size", 0.09, 0),
               ("geom_rbound", 0.5, 0), ("dof_damping", 0.3, None)]
    one_by_one = m
    for name, value, obj in changes:
        one_by_one = diffmj.set_param(one_by_one, name, value, obj)
    together = diffmj.set_params(m, changes)
    leaves, expected = torch.utils._pytree.tree_leaves(together), torch.utils._pytree.tree_leaves(one_by_one)
    assert len(leaves) == len(expected) and all(
        torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(leaves, expected))
    assert diffmj.get_param(together, "geom_rbound", 0) == 0.5
    assert not torch.equal(together.body_invweight0, m.body_invweight0)  # the masses did reach set_const
    # replace_param writes the field alone: nothing derived follows
    raw = diffmj.replace_param(m, "body_mass", 2.5, "upper")
    assert torch.equal(raw.body_invweight0, m.body_invweight0) and diffmj.get_param(raw, "body_mass", "upper") == 2.5


def test_set_param_is_out_of_place_and_keeps_structure():
    m = diffmj.load(MODELS / "chain.xml")
    before = m.dof_damping.clone()
    changed = diffmj.set_param(m, "dof_damping", 0.3)
    assert torch.equal(m.dof_damping, before) and changed.structure == m.structure
    assert torch.equal(changed.dof_damping, torch.full_like(before, 0.3))
    assert diffmj.set_param(m, "dof_damping", 2.0, 1).dof_damping.shape == before.shape  # joint id 1: shoulder


@pytest.mark.parametrize("args, message", [
    (("body_mas",), "unknown model parameter 'body_mas'; did you mean body_mass"),
    (("body_mass", "tors"), "no body named 'tors'"),
    (("body_mass", "shoulder"), "'shoulder' is a joint"),
    (("body_mass", 99), "body id 99 is out of range"),
    (("jnt_type",), "'jnt_type' is structure"),
    (("opt.iterations",), "'opt.iterations' is structure"),
    (("tree",), "'tree' is structure"),
    (("opt.timestp",), "did you mean opt.timestep"),
    (("stat_meaninertia", "torso"), "no rows per named object"),
])
def test_bad_names_are_refused(args, message):
    m = diffmj.load(MODELS / "chain.xml")
    with pytest.raises(ValueError, match=message):
        diffmj.get_param(m, *args)
    with pytest.raises(ValueError, match=message):
        diffmj.set_param(m, args[0], 1.0, *args[1:])


def test_gravcomp_refused_without_gravcomp():
    m = diffmj.load(MODELS / "pendulum.xml")
    with pytest.raises(ValueError, match="no body's gravcomp set"):
        diffmj.set_param(m, "body_gravcomp", 1.0)


def test_bad_values_are_refused():
    m = diffmj.load(MODELS / "chain.xml")
    with pytest.raises(ValueError, match=r"does not broadcast to 'dof_damping'\['shoulder'\] of shape \(3,\)"):
        diffmj.set_param(m, "dof_damping", [1.0, 2.0], "shoulder")
    with pytest.raises(ValueError, match="float32"):
        diffmj.set_param(m, "body_mass", torch.ones(m.nbody))
