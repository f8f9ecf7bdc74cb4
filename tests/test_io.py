"""put_model / load / make_data / put_data: structure, parameters, refusals, input checks."""

from __future__ import annotations

import dataclasses

import mujoco
import pytest
import torch

import diffmj
from tests.conftest import MODELS, mj_model, random_state


def test_two_loads_have_equal_hashable_structure():
    a = diffmj.load(MODELS / "chain.xml")
    b = diffmj.load((MODELS / "chain.xml").read_text())
    assert a.structure == b.structure
    assert hash(a.structure) == hash(b.structure)
    assert a.structure != diffmj.load(MODELS / "actuators.xml").structure


def test_parameters_are_tensors_that_can_require_grad():
    m = diffmj.load(MODELS / "chain.xml")
    assert isinstance(m.body_mass, torch.Tensor) and m.body_mass.dtype == torch.float64
    assert isinstance(m.opt.timestep, torch.Tensor) and m.opt.gravity.shape == (3,)
    mass = m.body_mass.clone().requires_grad_(True)
    heavier = m.replace(body_mass=mass * 2)
    assert heavier.body_mass.requires_grad and not m.body_mass.requires_grad
    d = diffmj.forward(heavier, diffmj.make_data(heavier))
    d.qacc.sum().backward()
    assert mass.grad is not None and torch.isfinite(mass.grad).all()


def test_to_casts_floats_and_keeps_indices():
    m = diffmj.load(MODELS / "actuators.xml")
    m32 = m.to(dtype=torch.float32)
    assert m32.dtype == torch.float32 and m32.opt.timestep.dtype == torch.float32
    assert m32.tree.dof_bodyid.dtype == torch.long
    assert m32.structure == m.structure
    out = diffmj.step(m32, diffmj.make_data(m32))
    assert out.qpos.dtype == torch.float32


def test_data_to_casts_floats_only():
    m = diffmj.load(MODELS / "contacts.xml")
    d = diffmj.make_data(m, batch_shape=(2,))
    for d32 in (d.to(torch.float32), d.to("cpu", dtype=torch.float32), d.to(dtype=torch.float32)):
        assert d32.qpos.dtype == d32.contact.dist.dtype == torch.float32
        assert d32.efc_active.dtype == d32.contact.active.dtype == d32.eq_active.dtype == torch.bool
        assert d32.efc_state.dtype == d.efc_state.dtype and d32.batch_size == d.batch_size
    m32 = m.to(dtype=torch.float32)
    assert diffmj.step(m32, d.to(torch.float32)).efc_active.dtype == torch.bool
    with pytest.raises(ValueError, match="not a float dtype"):
        d.to(torch.int32)


@pytest.mark.parametrize("batch_shape", [(), (2,)])
def test_data_replace_equals_tensordicts_own(batch_shape):
    """Data.replace builds its TensorDict from tensordict's internals: the result must be what
    tensordict's generic replace gives, share the fields it does not replace, batch and stack."""
    m = diffmj.load(MODELS / "contacts.xml")
    d = diffmj.make_data(m, batch_shape=batch_shape)
    qpos, dist = torch.rand_like(d.qpos), torch.zeros_like(d.contact.dist)
    contact = d.contact.replace(dist=dist)
    generic_contact = type(contact).from_tensordict(d.contact._tensordict.replace(dist=dist))
    assert type(contact) is type(generic_contact) and contact.batch_size == generic_contact.batch_size
    fast = d.replace(qpos=qpos, contact=contact)
    generic = type(d).from_tensordict(d._tensordict.replace(qpos=qpos, contact=contact))
    assert type(fast) is type(generic) is diffmj.Data
    assert fast.batch_size == generic.batch_size == d.batch_size and fast.device == generic.device
    assert set(fast._tensordict.keys()) == set(generic._tensordict.keys())
    for name in {field.name for field in dataclasses.fields(diffmj.Data)} - {"contact"}:
        assert getattr(fast, name) is getattr(generic, name), name
    for field in dataclasses.fields(diffmj.types.Contact):
        assert getattr(fast.contact, field.name) is getattr(generic.contact, field.name), field.name
        assert getattr(contact, field.name) is getattr(generic_contact, field.name), field.name
    assert d.qpos is not qpos and fast.qpos is qpos and fast.contact.dist.eq(0).all()
    if batch_shape:
        both = torch.stack([fast[1], fast[0]])
        assert both.batch_size == (2,) and torch.equal(both.qpos[0], qpos[1])
        assert torch.equal(torch.vmap(lambda x: x.replace(qvel=x.qvel + 1).qvel)(fast), d.qvel + 1)
    with pytest.raises(ValueError, match="no field 'qpso'"):
        d.replace(qpso=qpos)
    with pytest.raises(ValueError, match="leading dims must be the batch"):
        diffmj.make_data(m, batch_shape=(2,)).replace(qvel=torch.zeros(3, m.nv))


