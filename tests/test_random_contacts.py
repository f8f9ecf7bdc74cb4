"""Parity with MuJoCo C on seeded random models with contacts and constraints
(tests/mjcf_random.py: ``random_contact_mjcf``).

For each seed: build the model with converged solver settings (Newton, 100
iterations, tolerance 1e-12, small line-search tolerance, islands disabled:
see tests/test_solver.py ``converged``), start MuJoCo C from qpos0 with a
random velocity, step it with random controls and take the states after
SETTLE_STEPS steps (bodies have landed on the floor and on each other; limits,
frictionloss and equalities are active). From each state check

* ``diffmj.forward`` against ``mujoco.mj_forward``: contacts matched by geom
  pair (dist, pos, frame, friction, solref, solimp, includemargin) and efc
  rows as MuJoCo orders them (J, pos, margin, frictionloss, D, R, diagA, vel,
  aref, and K, B, I of KBIP), all within 1e-9; the converged qacc and efc_force within 1e-6
  relative to their largest entry (tests/test_solver.py ``assert_solution``);
* one ``diffmj.step`` against one ``mujoco.mj_step``: qpos, qvel and act
  within the same 1e-6.

efc_force is unique here: both solvers minimise a strictly convex function of
qacc (M positive definite), and each row's force is a function of that row's
J qacc - aref. The generator avoids the one case where it is not meaningful,
rows with J = 0 whose force is round-off times 1/R ~ 1e15 (see
``_ContactBuilder._equality``).

Newton can still stop short of the tolerance (a line search that finds no
improvement); diffmj's solver stops at the same point, and the integrators
must then use qfrc_smooth + qfrc_constraint, not M qacc (seed 79, Euler).

diffmj starts from the state and inputs alone (``put_data`` of the C state),
so every compared field is diffmj's own.
"""

from __future__ import annotations

import copy

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj import ConeType, ConstraintType, EqType, IntegratorType
from tests.conftest import TOL, assert_close, compare_contacts, compare_rows
from tests.mjcf_random import random_contact_mjcf
from tests.test_constraint import MAKE, REFERENCE
from tests.test_solver import assert_solution, converged

SEEDS = range(20)  # they cover every feature (test_default_seeds_cover_the_features)
SWEEP_SEEDS = range(20, 120)
SETTLE_STEPS = (100, 300)
STEP_FIELDS = ("qpos", "qvel", "act")


def _model(seed: int) -> mujoco.MjModel:
    mjm = mujoco.MjModel.from_xml_string(random_contact_mjcf(seed))
    converged(mjm, cone=mujoco.mjtCone(mjm.opt.cone).name.removeprefix("mjCONE_").lower())
    mjm.opt.ls_tolerance = 1e-12
    return mjm


def _settled_states(mjm: mujoco.MjModel, seed: int):
    """(steps, MuJoCo C state after mj_forward) at each of SETTLE_STEPS along one rollout
    from qpos0 with a random velocity under random controls."""
    rng = np.random.default_rng([seed, 2])  # a stream apart from the model generator's
    mjd = mujoco.MjData(mjm)
    mjd.qvel[:] = 0.3 * rng.standard_normal(mjm.nv)
    for k in range(1, max(SETTLE_STEPS) + 1):
        mjd.ctrl[:] = rng.uniform(-1.0, 1.0, mjm.nu)
        mujoco.mj_step(mjm, mjd)
        assert not mjd.warning[mujoco.mjtWarning.mjWARN_BADQACC].number, f"MuJoCo C went unstable by step {k}"
        if k in SETTLE_STEPS:
            state = copy.copy(mjd)
            mujoco.mj_forward(mjm, state)
            yield k, state


IMPEDANCE_ROWS = ("efc_D", "efc_R", "efc_KBIP", "efc_aref")
ROW_TOL = {name: TOL["impedance"] if name in IMPEDANCE_ROWS else TOL["rows"] for name in MAKE + REFERENCE}


def _check(seed: int) -> None:
    mjm = _model(seed)
    m = diffmj.put_model(mjm)
    for steps, mjd in _settled_states(mjm, seed):
        try:
            d = diffmj.put_data(m, mjd)
            out = diffmj.forward(m, d)
            compare_contacts(m, out, mjd)
            # efc_KBIP's P = d imp / d pos is left out: its derivative, (dmax - dmin) y''(x) / width^2,
            # is ~1e5 at the default width 1e-3, and a contact's dist may differ by ~1e-13 where
            # MuJoCo's own formula amplifies a 1-ulp difference in the geoms' frames (plane-cylinder
            # with the disk nearly parallel to the plane divides by the sine of the tilt; seed 95).
            # K, B and I (and aref, D, R, which depend on them) are compared.
            compare_rows(m, out, mjd, MAKE + REFERENCE, ROW_TOL, kbip_columns=slice(0, 3))
            assert_solution(m, out, mjm, mjd)
            mujoco.mj_step(mjm, mjd)
            stepped = diffmj.step(m, d)
            for name in STEP_FIELDS:
                # act is empty in models without stateful actuators
                assert_close(f"step {name}", getattr(stepped, name), getattr(mjd, name), TOL["solver"], empty_ok=True)
        except AssertionError as error:
            raise AssertionError(f"seed {seed}, state after {steps} steps: {error}") from error


@pytest.mark.parametrize("seed", SEEDS)
def test_matches_mujoco(seed):
    _check(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SWEEP_SEEDS)
def test_matches_mujoco_sweep(seed):
    _check(seed)


# ---- the generator


