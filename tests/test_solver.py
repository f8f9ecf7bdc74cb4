"""Constraint solver against MuJoCo C: converged qacc, forces, one step; batching; transforms.

MuJoCo solves each constraint island with its own stopping test, which leaves
differences at the solver tolerance between islands; the comparisons below
disable islands so both sides solve the same monolithic problem to convergence.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch
from torch._dynamo.testing import CompileCounter

import diffmj
from tests.conftest import (
    ARM_ON_BOX,
    BENCHMARK_MODELS,
    TOL,
    as_numpy,
    assert_close,
    match_efc,
    mj_model,
    random_state,
    settled_state,
)



def converged(mjm: mujoco.MjModel, cone: str = "pyramidal", solver: str = "newton") -> mujoco.MjModel:
    """Solver settings under which both sides reach the optimum.

    Newton converges in a few iterations at tolerance 1e-12. CG's improvement
    test stops it early at a point that depends on its line-search path, so CG
    runs a fixed 200 iterations (tolerance 0) on both sides.
    """
    if solver == "newton":
        mjm.opt.iterations, mjm.opt.ls_iterations, mjm.opt.tolerance = 100, 50, 1e-12
    else:
        mjm.opt.iterations, mjm.opt.ls_iterations, mjm.opt.tolerance = 200, 50, 0.0
    mjm.opt.cone = getattr(mujoco.mjtCone, f"mjCONE_{cone.upper()}")
    mjm.opt.solver = getattr(mujoco.mjtSolver, f"mjSOL_{solver.upper()}")
    mjm.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_ISLAND
    return mjm


def assert_solution(m, out, mjm, mjd, tol=TOL["solver"]):
    scale = max(1.0, np.abs(mjd.qacc).max())
    err = np.abs(as_numpy(out.qacc) - mjd.qacc).max() / scale
    assert err <= tol, f"qacc relative error {err:.2e}"
    ours, theirs = match_efc(m, out, mjd)
    force = as_numpy(out.efc_force)[ours]
    ferr = np.abs(force - mjd.efc_force[theirs]).max(initial=0) / max(1.0, np.abs(mjd.efc_force).max(initial=0))
    assert ferr <= tol, f"efc_force relative error {ferr:.2e}"
    state = as_numpy(out.efc_state)[ours]
    agree = np.mean(state == mjd.efc_state[theirs]) if len(ours) else 1.0
    assert agree >= 0.95, f"only {agree:.0%} of constraint states agree"


def _check_forward(mjm, mjd):
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, mjd)
    mujoco.mj_forward(mjm, mjd)
    assert_solution(m, diffmj.forward(m, d), mjm, mjd)
    return m, d


@pytest.mark.parametrize(
    "cone, solver", [("pyramidal", "newton"), ("elliptic", "newton"), ("pyramidal", "cg")]
)
def test_contact_model(cone, solver):
    mjm = converged(mj_model("contacts"), cone, solver)
    for steps in (100, 250, 400):
        mjd = settled_state(mjm, steps)
        assert mjd.ncon > 0
        _check_forward(mjm, mjd)


@pytest.mark.slow
def test_elliptic_cg_reaches_the_optimum():
    """MuJoCo's CG stalls on elliptic cones before converging, so diffmj's CG is checked
    against MuJoCo's converged Newton solution (the optimum is unique)."""
    reference = converged(mj_model("contacts"), "elliptic", "newton")
    m = diffmj.put_model(converged(mj_model("contacts"), "elliptic", "cg"))
    for steps in (100, 250, 400):
        mjd = settled_state(reference, steps)
        out = diffmj.forward(m, diffmj.put_data(m, mjd))
        mujoco.mj_forward(reference, mjd)
        assert_solution(m, out, reference, mjd)


@pytest.mark.parametrize("solver", ["newton", pytest.param("cg", marks=pytest.mark.slow)])
def test_equality_friction_limit_model(solver):
    mjm = converged(mj_model("constraints"), solver=solver)
    for seed in range(3):
        _check_forward(mjm, random_state(mjm, seed, scale=0.6))


@pytest.mark.parametrize("name", ["humanoid", "ant", "walker2d", "halfcheetah", "hopper"])
@pytest.mark.parametrize("cone", ["pyramidal", "elliptic"])
def test_shared_model_step(name, cone):
    mjm = converged(mujoco.MjModel.from_xml_path(str(BENCHMARK_MODELS / f"{name}.xml")), cone)
    for steps in (80, 200):
        mjd = settled_state(mjm, steps)
        m, d = _check_forward(mjm, mjd)
        mujoco.mj_step(mjm, mjd)
        out = diffmj.step(m, d)
        for field in ("qpos", "qvel"):
            assert_close(field, getattr(out, field), getattr(mjd, field), TOL["solver"])