def test_options_take_effect_or_are_refused():
    """Options read at run time take effect when replaced; those put_model built plans from
    (cone, planned disable flags, disableactuator) are refused with a ValueError."""
    m = diffmj.load(MODELS / "contacts.xml")
    d = diffmj.make_data(m)
    weightless = m.replace(opt=m.opt.replace(disableflags=m.opt.disableflags | diffmj.DisableBit.GRAVITY))
    assert diffmj.step(weightless, d).qvel.abs().max() == 0
    assert diffmj.step(m, d).qvel.abs().max() > 0
    assert m.replace(opt=m.opt.replace(iterations=3)).opt.iterations == 3
    refused = {
        "opt.cone": {"cone": diffmj.ConeType.ELLIPTIC},
        "contact": {"disableflags": m.opt.disableflags | diffmj.DisableBit.CONTACT},
        "frictionloss": {"disableflags": m.opt.disableflags | diffmj.DisableBit.FRICTIONLOSS},
        "disableactuator": {"disableactuator": 1},
        "energy": {"enableflags": diffmj.EnableBit.ENERGY},
        "opt.solver": {"solver": diffmj.SolverType.PGS},
        "opt.integrator": {"integrator": diffmj.IntegratorType.DISCRETE},
    }
    for message, change in refused.items():
        with pytest.raises(ValueError, match=message):
            m.opt.replace(**change)
    with pytest.raises(ValueError, match="put_model again"):  # also when opt is built by hand
        m.replace(opt=dataclasses.replace(m.opt, cone=diffmj.ConeType.ELLIPTIC))


def test_model_is_a_pytree():
    m = diffmj.load(MODELS / "chain.xml")
    leaves, spec = torch.utils._pytree.tree_flatten(m)
    assert all(isinstance(x, torch.Tensor) for x in leaves)
    rebuilt = torch.utils._pytree.tree_unflatten(leaves, spec)
    assert rebuilt.structure == m.structure and rebuilt.body_mass is m.body_mass


CONVEX_PAIR = ('<body><freejoint/><geom name="a" type="capsule" size=".1 .2"/></body>'
               '<body pos="1 0 0"><freejoint/><geom name="b" type="cylinder" size=".1 .2"/></body>')
REFUSED = {
    "heightfield pair": '<geom name="a" type="hfield" hfield="h"/>'
    '<body pos="0 0 1"><freejoint/><geom name="b" type="box" size=".1 .2 .1"/></body>',
    "multiccd": CONVEX_PAIR,
    "nativeccd": CONVEX_PAIR,
    "sensors": '<body><joint name="j"/><geom size=".1" contype="0" conaffinity="0"/></body>',
    "user dynamics": '<body><joint name="j"/><geom size=".1" contype="0" conaffinity="0"/></body>',
    "dcmotor thermal": '<body><joint name="j"/><geom size=".1" contype="0" conaffinity="0"/></body>',
    "dcmotor controller": '<body><joint name="j"/><geom size=".1" contype="0" conaffinity="0"/></body>',
}
ASSET = {"heightfield pair": '<asset><hfield name="h" nrow="3" ncol="3" size="1 1 .1 .1"/></asset>'}
EXTRA = {
    "sensors": '<sensor><user name="u" dim="1"/></sensor>',
    "user dynamics": '<actuator><general joint="j" dyntype="user"/></actuator>',
    "dcmotor thermal": '<actuator><dcmotor joint="j" motorconst=".05" resistance="2" thermal="1 10 25 .004 25"/>'
    "</actuator>",
    "dcmotor controller": '<actuator><dcmotor joint="j" motorconst=".05" resistance="2" input="pos" '
    'controller="10 0 1"/></actuator>',
}
OPTION = {
    "multiccd": '<option><flag multiccd="disable"/></option>',
    "nativeccd": '<option><flag nativeccd="disable"/></option>',
}
MESSAGE = {
    "heightfield pair": "geom pair 'a' \\(hfield\\) - 'b' \\(box\\): hfield against a box or mesh without margin",
    "multiccd": "flag 'multiccd' disabled for geom pair 'a' \\(capsule\\) - 'b' \\(cylinder\\)",
    "nativeccd": "flag 'nativeccd' disabled \\(libccd\\) for geom pair 'a' \\(capsule\\) - 'b' \\(cylinder\\)",
    "sensors": "sensor 'u': type 'user'",
    "user dynamics": "actuator #0: dynamics 'user'",
    "dcmotor thermal": "actuator #0: DC motor thermal model",
    "dcmotor controller": "actuator #0: DC motor inputs other than one voltage",
}


