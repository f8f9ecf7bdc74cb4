"""Gradients: implicit adjoint vs unrolled solver vs finite differences; transforms; memory."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from tests.conftest import (
    ACTUATOR_MODELS,
    ARM_ON_BOX,
    BENCHMARK_MODELS,
    TOL,
    assert_close,
    mj_model,
    random_state,
    settled_arm_on_box,
    settled_state,
)
from tests.test_solver import converged

IMPLICIT, UNROLL = diffmj.BackwardMode.IMPLICIT, diffmj.BackwardMode.UNROLL


def _loss_grads(mjm, mjd, mode):
    """Gradients of a loss on qacc and the constraint forces w.r.t. state and parameters."""
    m = diffmj.put_model(mjm, backward_mode=mode)
    d = diffmj.put_data(m, mjd)
    params = {
        "qpos": d.qpos,
        "qvel": d.qvel,
        "body_mass": m.body_mass,
        "geom_friction": m.geom_friction,
        "geom_solref": m.geom_solref,
        "geom_solimp": m.geom_solimp,
    }
    params = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    model = m.replace(**{k: v for k, v in params.items() if k not in ("qpos", "qvel")})
    out = diffmj.forward(model, d.replace(qpos=params["qpos"], qvel=params["qvel"]))
    weights = torch.linspace(-1, 1, m.nv, dtype=m.dtype)
    loss = (out.qacc * weights).sum() + 1e-3 * (out.efc_force**2).sum()
    return dict(zip(params, torch.autograd.grad(loss, list(params.values()))))


def _assert_grads_close(ours, theirs, tol, what):
    for name in ours:
        scale = float(theirs[name].abs().max()) + 1e-12
        err = float((ours[name] - theirs[name]).abs().max()) / scale
        assert err <= tol, f"{name}: {what} relative error {err:.2e}"


@pytest.mark.parametrize("cone", ["pyramidal", "elliptic"])
def test_implicit_equals_unrolled(cone):
    mjm = converged(mj_model("contacts"), cone)
    for steps in (100, 250):
        mjd = settled_state(mjm, steps)
        _assert_grads_close(_loss_grads(mjm, mjd, IMPLICIT), _loss_grads(mjm, mjd, UNROLL), 1e-8, "implicit vs unrolled")


def test_backward_mode_per_call():
    """step(..., backward_mode=...) overrides the model's choice for that call only. With one
    solver iteration the solve is far from converged, so the two modes' gradients differ."""
    mjm = mj_model("contacts")
    mjm.opt.iterations = 1
    mjd = settled_state(mjm, 100)

    def grad_qvel(mode_of_model, mode_of_call):
        m = diffmj.put_model(mjm, backward_mode=mode_of_model)
        d = diffmj.put_data(m, mjd)
        qvel = d.qvel.clone().requires_grad_(True)
        out = diffmj.step(m, d.replace(qvel=qvel), backward_mode=mode_of_call)
        return torch.autograd.grad(out.qvel.sum(), qvel)[0]

    implicit, unroll = grad_qvel(IMPLICIT, None), grad_qvel(UNROLL, None)
    assert (implicit - unroll).abs().max() > 1e-3 * unroll.abs().max()
    assert torch.equal(grad_qvel(IMPLICIT, UNROLL), unroll)
    assert torch.equal(grad_qvel(UNROLL, IMPLICIT), implicit)
    with pytest.raises(ValueError, match="backward_mode must be"):
        grad_qvel(IMPLICIT, "adjoint")

    def rollout_grad(mode_of_model, mode_of_call):  # through the checkpointed segments
        m = diffmj.put_model(mjm, backward_mode=mode_of_model)
        d = diffmj.put_data(m, mjd)
        qvel = d.qvel.clone().requires_grad_(True)
        ctrl = torch.zeros(4, m.nu, dtype=m.dtype)
        traj = diffmj.rollout(m, d.replace(qvel=qvel), ctrl, checkpoint=2, backward_mode=mode_of_call)
        return torch.autograd.grad(traj.qvel.sum(), qvel)[0]

    assert torch.equal(rollout_grad(IMPLICIT, UNROLL), rollout_grad(UNROLL, None))
    assert not torch.equal(rollout_grad(UNROLL, IMPLICIT), rollout_grad(UNROLL, None))


