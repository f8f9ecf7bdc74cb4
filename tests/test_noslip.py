"""The noslip post-processor (diffmj/noslip.py) against MuJoCo C: forces, qacc, steps; islands and early exit;
batching, compiling and gradients.

The main solver runs to tolerance 1e-14 here, so both sides hand noslip the same forces.
Rolling friction is 0.01 (not MuJoCo's default 1e-4): a pyramid's rolling edge pair has
K1 = A00 + A11 - 2 A01 ~ 4 mu^2 A00, a difference MuJoCo itself rounds to ~1e-16 / mu^2
relative, so at 1e-4 both sides' answers carry ~1e-8 of rounding (measured 3.7e-10 on
the forces of this model).
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj.noslip import noslip
from tests.conftest import TOL, as_numpy, assert_close, match_contacts, match_efc

# a box sliding on a plane with a box on it (a small stack), a capsule sliding along its axis, a pendulum
# with frictionloss: three constraint islands
SCENE = """
<mujoco><option cone="{cone}" noslip_iterations="{iterations}" noslip_tolerance="{tolerance}"
                timestep="0.005" tolerance="1e-14" iterations="100"/>
  <default><geom condim="{condim}" friction="{friction}"/></default>
  <worldbody><geom type="plane" size="5 5 .1"/>
    <body pos="0 0 .1"><freejoint/><geom type="box" size=".1 .1 .1"/></body>
    <body pos=".02 0 .3" euler="0 0 20"><freejoint/><geom type="box" size=".1 .1 .1"/></body>
    <body pos=".4 0 .05"><freejoint/><geom type="capsule" fromto="-.1 0 0 .1 0 0" size=".05"/></body>
    <body pos=".8 0 .3"><joint type="hinge" axis="0 1 0" frictionloss=".3"/>
      <geom type="capsule" fromto="0 0 0 .3 0 0" size=".03" contype="0" conaffinity="0"/></body>
  </worldbody></mujoco>"""

CASES = [(cone, condim) for cone in ("pyramidal", "elliptic") for condim in (3, 4, 6)]


def scene(cone="pyramidal", condim=3, iterations=20, tolerance=1e-6, islands=True,
          friction="1 0.02 0.01") -> mujoco.MjModel:
    mjm = mujoco.MjModel.from_xml_string(SCENE.format(cone=cone, condim=condim, iterations=iterations,
                                                      tolerance=tolerance, friction=friction))
    if not islands:
        mjm.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_ISLAND
    return mjm


def sliding(mjm: mujoco.MjModel, steps: int = 20) -> mujoco.MjData:
    """The scene after ``steps`` steps from the lower box and the capsule sliding."""
    mjd = mujoco.MjData(mjm)
    mjd.qvel[0], mjd.qvel[12] = 0.5, -0.3
    for _ in range(steps):
        mujoco.mj_step(mjm, mjd)
    mujoco.mj_forward(mjm, mjd)
    return mjd


def on_cone_surface(mjd: mujoco.MjData, row: int) -> bool:
    """Whether row is in an elliptic contact whose force MuJoCo put on the friction cone's surface (to
    rounding): noslip's slipping contacts, whose state (CONE or SATISFIED) a rounding decides on either side."""
    if mjd.efc_type[row] != mujoco.mjtConstraint.mjCNSTR_CONTACT_ELLIPTIC:
        return False
    con = mjd.contact[mjd.efc_id[row]]
    force = mjd.efc_force[con.efc_address : con.efc_address + con.dim]
    tangent = np.linalg.norm(force[1:] / con.friction[: con.dim - 1])
    return abs(force[0] - tangent) <= TOL["rows"] * (1 + abs(force[0]))


def assert_forward(m, out, mjd, tol=TOL["rows"]):
    ours, theirs = match_efc(m, out, mjd)
    force_scale = 1 + np.abs(mjd.efc_force).max()
    err = np.abs(as_numpy(out.efc_force)[ours] - mjd.efc_force[theirs]).max() / force_scale
    assert err <= tol, f"efc_force relative error {err:.2e}"
    differ = theirs[as_numpy(out.efc_state)[ours] != mjd.efc_state[theirs]]
    assert all(on_cone_surface(mjd, row) for row in differ), f"efc_state differs in rows {differ}"
    assert_close("qacc", out.qacc, mjd.qacc, tol)
    assert_close("qfrc_constraint", out.qfrc_constraint, mjd.qfrc_constraint, tol)


@pytest.mark.parametrize("islands", [True, False], ids=["islands", "monolithic"])
@pytest.mark.parametrize("cone, condim", CASES)
def test_forward_matches_mujoco(cone, condim, islands):
    mjm = scene(cone, condim, islands=islands)
    mjd = sliding(mjm)
    assert mjd.ncon >= 10 and mjd.nf == 1  # the stack, the capsule, the frictionloss row
    m = diffmj.put_model(mjm)
    out = diffmj.forward(m, diffmj.put_data(m, mjd))
    assert_forward(m, out, mjd)
    # noslip moved the forces well away from the main solver's
    without = diffmj.forward(m.replace(opt=m.opt.replace(noslip_iterations=0)), diffmj.put_data(m, mjd))
    assert (out.efc_force - without.efc_force).abs().max() > 1e-3


