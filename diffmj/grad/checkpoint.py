"""Checkpointed rollouts: O(sqrt(T)) memory for the gradient of a T-step trajectory.

The forward pass runs every step without a tape (but the last segment) and keeps only the states at
segment boundaries. The backward pass walks the segments in reverse: it
re-runs one segment from its stored boundary state under ``torch.func.vjp``
and pulls back the cotangents of that segment's outputs together with the
cotangent of its final state. Peak memory is one segment's tape plus the
boundary states; the gradient equals the full-tape gradient.

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

from diffmj.forward import step_unbatched
from diffmj.io import make_data
from diffmj.types import INPUT_FIELDS, STATE_FIELDS, BackwardMode, Data, Model
from diffmj.workarounds import transform_active

# Data fields a step reads besides the state it advances: the inputs it holds constant (ctrl comes per step)
HELD_INPUTS = tuple(f for f in INPUT_FIELDS if f != "ctrl")

# observe(m, d) -> what a rollout keeps of each step's Data: a pytree of tensors; None keeps the Data
Observe = Callable[[Model, Data], Any] | None


class Layout(NamedTuple):
    """Static description of the flat argument list of a checkpointed rollout."""

    model_spec: pytree.TreeSpec
    n_model: int  # model leaves
    n_input: int  # constant-input fields
    segment: int  # steps per segment
    horizon: int  # T
    mode: BackwardMode  # how each step's solver is differentiated
    observe: Observe  # what each step keeps


def join(parts: list, op: Callable) -> Any:
    """Stack or concatenate (op: torch.stack / torch.cat) a list of Data or of equal pytrees of tensors."""
    if isinstance(parts[0], Data):
        return op(parts)
    return pytree.tree_map(lambda *leaves: op(leaves), *parts)


def run_steps(m: Model, d: Data, ctrl: Tensor, mode: BackwardMode, observe: Observe = None) -> tuple[Any, Data]:
    """Step an unbatched d through ctrl [T, nu]; returns (the observations stacked over [T]: a Data of
    batch [T] when observe is None, and the last Data)."""
    outs = []
    for t in range(ctrl.shape[0]):
        d = step_unbatched(m, d.replace(ctrl=ctrl[t]), mode)
        outs.append(d if observe is None else observe(m, d))
    return join(outs, torch.stack), d


def _initial(m: Model, inputs, state) -> Data:
    """A Data holding only what a step reads: the constant inputs and the state."""
    d = make_data(m)
    return d.replace(**dict(zip(HELD_INPUTS, inputs)), **dict(zip(STATE_FIELDS, state)))


class CheckpointedRollout(torch.autograd.Function):
    """(model leaves, inputs, state, ctrl) -> (flattened observations, last state, segment boundaries), with
    segment recomputation."""

    generate_vmap_rule = True

    @staticmethod
    def forward(layout: Layout, *flat: Tensor):
        m, inputs, state, ctrl = _unpack(layout, flat)
        d = _initial(m, inputs, state)
        outs, boundaries = [], []
        for start in range(0, layout.horizon, layout.segment):
            boundaries.extend(getattr(d, name).clone() for name in STATE_FIELDS)
            traj, d = run_steps(m, d, ctrl[start : start + layout.segment], layout.mode, layout.observe)
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
        m_leaves = list(flat[: layout.n_model])
        inputs = list(flat[layout.n_model : layout.n_model + layout.n_input])
        ctrl = flat[-1]
        nstate = len(STATE_FIELDS)
        n_obs = ctx.n_out - nstate
        float_out = [i for i in ctx.float_out if i < n_obs and grad_outputs[i] is not None]
        grads_out = [grad_outputs[i] for i in float_out]
        # the last state's cotangent starts the chain through the segments
        g_state = [torch.zeros_like(t) if g is None else g
                   for g, t in zip(grad_outputs[n_obs : ctx.n_out], boundaries[-nstate:])]
        # pull back only to what needs a gradient (the state always: it chains the segments)
        needs = ctx.needs_input_grad[1:]
        differentiable = [i for i, t in enumerate(m_leaves) if t.is_floating_point() and needs[i]]
        input_float = [i for i, t in enumerate(inputs) if t.is_floating_point() and needs[layout.n_model + i]]

        def segment_fn(state, ctrl_seg, model_float, input_vals):
            leaves = list(m_leaves)
            for i, t in zip(differentiable, model_float):
                leaves[i] = t
            ins = list(inputs)
            for i, t in zip(input_float, input_vals):
                ins[i] = t
            m = pytree.tree_unflatten(leaves, layout.model_spec)
            traj, last = run_steps(m, _initial(m, ins, state), ctrl_seg, layout.mode, layout.observe)
            leaves = pytree.tree_flatten(traj)[0]
            return [leaves[i] for i in float_out], [getattr(last, name) for name in STATE_FIELDS]

        g_ctrl = torch.zeros_like(ctrl)
        g_model = [torch.zeros_like(m_leaves[i]) for i in differentiable]
        g_inputs = [torch.zeros_like(inputs[i]) for i in input_float]
        starts = list(range(0, layout.horizon, layout.segment))
        for k in reversed(range(len(starts))):
            start = starts[k]
            stop = min(start + layout.segment, layout.horizon)
            state = [t for t in boundaries[k * nstate : (k + 1) * nstate]]
            _, vjp = _vjp(
                segment_fn,
                state,
                ctrl[start:stop],
                [m_leaves[i] for i in differentiable],
                [inputs[i] for i in input_float],
            )
            g_outs = [g[start:stop] for g in grads_out]
            g_state, g_ctrl_seg, g_model_seg, g_inputs_seg = vjp((g_outs, g_state))
            g_ctrl = torch.cat((g_ctrl[:start], g_ctrl_seg, g_ctrl[stop:]))
            g_model = [a + b for a, b in zip(g_model, g_model_seg)]
            g_inputs = [a + b for a, b in zip(g_inputs, g_inputs_seg)]
        model_grads = [None] * layout.n_model
        for i, g in zip(differentiable, g_model):
            model_grads[i] = g
        input_grads = [None] * layout.n_input
        for i, g in zip(input_float, g_inputs):
            input_grads[i] = g
        state_grads = [g if t.is_floating_point() else None for g, t in zip(g_state, boundaries[:nstate])]
        return (None, *model_grads, *input_grads, *state_grads, g_ctrl)


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


def _unpack(layout: Layout, flat):
    m = pytree.tree_unflatten(list(flat[: layout.n_model]), layout.model_spec)
    inputs = flat[layout.n_model : layout.n_model + layout.n_input]
    state = flat[layout.n_model + layout.n_input : -1]
    return m, inputs, state, flat[-1]


def checkpointed_rollout(m: Model, d: Data, ctrl: Tensor, segment: int, mode: BackwardMode,
                         observe: Observe = None) -> Any:
    """The observations (as ``run_steps``) of an unbatched d under ctrl [T, nu], recomputing segments of
    ``segment`` steps in the backward pass.

    The last segment keeps its tape (as torch.utils.checkpoint.checkpoint_sequential does): the
    backward pass needs it first, so recomputing it would only cost time.
    """
    horizon = ctrl.shape[0]
    tail = horizon - segment * ((horizon - 1) // segment)  # steps in the last segment
    if tail == horizon:
        return run_steps(m, d, ctrl, mode, observe)[0]
    head, last = _checkpointed(m, d, ctrl[: horizon - tail], segment, mode, observe)
    return join([head, run_steps(m, last, ctrl[horizon - tail :], mode, observe)[0]], torch.cat)


def _checkpointed(m: Model, d: Data, ctrl: Tensor, segment: int, mode: BackwardMode,
                  observe: Observe) -> tuple[Any, Data]:
    """(The observations of the steps of ctrl [T, nu], the Data after the last step)."""
    horizon = ctrl.shape[0]
    m_leaves, model_spec = pytree.tree_flatten(m)
    layout = Layout(model_spec=model_spec, n_model=len(m_leaves), n_input=len(HELD_INPUTS),
                    segment=segment, horizon=horizon, mode=mode, observe=observe)
    flat = (*m_leaves, *(getattr(d, n) for n in HELD_INPUTS), *(getattr(d, n) for n in STATE_FIELDS), ctrl)
    out = CheckpointedRollout.apply(layout, *flat)
    if observe is None:
        spec = pytree.tree_flatten(make_data(m, (horizon,)))[1]
    else:  # stacking keeps a pytree's structure; observe runs once more, on d, to learn it
        with torch.no_grad():
            spec = pytree.tree_flatten(observe(m, d))[1]
    n_obs = len(out) - _n_boundaries(layout) - len(STATE_FIELDS)
    last = d.replace(**dict(zip(STATE_FIELDS, out[n_obs : n_obs + len(STATE_FIELDS)])))
    return pytree.tree_unflatten(list(out[:n_obs]), spec), last
