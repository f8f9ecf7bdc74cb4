"""rollout() and rollout_policy(): many steps, open loop or under a policy, with checkpointed gradients,
each step eager or one compiled graph."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from diffmj.forward import check_data, resolve_backward_mode, run_step
from diffmj.grad.checkpoint import HELD_INPUTS, Advance, Observe, checkpointed_rollout, run_steps
from diffmj.io import make_data
from diffmj.state import differentiate_pos, get_state
from diffmj.types import STATE_FIELDS, BackwardMode, Data, Model, State
from diffmj.workarounds import ScalarInputs, canonical_layout, elementwise, library_guard_filter, transform_active

ObserveArg = Sequence[str] | Callable[[Model, Data], Any] | None
CompileArg = bool | dict[str, Any]


class Control(NamedTuple):
    """How step t of a rollout gets its ctrl [nu]: ``law(at(params, t), m, d)``, d the Data before the step.

    params is what the rollout differentiates the controls by (a tuple of tensors); ``at`` runs outside a
    compiled step (t is a Python int, which a compiled graph would specialise on), ``law`` inside it.
    """

    at: Callable[[tuple[Tensor, ...], int], tuple[Tensor, ...]]
    law: Callable[[tuple[Tensor, ...], Model, Data], Tensor]


# params = (ctrl [..., T, nu],): step t applies row t
OPEN_LOOP = Control(at=lambda params, t: (params[0][..., t, :],), law=lambda row, m, d: row[0])


def _feedback_law(row: tuple[Tensor, ...], m: Model, d: Data) -> Tensor:
    """clamp(ctrl_t + K_t dx_t, lower, upper), dx_t the tangent deviation of d's state from the reference."""
    ctrl, gains, qpos, qvel, act, lower, upper = row
    dx = torch.cat((differentiate_pos(m, qpos, d.qpos), d.qvel - qvel, d.act - act))
    return torch.clamp(ctrl + gains @ dx, lower, upper)


# params = (ctrl [..., T, nu], gains [..., T, nu, ns], reference qpos, qvel, act [..., T, *], lower, upper [..., nu])
FEEDBACK = Control(at=lambda params, t: (params[0][..., t, :], params[1][..., t, :, :],
                                         *(x[..., t, :] for x in params[2:5]), *params[5:]),
                   law=_feedback_law)