def test_rejects_updates_that_raise_the_cost():
    """Torsional friction 1e-5 makes the scaled QCQP singular (det < 1e-10): its answer, zero
    friction, would raise the cost, so MuJoCo keeps each contact's forces as they were."""
    mjm = scene("elliptic", 4, friction="1 1e-5 1e-4")
    mjd = sliding(mjm)
    m = diffmj.put_model(mjm)
    assert_forward(m, diffmj.forward(m, diffmj.put_data(m, mjd)), mjd)


@pytest.mark.parametrize("cone, condim", [("pyramidal", 3), ("elliptic", 6)])
def test_steps_match_mujoco(cone, condim):
    """Steps from a sliding state (from the first impact on, the main solvers already differ by ~1e-8)."""
    mjm = scene(cone, condim)
    mjd = sliding(mjm)
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, mjd)
    for _ in range(20):
        mujoco.mj_step(mjm, mjd)
        d = diffmj.step(m, d)
    assert mjd.ncon >= 10
    for name in ("qpos", "qvel", "qacc_warmstart"):
        assert_close(name, getattr(d, name), getattr(mjd, name), TOL["rollout"])


# MuJoCo lists a box's contacts with the ground (a static box, an explicit <pair>) before the sphere's on it,
# and those before the capsule's on the sphere; diffmj's slots group them by geom types, in the other order
ORDER = """
<mujoco><option noslip_iterations="3" noslip_tolerance="0" tolerance="1e-14" iterations="100" timestep="0.005"/>
  <worldbody><geom name="ground" type="box" size="1 1 .1" pos="0 0 -.1"/>
    <body pos="0 0 .1"><freejoint/><geom name="box" type="box" size=".1 .1 .1"/></body>
    <body pos=".02 0 .29"><freejoint/><geom size=".09"/></body>
    <body pos=".05 0 .45"><freejoint/><geom type="capsule" fromto="-.05 0 0 .05 0 0" size=".05"/></body>
  </worldbody>
  <contact><pair geom1="box" geom2="ground" friction=".8 .8 .005 .0001 .0001"/></contact></mujoco>"""


def test_sweeps_contacts_in_mujocos_order():
    """Gauss-Seidel's answer after a few sweeps depends on the order of coupled contacts: MuJoCo's."""
    mjm = mujoco.MjModel.from_xml_string(ORDER)
    mjd = mujoco.MjData(mjm)
    mjd.qvel[0] = 0.3
    for _ in range(30):
        mujoco.mj_step(mjm, mjd)
    mujoco.mj_forward(mjm, mjd)
    m = diffmj.put_model(mjm)
    out = diffmj.forward(m, diffmj.put_data(m, mjd))
    slots = [match_contacts(m, out, mjd)[k] for k in range(mjd.ncon)]
    assert mjd.ncon == 6 and slots != sorted(slots)
    assert_forward(m, out, mjd)


def noslip_sweeps(mjm: mujoco.MjModel, mjd: mujoco.MjData) -> np.ndarray:
    """MuJoCo's noslip sweeps per island in its last forward: its iterations less the main solver's."""
    islands = max(mjd.nisland, 1)  # none with islands disabled: the count is in solver_niter[0]
    total = mjd.solver_niter[:islands].copy()
    iterations = mjm.opt.noslip_iterations
    mjm.opt.noslip_iterations = 0
    mujoco.mj_forward(mjm, mjd)
    main = mjd.solver_niter[:islands].copy()
    mjm.opt.noslip_iterations = iterations
    mujoco.mj_forward(mjm, mjd)
    return total - main


def test_islands_stop_by_their_own_test():
    """Each island stops after its own first sweep whose improvement, scaled by 1 / the trace of the
    island's M, is below the tolerance (the stack here after 7 sweeps, the capsule and the pendulum
    after 2); all rows as one island, scaled by 1 / (meaninertia nv), stop the stack elsewhere."""
    mjm = scene("pyramidal", 3, iterations=100)
    mjd = sliding(mjm, steps=3)
    sweeps = noslip_sweeps(mjm, mjd)
    assert len(sweeps) == 3 and sweeps.max() - sweeps.min() >= 3, sweeps
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, mjd)
    out = diffmj.forward(m, d)
    assert_forward(m, out, mjd)
    mjm.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_ISLAND  # islands are planned at put_model
    as_one = diffmj.forward(diffmj.put_model(mjm), d)
    assert (as_one.efc_force - out.efc_force).abs().max() > 1e-6


