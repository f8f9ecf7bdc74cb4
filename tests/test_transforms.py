"""Transforms from day one: vmap, torch.compile(fullgraph=True), no recompiles, gradcheck."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
import textwrap

import mujoco
import pytest
import torch
from torch._dynamo.testing import CompileCounter

import diffmj
from tests.conftest import MODELS, TOL, assert_close, mj_model, random_state


def _batch(m: diffmj.Model, mjm: mujoco.MjModel, n: int) -> diffmj.Data:
    return torch.stack([diffmj.put_data(m, random_state(mjm, s)) for s in range(n)]).to(m.dtype)


def test_vmap_step_equals_each_element():
    mjm = mj_model("actuators")
    m = diffmj.put_model(mjm)
    batch = _batch(m, mjm, 4)
    out = torch.vmap(diffmj.step, in_dims=(None, 0))(m, batch)
    for i in range(4):
        single = diffmj.step(m, batch[i])
        for name in ("qpos", "qvel", "act", "qacc", "xpos", "qM"):
            assert_close(name, getattr(out[i], name), getattr(single, name), TOL["batch"])


def test_vmap_over_model_parameters():
    mjm = mj_model("pendulum")
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, random_state(mjm, 0))
    masses = m.body_mass * torch.linspace(0.5, 2.0, 3, dtype=m.dtype)[:, None]

    def step_with_mass(mass):
        return diffmj.step(m.replace(body_mass=mass), d).qvel

    out = torch.vmap(step_with_mass)(masses)
    for i in range(3):
        assert_close("qvel", out[i], step_with_mass(masses[i]), TOL["batch"])


@pytest.fixture(scope="module")
def compiled_step():
    """One inductor compile of step per dtype, shared by the tests below."""
    torch._dynamo.reset()
    return {dtype: torch.compile(diffmj.step, fullgraph=True) for dtype in (torch.float64, torch.float32)}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_step_equals_eager(compiled_step, dtype):
    mjm = mj_model("pendulum")
    m = diffmj.put_model(mjm, dtype=dtype)
    d = diffmj.put_data(m, random_state(mjm, 1))
    eager = diffmj.step(m, d)
    compiled = compiled_step[dtype](m, d)
    tol = TOL["compiled"] if dtype == torch.float64 else TOL["float32"]
    for name in ("qpos", "qvel", "qacc", "xpos", "cvel", "qfrc_bias", "actuator_force"):
        assert_close(name, getattr(compiled, name), getattr(eager, name), tol)
    assert set(compiled.keys()) == set(eager.keys())
    # equal fields (qacc, qacc_warmstart, qacc_smooth here) are separate tensors: a step reading
    # two aliased inputs recompiles on its guard against duplicate tensors
    buffers = [v.data_ptr() for v in compiled.values(True, True) if v.numel()]
    assert len(buffers) == len(set(buffers)), "output fields share a buffer"
    with torch._dynamo.config.patch(error_on_recompile=True):  # empty fields (no sites) keep their strides
        compiled_step[dtype](m, compiled)


def test_same_xml_twice_does_not_recompile():
    counter = CompileCounter()
    step = torch.compile(diffmj.step, backend=counter, fullgraph=True)
    for _ in range(2):
        m = diffmj.load(MODELS / "chain.xml")
        d = step(m, diffmj.make_data(m))
        step(m, d)  # a step's output as the next input (no aliased fields, same strides)
    assert counter.frame_count == 1
    m = diffmj.load(MODELS / "actuators.xml")  # a different structure compiles anew
    step(m, diffmj.make_data(m))
    assert counter.frame_count == 2


@pytest.mark.parametrize("name", ["actuators", "chain", "constraints", "contacts", "sensors"])
def test_batched_step_output_is_laid_out_like_make_data(name):
    """Same strides in make_data, a batched step and a user's vmap(step): a compiled step fed its
    own output must pass its stride guards (model-constant fields used to come back as stride-0
    views, batched matmuls as transposed ones)."""
    m = diffmj.put_model(mj_model(name))
    d = diffmj.make_data(m, 3)
    outputs = (diffmj.step(m, d), torch.vmap(diffmj.step, in_dims=(None, 0))(m, d))
    for key, field in d.items(include_nested=True, leaves_only=True):
        for out in outputs:
            assert out.get(key).stride() == field.stride(), key


def test_compiled_vmap_step_has_no_graph_break():
    counter = CompileCounter()
    mjm = mj_model("actuators")
    m = diffmj.put_model(mjm)
    batch = _batch(m, mjm, 3)
    step = torch.compile(torch.vmap(diffmj.step, in_dims=(None, 0)), backend=counter, fullgraph=True)
    out = step(m, batch)
    assert counter.frame_count == 1
    assert_close("qvel", out.qvel, diffmj.step(m, batch).qvel, TOL["batch"])


def test_gradcheck_step():
    mjm = mj_model("actuators")
    m = diffmj.put_model(mjm)
    mjd = random_state(mjm, 2)
    mjd.ctrl[:] *= 0.3  # stay inside control and force ranges: step is smooth there
    d = diffmj.put_data(m, mjd)

    def step(qpos, qvel, ctrl, body_mass, dof_damping, actuator_gainprm):
        mm = m.replace(body_mass=body_mass, dof_damping=dof_damping, actuator_gainprm=actuator_gainprm)
        out = diffmj.step(mm, d.replace(qpos=qpos, qvel=qvel, ctrl=ctrl))
        return out.qpos, out.qvel, out.act

    inputs = (d.qpos, d.qvel, d.ctrl, m.body_mass, m.dof_damping, m.actuator_gainprm)
    inputs = tuple(x.detach().clone().requires_grad_(True) for x in inputs)
    assert torch.autograd.gradcheck(step, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


# A scatter fused into a 2D-tiled loop (beside a transposed read), compiled with inductor on two
# threads: torch.index_add writes out of bounds there and aborts the process (pytorch/pytorch#191837).
_TILED_SCATTER = textwrap.dedent("""
    import torch
    from diffmj import workarounds
    torch.set_num_threads(2)
    def f(q, vt, idx, k, lo):
        force = (torch.maximum(vt.t() * k, lo) + q).contiguous()
        spring = torch.vmap(lambda qi: workarounds.add_at_distinct(torch.zeros_like(qi), idx, -k * qi[idx]))(q)
        summed = torch.vmap(lambda qi: workarounds.sum_at(8, idx % 3, -k * qi[idx]))(q)  # repeated indices
        return spring, summed, force
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(64, 8, generator=g, dtype=torch.float64), torch.randn(8, 64, generator=g, dtype=torch.float64),
            torch.randperm(8, generator=g), torch.rand(8, generator=g, dtype=torch.float64),
            torch.rand(8, generator=g, dtype=torch.float64))
    compiled = torch.compile(f, fullgraph=True)
    for _ in range(3):
        out = compiled(*args)
    for a, b, atol in zip(out, f(*args), (0, 1e-14, 0)):  # the sums may round in another order
        torch.testing.assert_close(a, b, rtol=0, atol=atol)
