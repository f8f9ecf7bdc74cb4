"""contact_slots / contact_force between named geoms and bodies, against MuJoCo C's contacts."""

from __future__ import annotations

import itertools

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from tests.conftest import TOL, assert_close, mj_model


def settled(mjm: mujoco.MjModel, steps: int) -> mujoco.MjData:
    """The state after ``steps`` steps, solved with a tight tolerance (MuJoCo's and diffmj's forces agree)."""
    mjd = mujoco.MjData(mjm)
    for _ in range(steps):
        mujoco.mj_step(mjm, mjd)
    mjm.opt.tolerance = 1e-14
    mujoco.mj_forward(mjm, mjd)
    return mjd


def mj_contacts(mjm: mujoco.MjModel, mjd: mujoco.MjData, geoms: set[int]) -> list[tuple[float, np.ndarray]]:
    """(dist, force in the contact frame) of MuJoCo's contacts between two geoms, sorted by dist."""
    out = []
    for k in range(mjd.ncon):
        if set(mjd.contact[k].geom) == geoms:
            force = np.zeros(6)
            mujoco.mj_contactForce(mjm, mjd, k, force)
            out.append((mjd.contact[k].dist, force))
    return sorted(out, key=lambda c: c[0])


@pytest.mark.parametrize("cone", ["pyramidal", "elliptic"])
@pytest.mark.parametrize("steps", [81, 121, 300])  # ball on pill and pebble on die; ball on crate; all on the floor
def test_slots_and_forces_match_mujoco(steps, cone):
    mjm = mj_model("contacts")
    mjm.opt.cone = getattr(mujoco.mjtCone, f"mjCONE_{cone.upper()}")
    mjd = settled(mjm, steps)
    m = diffmj.put_model(mjm)
    d = diffmj.forward(m, diffmj.put_data(m, mjd))
    names = [mjm.geom(g).name for g in range(mjm.ngeom)]
    checked = 0
    for a, b in itertools.combinations(range(mjm.ngeom), 2):
        try:
            slots = diffmj.contact_slots(m, geom1=names[a], geom2=names[b])
        except ValueError:
            continue  # never collide
        assert torch.equal(slots, diffmj.contact_slots(m, geom1=b, geom2=a))
        held = slots[torch.isfinite(d.contact.dist[slots])]
        expected = mj_contacts(mjm, mjd, {a, b})
        assert len(held) == len(expected), (names[a], names[b])
        order = torch.argsort(d.contact.dist[held])
        dist = d.contact.dist[held][order].numpy()
        force = diffmj.contact_force(m, d, held)[order].numpy()
        for k, (mj_dist, mj_force) in enumerate(expected):
            assert_close("dist", dist[k], mj_dist, TOL["rows"])
            assert_close("contact force", force[k], mj_force, TOL["solver"])
            checked += 1
        free = slots[~torch.isfinite(d.contact.dist[slots])]
        assert not diffmj.contact_force(m, d, free).any()
    assert checked >= 3


def test_body_slots_and_the_normal_force_on_the_floor():
    mjm = mj_model("contacts")
    mjd = settled(mjm, 300)
    m = diffmj.put_model(mjm)
    d = diffmj.forward(m, diffmj.put_data(m, mjd))
    slots = diffmj.contact_slots(m, body1="crate", body2="world")
    assert torch.equal(slots, diffmj.contact_slots(m, geom1="crate", geom2="floor"))
    normal = diffmj.contact_force(m, d, slots)[..., 0].sum(-1)
    expected = sum(force[0] for _, force in mj_contacts(mjm, mjd, {0, 3}))
    assert_close("normal force", normal, expected, TOL["solver"])
    # every slot of the floor, one side only
    floor = diffmj.contact_slots(m, geom1="floor")
    geoms = m.collision_plan.contact_geom[floor]
    assert (geoms == 0).any(-1).all() and len(floor) > len(slots)
    # batched Data: one row per state
    batch = torch.stack([d, d])
    assert_close("batched", diffmj.contact_force(m, batch, slots)[1], diffmj.contact_force(m, d, slots), TOL["batch"])


def test_normal_force_is_differentiable():
    mjm = mj_model("contacts")
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, settled(mjm, 300))
    slots = diffmj.contact_slots(m, body1="crate", body2="world")

    def normal(mass):
        return diffmj.contact_force(m, diffmj.forward(diffmj.set_param(m, "body_mass", mass, "crate"), d), slots)[
            ..., 0].sum()

    grad = torch.func.grad(normal)(diffmj.get_param(m, "body_mass", "crate"))
    assert torch.isfinite(grad) and grad > 0  # a heavier crate presses harder on the floor


def test_contact_slots_refuses_bad_input():
    m = diffmj.put_model(mj_model("contacts"))
    with pytest.raises(ValueError, match="never collide"):
        diffmj.contact_slots(m, body1="ball", body2="drum")  # <exclude>
    with pytest.raises(ValueError, match="no geom named 'flor'"):
        diffmj.contact_slots(m, geom1="flor")
    with pytest.raises(ValueError, match="not both"):
        diffmj.contact_slots(m, geom1="ball", body1="ball")
    with pytest.raises(ValueError, match="needs geom1 or body1"):
        diffmj.contact_slots(m, geom2="ball")