def test_implicit_cg_equals_implicit_newton():
    """CG reaches the same optimum, so its adjoint gives Newton's gradient (unrolling CG's
    iterations converges far more slowly than its iterates do)."""
    newton = converged(mj_model("contacts"))
    cg = converged(mj_model("contacts"), solver="cg")
    mjd = settled_state(newton, 250)
    _assert_grads_close(_loss_grads(cg, mjd, IMPLICIT), _loss_grads(newton, mjd, IMPLICIT), 1e-8, "CG vs Newton")


def test_implicit_matches_finite_differences():
    """d loss / d (qvel, geom friction) at a state with sliding and resting contacts."""
    mjm = converged(mj_model("contacts"), "elliptic")
    mjd = settled_state(mjm, 250)
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, mjd)
    weights = torch.linspace(-1, 1, m.nv, dtype=m.dtype)

    def loss(qvel, friction):
        out = diffmj.forward(m.replace(geom_friction=friction), d.replace(qvel=qvel))
        return (out.qacc * weights).sum()

    qvel, friction = d.qvel.clone().requires_grad_(True), m.geom_friction.clone().requires_grad_(True)
    grads = torch.autograd.grad(loss(qvel, friction), (qvel, friction))
    # directional derivatives along random directions
    gen = torch.Generator().manual_seed(0)
    eps = 1e-6
    for _ in range(3):
        dirs = [torch.randn(x.shape, generator=gen, dtype=x.dtype) for x in (d.qvel, m.geom_friction)]
        fd = (loss(d.qvel + eps * dirs[0], m.geom_friction + eps * dirs[1])
              - loss(d.qvel - eps * dirs[0], m.geom_friction - eps * dirs[1])) / (2 * eps)
        analytic = sum((g * v).sum() for g, v in zip(grads, dirs))
        assert_close("directional derivative", analytic, fd, TOL["finite_difference"])


def _step_loss(m, d):
    def loss(ctrl):
        out = diffmj.step(m, d.replace(ctrl=ctrl))
        return (out.qvel**2).sum(), out.qpos

    return loss


def test_func_transforms_eager(arm_on_box):
    m, d = arm_on_box
    loss = _step_loss(m, d)
    grad, _ = torch.func.grad(loss, has_aux=True)(d.ctrl)
    eps = 1e-6
    fd = (loss(d.ctrl + eps)[0] - loss(d.ctrl - eps)[0]) / (2 * eps)
    assert_close("grad vs finite difference", grad, fd[None], TOL["finite_difference"])

    def next_qvel(qvel):
        return diffmj.step(m, d.replace(qvel=qvel)).qvel

    assert_close("jacrev vs jacfwd", torch.func.jacrev(next_qvel)(d.qvel), torch.func.jacfwd(next_qvel)(d.qvel),
                 TOL["batch"])
    ctrls = torch.linspace(-0.5, 0.5, 3, dtype=m.dtype)[:, None]
    batched, _ = torch.vmap(torch.func.grad(loss, has_aux=True))(ctrls)
    for i in range(3):
        assert_close("vmap(grad)", batched[i], torch.func.grad(loss, has_aux=True)(ctrls[i])[0], TOL["batch"])