def rollout(
    m: Model,
    d: Data,
    ctrl: Tensor,
    *,
    checkpoint: int | str | None = "auto",
    backward_mode: BackwardMode | None = None,
    observe: ObserveArg = None,
    compile: CompileArg = False,
) -> Any:
    """Step d through the controls ctrl [..., T, nu]; the trajectory as a Data of batch [..., T].

    ``traj[t]`` (``traj.qpos[..., t, :]``, ...) is the Data after step t + 1.
    Leading batch dimensions of d and ctrl broadcast (a batch of initial states,
    of control sequences, or both) and are stepped as one batch (``diffmj.step``'s explicit batch).

    observe: what to keep of each step, instead of every Data field: Data field names (e.g.
    ``("qpos", "qvel", "act", "sensordata")``, as ``mujoco.rollout`` keeps state and sensordata) give a
    dict of those fields [..., T, ...]; a function ``observe(m, d)`` of the Data after each step returning
    a pytree of tensors (a dict, a tuple, one tensor; e.g. ``get_state`` or a running cost) gives that
    pytree with leaves [..., T, ...]. Gradients and checkpointing are unchanged; memory for the outputs
    is what observe returns.

    checkpoint: steps per recomputed segment in the backward pass; "auto" uses
    about sqrt(T) (O(sqrt(T)) memory, one extra forward pass), None keeps the
    full autograd tape (O(T) memory). The gradient is the same either way.
    backward_mode: how gradients pass through each step's constraint solver; None uses
    the model's.
    compile: run each step as one compiled graph (``torch.compile``; True, or a dict of its keyword arguments,
    e.g. ``{"backend": "aot_eager"}``, over the defaults ``fullgraph=True, dynamic=False`` and, for inductor
    without a ``mode``, ``options={"max_fusion_size": 1}``: no kernel fusion, as torch 2.13 fuses some backward
    kernels wrongly; a batch's gradients w.r.t. body_mass and the initial qvel were up to 62 % off, and
    inductor's C++ wrapper (``"cpp_wrapper": True``) gets long rollouts' gradients wrong; benchmarks/README.md,
    "Inductor miscompiles gradients of the batched rollout"), and without a ``mode``,
    ``options={"guard_filter_fn": library_guard_filter(...)}``: no guards on diffmj's, torch's and tensordict's
    globals, checked at every call otherwise (README.md, "Guards")); the loop over time stays in Python, so compile
    time does not grow with T. A batch is stepped by one compiled explicit-batch step per time step (its solver
    stops once every element has converged). Checkpointing, results and gradients are eager's (to rounding, with
    inductor). All steps run two graphs, one without grad (no input requires grad, or the forward pass of
    checkpointed segments) and one with; later rollouts reuse them from Dynamo's cache, whose entries (one per
    model, batch size and set of model parameters, inputs or params requiring grad) are at most
    ``torch._dynamo.config.recompile_limit`` per compiled function. Not inside ``torch.func`` transforms or
    ``torch.compile`` (PyTorch cannot call a compiled function there: pytorch/pytorch#128711): take gradients
    with ``torch.autograd`` (``.backward()``, ``torch.autograd.grad``).
    """
    check_data(m, d)
    if ctrl.shape[-1] != m.nu:
        raise ValueError(f"ctrl has {ctrl.shape[-1]} controls per step, the model needs {m.nu}")
    if ctrl.dim() < 2:
        raise ValueError(f"ctrl must be [..., T, nu], got shape {tuple(ctrl.shape)}")
    if ctrl.dtype != m.dtype:
        raise ValueError(f"ctrl is {ctrl.dtype} but the model is {m.dtype}")
    batch = torch.broadcast_shapes(d.batch_size, ctrl.shape[:-2])
    ctrl = ctrl.expand(*batch, *ctrl.shape[-2:])
    return _rollout(m, d, OPEN_LOOP, (ctrl,), len(batch), ctrl.shape[-2], checkpoint, backward_mode, observe,
                    compile)


def rollout_policy(
    m: Model,
    d: Data,
    policy: Callable[[Any, Tensor], Tensor],
    params: Any,
    steps: int,
    *,
    checkpoint: int | str | None = "auto",
    backward_mode: BackwardMode | None = None,
    observe: ObserveArg = None,
    compile: CompileArg = False,
) -> Any:
    """Step d ``steps`` times in closed loop: ctrl_t = policy(params, x_t) [nu], x_t = ``get_state(m, d_t,
    State.PHYSICS)`` [nq + nv + na] the state before step t. Returns what ``rollout`` returns.

    params: a pytree of tensors (e.g. ``dict(net.named_parameters())`` with ``policy = lambda p, x:
    torch.func.functional_call(net, p, (x,))``), shared by every batch element; gradients flow to it, to
    the model's parameters and to d's state, through checkpointed segments as in ``rollout`` (so
    ``loss.backward()`` fills ``net``'s ``.grad``, and ``torch.func.grad`` over params works). A batch of
    initial states (leading dimensions of d) is stepped as one batch: policy sees one state [ns] (vmapped).
    checkpoint, backward_mode, observe, compile: as for ``rollout``; compiled, the policy is part of each
    step's graph.
    """
    check_data(m, d)
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    leaves, spec = pytree.tree_flatten(params)
    if not all(isinstance(leaf, Tensor) for leaf in leaves):
        raise ValueError("params must be a pytree of tensors (e.g. dict(net.named_parameters()))")

    def law(flat: tuple[Tensor, ...], m: Model, d: Data) -> Tensor:
        ctrl = policy(pytree.tree_unflatten(list(flat), spec), get_state(m, d, State.PHYSICS))
        if ctrl.shape != (m.nu,) or ctrl.dtype != m.dtype:
            raise ValueError(f"policy must return ctrl [nu={m.nu}] of {m.dtype}, got {tuple(ctrl.shape)} "
                             f"of {ctrl.dtype}")
        return ctrl

    control = Control(at=lambda params, t: params, law=law)
    return _rollout(m, d, control, tuple(leaves), 0, steps, checkpoint, backward_mode, observe, compile)


