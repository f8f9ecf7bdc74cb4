"""The explicit batch: diffmj.step on batched Data solves the whole batch at once, its solver loops
running over the batch (and stopping when every element is done), the pieces between them vmapped.

It must equal stepping each element alone and torch.vmap(diffmj.step) (which runs the per-element code
under vmap: under compile, the loops' full count), eager and compiled, values and gradients.
"""

from __future__ import annotations

import mujoco
from unittest import mock

import pytest
import torch

import diffmj
from diffmj import workarounds
from tests.conftest import ARM_ON_BOX, assert_close, settled_state

FIELDS = ("qpos", "qvel", "act", "qacc", "efc_force", "qfrc_constraint", "sensordata")


def arm_batch(integrator: str = "Euler", cone: str = "pyramidal", iterations: int = 100):
    """ARM_ON_BOX (MuJoCo's 100 iterations) and a batch of three settled states, contact and limit rows
    active in each, each converging in its own number of iterations."""
    mjm = mujoco.MjModel.from_xml_string(ARM_ON_BOX.format(iterations=iterations))
    mjm.opt.integrator = getattr(mujoco.mjtIntegrator, f"mjINT_{integrator.upper()}")
    mjm.opt.cone = getattr(mujoco.mjtCone, f"mjCONE_{cone.upper()}")
    m = diffmj.put_model(mjm)
    batch = torch.stack([diffmj.put_data(m, settled_state(mjm, n, seed=n)) for n in (20, 40, 60)])
    assert bool(diffmj.forward(m, batch).efc_active.any(-1).all())
    return m, batch


def assert_fields_close(out, expected, tol=1e-12):
    for name in FIELDS:
        assert_close(name, getattr(out, name), getattr(expected, name), tol, empty_ok=True)


@pytest.mark.parametrize("integrator, cone", [("Euler", "pyramidal"), ("Euler", "elliptic"), ("RK4", "elliptic"),
                                              ("implicitfast", "pyramidal")])
def test_explicit_batch_equals_each_element_and_vmap(integrator, cone):
    m, batch = arm_batch(integrator, cone)
    out = diffmj.step(m, batch)
    assert_fields_close(out, torch.vmap(diffmj.step, in_dims=(None, 0))(m, batch))
    assert_fields_close(out, torch.stack([diffmj.step(m, batch[i]) for i in range(3)]))
    assert_fields_close(diffmj.forward(m, batch[None]), diffmj.forward(m, batch)[None])  # two batch dims


def _compile_recording_ops(fn, ops: set):
    """torch.compile(fn, fullgraph=True) with aot_eager, noting the ops of Dynamo's graph."""

    def backend(gm, example_inputs):
        ops.update(node.target for node in gm.graph.nodes if node.op == "call_function")
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    return torch.compile(fn, fullgraph=True, backend=backend)


@pytest.mark.slow
def test_compiled_explicit_batch_stops_when_all_converge():
    """Compiled, the batch's solver loop and its line searches are while_loops (no scan: no full count),
    with eager's result, and the step fed its own output does not recompile. implicitfast: the free
    body's bias derivative compiles under the batch (test_compiled_batch_of_free_body_with_implicitfast...)."""
    m, batch = arm_batch("implicitfast", cone="elliptic")
    ops = set()
    torch._dynamo.reset()
    step = _compile_recording_ops(diffmj.step, ops)
    out = step(m, batch)
    assert_fields_close(out, diffmj.step(m, batch))
    assert torch.ops.higher_order.while_loop in ops and torch.ops.higher_order.scan not in ops
    with torch._dynamo.config.patch(error_on_recompile=True):
        step(m, out)