def test_compiled_vmap_grad_on_contact_model():
    """torch.compile(vmap(grad(loss through step)), fullgraph=True), inductor, equals eager.

    One solver iteration of at most two line-search steps: under grad the solver's loops are unrolled,
    and ARM_ON_BOX's 6 x 8 took 19 minutes to compile cold on 2 cores (this: 3.4).
    """
    m, d = settled_arm_on_box(iterations=1, ls_iterations=2)
    loss = _step_loss(m, d)
    ctrls = torch.linspace(-0.5, 0.5, 3, dtype=m.dtype)[:, None]
    eager = torch.vmap(torch.func.grad(loss, has_aux=True))(ctrls)
    torch._dynamo.reset()
    compiled = torch.compile(torch.vmap(torch.func.grad(loss, has_aux=True)), fullgraph=True)(ctrls)
    assert_close("grad", compiled[0], eager[0], TOL["compiled"])
    assert_close("next qpos", compiled[1], eager[1], TOL["compiled"])


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("transform", ["grad", "jacrev", "jacfwd"])
def test_compiled_transforms(arm_on_box, transform, backend):
    """torch.compile(fullgraph=True) of grad / jacrev / jacfwd through step equals eager.

    Slow suite only: each takes about two minutes on 2 cores (under grad transforms the solver's
    loops are unrolled by bounded_loop: six iterations of up to eight line-search evaluations
    each). The default suite compiles gradients in test_compiled_vmap_grad_on_contact_model
    (inductor, vmap of grad, one solver iteration).
    """
    m, d = arm_on_box

    def next_qvel(qvel):
        return diffmj.step(m, d.replace(qvel=qvel)).qvel

    fn = {
        "grad": torch.func.grad(lambda v: next_qvel(v).sum()),
        "jacrev": torch.func.jacrev(next_qvel),
        "jacfwd": torch.func.jacfwd(next_qvel),
    }[transform]
    torch._dynamo.reset()
    tol = TOL["compiled"] if backend == "inductor" else TOL["batch"]
    assert_close(transform, torch.compile(fn, fullgraph=True, backend=backend)(d.qvel), fn(d.qvel), tol)


@pytest.mark.slow
def test_compiled_step_backward_with_autograd(arm_on_box):
    """A compiled step whose input requires grad (plain autograd, no torch.func transform) keeps
    the implicit adjoint: its backward equals eager's (a compile without such inputs leaves the
    adjoint's correction out of the graph)."""
    m, d = arm_on_box

    def grad_of_qvel(step):
        qvel = d.qvel.clone().requires_grad_(True)
        (step(m, d.replace(qvel=qvel)).qvel ** 2).sum().backward()
        return qvel.grad

    torch._dynamo.reset()
    compiled = grad_of_qvel(torch.compile(diffmj.step, fullgraph=True, backend="aot_eager"))
    assert_close("d loss / d qvel", compiled, grad_of_qvel(diffmj.step), TOL["batch"])


def test_backward_memory_independent_of_iterations():
    mjm = mujoco.MjModel.from_xml_path(str(BENCHMARK_MODELS / "humanoid.xml"))
    mjd = settled_state(mjm, 150)
    mjm.opt.tolerance = 0  # run every iteration
    saved = {}
    for mode in (IMPLICIT, UNROLL):
        for iterations in (1, 50):
            mjm.opt.iterations = iterations
            m = diffmj.put_model(mjm, backward_mode=mode)
            d = diffmj.put_data(m, mjd)
            ctrl = d.ctrl.clone().requires_grad_(True)
            saved[mode, iterations] = diffmj.grad.saved_tensor_bytes(lambda: diffmj.step(m, d.replace(ctrl=ctrl)))
    ratio = saved[IMPLICIT, 50] / saved[IMPLICIT, 1]
    assert abs(ratio - 1) <= 0.05, f"implicit saved bytes grow {ratio:.3f}x from 1 to 50 iterations"
    assert saved[UNROLL, 50] > 2 * saved[UNROLL, 1]  # the tape of unrolled iterations does grow


def _central_jacobian(f, x0: np.ndarray, eps: float) -> np.ndarray:
    columns = []
    for i in range(x0.size):
        dx = np.zeros_like(x0)
        dx[i] = eps
        columns.append((f(x0 + dx) - f(x0 - dx)) / (2 * eps))
    return np.stack(columns, -1)