def test_warmstart_disabled_gives_same_solution():
    mjm = converged(mj_model("contacts"))
    mjm.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_WARMSTART
    _check_forward(mjm, settled_state(mjm, 250))


def test_batch_equals_each_element():
    mjm = converged(mj_model("contacts"))
    m = diffmj.put_model(mjm)
    datas = [diffmj.put_data(m, settled_state(mjm, n)) for n in (100, 250, 400)]
    batch = diffmj.forward(m, torch.stack(datas))
    for i, d in enumerate(datas):
        single = diffmj.forward(m, d)
        assert_close("qacc", batch[i].qacc, single.qacc, 1e-12)
        assert_close("efc_force", batch[i].efc_force, single.efc_force, 1e-12)


@pytest.fixture(scope="module")
def small_contact_model():
    """A box on a plane with a capsule arm: few rows, cheap to compile."""
    mjm = mujoco.MjModel.from_xml_string(ARM_ON_BOX.format(iterations=4))
    return mjm, diffmj.put_model(mjm)


@pytest.mark.slow
def test_compiled_vmap_step_on_contact_model(small_contact_model):
    """torch.compile(vmap(step), fullgraph=True) with inductor equals eager on a contact model."""
    mjm, m = small_contact_model
    batch = torch.stack([diffmj.put_data(m, settled_state(mjm, n, seed=n)) for n in (20, 40, 60)])
    torch._dynamo.reset()
    step = torch.compile(torch.vmap(diffmj.step, in_dims=(None, 0)), fullgraph=True)
    out = step(m, batch)
    eager = diffmj.step(m, batch)
    assert bool(eager.efc_active.any())
    for name in ("qpos", "qvel", "qacc", "efc_force"):
        assert_close(name, getattr(out, name), getattr(eager, name), TOL["compiled"])
    with torch._dynamo.config.patch(error_on_recompile=True):
        out = step(m, out)  # its own output as the next input is laid out alike: no second graph
    assert_close("qvel", out.qvel, diffmj.step(m, eager).qvel, TOL["compiled"])


@pytest.mark.slow
def test_compiled_vmap_step_humanoid():
    """torch.compile(vmap(step), fullgraph=True) runs the humanoid without a graph break."""
    mjm = mujoco.MjModel.from_xml_path(str(BENCHMARK_MODELS / "humanoid.xml"))
    m = diffmj.put_model(mjm)
    batch = torch.stack([diffmj.put_data(m, settled_state(mjm, n, seed=n)) for n in (30, 60)])
    counter = CompileCounter()
    torch._dynamo.reset()
    out = torch.compile(torch.vmap(diffmj.step, in_dims=(None, 0)), fullgraph=True)(m, batch)
    eager = diffmj.step(m, batch)
    for name in ("qpos", "qvel", "qacc", "efc_force"):
        assert_close(name, getattr(out, name), getattr(eager, name), TOL["compiled"])
    torch.compile(torch.vmap(diffmj.step, in_dims=(None, 0)), fullgraph=True, backend=counter)(m, batch)
    assert counter.frame_count == 1


def _compile_recording_ops(fn, ops: set):
    """torch.compile(fn, fullgraph=True) with aot_eager, noting the ops of Dynamo's graph."""

    def backend(gm, example_inputs):
        ops.update(node.target for node in gm.graph.nodes if node.op == "call_function")
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    return torch.compile(fn, fullgraph=True, backend=backend)


@pytest.mark.slow
@pytest.mark.parametrize("iterations", [1, 10])
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "vmap"])
def test_compiled_solver_loop_is_traced_once(iterations, batched):
    """Under compile the solver's loop is one while_loop (unbatched) or scan (vmap), not unrolled,
    and gives eager's result to the bit (tolerance 0: every iteration runs)."""
    mjm = mujoco.MjModel.from_xml_string(ARM_ON_BOX.format(iterations=iterations))
    mjm.opt.tolerance = 0.0
    m = diffmj.put_model(mjm)
    batch = torch.stack([diffmj.put_data(m, settled_state(mjm, n, seed=n)) for n in (20, 40, 60)])
    fn, d = (torch.vmap(diffmj.step, in_dims=(None, 0)), batch) if batched else (diffmj.step, batch[1])
    ops = set()
    torch._dynamo.reset()
    out = _compile_recording_ops(fn, ops)(m, d)
    eager = fn(m, d)
    assert bool(eager.efc_active.any())
    assert (torch.ops.higher_order.scan if batched else torch.ops.higher_order.while_loop) in ops
    for name in ("qpos", "qvel", "qacc", "efc_force"):
        assert torch.equal(getattr(out, name), getattr(eager, name)), name