def rollout_feedback(
    m: Model,
    d: Data,
    ctrl: Tensor,
    gains: Tensor,
    reference: Data,
    *,
    ctrl_range: tuple[Tensor, Tensor] | None = None,
    checkpoint: int | str | None = "auto",
    backward_mode: BackwardMode | None = None,
    observe: ObserveArg = None,
    compile: CompileArg = False,
) -> Any:
    """Step d under the time-varying linear feedback law u_t = ctrl_t + K_t dx_t (iLQR's forward pass,
    TVLQR tracking); returns what ``rollout`` returns, each step's Data holding the u_t it applied in ctrl.

    ctrl [..., T, nu]: the feedforward controls; gains [..., T, nu, 2 nv + na]: K_t; reference: a Data
    of batch [..., T] (its qpos, qvel, act are read), the state planned before each step. dx_t is the
    tangent deviation (``differentiate_pos(m, reference.qpos, qpos)``, qvel - reference.qvel, act -
    reference.act) of the state before step t, the convention of ``mjd_transitionFD``. Leading batch
    dimensions of d, ctrl, gains and reference broadcast (e.g. a batch of step sizes: ctrl [A, T, nu],
    gains and reference shared) and are stepped as one batch. ctrl_range: (lower, upper), each [nu]
    (-inf / inf where unbounded): u_t is clamped to them; None: no clamp.
    checkpoint, backward_mode, observe, compile: as for ``rollout`` (compiled, the law is part of each
    step's graph).
    """
    check_data(m, d)
    ns = 2 * m.nv + m.na
    if ctrl.dim() < 2 or ctrl.shape[-1] != m.nu:
        raise ValueError(f"ctrl must be [..., T, nu={m.nu}], got shape {tuple(ctrl.shape)}")
    horizon = ctrl.shape[-2]
    if gains.dim() < 3 or gains.shape[-3:] != (horizon, m.nu, ns):
        raise ValueError(f"gains must be [..., T={horizon}, nu={m.nu}, 2nv+na={ns}], got {tuple(gains.shape)}")
    if not isinstance(reference, Data) or not reference.batch_dims or reference.batch_size[-1] != horizon:
        raise ValueError(f"reference must be a Data of batch [..., T={horizon}]")
    if ctrl_range is None:
        inf = torch.full((m.nu,), torch.inf, dtype=m.dtype, device=m.device)
        ctrl_range = (-inf, inf)
    if len(ctrl_range) != 2 or any(bound.shape != (m.nu,) for bound in ctrl_range):
        raise ValueError(f"ctrl_range must be (lower, upper), each [nu={m.nu}]")
    tensors = (ctrl, gains, reference.qpos, *ctrl_range)
    if any(x.dtype != m.dtype for x in tensors):
        raise ValueError(f"ctrl, gains, reference and ctrl_range must be {m.dtype}, "
                         f"got {[x.dtype for x in tensors]}")
    batch = torch.broadcast_shapes(d.batch_size, ctrl.shape[:-2], gains.shape[:-3], reference.batch_size[:-1])
    # every param with the batch's leading dimensions (expanded views: no copies)
    per_step = [(x, 1) for x in (ctrl, reference.qpos, reference.qvel, reference.act)] + [(gains, 2)]
    ctrl, qpos, qvel, act, gains = (x.expand(*batch, horizon, *x.shape[x.dim() - trailing:])
                                    for x, trailing in per_step)
    lower, upper = (bound.expand(*batch, m.nu) for bound in ctrl_range)
    return _rollout(m, d, FEEDBACK, (ctrl, gains, qpos, qvel, act, lower, upper), len(batch), horizon, checkpoint,
                    backward_mode, observe, compile)