def _mujoco_step_jacobian(mjm, mjd, eps=1e-6):
    """Centered finite differences of mujoco.mj_step in mjd_transitionFD's tangent convention."""
    nv, na = mjm.nv, mjm.na
    nominal = mujoco.MjData(mjm)

    def run(dx, ctrl):
        data = mujoco.MjData(mjm)
        data.qpos[:] = mjd.qpos
        mujoco.mj_integratePos(mjm, data.qpos, dx[:nv], 1.0)
        data.qvel[:] = mjd.qvel + dx[nv : 2 * nv]
        data.act[:] = mjd.act + dx[2 * nv :]
        data.ctrl[:] = ctrl
        data.qacc_warmstart[:] = mjd.qacc_warmstart
        data.time = mjd.time
        mujoco.mj_step(mjm, data)
        tangent = np.zeros(nv)
        mujoco.mj_differentiatePos(mjm, tangent, 1.0, nominal.qpos, data.qpos)
        return np.concatenate((tangent, data.qvel, data.act))

    x0 = np.zeros(2 * nv + na)
    nominal.qpos[:] = mjd.qpos
    base = mujoco.MjData(mjm)
    base.qpos[:], base.qvel[:], base.act[:], base.ctrl[:] = mjd.qpos, mjd.qvel, mjd.act, mjd.ctrl
    base.qacc_warmstart[:] = mjd.qacc_warmstart
    mujoco.mj_step(mjm, base)
    nominal.qpos[:] = base.qpos
    A = _central_jacobian(lambda x: run(x, mjd.ctrl), x0, eps)
    B = _central_jacobian(lambda u: run(x0, u), mjd.ctrl.copy(), eps)
    return A, B


@pytest.mark.parametrize("name", ["hopper", "halfcheetah", "humanoid", "ant", "walker2d"])
def test_transition_jacobians_match_mujoco(name):
    mjm = converged(mujoco.MjModel.from_xml_path(str(BENCHMARK_MODELS / f"{name}.xml")))
    mjd = settled_state(mjm, 150)
    m = diffmj.put_model(mjm)
    A, B, C, D = diffmj.grad.transition_jacobians(m, diffmj.put_data(m, mjd))
    nx = 2 * mjm.nv + mjm.na
    assert A.shape == (nx, nx) and B.shape == (nx, mjm.nu)
    assert C.shape == (mjm.nsensordata, nx) and D.shape == (mjm.nsensordata, mjm.nu)
    pairs = []
    if mjm.opt.integrator == mujoco.mjtIntegrator.mjINT_RK4:  # mjd_transitionFD refuses RK4
        Am, Bm = _mujoco_step_jacobian(mjm, mjd)
    else:
        Am, Bm = np.zeros((nx, nx)), np.zeros((nx, mjm.nu))
        Cm, Dm = np.zeros((mjm.nsensordata, nx)), np.zeros((mjm.nsensordata, mjm.nu))
        mujoco.mjd_transitionFD(mjm, mjd, 1e-6, 1, Am, Bm, Cm, Dm)
        # some sensor rows are not differentiable here (a touch sensor at a contact switch) or
        # differences of rounding noise (growing like 1/eps): keep the rows whose finite
        # differences agree at eps / 10
        Cf, Df = np.zeros_like(Cm), np.zeros_like(Dm)
        mujoco.mjd_transitionFD(mjm, mjd, 1e-7, 1, None, None, Cf, Df)

        def agree(a, b):
            return np.all(np.abs(a - b) <= 1e-2 * np.abs(a) + 1e-6, 1)

        smooth = agree(Cm, Cf) & agree(Dm, Df)
        assert smooth.sum() >= mjm.nsensordata // 2, "too few sensor rows to compare"
        pairs = [("C", C[smooth], Cm[smooth]), ("D", D[smooth], Dm[smooth])]
    for label, ours, theirs in [("A", A, Am), ("B", B, Bm)] + pairs:
        err = np.abs(ours.numpy() - theirs).max(initial=0) / max(1.0, np.abs(theirs).max(initial=0))
        assert err <= 1e-5, f"{name} {label}: relative error {err:.2e} vs MuJoCo finite differences"


@pytest.mark.parametrize("integrator", ["euler", "implicit", "implicitfast"])
@pytest.mark.parametrize("name", ["muscles", "dcmotors"])
def test_transition_jacobians_match_mujoco_on_actuator_models(name, integrator):
    """Muscles and DC motors: exact Jacobians against mjd_transitionFD (centred, eps 1e-6), within its
    truncation error (measured 2e-10)."""
    mjm = mj_model(name)
    mjm.opt.integrator = diffmj.IntegratorType[integrator.upper()]
    mjd = random_state(mjm, 2)
    mjd.ctrl[:] *= ACTUATOR_MODELS[name]
    mujoco.mj_forward(mjm, mjd)
    m = diffmj.put_model(mjm)
    A, B, _, _ = diffmj.grad.transition_jacobians(m, diffmj.put_data(m, mjd))
    nx = 2 * mjm.nv + mjm.na
    Am, Bm = np.zeros((nx, nx)), np.zeros((nx, mjm.nu))
    mujoco.mjd_transitionFD(mjm, mjd, 1e-6, 1, Am, Bm, None, None)
    assert np.abs(Bm[2 * mjm.nv :]).max() > 0.1  # the activations respond to the controls
    for label, ours, theirs in (("A", A, Am), ("B", B, Bm)):
        err = np.abs(ours.numpy() - theirs).max() / max(1.0, np.abs(theirs).max())
        assert err <= 1e-6, f"{label}: relative error {err:.2e} vs mjd_transitionFD"