""")


def test_add_at_in_a_tiled_compiled_kernel():
    """workarounds.add_at_distinct (joint springs, scalar-joint integration) and workarounds.sum_at
    (tendons, contact wrenches, sensors) run where index_add crashes."""
    run = subprocess.run([sys.executable, "-c", _TILED_SCATTER], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]


def test_add_at_equals_index_add():
    g = torch.Generator().manual_seed(0)
    target = torch.randn(10, 3, generator=g, dtype=torch.float64)
    index = torch.tensor([7, 2, 9, 0])
    values = torch.randn(4, 3, generator=g, dtype=torch.float64)
    assert torch.equal(diffmj.workarounds.add_at_distinct(target, index, values), target.index_add(0, index, values))


def test_sum_at_equals_index_add():
    g = torch.Generator().manual_seed(0)
    index = torch.tensor([7, 2, 7, 0, 2, 7])
    values = torch.randn(6, 3, generator=g, dtype=torch.float64)
    expected = torch.zeros(10, 3, dtype=torch.float64).index_add(0, index, values)
    torch.testing.assert_close(diffmj.workarounds.sum_at(10, index, values), expected, rtol=0, atol=1e-15)  # order of sums
    assert diffmj.workarounds.sum_at(4, index[:0], values[:0]).shape == (4, 3)


def test_no_index_select_in_the_package():
    """workarounds' rule, kept in the default suite: its compiled check (capsule-box's reverse-mode Jacobian,
    off by up to 3.6 with index_select) takes minutes (test_collision_primitive.py, slow)."""
    package = pathlib.Path(diffmj.__file__).parent
    calls = [f"{path.relative_to(package)}:{node.lineno}" for path in sorted(package.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and node.attr == "index_select"]
    assert not calls, f"index_select in differentiated code (diffmj.workarounds): {calls}"


def test_literal_compiles_inside_a_loop_body():
    """A constant table made in a while_loop's body (RK4's stages run a whole forward pass there): inductor
    compiles workarounds.literal's, where torch.tensor's [3, 4] table is left unset in the generated code."""
    table = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]]
    assert torch.equal(diffmj.workarounds.literal(table, torch.float64), torch.tensor(table, dtype=torch.float64))

    def f(x):
        def body(carry):
            done, value = carry
            scale = diffmj.workarounds.literal(table, value.dtype, value.device)
            return done.clone(), value @ scale.T @ scale / 1e3
        return diffmj.workarounds.bounded_loop(body, (torch.zeros((), dtype=torch.bool), x), 3)[1]

    x = torch.linspace(0.0, 1.0, 4, dtype=torch.float64)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x), f(x), rtol=1e-14, atol=0)


def test_literal_first_made_under_a_transform_is_a_plain_tensor():
    """A table first made inside jacrev is kept as a plain tensor, not one wrapped for jacrev's level: used
    after that level ends, the wrapped one broke torch.compile ("attempted to apply meta conversion to view
    functorch tensor")."""
    table = diffmj.workarounds.Literal.of((1.0, 2.0))
    x = torch.ones(2, dtype=torch.float64)
    assert torch.func.jacrev(lambda y: table.tensor(torch.float64) * y)(x).tolist() == [[1.0, 0.0], [0.0, 2.0]]
    assert not torch._C._functorch.is_functorch_wrapped_tensor(table.tensor(torch.float64))
    torch._dynamo.reset()
    traced = torch.compile(lambda y: table.tensor(torch.float64) * y, fullgraph=True, backend="aot_eager")
    assert traced(x).tolist() == [1.0, 2.0]


def test_literal_eager_table_is_made_once_and_usable_with_autograd():
    """Eager calls share one tensor per dtype and device; the first made inside inference_mode is still a
    normal tensor (an inference tensor cannot be saved for backward), and traced calls do not see it."""
    table = diffmj.workarounds.Literal.of(((1.0, 2.0), (3.0, 4.0)))
    with torch.inference_mode():
        first = table.tensor(torch.float64)
    assert table.tensor(torch.float64) is first and not first.is_inference()
    assert table.tensor(torch.float32) is not first
    x = torch.ones(2, dtype=torch.float64, requires_grad=True)
    (table.tensor(torch.float64) @ x).sum().backward()
    assert x.grad.tolist() == [4.0, 6.0]
    torch._dynamo.reset()
    traced = torch.compile(lambda y: table.tensor(torch.float64) @ y, fullgraph=True, backend="aot_eager")
    assert traced(x.detach()).tolist() == [3.0, 7.0] and len(table.eager) == 2