@pytest.mark.parametrize("feature", REFUSED)
def test_unsupported_features_are_refused_by_name(feature):
    xml = (
        f"<mujoco>{OPTION.get(feature, '')}{ASSET.get(feature, '')}<worldbody>{REFUSED[feature]}</worldbody>"
        f"{EXTRA.get(feature, '')}</mujoco>"
    )
    with pytest.raises(NotImplementedError, match=MESSAGE[feature]):
        diffmj.put_model(mujoco.MjModel.from_xml_string(xml))


def test_bad_inputs_raise_value_error():
    m = diffmj.load(MODELS / "actuators.xml")
    d = diffmj.make_data(m)
    with pytest.raises(ValueError, match="ctrl has length"):
        diffmj.step(m, d.replace(ctrl=torch.zeros(m.nu + 1, dtype=torch.float64)))
    with pytest.raises(ValueError, match="qpos has length"):
        diffmj.forward(m, d.replace(qpos=torch.zeros(m.nq - 1, dtype=torch.float64)))
    with pytest.raises(ValueError, match="float32 but the model is torch.float64"):
        diffmj.step(m, d.to(torch.float32))
    with pytest.raises(ValueError, match="expected diffmj.Data"):
        diffmj.step(m, {"qpos": d.qpos})
    with pytest.raises(ValueError, match="floating-point"):
        diffmj.put_model(mj_model("chain"), dtype=torch.int64)
    with pytest.raises(TypeError, match="mujoco.MjModel"):
        diffmj.put_model("chain.xml")
    mjd = random_state(mj_model("chain"), 0)
    with pytest.raises(ValueError, match="does not match"):
        diffmj.put_data(m, mjd)
    with pytest.raises(ValueError, match="unbatched"):
        diffmj.get_data_into(mujoco.MjData(mj_model("actuators")), mj_model("actuators"), diffmj.make_data(m, 2))


def test_every_data_field_has_one_role():
    """State, input or computed: what put_data / get_data copy and checkpointed rollouts carry."""
    roles = diffmj.types.STATE_FIELDS + diffmj.types.INPUT_FIELDS + diffmj.types.COMPUTED_FIELDS
    assert len(roles) == len(set(roles)), "a Data field has two roles"
    assert set(roles) == {f.name for f in dataclasses.fields(diffmj.Data)}, "a Data field has no role"


def test_get_data_put_data_keep_state_and_inputs():
    mjm = mj_model("constraints")
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, random_state(mjm, 0))
    changed = {name: torch.rand_like(getattr(d, name), dtype=m.dtype).to(getattr(d, name).dtype)
               for name in diffmj.types.STATE_FIELDS + diffmj.types.INPUT_FIELDS}
    changed["eq_active"] = ~d.eq_active
    d = d.replace(**changed)
    back = diffmj.put_data(m, diffmj.get_data(mjm, d))
    for name in changed:
        torch.testing.assert_close(getattr(back, name), getattr(d, name), rtol=0, atol=0, msg=name)


def test_put_data_copies_a_state_whose_mass_matrix_is_not_positive_definite():
    """MuJoCo's data after its simulation blew up (gymnasium-robotics' fetch in the census) can hold an M that
    is not positive definite: put_data still copies the state (qLD is then not a factor) instead of raising."""
    mjm = mj_model("constraints")
    m = diffmj.put_model(mjm)
    mjd = random_state(mjm, 0)
    mujoco.mj_forward(mjm, mjd)
    mjd.M[:] = -1.0
    d = diffmj.put_data(m, mjd)
    torch.testing.assert_close(d.qpos, torch.as_tensor(mjd.qpos), rtol=0, atol=0)