def test_transition_jacobians_match_own_differences():
    mjm = converged(mujoco.MjModel.from_xml_path(str(BENCHMARK_MODELS / "hopper.xml")))
    mjd = settled_state(mjm, 150)
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, mjd)
    A, B, _, _ = diffmj.grad.transition_jacobians(m, d)
    from diffmj.grad.transition import transition

    f = transition(d, diffmj.step(m, d).qpos, diffmj.BackwardMode.IMPLICIT)  # the step, solved in full
    x0 = torch.zeros(2 * m.nv + m.na, dtype=m.dtype)
    eps = 1e-6
    Afd = _central_jacobian(lambda x: f(m, torch.as_tensor(x), d.ctrl)[0].numpy(), x0.numpy(), eps)
    Bfd = _central_jacobian(lambda u: f(m, x0, torch.as_tensor(u))[0].numpy(), d.ctrl.numpy(), eps)
    assert_close("A", A, Afd, 1e-7)
    assert_close("B", B, Bfd, 1e-7)


def test_jacrev_chained_equals_jacrev():
    """jacrev_chained (the inner function's rows mapped output by output, the outer chained to them) gives
    jacrev's Jacobians of the composition: per output, per primal (a tensor and a list of tensors), an output
    that does not depend on a primal, and empty outputs."""
    from diffmj.grad.transition import jacrev_chained

    def inner(x, ws):
        return torch.sin(x) * ws[0].sum() + ws[1][:3], x[:2] ** 3, ws[1][:0]

    def outer(x, ws, y):
        return torch.cat((y[0] * x, y[1] + ws[1][:2])), y[1] * ws[0][0, 1], y[2], ws[1] * 2

    x = torch.linspace(0.1, 0.9, 3, dtype=torch.float64)
    ws = [torch.linspace(-1, 1, 4, dtype=torch.float64).reshape(2, 2), torch.linspace(0.5, 2, 5, dtype=torch.float64)]
    ours = jacrev_chained(inner, outer, x, ws)
    theirs = torch.func.jacrev(lambda x, ws: outer(x, ws, inner(x, ws)), argnums=(0, 1))(x, ws)
    ours, theirs = torch.utils._pytree.tree_leaves(ours), torch.utils._pytree.tree_leaves(theirs)
    assert len(ours) == len(theirs) == 12
    assert all(a.shape == b.shape for a, b in zip(ours, theirs))
    assert all(torch.allclose(a, b, rtol=1e-15, atol=1e-15) for a, b in zip(ours, theirs))


def test_transition_jacobians_batched():
    mjm = mujoco.MjModel.from_xml_path(str(BENCHMARK_MODELS / "hopper.xml"))
    m = diffmj.put_model(mjm)
    datas = [diffmj.put_data(m, settled_state(mjm, n)) for n in (50, 150)]
    batched = diffmj.grad.transition_jacobians(m, torch.stack(datas))
    for i, d in enumerate(datas):
        for ours, single in zip(batched, diffmj.grad.transition_jacobians(m, d)):
            # C and D (sensor rows) are empty: the hopper has no sensors
            assert_close("batched jacobian", ours[i], single, TOL["batch"], empty_ok=True)


