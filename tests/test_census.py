"""benchmarks/census.py on a tiny collection: a matching model, two refused ones, a fragment that does not
compile and a file that is not MJCF; its records say what happened. The census's figures are the
benchmark's, not a test's."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil

import mujoco
import numpy as np
import pytest
import torch

import diffmj

ROOT = pathlib.Path(__file__).parents[1]
_spec = importlib.util.spec_from_file_location("census_benchmark", ROOT / "benchmarks" / "census.py")
census = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(census)

SLEEP = """<mujoco><option><flag sleep="enable"/></option>
  <worldbody><body><freejoint/><geom name="ball" size=".1"/></body></worldbody></mujoco>"""
TENDON = """<mujoco><worldbody><site name="s0"/>
  <body><joint name="hinge"/><geom size=".1" pos="0 0 .5"/><site name="s1" pos="0 0 .5"/></body></worldbody>
  <tendon><spatial name="string" armature=".1"><site site="s0"/><site site="s1"/></spatial></tendon></mujoco>"""
FRAGMENT = """<mujoco><worldbody><body childclass="missing"><geom size=".1"/></body></worldbody></mujoco>"""
INCLUDE = """<mujocoinclude><geom size=".1"/></mujocoinclude>"""
STATIC = """<mujoco><worldbody><geom type="box" size=".1 .1 .1"/></worldbody></mujoco>"""


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("census")
    shutil.copy(ROOT / "tests" / "models" / "pendulum.xml", folder / "pendulum.xml")
    (folder / "sub").mkdir()
    for name, text in (("sub/sleep.xml", SLEEP), ("tendon.xml", TENDON), ("fragment.xml", FRAGMENT),
                       ("include.xml", INCLUDE), ("static.xml", STATIC)):
        (folder / name).write_text(text)
    out = census.run_census({"tiny": folder}, timeout=300, states=1, steps=2, tol=census.TOL)
    return {r["model"]: r for r in out}


def test_census_finds_the_mjcf_files_recursively(records):
    assert sorted(records) == ["fragment.xml", "pendulum.xml", "static.xml", "sub/sleep.xml", "tendon.xml"]  # not include.xml
    assert {r["collection"] for r in records.values()} == {"tiny"}


def test_census_matches_a_supported_model(records):
    r = records["pendulum.xml"]
    assert r["status"] == "match" and not r["diverges"]
    assert r["size"]["nq"] == 6 and r["size"]["nu"] == 2
    assert set(r["errors"]["forward"]) == set(census.FORWARD_FIELDS)
    assert set(r["errors"]["step"]) == set(r["errors"]["rollout"]) == set(census.STEP_FIELDS)
    assert 0 <= r["worst"]["forward"] <= census.TOL and 0 <= r["worst"]["step"] <= census.TOL
    assert set(r["mujoco_solver"]) == {"ncon", "iterations", "ls_evals", "resets"}


def test_census_reports_refusals_by_feature(records):
    sleep, tendon = records["sub/sleep.xml"], records["tendon.xml"]
    assert sleep["status"] == tendon["status"] == "refused"
    assert sleep["refusal"] == "option flag 'sleep' is not supported by diffmj"
    assert sleep["feature"] == "option flag 'sleep'"
    assert "'string'" in tendon["refusal"] and tendon["feature"] == "tendon: armature on a spatial tendon"
    assert "errors" not in sleep


def test_census_sets_static_models_aside(records):
    r = records["static.xml"]
    assert r["status"] == "match" and r["size"]["nv"] == 0 and census.status(r) == "static"
    assert census.status(records["pendulum.xml"]) == "match"


def test_census_skips_files_that_do_not_compile(records):
    r = records["fragment.xml"]
    assert r["status"] == "not_compiled" and "unknown default childclass" in r["compile_error"]


def test_summary_ranks_refusals_and_counts_collections(records):
    table = census.summary_tables(list(records.values()), census.TOL)
    assert "3 models with degrees of freedom compiled by MuJoCo (1 static ones and 1 files" in table
    assert "loaded by diffmj: 1; match MuJoCo C within 1e-09: 1, and 0 more where" in table
    assert "| tiny | 3 | 1 | 0 | 0 | 0 | 2 | 0 | 0 | 1 | 1 |" in table
    assert "| `tendon: armature on a spatial tendon` | 1 | tiny 1 | tiny/tendon.xml |" in table


@pytest.mark.parametrize("message, expected", [
    ("geom pair 'a b' (mesh) - '#3' (box): collision is not supported by diffmj", "geom pair (mesh) - (box): collision"),
    ("geom pair #1 (box) - #2 (mesh): collision is not supported by diffmj", "geom pair (box) - (mesh): collision"),
    ("sensor #4: rangefinder ray against hfield geom 'terrain' is not supported by diffmj",
     "sensor: rangefinder ray against hfield geom"),
    ("tendon 'string': armature on a spatial tendon is not supported by diffmj", "tendon: armature on a spatial tendon"),
    ("option solver 'PGS' (use Newton or CG) is not supported by diffmj", "option solver 'PGS' (use Newton or CG)"),
])
def test_feature_drops_element_names(message, expected):
    assert census.feature(message) == expected


def test_worker_past_its_timeout_is_recorded_and_replaced():
    worker = census.Worker(states=1, steps=1, tol=census.TOL)
    try:
        late = worker.examine(ROOT / "tests" / "models" / "pendulum.xml", timeout=0.01)
        assert late["status"] == "timeout" and worker.process is None
        assert worker.examine(ROOT / "tests" / "models" / "pendulum.xml", timeout=300)["status"] == "match"
    finally:
        worker.close()


def test_worker_past_its_memory_is_recorded_and_replaced():
    worker = census.Worker(states=1, steps=1, tol=census.TOL, memory_gib=1e-3)  # 1 MiB: any Python is over
    try:
        big = worker.examine(ROOT / "tests" / "models" / "pendulum.xml", timeout=300)
        assert big["status"] == "error" and "resident memory" in big["error"] and worker.process is None
    finally:
        worker.close()


def test_resumed_census_examines_only_the_files_not_recorded(tmp_path):
    shutil.copy(ROOT / "tests" / "models" / "pendulum.xml", tmp_path / "pendulum.xml")
    (tmp_path / "static.xml").write_text(STATIC)
    done = [{"collection": "tiny", "model": "pendulum.xml", "status": "match", "kept": True}]
    out = census.run_census({"tiny": tmp_path}, timeout=300, states=1, steps=1, tol=census.TOL, done=done)
    assert [r["model"] for r in out] == ["pendulum.xml", "static.xml"] and out[0].get("kept")
    assert census.status(out[1]) == "static"


def test_compare_state_sees_a_different_model():
    """The census's comparison against MuJoCo C, given a diffmj model with 1 % more gravity: every
    moving field differs (a comparison that always passed would hide a wrong model)."""
    mjm = mujoco.MjModel.from_xml_path(str(ROOT / "tests" / "models" / "pendulum.xml"))
    m = diffmj.put_model(mjm)
    heavier = m.replace(opt=m.opt.replace(gravity=m.opt.gravity * 1.01))
    effort = {}
    same = census.compare_state(mjm, m, census.initial_state(mjm, 0), 2, effort)
    differs = census.compare_state(mjm, heavier, census.initial_state(mjm, 0), 2, effort)
    assert census.max_error(same["forward"]) <= census.TOL and census.max_error(same["step"]) <= census.TOL
    assert differs["forward"]["qacc"] > 1e-5 and differs["forward"]["qfrc_bias"] > 1e-5
    assert differs["step"]["qvel"] > 1e-5 and differs["rollout"]["qvel"] > 1e-5
    assert differs["forward"]["xpos"] == 0  # positions do not depend on gravity


def test_truncated_solver_matches():
    """With one solver iteration of one line-search evaluation diffmj stops where MuJoCo C's line search
    stops (its PrimalSearch): the model matches."""
    mjm = mujoco.MjModel.from_xml_path(str(ROOT / "tests" / "models" / "constraints.xml"))
    mjm.opt.iterations, mjm.opt.ls_iterations = 1, 1
    errors = census.compare_model(mjm, diffmj.put_model(mjm), 1, 3, {})
    assert census.max_error(errors["step"]) <= census.TOL


# gymnasium-robotics' manipulate_egg in small: its egg (an ellipsoid) pressed on a box corner, on a box edge
# and by a capsule finger, the pairs whose contacts MuJoCo C's EPA leaves ~5e-3 rad off at its default
# ccd_tolerance
EGG = """<mujoco><option timestep="0.002"/>
  <worldbody>
    <geom name="corner" type="box" size=".0095 .0111 .025" euler="40 35 0"/>
    <geom name="finger" type="capsule" size=".01" fromto=".04 -.02 .064 .04 .02 .064"/>
    <geom name="edge" type="box" size=".032 .0111 .049" pos=".09 0 0" euler="45 0 0"/>
    <body pos="0 0 .0576"><freejoint/><geom name="egg" type="ellipsoid" size=".03 .03 .04" euler="20 10 0"/></body>
    <body pos=".09 0 .0584"><freejoint/><geom type="ellipsoid" size=".03 .03 .04" euler="0 15 30"/></body>
  </worldbody><keyframe><key qpos="0.003 0.002 .0576 1 0 0 0 .09 0.004 .0584 1 0 0 0"/></keyframe></mujoco>"""


@pytest.fixture(scope="module")
def egg():
    mjm = mujoco.MjModel.from_xml_string(EGG)
    mjd = mujoco.MjData(mjm)
    mujoco.mj_resetDataKeyframe(mjm, mjd, 0)
    return mjm, diffmj.put_model(mjm), mjd


def test_convex_mismatch_is_mujocos_ccd_error(egg):
    """The egg mismatches MuJoCo C by its EPA's error (qacc 8e-2); with MuJoCo C's contacts replaced by
    diffmj's, each certified within MuJoCo C's own error, forward and 5 steps match to rounding."""
    mjm, m, mjd = egg
    plain = census.compare_state(mjm, m, mjd, 5, {})
    assert census.max_error(plain["forward"]) > 1e-3
    into = {"replaced": 0, "normal_angle": 0.0}
    exact = census.exact_contact_state(mjm, m, mjd, 5, into)
    assert "refused" not in exact, exact
    assert census.max_error(exact) <= census.TOL
    assert set(exact) == set(census.FORWARD_FIELDS + census.STEP_FIELDS)
    assert into["replaced"] == 15 and 1e-3 < into["normal_angle"] < 1e-2


def test_certify_refuses_a_contact_off_the_minimum(egg):
    """The certificate accepts diffmj's exact contact and refuses it moved: the normal turned by 3e-2 rad
    within the tangent plane, with the support value there as its dist (MuJoCo's normal then has the
    lower support value), or the dist 1e-6 deeper than the support value."""
    mjm, m, mjd = egg
    mujoco.mj_forward(mjm, mjd)
    d = diffmj.forward(m, diffmj.put_data(m, mjd))
    checked = 0
    for contact in mjd.contact[:mjd.ncon]:
        slot = next(i for i, g in enumerate(m.collision_plan.contact_geom.tolist())
                    if tuple(g) == tuple(contact.geom) and np.isfinite(float(d.contact.dist[i])))
        dist, pos, frame = float(d.contact.dist[slot]), d.contact.pos[slot].numpy(), d.contact.frame[slot].numpy()
        assert census.certify(mjm, mjd, contact, (dist, pos, frame[0])) == ""
        turned = np.cos(3e-2) * frame[0] + np.sin(3e-2) * frame[1]  # MuJoCo C is ~5e-3 rad off
        off_minimum = (-sum(census.support(mjm, mjd, g, sign * turned) for g, sign in zip(contact.geom, (1, -1))),
                       pos, turned)  # its dist the support value at the turned normal
        assert census.certify(mjm, mjd, contact, off_minimum).startswith("MuJoCo's normal has a support value")
        deeper = census.certify(mjm, mjd, contact, (dist - 1e-6, pos, frame[0]))
        assert deeper.startswith("diffmj's dist")
        checked += 1
    assert checked == 3


def test_certificate_bounds_the_position(egg):
    """A MuJoCo contact point farther from diffmj's than its normal's angle allows is refused."""
    mjm, m, mjd = egg
    mujoco.mj_forward(mjm, mjd)
    d = diffmj.forward(m, diffmj.put_data(m, mjd))
    contact = mjd.contact[0]  # finger - egg
    slot = next(i for i, g in enumerate(m.collision_plan.contact_geom.tolist())
                if tuple(g) == tuple(contact.geom) and np.isfinite(float(d.contact.dist[i])))
    ours = (float(d.contact.dist[slot]), d.contact.pos[slot].numpy(), d.contact.frame[slot, 0].numpy())
    assert census.certify(mjm, mjd, contact, ours) == ""
    contact.pos[:] = ours[1] + 2e-5  # the bound: 6.9e-5 rad times the reaches, 3 cm (finger) + 5.3 cm (egg)
    try:
        assert census.certify(mjm, mjd, contact, ours).startswith("normal")
    finally:
        mujoco.mj_forward(mjm, mjd)


# a hinge so stiff that the census's perturbation of qpos0 gives a qacc over 1e10: MuJoCo C resets it
UNSTABLE = """<mujoco><worldbody><body><joint name="hinge" stiffness="1e14"/><geom size=".1" pos="0 0 .5"/></body>
  </worldbody></mujoco>"""


def test_step_that_mujoco_resets_compares_the_bad_qacc():
    """At a step where MuJoCo C resets the simulation (mj_checkAcc: a qacc ~1e12 here), diffmj's qacc must be
    as bad instead of the step matching MuJoCo C's reset state; the steps after the reset start from that
    state and match as any other. A stable diffmj model (the hinge 1e6 times softer) fails there."""
    mjm = mujoco.MjModel.from_xml_string(UNSTABLE)
    effort = {}
    errors = census.compare_state(mjm, diffmj.put_model(mjm), census.initial_state(mjm, 0), 3, effort)
    assert effort["resets"] == 1
    assert set(errors["step"]) == {"bad_at_reset", *census.STEP_FIELDS}
    assert census.max_error(errors["forward"]) <= census.TOL and census.max_error(errors["step"]) <= census.TOL
    assert not errors["rollout"]["qvel"] <= census.TOL  # diffmj's own rollout goes on from the unstable state
    softer = diffmj.put_model(mjm).replace(jnt_stiffness=torch.tensor([1e8], dtype=torch.float64))
    errors = census.compare_state(mjm, softer, census.initial_state(mjm, 0), 3, {})
    assert errors["step"]["bad_at_reset"] == np.inf


# a box pressed 3 cm into a plane on four contacts, solved by PGS, which stops within its tolerance elsewhere
# than Newton's optimum
PGS = """<mujoco><option solver="PGS" iterations="20"/><worldbody><geom type="plane" size="1 1 .1"/>
  <body pos="0 0 .07"><freejoint/><geom type="box" size=".1 .2 .1" mass="1"/></body></worldbody></mujoco>"""


def test_pgs_model_matches_mujoco_solving_it_by_newton(tmp_path):
    (tmp_path / "pgs.xml").write_text(PGS)
    with pytest.warns(UserWarning, match="PGS solver"):
        r = census.examine(str(tmp_path / "pgs.xml"), states=1, steps=3, tol=census.TOL)
    assert r["status"] == "match_newton" and r["worst"]["forward"] > 1e-6 and r["newton"] <= census.TOL