def _rollout(m: Model, d: Data, control: Control, params: tuple[Tensor, ...], batched_params: int, horizon: int,
             checkpoint: int | str | None, backward_mode: BackwardMode | None, observe: ObserveArg,
             compile: CompileArg) -> Any:
    """What rollout and rollout_policy share. The first ``batched_params`` dimensions of every param are
    batch dimensions, as d's (0: params shared by the batch)."""
    mode = resolve_backward_mode(m, backward_mode)
    observe = _observer(observe)
    options = compile_options(compile)
    if options is not None and transform_active([*pytree.tree_leaves(d), *params]):
        raise ValueError("compile= cannot run inside torch.func transforms or torch.compile "
                         "(pytorch/pytorch#128711): use compile=False there, or torch.autograd for gradients")
    if checkpoint == "auto":
        segment = max(1, round(math.sqrt(horizon)))
    elif checkpoint is None:
        segment = None
    else:
        segment = int(checkpoint)
        if segment < 1:
            raise ValueError(f"checkpoint must be a positive number of steps, 'auto' or None, got {checkpoint}")
    batch = d.batch_size if not batched_params else params[0].shape[:batched_params]
    size = batch.numel()  # not -1 in the reshapes: nu may be 0
    if batch:  # one batch dimension, the loop over time outside each batched step
        d = d.expand(batch).reshape(size)
        params = tuple(p.reshape(size, *p.shape[batched_params:]) for p in params) if batched_params else params
    advance = _advance(m, d, control, mode, observe, bool(batched_params), options)
    if segment is None or segment >= horizon or not torch.is_grad_enabled() or torch.compiler.is_compiling():
        traj = run_steps(m, d, advance, params, range(horizon))[0]
    else:
        traj = checkpointed_rollout(m, d, advance, params, horizon, segment, observe)
    if not batch:
        return traj
    if observe is None:  # [T, size] -> [*batch, T]
        return traj.transpose(0, 1).reshape(*batch, horizon)
    return pytree.tree_map(lambda leaf: leaf.movedim(0, 1).reshape(*batch, horizon, *leaf.shape[2:]), traj)