@pytest.mark.slow
@pytest.mark.parametrize("batching", ["unbatched", "explicit", "vmap"])
def test_compiled_rk4_traces_its_later_stages_once(batching):
    """RK4's three later stages (each a forward pass with its solver loop) are one loop body, traced once:
    the graph holds two loops (the first forward's solver and the stages'; unrolled stages made four),
    and the compiled step equals eager."""
    m, batch = arm_batch("RK4", cone="elliptic")
    fn = {"unbatched": diffmj.step, "explicit": diffmj.step, "vmap": torch.vmap(diffmj.step, in_dims=(None, 0))}
    d = batch[1] if batching == "unbatched" else batch
    loops = []

    def backend(gm, example_inputs):  # called again if Dynamo restarts: the last graph counts
        loops[:] = [node.target for node in gm.graph.nodes
                    if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator)]
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    torch._dynamo.reset()
    with torch.no_grad():  # under vmap, grad mode alone makes the stages unroll (vmap hides requires_grad)
        out = torch.compile(fn[batching], fullgraph=True, backend=backend)(m, d)
    assert_fields_close(out, diffmj.step(m, d))
    assert len(loops) == 2, loops  # while_loops, or under vmap scans


def test_compiled_batch_loop_runs_until_every_element_is_done():
    """bounded_loop over an explicit batch (a vmapped body inside a while_loop) runs as many passes as
    its slowest element needs and no more: a pass counter that every pass increments shows it."""

    def halve(x, carry):  # one element: halve until below 1
        done, value, passes = carry
        new = torch.where(done, value, value * 0.5)
        return done | (new < 1), new, passes + 1

    def run(x):
        carry = (x < 1, x.clone(), torch.zeros_like(x, dtype=torch.int64))
        step = workarounds.elementwise(halve, True, (0, 0))
        return workarounds.bounded_loop(lambda c: step(x, c), carry, 100)

    x = torch.tensor([3.0, 1.5, 0.5], dtype=torch.float64)  # 2, 1 and 0 halvings
    for fn in (run, torch.compile(run, fullgraph=True, backend="aot_eager")):
        done, value, passes = fn(x)
        assert bool(done.all())
        assert torch.equal(value, torch.tensor([0.75, 0.75, 0.5], dtype=torch.float64))
        assert passes.tolist() == [2, 2, 2]


def test_row_loop_advances_only_unfinished_rows_and_equals_the_full_loop():
    """bounded_row_loop, eager: each pass advances only the rows not yet done (in chunks of ROW_CHUNK), and
    its carry equals bounded_loop's over every row, eager, vmapped and compiled."""
    x = torch.tensor([3.0, 1.5, 0.5, 40.0], dtype=torch.float64)  # 2, 1, 0 and 6 halvings
    seen = []

    def halve(carry, rows):
        done, value = carry
        new = torch.where(done, value, value * 0.5)
        return done | (new < 1), new

    def recorded(carry, rows):
        seen.append(None if rows is None else rows.tolist())
        return halve(carry, rows)

    def run(x, body=halve):
        return workarounds.bounded_row_loop(body, (x < 1, x.clone()), 100)[1]

    expected = workarounds.bounded_loop(lambda c: halve(c, None), (x < 1, x.clone()), 100)[1]
    assert torch.equal(expected, torch.tensor([0.75, 0.75, 0.5, 0.625], dtype=torch.float64))
    assert torch.equal(run(x, recorded), expected)
    assert seen == [[0, 1, 3], [0, 3], [3], [3], [3], [3]]
    assert torch.equal(torch.vmap(run)(x[None].expand(2, 4)), expected.expand(2, 4))
    assert torch.equal(torch.compile(run, fullgraph=True, backend="aot_eager")(x), expected)
    with mock.patch.object(workarounds, "ROW_CHUNK", 2):
        seen.clear()
        assert torch.equal(run(x, recorded), expected)
        assert seen[:2] == [[0, 1], [3]]


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "compiled"])
def test_gradient_through_explicit_batch_equals_each_element(compiled):
    """The implicit adjoint of an explicit batch (its correction vmapped) gives each element's gradient
    (eager, one element: the autograd.Function's), eager and compiled."""
    m, batch = arm_batch(cone="elliptic")
    ctrl = torch.linspace(-0.5, 0.5, 3, dtype=torch.float64)[:, None]

    def loss(step, ctrl, d):
        out = step(m, d.replace(ctrl=ctrl))
        return (out.qvel ** 2).sum() + out.qpos[..., 2].sum()

    def element_grad(i):
        row = ctrl[i].clone().requires_grad_()
        return torch.autograd.grad(loss(diffmj.step, row, batch[i]), row)[0]

    expected = torch.stack([element_grad(i) for i in range(3)])
    torch._dynamo.reset()
    step = torch.compile(diffmj.step, fullgraph=True, backend="aot_eager") if compiled else diffmj.step
    ctrl_in = ctrl.clone().requires_grad_()
    assert_close("grad", torch.autograd.grad(loss(step, ctrl_in, batch), ctrl_in)[0], expected, 1e-10)