@pytest.mark.slow
def test_compiled_early_exit_equals_fixed_count():
    """An unbatched compiled step stops when converged (while_loop): the same as eager's early stop,
    and as the full count (early_exit=False) with converged islands frozen (to rounding)."""
    mjm = mujoco.MjModel.from_xml_string(ARM_ON_BOX.format(iterations=100))
    mjm.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC  # the line search's own loop too
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, settled_state(mjm, 40, seed=40))
    ops = set()
    torch._dynamo.reset()
    early = _compile_recording_ops(diffmj.step, ops)(m, d)
    fixed = diffmj.step(diffmj.put_model(mjm, early_exit=False), d)
    assert torch.ops.higher_order.while_loop in ops
    for name in ("qpos", "qvel", "qacc", "efc_force"):
        assert_close(name, getattr(early, name), getattr(fixed, name), 1e-12)
        assert torch.equal(getattr(early, name), getattr(diffmj.step(m, d), name)), name


@pytest.mark.slow
def test_fixed_iteration_count_mode(monkeypatch):
    """put_model(early_exit=False) runs the full count and never reads ``done`` on the host: eager asks no
    all_true, a compiled unbatched step is a scan (not a while_loop); results equal early exit's (converged
    elements are frozen, so the extra iterations change nothing)."""
    mjm = mujoco.MjModel.from_xml_string(ARM_ON_BOX.format(iterations=100))
    mjm.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC  # the line search's own loop too
    early, fixed = diffmj.put_model(mjm), diffmj.put_model(mjm, early_exit=False)
    d = diffmj.put_data(fixed, settled_state(mjm, 40, seed=40))
    expected = diffmj.step(early, d)
    assert bool(expected.efc_active.any())

    def host_read(done):
        raise AssertionError("the fixed-count mode read done on the host")

    monkeypatch.setattr(diffmj.workarounds, "all_true", host_read)
    ops = set()
    torch._dynamo.reset()
    for out in (diffmj.step(fixed, d), _compile_recording_ops(diffmj.step, ops)(fixed, d)):
        for name in ("qpos", "qvel", "qacc", "efc_force"):
            assert torch.equal(getattr(out, name), getattr(expected, name)), name
    assert torch.ops.higher_order.scan in ops and torch.ops.higher_order.while_loop not in ops


@pytest.mark.parametrize("tolerance", [1e-8, 1e-14])
@pytest.mark.parametrize("cone", ["pyramidal", "elliptic"])
def test_pgs_model_is_solved_by_newton_to_the_pgs_optimum(cone, tolerance):
    """A model asking for PGS loads with a warning and is solved by Newton, to MuJoCo's PGS answer.

    The three solvers minimise one convex problem whose optimum is unique (M > 0 in the primal, R > 0
    in the dual). MuJoCo's PGS stops once an iteration lowers its scaled cost by less than ``tolerance``;
    the cost is quadratic about the optimum, so PGS's qacc and forces are off by about sqrt(tolerance),
    relative, and no closer. Measured on these states from zero forces, at tolerances 1e-6 to 1e-14:
    qacc 0.05 to 2.5 sqrt(tolerance), efc_force 0.1 to 13.6 (the forces' directions of smallest
    curvature, A + R's smallest eigenvalues, converge slowest). MuJoCo's PGS labels elliptic rows
    differently (efc_state), which is not compared.
    """
    mjm = converged(mj_model("contacts"), cone)
    mjm.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_WARMSTART  # PGS's own stopping test decides
    states = [settled_state(mjm, steps) for steps in (100, 250, 400)]
    mjm.opt.solver, mjm.opt.iterations, mjm.opt.tolerance = mujoco.mjtSolver.mjSOL_PGS, 10000, tolerance
    with pytest.warns(UserWarning, match="asks for the PGS solver.*solved by Newton"):
        m = diffmj.put_model(mjm)
    assert m.opt.solver == diffmj.SolverType.NEWTON
    for mjd in states:
        out = diffmj.forward(m, diffmj.put_data(m, mjd))
        mujoco.mj_forward(mjm, mjd)
        assert mjd.ncon > 0 and mjd.solver_niter[0] < mjm.opt.iterations, "PGS stopped by its tolerance"
        qacc_err = np.abs(as_numpy(out.qacc) - mjd.qacc).max() / max(1.0, np.abs(mjd.qacc).max())
        ours, theirs = match_efc(m, out, mjd)
        force_err = np.abs(as_numpy(out.efc_force)[ours] - mjd.efc_force[theirs]).max() / max(
            1.0, np.abs(mjd.efc_force).max()
        )
        assert qacc_err <= 5 * np.sqrt(tolerance), f"qacc relative error {qacc_err:.2e}"
        assert force_err <= 30 * np.sqrt(tolerance), f"efc_force relative error {force_err:.2e}"
