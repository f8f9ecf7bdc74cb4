"""Contacts (collision) and constraint rows (make_constraint, reference_constraint) against MuJoCo C,
row by row, float64. Each stage runs with its outputs poisoned (conftest.check_stage); a stage's input
rows are diffmj's own from the stage before (put_data carries no contacts or rows)."""

from __future__ import annotations

import mujoco
import pytest

import diffmj
from diffmj.collision.driver import collision
from diffmj.constraint import make_constraint, reference_constraint
from tests.conftest import BENCHMARK_MODELS, TOL, check_stage, mj_model, random_state, settled_state

MAKE = ("efc_active", "efc_J", "efc_pos", "efc_margin", "efc_frictionloss", "efc_KBIP", "efc_R", "efc_D",
        "efc_diagA")
REFERENCE = ("efc_vel", "efc_aref")
STEPS = {"hopper": (185, 250, 304)}  # states with contacts (the hopper is in the air after 60 and 140 steps)


def check_rows(m, mjd, d):
    """make_constraint then reference_constraint on d (MuJoCo's state, diffmj's contacts)."""
    d = check_stage(make_constraint, m, mjd, MAKE, TOL["rows"], d=d)
    check_stage(reference_constraint, m, mjd, REFERENCE, TOL["rows"], d=d)


@pytest.mark.parametrize("seed", range(5))
def test_equality_friction_limit_rows(seed):
    mjm = mj_model("constraints")
    mjd = random_state(mjm, seed, scale=0.6)
    mujoco.mj_forward(mjm, mjd)
    assert mjd.nefc > 10
    m = diffmj.put_model(mjm)
    check_rows(m, mjd, diffmj.put_data(m, mjd))


# a joint equality and a joint limit, no other block (rows are built only for blocks with elements)
JOINT_EQUALITY_ONLY = """
<mujoco>
  <worldbody>
    <body>
      <joint name="a" axis="0 1 0" limited="true" range="-0.3 0.3"/>
      <geom type="capsule" size=".05" fromto="0 0 0 .5 0 0"/>
      <body pos=".5 0 0">
        <joint name="b" axis="0 1 0"/>
        <geom type="capsule" size=".05" fromto="0 0 0 .5 0 0"/>
      </body>
    </body>
  </worldbody>
  <equality>
    <joint joint1="b" joint2="a" polycoef="0.1 -0.5 0.2 0 0"/>
  </equality>
</mujoco>
"""


@pytest.mark.parametrize("seed", range(2))
def test_rows_of_a_joint_equality_without_connect_or_weld(seed):
    mjm = mujoco.MjModel.from_xml_string(JOINT_EQUALITY_ONLY)
    mjd = random_state(mjm, seed, scale=0.6)
    mujoco.mj_forward(mjm, mjd)
    assert mjd.nefc >= 2
    m = diffmj.put_model(mjm)
    check_rows(m, mjd, diffmj.put_data(m, mjd))


@pytest.mark.parametrize("name", ["contacts", "humanoid", "ant", "walker2d", "halfcheetah", "hopper"])
@pytest.mark.parametrize("cone", ["pyramidal", "elliptic"])
def test_contact_rows(name, cone):
    """Every geom pair type, condim, mixing rule, pair / exclude (contacts.xml) and the shared models."""
    path = BENCHMARK_MODELS / f"{name}.xml"
    mjm = mujoco.MjModel.from_xml_path(str(path)) if path.exists() else mj_model(name)
    mjm.opt.cone = getattr(mujoco.mjtCone, f"mjCONE_{cone.upper()}")
    m = diffmj.put_model(mjm)
    for steps in STEPS.get(name, (60, 140, 300)):
        mjd = settled_state(mjm, steps)
        check_rows(m, mjd, check_stage(collision, m, mjd, ("contact",), TOL["rows"]))