def _advance(m: Model, d: Data, control: Control, mode: BackwardMode, observe: Observe, batched_params: bool,
             options: dict[str, Any] | None) -> Advance:
    """How each step of a rollout of m from d (unbatched or of batch [B]) runs, the one place that decides:
    eager; as an explicit batch (diffmj.step's: the control law, the stages and observe vmapped over the batch
    and over the first dimension of params where batched_params, the solver's loops over the whole batch) when
    d is batched; compiled when options (torch.compile's keyword arguments) are given."""

    def transition(m: Model, d: Data, step_params: tuple[Tensor, ...], batch: bool = False) -> tuple[Data, Any]:
        law = elementwise(control.law, batch, (0 if batched_params else None, None, 0))
        out = run_step(m, d.replace(ctrl=law(step_params, m, d)), mode, batch)
        if options is not None:  # the next step's input laid out like this one's: no recompile
            out = elementwise(canonical_layout, batch)(out, d)
        return out, (out if observe is None else elementwise(observe, batch, (None, 0))(m, out))

    def batched(m: Model, d: Data, step_params: tuple[Tensor, ...]) -> tuple[Data, Any]:
        return transition(m, d, step_params, batch=True)

    run = batched if d.batch_dims else transition
    if options is None:
        return lambda m, d, params, t: run(m, d, control.at(params, t))
    template = make_data(m, d.batch_size)
    scalars = ScalarInputs.of(m, template)

    def restored(m: Model, d: Data, step_params: tuple[Tensor, ...]) -> tuple[Data, Any]:
        return run(*scalars.restore(m, d), step_params)

    compiled = compile_function(restored, options)

    def advance(m: Model, d: Data, params: tuple[Tensor, ...], t: int) -> tuple[Data, Any]:
        # A compiled graph guards on its inputs' strides and requires_grad flags. It is given only what a
        # step reads, contiguous, on the template's other (constant) fields; and either no derivative is asked
        # for (no_grad, nothing requires grad) or every float state field requires grad, as from the second
        # step on. So all steps of all rollouts of this model run one of two graphs (per pattern of the
        # model's, held inputs' and params' requires_grad, which a rollout does not change).
        step_params = tuple(x.contiguous() for x in control.at(params, t))  # a batch's ctrl[:, t]: strided by T
        read = {name: getattr(d, name).contiguous() for name in (*STATE_FIELDS, *HELD_INPUTS)}
        # the model's leaves (hundreds) are looked at last: walking them took a third of a compiled step's time
        derivative = torch.is_grad_enabled() and (any(x.requires_grad for x in (*read.values(), *step_params))
                                                  or any(x.requires_grad for x in pytree.tree_leaves(m)))
        if not derivative:
            with torch.no_grad():
                read = {name: x.detach() for name, x in read.items()}
                return compiled(*scalars.lift(m, template.replace(**read)), tuple(x.detach() for x in step_params))
        for name in STATE_FIELDS:
            if read[name].is_floating_point() and not read[name].requires_grad:
                read[name] = read[name].detach().requires_grad_()  # its gradient is not needed: dropped
        return compiled(*scalars.lift(m, template.replace(**read)), step_params)

    return advance


def compile_options(compile: CompileArg) -> dict[str, Any] | None:
    """rollout's ``compile`` as torch.compile's keyword arguments; None for eager."""
    if compile is False:
        return None
    if compile is True:
        compile = {}
    if not isinstance(compile, dict):
        raise ValueError(f"compile must be False, True or a dict of torch.compile's keyword arguments, "
                         f"got {compile!r}")
    options = {"fullgraph": True, "dynamic": False, **compile}
    if options.get("backend", "inductor") == "inductor" and "mode" not in options:
        # No kernel fusion, and the Python wrapper rather than the (faster) C++ one: with either, torch 2.13's
        # inductor gets some gradients wrong (the docstring; benchmarks/README.md, "Inductor miscompiles ...")
        options["options"] = {"max_fusion_size": 1, **options.get("options", {})}
    return options


def compile_function(fn: Callable, options: dict[str, Any]) -> Callable:
    """``torch.compile(fn, **options)`` (options from ``compile_options``) for a function of diffmj's, skipping the
    guards on library globals (``workarounds.library_guard_filter``: a third to a half of a hopper step at B=1)
    unless the options choose their own filter or a ``mode`` (torch.compile takes a mode or options, not both)."""
    if "mode" not in options:
        options = {**options, "options": {"guard_filter_fn": library_guard_filter(fn), **options.get("options", {})}}
    return torch.compile(fn, **options)


def _observer(observe: ObserveArg) -> Observe:
    """rollout's ``observe`` as a function (None: keep the Data)."""
    if observe is None or callable(observe):
        return observe
    if isinstance(observe, str) or not all(isinstance(name, str) for name in observe):
        raise ValueError(f"observe must be a sequence of Data field names or a function (m, d) -> tensors, "
                         f"got {observe!r}")
    fields = {f.name for f in dataclasses.fields(Data)}
    unknown = [name for name in observe if name not in fields]
    if unknown:
        raise ValueError(f"observe names fields Data does not have: {unknown}")
    names = tuple(observe)
    return lambda m, d: {name: getattr(d, name) for name in names}