@pytest.mark.parametrize("early_exit", [True, False])
def test_stops_when_converged(early_exit):
    """Sweeps past convergence change nothing: 100 allowed sweeps give what MuJoCo's fewer did, to the bit
    what exactly as many sweeps give, with or without the loop's early exit."""
    mjm = scene("pyramidal", 3, iterations=100, islands=False)
    mjd = sliding(mjm, steps=5)
    (sweeps,) = noslip_sweeps(mjm, mjd)
    assert 1 < sweeps < 100
    m = diffmj.put_model(mjm, early_exit=early_exit)
    d = diffmj.put_data(m, mjd)
    out = diffmj.forward(m, d)
    assert_forward(m, out, mjd)
    exact = diffmj.forward(m.replace(opt=m.opt.replace(noslip_iterations=sweeps)), d)
    assert torch.equal(out.efc_force, exact.efc_force)
    fewer = diffmj.forward(m.replace(opt=m.opt.replace(noslip_iterations=sweeps - 1)), d)
    assert not torch.equal(out.efc_force, fewer.efc_force)


def solved_batch(cone: str):
    """One box on a plane and the frictionloss pendulum (few rows), solved up to noslip: a batch of three states."""
    xml = SCENE.replace('<body pos=".02 0 .3" euler="0 0 20"><freejoint/><geom type="box" size=".1 .1 .1"/></body>', "")
    xml = xml.replace('<body pos=".4 0 .05"><freejoint/><geom type="capsule" fromto="-.1 0 0 .1 0 0" size=".05"/></body>',
                      "")
    mjm = mujoco.MjModel.from_xml_string(xml.format(cone=cone, condim=3, iterations=10, tolerance=1e-6,
                                                    friction="1 0.02 0.01"))
    m = diffmj.put_model(mjm)
    states = []
    for speed in (0.2, 0.5, -0.4):
        mjd = mujoco.MjData(mjm)
        mjd.qvel[0], mjd.qvel[6] = speed, -speed
        for _ in range(10):
            mujoco.mj_step(mjm, mjd)
        states.append(diffmj.put_data(m, mjd))
    batch = torch.stack(states)
    no_noslip = m.replace(opt=m.opt.replace(noslip_iterations=0))
    return m, diffmj.forward(no_noslip, batch)


@pytest.fixture(scope="module", params=["pyramidal", "elliptic"])
def solved(request):
    return solved_batch(request.param)


def assert_batch_close(actual, expected, tol):
    """efc_force and qacc of Data, relative to each one's largest entry (batched and single matrix
    products round differently, and inductor's kernels differently again)."""
    for name in ("efc_force", "qacc"):
        scale = getattr(expected, name).abs().max()
        assert_close(name, getattr(actual, name) / scale, getattr(expected, name) / scale, tol)


def test_vmap_matches_loop(solved):
    m, batch = solved
    mapped = torch.vmap(noslip, in_dims=(None, 0))(m, batch)
    for k in range(batch.batch_size[0]):
        assert_batch_close(mapped[k], noslip(m, batch[k]), TOL["batch"])


@pytest.mark.slow  # 50-70 s of compiling on a loaded 2-core machine
def test_compiled_matches_eager(solved):
    """One while_loop over the sweeps (and one per elliptic contact's QCQP), whatever noslip_iterations."""
    m, batch = solved
    compiled = torch.compile(noslip, fullgraph=True, dynamic=False)
    for k in range(2):
        assert_batch_close(compiled(m, batch[k]), noslip(m, batch[k]), TOL["compiled"])


@pytest.mark.slow  # 6 min on a loaded 2-core machine; with inductor over 15 min
def test_compiled_vmap_matches_loop():
    """vmap's scan over the sweeps, traced by Dynamo and AOTAutograd (aot_eager: inductor's compile is too long)."""
    m, batch = solved_batch("pyramidal")
    step = torch.compile(torch.vmap(noslip, in_dims=(None, 0)), fullgraph=True, dynamic=False, backend="aot_eager")
    mapped = step(m, batch)
    for k in range(batch.batch_size[0]):
        assert_batch_close(mapped[k], noslip(m, batch[k]), TOL["compiled"])


@pytest.mark.parametrize("mode", list(diffmj.BackwardMode))
def test_gradients_are_finite_and_match_differences(mode, solved):
    """d qvel' / d qvel through a step: the unrolled sweeps against central differences."""
    m, batch = solved
    m = m.replace(backward_mode=mode)
    d = batch[1]

    def velocity_after(qvel):
        return diffmj.step(m, d.replace(qvel=qvel)).qvel

    jac = torch.func.jacrev(velocity_after)(d.qvel)
    assert torch.isfinite(jac).all() and jac.abs().max() > 0
    eps = 1e-6
    for i in (0, 2, 6):
        e = torch.zeros_like(d.qvel)
        e[i] = eps
        column = (velocity_after(d.qvel + e) - velocity_after(d.qvel - e)) / (2 * eps)
        assert_close(f"column {i}", jac[:, i], column, TOL["finite_difference"])