def test_generator_is_deterministic():
    assert random_contact_mjcf(3) == random_contact_mjcf(3)
    assert random_contact_mjcf(3) != random_contact_mjcf(4)


def _features(mjm: mujoco.MjModel, mjd: mujoco.MjData) -> set:
    """What a settled state exercises, in MuJoCo's own terms."""
    found = {("cone", int(mjm.opt.cone)), ("integrator", int(mjm.opt.integrator))}
    found |= {("efc type", int(t)) for t in mjd.efc_type}
    found |= {("equality", int(mjm.eq_type[i])) for t, i in zip(mjd.efc_type, mjd.efc_id)
              if t == ConstraintType.EQUALITY}
    for k in range(mjd.ncon):
        con = mjd.contact[k]
        found.add(("condim", int(con.dim)))
        if np.all(mjm.geom_bodyid[con.geom] > 0):
            found.add(("body-body contact",))
        if any(sorted(con.geom) == sorted((mjm.pair_geom1[p], mjm.pair_geom2[p])) for p in range(mjm.npair)):
            found.add(("explicit pair contact",))
        if con.includemargin > 0:
            found.add(("contact margin",))
    return found


def test_default_seeds_cover_the_features():
    """The default seeds' compared states have contacts and exercise each constraint feature."""
    found, with_contacts = set(), 0
    for seed in SEEDS:
        mjm = _model(seed)
        for _, mjd in _settled_states(mjm, seed):
            found |= _features(mjm, mjd)
            with_contacts += mjd.ncon > 0
    assert with_contacts >= 0.7 * len(SEEDS) * len(SETTLE_STEPS)  # some trees hang from an equality
    expected = {("cone", c) for c in ConeType}
    expected |= {("integrator", i) for i in IntegratorType if i != IntegratorType.DISCRETE}
    expected |= {("efc type", t) for t in ConstraintType}
    expected |= {("equality", e) for e in (EqType.CONNECT, EqType.WELD, EqType.JOINT, EqType.TENDON)}
    expected |= {("condim", n) for n in (1, 3, 4, 6)}
    expected |= {("body-body contact",), ("explicit pair contact",), ("contact margin",)}
    assert expected <= found, f"features no default seed exercises: {sorted(expected - found, key=str)}"


# ---- minimal reproducers of the mismatches these seeds exposed


def test_regression_implicitfast_free_body_with_welded_child():
    """MuJoCo 4.0.0 solves the 6x6 block of a free joint whose tree has no other dof with the
    bias (gyroscopic) derivative included, also when jointless bodies are welded below it."""
    xml = """<mujoco><option integrator="implicitfast" timestep="0.01" gravity="0 0 0"/><worldbody>
      <body><freejoint/><geom type="box" size=".05 .1 .2" pos=".1 0 0"/>
        <body pos=".2 .1 0" quat=".9 .3 .1 .2"><geom type="capsule" size=".05 .2" pos="0 .1 0"/></body>
      </body></worldbody></mujoco>"""
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    mjd.qvel[:] = [0.3, -0.2, 0.1, 10.0, -20.0, 15.0]
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, mjd)
    mujoco.mj_step(mjm, mjd)
    assert_close("qvel", diffmj.step(m, d).qvel, mjd.qvel, TOL["smooth"])


def test_regression_euler_damping_after_unconverged_solve():
    """With dof damping mj_Euler solves (M + h B) qacc' = qfrc_smooth + qfrc_constraint, which is
    not M qacc when the constraint solver stopped early (here after one iteration)."""
    xml = """<mujoco><option timestep="0.005" iterations="1"/><worldbody><geom type="plane" size="1 1 .1"/>
      <body pos="0 0 .09" euler="10 20 0"><joint type="free" damping="0.5"/><geom type="box" size=".1 .1 .1"/>
      </body></worldbody></mujoco>"""
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    mjd.qvel[:] = [0.5, -0.3, -0.2, 1.0, 2.0, -1.0]
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, mjd)
    mujoco.mj_step(mjm, mjd)
    assert_close("qvel", diffmj.step(m, d).qvel, mjd.qvel, TOL["smooth"])


@pytest.mark.parametrize("seed", [2, 4, 5, 12])  # 13 to 27 candidate pairs, 6 to 11 apart, 3 to 7 contacts
def test_pairs_skipped_by_bounding_spheres_hold_no_contact(seed):
    """Eager and unbatched, collision skips the pairs whose bounding spheres are apart; its contacts equal
    those of collision under vmap (a batch of one), which collides every pair, in every slot (empty slots
    alike). Fails when the filter drops a pair that touches, or an empty slot keeps its pair's values."""
    from diffmj.collision.driver import _spheres_apart, collision, contact_params

    mjm = _model(seed)
    m = diffmj.put_model(mjm)
    plan = m.collision_plan
    skipped = contacts = 0
    for _, mjd in _settled_states(mjm, seed):
        d = diffmj.put_data(m, mjd)
        params = contact_params(m)
        skipped += int(_spheres_apart(m, d, plan.geom1, plan.geom2, params["margin"] + params["gap"]).sum())
        eager = collision(m, d).contact
        mapped = torch.vmap(lambda d: collision(m, d).contact)(d[None])[0]
        contacts += int(torch.isfinite(eager.dist).sum())
        for name in ("dist", "pos", "frame", "active"):
            torch.testing.assert_close(getattr(eager, name), getattr(mapped, name), rtol=0, atol=TOL["batch"])
    assert skipped > 0 and contacts >= 3