@pytest.mark.parametrize("cone", ["pyramidal", "elliptic"])
def test_transition_jacobians_from_the_solution_equal_the_full_solve(cone):
    """transition_jacobians differentiates a step that starts from the solution, with no solver iterations
    (diffmj.grad.solution); its Jacobians equal those of the step solved in full under jacrev."""
    from diffmj.grad.solution import reuses_solution
    from diffmj.grad.transition import transition

    mjm = mujoco.MjModel.from_xml_string(ARM_ON_BOX.format(iterations=100))
    mjm.opt.cone = getattr(mujoco.mjtCone, f"mjCONE_{cone.upper()}")
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, settled_state(mjm, 40))
    assert reuses_solution(m, m.backward_mode) and int(diffmj.forward(m, d).efc_active.sum()) >= 4
    A, B, _, _ = diffmj.grad.transition_jacobians(m, d)
    full = transition(d, diffmj.step(m, d).qpos, diffmj.BackwardMode.IMPLICIT)
    x0 = torch.zeros(2 * m.nv + m.na, dtype=m.dtype)
    A_full, B_full = torch.func.jacrev(lambda x, u: full(m, x, u)[0], argnums=(0, 1))(x0, d.ctrl)
    assert_close("A", A, A_full, TOL["batch"])
    assert_close("B", B, B_full, TOL["batch"])


def test_transition_jacobians_from_a_step_already_taken():
    """stepped= (the Data after the step, e.g. a rollout's next entry): the step is not taken again. From
    diffmj's own step the Jacobians are the same to the bit, from MuJoCo C's mj_step (its warm start) to
    rounding; from a wrong solution they differ (the given one is the one differentiated)."""
    mjm = mujoco.MjModel.from_xml_string(ARM_ON_BOX.format(iterations=100))
    m = diffmj.put_model(mjm)
    d = torch.stack([diffmj.put_data(m, settled_state(mjm, n)) for n in (40, 45)])
    expected = diffmj.grad.transition_jacobians(m, d)
    stepped = diffmj.step(m, d)
    for ours, theirs in zip(diffmj.grad.transition_jacobians(m, d, stepped=stepped), expected):
        assert torch.equal(ours, theirs)
    in_c = []
    for n in (40, 45):
        mjd = settled_state(mjm, n)
        mujoco.mj_step(mjm, mjd)
        in_c.append(diffmj.put_data(m, mjd))
    A, B, _, _ = diffmj.grad.transition_jacobians(m, d, stepped=torch.stack(in_c))
    assert_close("A from MuJoCo C's step", A, expected[0], TOL["batch"])
    assert_close("B from MuJoCo C's step", B, expected[1], TOL["batch"])
    wrong = stepped.replace(qacc_warmstart=stepped.qacc_warmstart + 0.5)
    assert (diffmj.grad.transition_jacobians(m, d, stepped=wrong)[0] - expected[0]).abs().max() > 1e-6
    with pytest.raises(ValueError, match="stepped must be"):
        diffmj.grad.transition_jacobians(m, d, stepped=stepped[0])


def test_from_solution_compiles_for_models_that_differ_in_their_flags():
    """A compiled function that has seen two models differing in opt.disableflags traces the flags as a
    symbolic int; from_solution still clears the warm-start bit (it failed in Dynamo building a DisableBit)."""
    from diffmj.grad.solution import from_solution

    m = diffmj.put_model(mj_model("pendulum"))
    compiled = torch.compile(lambda m, x: (x * 2, from_solution(m).opt.disableflags), backend="eager", fullgraph=True)
    for flags in (0, diffmj.DisableBit.WARMSTART, diffmj.DisableBit.GRAVITY | diffmj.DisableBit.WARMSTART):
        _, out = compiled(m.replace(opt=m.opt.replace(disableflags=int(flags))), torch.ones(2))
        assert out == int(flags) & ~int(diffmj.DisableBit.WARMSTART)


@pytest.mark.slow
def test_compiled_transition_jacobians_do_not_unroll_the_solver(arm_on_box):
    """Compiled, transition_jacobians traces no solver iteration under jacrev: the graph is the same at 3
    and at 30 iterations, and its Jacobians equal eager's."""
    from torch._dynamo.testing import CompileCounterWithBackend

    m, d = arm_on_box
    sizes = []
    for iterations in (3, 30):
        mi = m.replace(opt=m.opt.replace(iterations=iterations))
        torch._dynamo.reset()
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(diffmj.grad.transition_jacobians, backend=counter, fullgraph=True)(mi, d)
        for name, ours, eager in zip("ABCD", compiled, diffmj.grad.transition_jacobians(mi, d)):
            assert_close(name, ours, eager, TOL["batch"], empty_ok=True)
        sizes.append((counter.frame_count, counter.op_count))
    assert sizes[0] == sizes[1], f"graph (frames, ops) at 3 and 30 iterations: {sizes}"