def test_jvp_through_explicit_batch_under_no_grad_equals_each_element():
    """Forward-mode tangents reach the constrained qacc under no_grad too (sysid's stepwise Jacobian runs
    there): the explicit batch's implicit correction must not be skipped as it is for a plain no_grad call."""
    m, batch = arm_batch(cone="elliptic")
    ctrl = torch.linspace(-0.5, 0.5, 3, dtype=torch.float64)[:, None]

    def qvel(ctrl, d):
        return diffmj.step(m, d.replace(ctrl=ctrl)).qvel

    with torch.no_grad():
        _, tangent = torch.func.jvp(lambda c: qvel(c, batch), (ctrl,), (torch.ones_like(ctrl),))
        expected = torch.stack([torch.func.jvp(lambda c: qvel(c, batch[i]), (ctrl[i],), (torch.ones_like(ctrl[i]),))[1]
                                for i in range(3)])
    assert expected.abs().max() > 1e-3
    assert_close("tangent", tangent, expected, 1e-10)


@pytest.mark.slow  # minutes of compile (test_compiled_explicit_batch_stops_when_all_converge compiles it once)
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "explicit-batch"])
def test_compiled_step_without_warm_start_equals_eager(batched):
    """Without warm start the solver's first iterate is qacc_smooth itself, an input the loop's body also
    reads: the compiled loop must not see its carry alias its other inputs (while_loop refuses that)."""
    m, batch = arm_batch()
    m = m.replace(opt=m.opt.replace(disableflags=m.opt.disableflags | mujoco.mjtDisableBit.mjDSBL_WARMSTART))
    d = batch if batched else batch[1]
    torch._dynamo.reset()
    out = torch.compile(diffmj.step, fullgraph=True, backend="aot_eager")(m, d)
    assert_fields_close(out, diffmj.step(m, d), 1e-10)


FREE_BOX_IMPLICITFAST = """<mujoco><option integrator="implicitfast"/><worldbody><geom type="plane" size="5 5 .1"/>
<body pos="0 0 .2"><freejoint/><geom type="box" size=".1 .1 .1"/></body></worldbody></mujoco>"""


@pytest.mark.slow  # test_compiled_explicit_batch_stops_when_all_converge compiles an implicitfast explicit batch
@pytest.mark.parametrize("batching", ["explicit", "vmap"])
def test_compiled_batch_of_free_body_with_implicitfast_equals_eager(batching):
    """implicitfast solves a free body's 6x6 block with the bias derivative (bias_vel), which compiles under a
    batch: torch 2.13's Dynamo failed on forward-mode AD there (an internal assert in _fw_primal)."""
    mjm = mujoco.MjModel.from_xml_string(FREE_BOX_IMPLICITFAST)
    m = diffmj.put_model(mjm)
    mjd = mujoco.MjData(mjm)
    mjd.qvel[:] = [1.0, 0.5, 0.0, 0.3, -0.2, 0.1]
    d = diffmj.put_data(m, mjd)
    batch = torch.stack([d, d.replace(qvel=-d.qvel)])
    fn = diffmj.step if batching == "explicit" else torch.vmap(diffmj.step, in_dims=(None, 0))
    torch._dynamo.reset()
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(m, batch)
    assert_fields_close(out, torch.stack([diffmj.step(m, batch[i]) for i in range(2)]), 1e-12)
