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
    assert "loaded by diffmj: 1; match MuJoCo C within 1e-09: 1." in table
    assert "| tiny | 3 | 1 | 0 | 2 | 0 | 0 | 1 | 1 |" in table
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


def test_truncated_solver_matches_without_diagnosis():
    """With one solver iteration of one line-search evaluation diffmj stops where MuJoCo C's line search
    stops (its PrimalSearch): the model matches. A model without convex pairs has no diagnosis to run;
    one with them is compared again with MuJoCo C's convex collision converged (an error is reported)."""
    mjm = mujoco.MjModel.from_xml_path(str(ROOT / "tests" / "models" / "constraints.xml"))
    mjm.opt.iterations, mjm.opt.ls_iterations = 1, 1
    errors = census.compare_model(mjm, diffmj.put_model(mjm), 1, 3, {})
    assert census.max_error(errors["step"]) <= census.TOL
    assert census.diagnose(mjm, 1, 3) == {}
    convex = mujoco.MjModel.from_xml_path(str(ROOT / "tests" / "models" / "convex_pairs.xml"))
    diagnosis = census.diagnose(convex, 1, 2)
    assert list(diagnosis) == ["ccd_tolerance 1e-14"] and np.isfinite(diagnosis["ccd_tolerance 1e-14"])