@pytest.mark.slow  # seven minutes of inductor compile on 2 cores
def test_inductor_batched_transition_jacobians_equal_eager():
    """Batched transition Jacobians compiled by inductor, its default options, equal eager's.

    On 2026-11-25 inductor's reordering for peak memory (reorder_for_peak_memory, on by default) miscompiled
    them: on this model its code read a buffer it deleted (UnboundLocalError), on the hopper its Jacobians
    were 4.3 (relative) off eager's; both equal eager's with it on since 2026-12-07. README, "Gradient costs"."""
    mjm = mujoco.MjModel.from_xml_string(ARM_ON_BOX.format(iterations=100))
    m = diffmj.put_model(mjm)
    batch = torch.stack([diffmj.put_data(m, settled_state(mjm, n)) for n in (40, 47)])
    torch._dynamo.reset()
    compiled = torch.compile(diffmj.grad.transition_jacobians, fullgraph=True)(m, batch)
    for name, ours, eager in zip("ABCD", compiled, diffmj.grad.transition_jacobians(m, batch)):
        assert_close(name, ours, eager, TOL["compiled"], empty_ok=True)


PARAMETERS = {  # (field, index) of one element each; all change this model's motion
    "body_mass": (1,),
    "body_inertia": (1, 0),
    "body_ipos": (1, 0),
    "dof_damping": (6,),
    "dof_armature": (6,),
    "dof_frictionloss": (6,),
    "jnt_stiffness": (1,),
    "actuator_gainprm": (0, 0),
    "actuator_biasprm": (0, 1),
    "geom_friction": (0, 0),
    "geom_solref": (0, 0),
    "geom_solimp": (0, 0),
    "opt.gravity": (2,),
    "opt.timestep": (),
}


@pytest.mark.parametrize("horizon", [25, pytest.param(100, marks=pytest.mark.slow)])
def test_parameter_gradients_over_a_rollout(horizon):
    """Gradients of a rollout loss w.r.t. model parameters match central differences."""
    mjm = mj_model("smooth_contact")
    m = diffmj.put_model(mjm)
    d = diffmj.make_data(m).replace(
        qvel=torch.tensor([0.5, 0.2, 0, 0, 0, 0, 1.0], dtype=m.dtype), ctrl=torch.tensor([0.3], dtype=m.dtype)
    )
    ctrl = torch.full((horizon, 1), 0.3, dtype=m.dtype)

    def model_with(values: dict) -> diffmj.Model:
        fields = {k: v for k, v in values.items() if not k.startswith("opt.")}
        opt = {k[4:]: v for k, v in values.items() if k.startswith("opt.")}
        return m.replace(**fields, opt=m.opt.replace(**opt))

    def get(name):
        return getattr(m.opt, name[4:]) if name.startswith("opt.") else getattr(m, name)

    def loss(values: dict):
        traj = diffmj.rollout(model_with(values), d, ctrl)
        return traj.qpos[-1, 0] + 2 * traj.qpos[-1, 1] + 10 * traj.qpos[-1, 2] + traj.qpos[-1, 7] + traj.qvel[-1, 6]

    values = {name: get(name).clone().requires_grad_(True) for name in PARAMETERS}
    grads = dict(zip(values, torch.autograd.grad(loss(values), list(values.values()))))
    for name, index in PARAMETERS.items():
        analytic = float(grads[name][index])
        base = get(name)
        eps = 1e-6 * max(1.0, float(base[index].abs()))
        plus, minus = base.clone(), base.clone()
        plus[index] += eps
        minus[index] -= eps
        fd = float(loss({name: plus}) - loss({name: minus})) / (2 * eps)
        assert analytic != 0.0, f"{name}: zero gradient"
        assert abs(analytic - fd) <= 1e-5 * abs(fd), f"{name}: analytic {analytic:.8e} vs central difference {fd:.8e}"
