"""Checkpointed rollouts: O(sqrt(T)) memory for the gradient of a T-step trajectory.

The forward pass runs every step without a tape (but the last segment) and keeps only the states at
segment boundaries. The backward pass walks the segments in reverse: it
re-runs one segment from its stored boundary state under ``torch.func.vjp``
and pulls back the cotangents of that segment's outputs together with the
cotangent of its final state. Peak memory is one segment's tape plus the
boundary states; the gradient equals the full-tape gradient. A step is
whatever the caller's ``advance`` runs (eager, vmapped over a batch, or
compiled), in the forward pass and in the recomputation alike.

It is a new-style ``torch.autograd.Function`` (setup_context, generated vmap
rule) over flat tensors, so it composes with ``torch.func.grad`` / ``vjp`` /
``vmap``, and with the solver's implicit adjoint inside every step.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from diffmj.io import make_data
from diffmj.types import INPUT_FIELDS, STATE_FIELDS, Data, Model
from diffmj.workarounds import transform_active

# Data fields a step reads besides the state it advances: the inputs it holds constant (ctrl comes per step)
HELD_INPUTS = tuple(f for f in INPUT_FIELDS if f != "ctrl")

# observe(m, d) -> what a rollout keeps of each step's Data: a pytree of tensors; None keeps the Data
Observe = Callable[[Model, Data], Any] | None

# advance(m, d, params, t) -> (the Data after step t, what the rollout keeps of it): step t of a rollout from the
# Data d before it (unbatched, or batched along the first dimension as every tensor of params is or is not); a
# function of d's state and HELD_INPUTS (its other fields are stale where a checkpointed segment starts) and of
# params, a tuple of tensors: what a rollout differentiates the controls by (an open loop's controls [T, nu], a
# policy's weights)
Advance = Callable[[Model, Data, tuple[Tensor, ...], int], tuple[Data, Any]]


class Layout(NamedTuple):
    """Static description of the flat argument list of a checkpointed rollout."""

    model_spec: pytree.TreeSpec
    n_model: int  # model leaves
    n_input: int  # constant-input fields
    n_params: int  # the control's parameters
    segment: int  # steps per segment
    horizon: int  # T
    advance: Advance  # each step


def join(parts: list, op: Callable) -> Any:
    """Stack or concatenate (op: torch.stack / torch.cat) a list of Data or of equal pytrees of tensors."""
    if isinstance(parts[0], Data):
        return op(parts)
    return pytree.tree_map(lambda *leaves: op(leaves), *parts)


def run_steps(m: Model, d: Data, advance: Advance, params: tuple[Tensor, ...], steps: range) -> tuple[Any, Data]:
    """Advance d through the steps t in ``steps``; returns (what advance keeps of each step, stacked along a new
    first dimension: a Data of batch [len(steps), *d.batch_size] when it keeps the Data, and the last Data)."""
    outs = []
    for t in steps:
        d, kept = advance(m, d, params, t)
        outs.append(kept)
    return join(outs, torch.stack), d


def _initial(m: Model, inputs, state) -> Data:
    """A Data holding only what a step reads: the constant inputs and the state (its time [*batch])."""
    state = dict(zip(STATE_FIELDS, state))
    return make_data(m, state["time"].shape).replace(**dict(zip(HELD_INPUTS, inputs)), **state)


def _segments(layout: Layout) -> list[range]:
    return [range(start, min(start + layout.segment, layout.horizon))
            for start in range(0, layout.horizon, layout.segment)]


class CheckpointedRollout(torch.autograd.Function):
    """(model leaves, inputs, state, control params) -> (flattened observations, last state, segment
    boundaries), with segment recomputation."""

    generate_vmap_rule = True

    @staticmethod
    def forward(layout: Layout, *flat: Tensor):
        m, inputs, state, params = _unpack(layout, flat)
        d = _initial(m, inputs, state)
        outs, boundaries = [], []
        for steps in _segments(layout):
            boundaries.extend(getattr(d, name).clone() for name in STATE_FIELDS)
            traj, d = run_steps(m, d, layout.advance, params, steps)
            outs.append(traj)
        leaves = pytree.tree_flatten(join(outs, torch.cat))[0]
        # cloned: a field no step changes (act when na = 0) would be a saved input returned as-is
        return (*leaves, *(getattr(d, name).clone() for name in STATE_FIELDS), *boundaries)

    @staticmethod
    def setup_context(ctx, inputs, output):
        layout, *flat = inputs
        n_out = len(output) - _n_boundaries(layout)
        ctx.layout, ctx.n_out = layout, n_out
        ctx.float_out = [i for i in range(n_out) if output[i].is_floating_point()]
        ctx.set_materialize_grads(False)  # unused outputs get None: no pulling back of zeros
        ctx.mark_non_differentiable(*(o for i, o in enumerate(output) if i >= n_out or not o.is_floating_point()))
        ctx.save_for_backward(*flat, *output[n_out:])

    @staticmethod
    def backward(ctx, *grad_outputs):
        layout = ctx.layout
        saved = ctx.saved_tensors
        flat, boundaries = saved[: len(saved) - _n_boundaries(layout)], saved[len(saved) - _n_boundaries(layout) :]
        m_leaves, inputs, _, params = (list(part) for part in _split(layout, flat))
        nstate = len(STATE_FIELDS)
        n_obs = ctx.n_out - nstate
        float_out = [i for i in ctx.float_out if i < n_obs and grad_outputs[i] is not None]
        grads_out = [grad_outputs[i] for i in float_out]
        # the last state's cotangent starts the chain through the segments
        g_state = [torch.zeros_like(t) if g is None else g
                   for g, t in zip(grad_outputs[n_obs : ctx.n_out], boundaries[-nstate:])]
        # pull back only to what needs a gradient (the state always: it chains the segments)
        needs = ctx.needs_input_grad[1:]
        first_param = layout.n_model + layout.n_input + nstate

        def wanted(tensors, offset):
            return [i for i, t in enumerate(tensors) if t.is_floating_point() and needs[offset + i]]

        differentiable = wanted(m_leaves, 0)
        input_float = wanted(inputs, layout.n_model)
        param_float = wanted(params, first_param)

        def replaced(values, indices, new):
            values = list(values)
            for i, t in zip(indices, new):
                values[i] = t
            return values

        def segment_fn(state, model_float, input_vals, param_vals, steps):
            m = pytree.tree_unflatten(replaced(m_leaves, differentiable, model_float), layout.model_spec)
            d = _initial(m, replaced(inputs, input_float, input_vals), state)
            traj, last = run_steps(m, d, layout.advance, tuple(replaced(params, param_float, param_vals)), steps)
            leaves = pytree.tree_flatten(traj)[0]
            return [leaves[i] for i in float_out], [getattr(last, name) for name in STATE_FIELDS]

        g_model = [torch.zeros_like(m_leaves[i]) for i in differentiable]
        g_inputs = [torch.zeros_like(inputs[i]) for i in input_float]
        g_params = [torch.zeros_like(params[i]) for i in param_float]
        for k, steps in reversed(list(enumerate(_segments(layout)))):
            _, vjp = _vjp(
                lambda *primals: segment_fn(*primals, steps),
                list(boundaries[k * nstate : (k + 1) * nstate]),
                [m_leaves[i] for i in differentiable],
                [inputs[i] for i in input_float],
                [params[i] for i in param_float],
            )
            g_outs = [g[steps.start : steps.stop] for g in grads_out]
            g_state, g_model_seg, g_inputs_seg, g_params_seg = vjp((g_outs, g_state))
            g_model = [a + b for a, b in zip(g_model, g_model_seg)]
            g_inputs = [a + b for a, b in zip(g_inputs, g_inputs_seg)]
            g_params = [a + b for a, b in zip(g_params, g_params_seg)]
        state_grads = [g if t.is_floating_point() else None for g, t in zip(g_state, boundaries[:nstate])]
        return (None, *replaced([None] * layout.n_model, differentiable, g_model),
                *replaced([None] * layout.n_input, input_float, g_inputs), *state_grads,
                *replaced([None] * layout.n_params, param_float, g_params))


def _vjp(fn, *primals):
    """``torch.func.vjp(fn, *primals)``; with plain autograd when no functorch transform or
    compile is active, which costs about half as much per operation in eager mode."""
    flat, spec = pytree.tree_flatten(primals)
    if transform_active(flat):
        return torch.func.vjp(fn, *primals)
    flat = [t.detach().requires_grad_(t.is_floating_point()) for t in flat]
    with torch.enable_grad():
        outs = fn(*pytree.tree_unflatten(flat, spec))
    out_flat, out_spec = pytree.tree_flatten(outs)

    def pullback(cotangents):
        pairs = [(o, g) for o, g in zip(out_flat, pytree.tree_flatten(cotangents)[0]) if o.requires_grad]
        wrt = [t for t in flat if t.requires_grad]
        grads = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True))
        result = [(next(grads) if t.requires_grad else None) for t in flat]
        result = [torch.zeros_like(t) if g is None else g for g, t in zip(result, flat)]
        return pytree.tree_unflatten(result, spec)

    detached = pytree.tree_unflatten([o.detach() for o in out_flat], out_spec)
    return detached, pullback


def _n_boundaries(layout: Layout) -> int:
    return len(STATE_FIELDS) * math.ceil(layout.horizon / layout.segment)


def _split(layout: Layout, flat) -> tuple:
    """The flat arguments as (model leaves, inputs, state, control params)."""
    n_state = layout.n_model + layout.n_input
    n_params = n_state + len(STATE_FIELDS)
    return flat[: layout.n_model], flat[layout.n_model : n_state], flat[n_state:n_params], tuple(flat[n_params:])


def _unpack(layout: Layout, flat):
    m_leaves, inputs, state, params = _split(layout, flat)
    return pytree.tree_unflatten(list(m_leaves), layout.model_spec), inputs, state, params


def checkpointed_rollout(m: Model, d: Data, advance: Advance, params: tuple[Tensor, ...], horizon: int, segment: int,
                         observe: Observe = None) -> Any:
    """What ``run_steps`` keeps of d over ``horizon`` steps of ``advance`` (observe: what advance keeps, None
    for the Data), recomputing segments of ``segment`` steps in the backward pass.

    The last segment keeps its tape (as torch.utils.checkpoint.checkpoint_sequential does): the
    backward pass needs it first, so recomputing it would only cost time.
    """
    head = segment * ((horizon - 1) // segment)  # steps before the last segment
    if head == 0:
        return run_steps(m, d, advance, params, range(horizon))[0]
    m_leaves, model_spec = pytree.tree_flatten(m)
    layout = Layout(model_spec=model_spec, n_model=len(m_leaves), n_input=len(HELD_INPUTS), n_params=len(params),
                    segment=segment, horizon=head, advance=advance)
    flat = (*m_leaves, *(getattr(d, n) for n in HELD_INPUTS), *(getattr(d, n) for n in STATE_FIELDS), *params)
    out = CheckpointedRollout.apply(layout, *flat)
    if observe is None:
        spec = pytree.tree_flatten(make_data(m, (head, *d.batch_size)))[1]
    else:  # stacking keeps a pytree's structure; observe runs once more, on one state of d, to learn it
        with torch.no_grad():
            spec = pytree.tree_flatten(observe(m, d[0] if d.batch_dims else d))[1]
    n_obs = len(out) - _n_boundaries(layout) - len(STATE_FIELDS)
    last = d.replace(**dict(zip(STATE_FIELDS, out[n_obs : n_obs + len(STATE_FIELDS)])))
    tail = run_steps(m, last, advance, params, range(head, horizon))[0]
    return join([pytree.tree_unflatten(list(out[:n_obs]), spec), tail], torch.cat)
