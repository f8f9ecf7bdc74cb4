"""System identification: named model parameters fitted to recorded controls and measurements.

diffmj's counterpart of ``mujoco.sysid``, with exact Jacobians instead of finite differences.
A problem is

- parameters: ``Parameter`` specs, each a MuJoCo field (``diffmj.get_param``'s names,
  ``opt.*`` included), optionally one object's rows of it and components of that row, with an
  initial value, bounds, and ``log=True`` to optimise log p for a positive p;
- a ``Recording``: initial state(s) d0 [...], controls [..., T, nu] and the measured
  sensordata [..., T, nsensordata] and / or qpos [..., T, nq] / qvel [..., T, nv], one or
  several sequences (the leading dimensions) at once.

The optimisation variable x [n] concatenates the parameters' flattened values, log-transformed
where asked. ``residual(x)`` is the weighted difference between ``diffmj.rollout`` of the model
with the parameters set by ``diffmj.set_params`` and the measurements, flattened; ``jacobian(x)``
its exact Jacobian (by default every step's Jacobians, all steps in one reverse-mode batch, chained
along the rollout; or ``torch.func.jacfwd`` / ``jacrev`` of the rollout); ``fit`` a small
Levenberg-Marquardt on them whose steps minimise its quadratic model within the bounds
(``box_qp``); ``least_squares_functions`` hands the same residual and Jacobian to
``mujoco.minimize.least_squares``.

Measurements line up with ``diffmj.rollout`` and with MuJoCo C: entry t is what mjData holds
after the (t + 1)-th ``mj_step`` (sensors are evaluated at the start of a step, so sensordata[t]
reads the state before step t + 1, qpos[t] / qvel[t] the state after it).
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from typing import Callable, NamedTuple, Sequence

import mujoco
import numpy as np
import scipy.stats
import torch
import torch.utils._pytree as pytree
from torch import Tensor

from diffmj import Data, Model, differentiate_pos, get_param, integrate_pos, replace_param, rollout, set_params, step
from diffmj.grad.solution import from_solution, reuses_solution
from diffmj.grad.transition import jacrev_chained, transition
from diffmj.optim.mujoco_c import check_sizes, rollout_feedback_mujoco
from diffmj.rollout import CompileArg, compile_function, compile_options
from diffmj.setconst import SET_CONST_INPUTS
from diffmj.types import STATE_FIELDS
from diffmj.workarounds import elementwise, restarts_compile

SIGNALS = ("sensordata", "qpos", "qvel")


class Parameter(NamedTuple):
    """One parameter to identify.

    name: MuJoCo's field name (``"body_mass"``, ``"dof_damping"``, ``"opt.timestep"``, ...).
    obj: the object's name or id (as ``diffmj.get_param``), None for the whole field.
    index: components of ``get_param(m, name, obj)`` flattened (an int or a sequence of ints,
    e.g. 0 for ``actuator_gear``'s first entry or ``geom_friction``'s sliding friction); None
    for all of them.
    initial: starting value, broadcast to the parameter's shape; None reads the model's.
    lower, upper: bounds in the parameter's units (applied to every component).
    log: optimise log p (p must start positive; a lower bound <= 0 then bounds nothing).
    """

    name: str
    obj: str | int | None = None
    index: int | Sequence[int] | None = None
    initial: float | Sequence[float] | Tensor | None = None
    lower: float = -math.inf
    upper: float = math.inf
    log: bool = False

    @property
    def label(self) -> str:
        """A readable key: ``body_mass[torso]``, ``actuator_gear[motor][0]``, ``opt.timestep``."""
        label = self.name if self.obj is None else f"{self.name}[{self.obj}]"
        if self.index is not None:
            label += f"[{self.index}]" if isinstance(self.index, int) else f"[{','.join(map(str, self.index))}]"
        return label


class Recording(NamedTuple):
    """Recorded sequences: what the model is fitted to.

    d0: the initial Data, batch [...] (several sequences) or unbatched. ctrl [..., T, nu].
    sensordata [..., T, nsensordata], qpos [..., T, nq], qvel [..., T, nv]: the measurements
    (at least one), entry t being the Data after step t + 1 as ``diffmj.rollout`` returns it.
    Leading dimensions of d0, ctrl and the measurements broadcast.
    weights: per signal (``"sensordata"``, ``"qpos"``, ``"qvel"``), a factor broadcast to that
    signal's residual [..., T, n] (n = nv for qpos, whose residual is the tangent difference),
    e.g. one per sensor entry [nsensordata] or 1 / noise scale; default 1.
    """

    d0: Data
    ctrl: Tensor
    sensordata: Tensor | None = None
    qpos: Tensor | None = None
    qvel: Tensor | None = None
    weights: dict[str, Tensor | float] | None = None


class SysIdResult(NamedTuple):
    """What ``fit`` returns.

    x [n]: the optimised (transformed) vector. params: label -> value in the parameter's units
    (shape of the parameter: [] for one component). cost: 0.5 |r|^2 at x. cost_history
    [iterations + 1]: the cost at the start and after each iteration (a rejected step repeats it).
    iterations: LM iterations run. status: why it stopped (``"gradient"``, ``"step"``, ``"cost"``,
    ``"max_iterations"``, ``"regularization"``). converged: stopped by a tolerance. wall_time:
    seconds. jacobian [nr, n]: at x. covariance [n, n]: s^2 (J'J)^-1 in x's coordinates with
    s^2 = |r|^2 / (nr - n) (``mujoco.sysid.calculate_intervals``' formula). confidence: label ->
    (low, high) tensors, the ``1 - alpha`` interval x_i +- t_{nr-n}(1 - alpha/2) sqrt(cov_ii)
    mapped to the parameter's units (exp for log parameters, so there it is not symmetric);
    infinite for parameters the residual does not determine. singular: J'J is (numerically)
    singular; unidentified: labels of the parameters in its null space.
    """

    x: Tensor
    params: dict[str, Tensor]
    cost: float
    cost_history: Tensor
    iterations: int
    status: str
    converged: bool
    wall_time: float
    jacobian: Tensor
    covariance: Tensor
    confidence: dict[str, tuple[Tensor, Tensor]]
    singular: bool
    unidentified: tuple[str, ...]


def _layout(m: Model, params: Sequence[Parameter]) -> list[tuple[Parameter, torch.Size, Tensor | None]]:
    """(spec, shape of its value, flat component indices or None) per parameter; ValueError on bad specs."""
    if not params:
        raise ValueError("no parameters to identify")
    layout = []
    for p in params:
        if not isinstance(p, Parameter):
            raise ValueError(f"parameters must be sysid.Parameter, got {type(p).__name__}")
        row = get_param(m, p.name, p.obj)  # raises ValueError for unknown fields and names
        if p.index is None:
            layout.append((p, row.shape, None))
            continue
        index = torch.as_tensor(p.index, dtype=torch.long, device=row.device).reshape(-1)
        if index.numel() == 0 or index.min() < 0 or index.max() >= row.numel() or index.unique().numel() != index.numel():
            raise ValueError(f"{p.label}: index must pick distinct components of {tuple(row.shape)} "
                             f"(flattened, 0..{row.numel() - 1})")
        layout.append((p, torch.Size([index.numel()]), index))
    labels = [p.label for p in params]
    if len(set(labels)) != len(labels):
        raise ValueError(f"a parameter is listed twice: {labels}")
    return layout


def _current(m: Model, p: Parameter, index: Tensor | None) -> Tensor:
    value = get_param(m, p.name, p.obj)
    return value if index is None else value.reshape(-1)[index]


def initial_vector(m: Model, params: Sequence[Parameter]) -> Tensor:
    """x0 [n]: the initial values (the model's where ``initial`` is None), log-transformed where asked.

    Raises ValueError for bad specs, bounds that are empty or NaN, initial values outside the bounds
    and non-positive values of log parameters.
    """
    parts = []
    for p, shape, index in _layout(m, params):
        value = _current(m, p, index) if p.initial is None else torch.as_tensor(p.initial, dtype=m.dtype, device=m.device)
        try:
            value = torch.broadcast_to(value.to(m.dtype), shape)
        except RuntimeError:
            raise ValueError(f"{p.label}: initial value of shape {tuple(value.shape)} does not broadcast to "
                             f"{tuple(shape)}") from None
        if math.isnan(p.lower) or math.isnan(p.upper) or not p.lower < p.upper:
            raise ValueError(f"{p.label}: bounds must satisfy lower < upper, got ({p.lower}, {p.upper})")
        if ((value < p.lower) | (value > p.upper)).any():
            raise ValueError(f"{p.label}: initial value {value.tolist()} outside the bounds ({p.lower}, {p.upper})")
        if p.log:
            if (value <= 0).any():
                raise ValueError(f"{p.label}: a log parameter must start positive, got {value.tolist()}")
            value = value.log()
        parts.append(value.reshape(-1))
    return torch.cat(parts)


def bounds(m: Model, params: Sequence[Parameter]) -> tuple[Tensor, Tensor]:
    """(lower [n], upper [n]) on x: the parameters' bounds, log-transformed for log parameters."""
    lower, upper = [], []
    for p, shape, _ in _layout(m, params):
        low, high = (math.log(p.lower) if p.lower > 0 else -math.inf, math.log(p.upper)) if p.log else (p.lower, p.upper)
        lower.append(torch.full((shape.numel(),), low, dtype=m.dtype, device=m.device))
        upper.append(torch.full((shape.numel(),), high, dtype=m.dtype, device=m.device))
    return torch.cat(lower), torch.cat(upper)


def values(m: Model, params: Sequence[Parameter], x: Tensor) -> dict[str, Tensor]:
    """label -> parameter value in its units (exp for log parameters), shaped as the parameter, from x [n]."""
    layout = _layout(m, params)
    sizes = [shape.numel() for _, shape, _ in layout]
    if x.shape != (sum(sizes),):
        raise ValueError(f"x must have shape ({sum(sizes)},) (the parameters' components), got {tuple(x.shape)}")
    out = {}
    for (p, shape, _), chunk in zip(layout, x.split(sizes)):
        out[p.label] = (chunk.exp() if p.log else chunk).reshape(shape)
    return out


def apply(m: Model, params: Sequence[Parameter], x: Tensor) -> Model:
    """The model with every parameter set from x [n] by ``diffmj.set_params`` (differentiable in x).

    set_params recomputes the constants MuJoCo derives from masses, inertias, armature and geometry
    (``diffmj.set_const``, once for all parameters), so the model is the one MuJoCo C simulates after
    mj_setConst.
    """
    if x.dtype != m.dtype or x.device != m.device:
        raise ValueError(f"x is {x.dtype} on {x.device}, the model is {m.dtype} on {m.device}")
    changes, written = [], m  # written: the changes so far, nothing derived (components of one row add up)
    for (p, _, index), value in zip(_layout(m, params), values(m, params, x).values()):
        if index is not None:
            row = get_param(written, p.name, p.obj)
            value = row.reshape(-1).index_copy(0, index, value).reshape(row.shape)
        written = replace_param(written, p.name, value, p.obj)
        changes.append((p.name, value, p.obj))
    return set_params(m, changes)


def _check_recording(m: Model, data: Recording) -> None:
    if not isinstance(data, Recording):
        raise ValueError(f"data must be a sysid.Recording, got {type(data).__name__}")
    ctrl = data.ctrl
    if not isinstance(ctrl, Tensor) or ctrl.dim() < 2 or ctrl.shape[-1] != m.nu:
        raise ValueError(f"ctrl must be a tensor [..., T, nu={m.nu}], got "
                         f"{tuple(ctrl.shape) if isinstance(ctrl, Tensor) else type(ctrl).__name__}")
    sizes = {"sensordata": m.nsensordata, "qpos": m.nq, "qvel": m.nv}
    given = [s for s in SIGNALS if getattr(data, s) is not None]
    if not given:
        raise ValueError("the recording has no measurements: give sensordata, qpos or qvel")
    batch = [tuple(data.d0.batch_size), tuple(ctrl.shape[:-2])]
    for s in given:
        x = getattr(data, s)
        if not isinstance(x, Tensor) or x.dim() < 2 or x.shape[-2:] != (ctrl.shape[-2], sizes[s]):
            raise ValueError(f"{s} must be a tensor [..., T={ctrl.shape[-2]}, {sizes[s]}], got "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
        batch.append(tuple(x.shape[:-2]))
    for name, x in [("ctrl", ctrl)] + [(s, getattr(data, s)) for s in given]:
        if x.dtype != m.dtype or x.device != m.device:
            raise ValueError(f"{name} is {x.dtype} on {x.device}, the model is {m.dtype} on {m.device}")
    try:
        torch.broadcast_shapes(*batch)
    except RuntimeError:
        raise ValueError(f"batch shapes of d0, ctrl and the measurements do not broadcast: {batch}") from None
    unknown = set(data.weights or {}) - set(given)
    if unknown:
        raise ValueError(f"weights for {sorted(unknown)}, which are not measured (measured: {given})")


def residual(m: Model, params: Sequence[Parameter], data: Recording, x: Tensor) -> Tensor:
    """Weighted predicted - measured, flattened: [nr] (sensordata, then qpos, then qvel).

    The prediction is ``diffmj.rollout`` (full tape, no checkpointing: forward mode needs it) of
    ``apply(m, params, x)`` from ``data.d0`` under ``data.ctrl``. qpos is compared on the manifold,
    ``differentiate_pos(measured, predicted)`` [..., T, nv] (predicted - measured for hinge / slide).
    """
    _check_recording(m, data)
    traj = rollout(apply(m, params, x), data.d0, data.ctrl, checkpoint=None)
    return _weighted_difference(m, data, {s: getattr(traj, s) for s in _measured(data)})


def _measured(data: Recording) -> tuple[str, ...]:
    return tuple(s for s in SIGNALS if getattr(data, s) is not None)


def _weighted_difference(m: Model, data: Recording, predicted: dict[str, Tensor]) -> Tensor:
    """The residual [nr] from the predicted signals (name -> [..., T, n]), as ``residual`` documents."""
    weights = data.weights or {}
    parts = []
    for s, prediction in predicted.items():
        measured = getattr(data, s)
        r = differentiate_pos(m, measured, prediction) if s == "qpos" else prediction - measured
        r = r * torch.as_tensor(weights.get(s, 1.0), dtype=m.dtype, device=m.device)
        parts.append(r.reshape(-1))
    return torch.cat(parts)


def _weighted_difference_and_jacobian(m: Model, data: Recording, predicted: dict[str, Tensor],
                                      derivatives: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """(the residual [nr], its Jacobian [nr, n]) from the predicted signals (name -> [..., T, k]) and their
    derivatives w.r.t. x (name -> [n, ..., T, k])."""
    r = _weighted_difference(m, data, predicted)
    J = torch.vmap(lambda tangent: torch.func.jvp(lambda p: _weighted_difference(m, data, p), (predicted,),
                                                  (tangent,))[1])(derivatives)
    return r, J.mT


def jacobian(m: Model, params: Sequence[Parameter], data: Recording, x: Tensor, mode: str = "auto") -> Tensor:
    """The exact Jacobian of ``residual`` w.r.t. x: [nr, n].

    mode: ``"steps"`` (the default for ``"auto"``): one rollout, then every step's Jacobians w.r.t. the state
    and the parameters by reverse mode, all steps as one batch, chained into the trajectory's (forward
    sensitivities); ``"forward"`` (``torch.func.jacfwd`` of the rollout: one tangent per parameter) or
    ``"reverse"`` (``torch.func.jacrev``: one cotangent per residual). All three give the same Jacobian
    to roundoff; "steps" is the fastest eager (benchmarks/README.md, System identification).
    """
    if mode == "auto":
        mode = "steps"
    if mode not in ("steps", "forward", "reverse"):
        raise ValueError(f"mode must be 'auto', 'steps', 'forward' or 'reverse', got {mode!r}")
    if mode == "steps":
        _check_recording(m, data)
        return _steps_jacobian(m, params, data, x, _trajectory(m, params, data, x))
    transform = torch.func.jacfwd if mode == "forward" else torch.func.jacrev
    return transform(lambda x: residual(m, params, data, x))(x)


def residual_and_jacobian_function(m: Model, params: Sequence[Parameter], data: Recording,
                                   compile: CompileArg = False) -> Callable[[Tensor], tuple[Tensor, Tensor]]:
    """x [n] -> (``residual`` [nr], its Jacobian [nr, n]) from one rollout that carries the state's n
    tangents (d state / dx, one per component of x) step by step: forward-mode sensitivities.

    The same operations as ``residual`` and ``jacobian(mode="forward")`` (tangents batched the same
    way, outside the batch of sequences; the constraint solver's iterations without tangents, its
    solution's tangent by the same implicit adjoint), so the results agree to roundoff. The point of stepping by
    hand is ``compile``: True, or a dict of ``torch.compile``'s keyword arguments, runs each step (the
    whole batch with its n tangents) as one compiled graph; the loop over time stays in Python, so
    compile time does not grow with T, and every later step and call reuses the graph (so do
    functions made later in the process for the same model and shapes: Dynamo's cache). False:
    eager. On CPU, Inductor's OpenMP regions around kernels this small cost more than they save
    when other processes share the cores: compile and run under ``torch.set_num_threads(1)`` there
    (see benchmarks/README.md, System identification).

    Only the model's tensors that ``apply`` recomputes from x (found once, here) carry tangents.
    """
    _check_recording(m, data)
    options = compile_options(compile)
    leaves, spec = pytree.tree_flatten(m)
    varying = _varying_positions(m, params, initial_vector(m, params))
    measured = _measured(data)
    batch, d0, ctrl = _flat_inputs(data)
    # copies: a compiled step guards on which inputs alias each other, and later steps' states alias nothing
    state0 = {name: getattr(d0, name).clone() for name in STATE_FIELDS if getattr(d0, name).is_floating_point()}

    # Differentiate each step from its solution (diffmj.grad.solution): under jvp the solver's iterations are
    # a Python loop that Dynamo unrolls to the full count, opt.iterations x opt.ls_iterations line-search
    # steps in one graph. So each step first solves without tangents (a while_loop stopping once
    # converged), then steps under jvp from that solution with no iterations.
    solve_first = reuses_solution(m, m.backward_mode)
    tangent_spec = pytree.tree_structure(from_solution(m)) if solve_first else spec

    # compiled, the model's 0-dim float64 leaves enter the step as [1] views (workarounds.ScalarInputs)
    scalar = {i for i, leaf in enumerate(leaves) if restarts_compile(leaf)} if options is not None else set()

    def advance(model_leaves: list[Tensor], model_tangents: list[Tensor], state: dict[str, Tensor],
                state_tangents: dict[str, Tensor], ctrl_t: Tensor):
        """One step of the batch [size] and its tangents [n, size, ...]: (state, state tangents, measured
        signals [size, k], their tangents [n, size, k])."""
        model_leaves = [leaf.reshape(()) if i in scalar else leaf for i, leaf in enumerate(model_leaves)]
        if solve_first:
            solved = step(pytree.tree_unflatten(model_leaves, spec), d0.replace(**state, ctrl=ctrl_t))
            state = {**state, "qacc_warmstart": solved.qacc}

        def stepped(changed: list[Tensor], state: dict[str, Tensor]):
            out = step(_replaced(model_leaves, varying, changed, tangent_spec), d0.replace(**state, ctrl=ctrl_t))
            return {name: getattr(out, name) for name in state}, {s: getattr(out, s) for s in measured}

        def along(model_tangent: list[Tensor], state_tangent: dict[str, Tensor]):
            return torch.func.jvp(stepped, ([model_leaves[i] for i in varying], state),
                                  (model_tangent, state_tangent))

        # the primal does not depend on the tangent: vmap returns n equal copies, keep the first
        (state, signals), (state_tangents, signal_tangents) = torch.vmap(along)(model_tangents, state_tangents)
        first = lambda tree: pytree.tree_map(lambda v: v[0], tree)  # noqa: E731
        return first(state), state_tangents, first(signals), signal_tangents

    if options is not None:
        advance = compile_function(advance, options)

    def evaluate(x: Tensor) -> tuple[Tensor, Tensor]:
        n = x.shape[0]
        values, model_tangents = _varying_leaves(m, params, x, varying)
        model_leaves = list(leaves)
        for i, value in zip(varying, values):
            model_leaves[i] = value
        model_leaves = [leaf.reshape(1) if i in scalar else leaf for i, leaf in enumerate(model_leaves)]
        state = state0
        state_tangents = {name: value.new_zeros(n, *value.shape) for name, value in state.items()}
        signals, tangents = [], []
        with torch.no_grad():
            for t in range(ctrl.shape[-2]):
                state, state_tangents, s, ts = advance(model_leaves, model_tangents, state, state_tangents,
                                                       ctrl[:, t].contiguous())
                signals.append(s)
                tangents.append(ts)
        # [size] -> [*batch, T, k] and [n, size] -> [n, *batch, T, k], as rollout returns them
        predicted = {s: torch.stack([v[s] for v in signals], 1).reshape(*batch, len(signals), -1) for s in measured}
        predicted_tangents = {s: torch.stack([v[s] for v in tangents], 2).reshape(n, *batch, len(tangents), -1)
                              for s in measured}
        return _weighted_difference_and_jacobian(m, data, predicted, predicted_tangents)

    return evaluate


def _varying_positions(m: Model, params: Sequence[Parameter], x: Tensor) -> list[int]:
    """The positions of m's pytree leaves that ``apply`` recomputes from x [n]."""
    return [i for i, (before, after) in enumerate(zip(pytree.tree_leaves(m), pytree.tree_leaves(apply(m, params, x))))
            if before is not after]


def _varying_leaves(m: Model, params: Sequence[Parameter], x: Tensor,
                    positions: list[int]) -> tuple[list[Tensor], list[Tensor]]:
    """The leaves at ``positions`` of ``apply(m, params, x)``, and their tangents [n, ...] (d leaf / d x_i, one
    per component of x [n]). Reverse mode: a few dozen derived entries, where forward mode's zero tangents
    of the constants that set_const mixes in cost twice as much (their shapes worked out by torch's Python
    references)."""

    def changed(x: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        leaves = [pytree.tree_leaves(apply(m, params, x))[i] for i in positions]
        return leaves, leaves

    jacobians, values = torch.func.jacrev(changed, has_aux=True)(x)
    return [v.clone() for v in values], [j.movedim(-1, 0).contiguous() for j in jacobians]


def _replaced(leaves: list[Tensor], positions: list[int], replacements: list[Tensor], spec) -> Model:
    """The model of pytree ``spec`` from ``leaves`` with those at ``positions`` replaced."""
    leaves = list(leaves)
    for i, leaf in zip(positions, replacements):
        leaves[i] = leaf
    return pytree.tree_unflatten(leaves, spec)


def _trajectory(m: Model, params: Sequence[Parameter], data: Recording, x: Tensor) -> dict[str, Tensor]:
    """The rollout at x without derivatives: the state fields, qacc and the measured signals, name ->
    [size, T, ...] over the flattened batch of sequences. The residual is ``_weighted_difference`` of its
    measured signals; ``_chain_step_jacobians`` takes their derivatives from it."""
    _, d0, ctrl = _flat_inputs(data)
    kept = tuple(dict.fromkeys((*STATE_FIELDS, "qacc", *_measured(data))))
    with torch.no_grad():
        return rollout(apply(m, params, x), d0, ctrl, checkpoint=None, observe=kept)


def mujoco_model(mj_model: mujoco.MjModel, m: Model, params: Sequence[Parameter], x: Tensor) -> mujoco.MjModel:
    """A copy of mj_model (the MjModel m was made from) with the parameters set from x [n] as ``apply`` sets
    them on m: in the order given, each parameter's entries that differ from m's written (a float32 model's
    other entries keep mj_model's values), and ``mj_setConst`` after one that feeds MuJoCo's derived constants
    (``SET_CONST_INPUTS``). ValueError for a field the MjModel does not hold in the model's shape."""
    check_sizes(mj_model, m)
    model = copy.copy(mj_model)
    applied = apply(m, params, x)
    for p in params:
        owner, attr = ((model.opt, p.name[4:]) if p.name.startswith("opt.") else
                       (model.stat, p.name[5:]) if p.name.startswith("stat_") else (model, p.name))
        new = get_param(applied, p.name)
        current = np.asarray(getattr(owner, attr)) if hasattr(owner, attr) else None
        if current is None or current.shape != tuple(new.shape):
            held = "does not hold it" if current is None else f"holds it as {current.shape}"
            raise ValueError(f"{p.name}: mj_model {held}, the model as {tuple(new.shape)}")
        changed = (new != get_param(m, p.name)).cpu().numpy()
        value = new.detach().to("cpu", torch.float64).numpy()
        if current.ndim == 0:
            if changed:
                setattr(owner, attr, float(value))
        else:
            current[changed] = value[changed]
        if p.name in SET_CONST_INPUTS:
            mujoco.mj_setConst(model, mujoco.MjData(model))
    return model


def _trajectory_mujoco(mj_model: mujoco.MjModel, m: Model, params: Sequence[Parameter], data: Recording,
                       x: Tensor) -> dict[str, Tensor]:
    """``_trajectory`` rolled out by MuJoCo C (``mujoco_model`` at x, ``mj_step`` step by step): the same
    fields, qacc being the warm start each step leaves."""
    _, d0, ctrl = _flat_inputs(data)
    traj = rollout_feedback_mujoco(mujoco_model(mj_model, m, params, x), m, d0, ctrl, None, None)
    kept = tuple(dict.fromkeys((*STATE_FIELDS, *_measured(data))))
    return {"qacc": traj.qacc_warmstart, **{f: getattr(traj, f) for f in kept}}


def _rolled_out(m: Model, params: Sequence[Parameter], data: Recording, x: Tensor,
                mj_model: mujoco.MjModel | None) -> tuple[dict[str, Tensor], Tensor]:
    """The trajectory at x (``_trajectory``, or ``_trajectory_mujoco`` given mj_model) and the residual [nr]."""
    traj = _trajectory(m, params, data, x) if mj_model is None else _trajectory_mujoco(mj_model, m, params, data, x)
    return traj, _weighted_difference(m, data, _predicted(data, traj))


def _check_mujoco(mj_model: mujoco.MjModel | None, m: Model, params: Sequence[Parameter], x: Tensor, mode: str,
                  compile: CompileArg = False) -> None:
    if mj_model is None:
        return
    if compile is not False or mode not in ("auto", "steps"):
        raise ValueError("mj_model= rolls the residual out in MuJoCo C under per-step Jacobians: use it with "
                         "compile=False and mode 'auto' or 'steps'")
    mujoco_model(mj_model, m, params, x)  # a field MuJoCo holds in another shape fails here, not mid-fit


def _predicted(data: Recording, traj: dict[str, Tensor]) -> dict[str, Tensor]:
    """The measured signals of ``_trajectory``'s output, name -> [*batch, T, k] (as ``rollout`` gives them)."""
    return {s: traj[s].reshape(*_batch_shape(data), data.ctrl.shape[-2], -1) for s in _measured(data)}


def _steps_jacobian(m: Model, params: Sequence[Parameter], data: Recording, x: Tensor,
                    traj: dict[str, Tensor]) -> Tensor:
    """``jacobian(mode="steps")`` [nr, n] from ``traj``, the ``_trajectory`` at x [n]."""
    derivatives = _chain_step_jacobians(m, params, data, x, traj)
    return _weighted_difference_and_jacobian(m, data, _predicted(data, traj), derivatives)[1]


def _chain_step_jacobians(m: Model, params: Sequence[Parameter], data: Recording, x: Tensor,
                          traj: dict[str, Tensor]) -> dict[str, Tensor]:
    """The derivatives of the measured signals w.r.t. x (name -> [n, *batch, T, k]) along ``traj``, the
    ``_trajectory`` at x, by forward sensitivities from per-step Jacobians.

    Every step of every sequence, all T x size at once as one explicit batch, is differentiated by
    reverse mode (``diffmj.grad.transition``'s step by ``jacrev_chained``, from the step's known solution
    where ``reuses_solution``), s_t being the state before step t + 1 as a tangent (dq, dqvel, dact) [ns =
    2 nv + na] and theta the model's tensors that x sets: A_t = d s_t+1 / d s_t [size, T, ns, ns] and
    P_t = d s_t+1 / d theta, C_t = d sensordata_t / d s_t [size, T, nsensordata, ns] and Q_t = d
    sensordata_t / d theta, the theta columns contracted with d theta / dx (P_t [size, T, ns, n], Q_t
    [size, T, nsensordata, n]). The sensitivity S_t = d s_t / dx [size, ns, n] then follows S_0 = 0,
    S_t+1 = A_t S_t + P_t: T small matrix products instead of T steps under forward-mode AD. sensordata[t]
    (read before step t + 1) takes C_t S_t + Q_t, qpos[t] and qvel[t] (after it) S_t+1, whose position
    rows, tangents at the qpos before, are mapped to qpos's own coordinates at the qpos after.
    """
    measured = _measured(data)
    batch, d0, ctrl = _flat_inputs(data)
    size, T, nv = batch.numel(), ctrl.shape[-2], m.nv
    ctrl = ctrl.reshape(size * T, m.nu)
    model = apply(m, params, x)
    # the Data before each step [size * T]: d0's inputs, the state after the step before, this step's control
    before = {f: torch.cat((getattr(d0, f)[:, None], traj[f][:, :-1]), 1).reshape(size * T, *traj[f].shape[2:])
              for f in STATE_FIELDS}
    d = d0[:, None].expand(size, T).reshape(size * T).replace(**before, ctrl=ctrl)
    nominal = traj["qpos"].reshape(size * T, m.nq)
    mode = model.backward_mode
    if reuses_solution(model, mode):  # differentiate from the solution: no solver iterations under jacrev
        d = d.replace(qacc_warmstart=traj["qacc"].reshape(size * T, nv))
        model = from_solution(model)
    varying = _varying_positions(m, params, x)
    leaves, spec = pytree.tree_flatten(model)  # the varying leaves are replaced by jacrev's inputs below
    values = [leaves[i] for i in varying]
    dx0 = torch.zeros(2 * nv + m.na, dtype=m.dtype, device=m.device)

    def jacobians(d: Data, nominal: Tensor) -> tuple[Tensor, list[Tensor], Tensor, list[Tensor]]:
        f = transition(d, nominal, mode)
        model_of = lambda changed: _replaced(leaves, varying, changed, spec)  # noqa: E731
        return tuple(J for out in jacrev_chained(lambda dx, changed: f.step(model_of(changed), dx, d.ctrl),
                                                 lambda dx, changed, y: f.state(model_of(changed), dx, y), dx0,
                                                 values)
                     for J in out)

    A, P, C, Q = elementwise(jacobians, True)(d, nominal)  # P, Q: per varying leaf [size * T, rows, *leaf]
    # d out / d theta contracted with d theta / dx, for the leaves the step reads only: a derived constant that
    # nothing reads here (contact regularisation without contacts) then costs no backward through set_const
    read = [k for k in range(len(varying)) if P[k].any() or Q[k].any()]
    tangents = _varying_leaves(m, params, x, [varying[k] for k in read])[1]

    def contract(J: list[Tensor]) -> Tensor:  # [size * T, rows, n]
        total = J[0].new_zeros(*J[0].shape[:2], x.shape[0])
        for k, t in zip(read, tangents):
            total = total + J[k].reshape(*J[k].shape[:2], t[0].numel()) @ t.reshape(t.shape[0], -1).mT
        return total

    A, P, C, Q = (J.reshape(size, T, *J.shape[1:]) for J in (A, contract(P), C, contract(Q)))
    S = torch.zeros(size, 2 * nv + m.na, x.shape[0], dtype=m.dtype, device=m.device)
    states, sensors = [], []
    for t in range(T):
        sensors.append(C[:, t] @ S + Q[:, t])
        S = A[:, t] @ S + P[:, t]
        states.append(S)
    states = torch.stack(states, 1)  # [size, T, 2nv + na, n]
    # tangent-space position derivatives to qpos's own coordinates (quaternions: their tangent plane)
    one = torch.ones((), dtype=m.dtype, device=m.device)
    zero = torch.zeros_like(states[..., :nv, 0])
    qpos = torch.vmap(lambda dq: torch.func.jvp(lambda v: integrate_pos(m, traj["qpos"], v, one), (zero,), (dq,))[1],
                      in_dims=-1, out_dims=-1)(states[..., :nv, :])
    derivative = {"sensordata": torch.stack(sensors, 1), "qpos": qpos, "qvel": states[..., nv : 2 * nv, :]}
    return {s: derivative[s].movedim(-1, 0).reshape(x.shape[0], *batch, T, -1) for s in measured}


def _flat_inputs(data: Recording) -> tuple[torch.Size, Data, Tensor]:
    """(the batch shape of the sequences, d0 [size], ctrl [size, T, nu]) with the batch flattened to one
    dimension of size ``batch.numel()``, as ``rollout`` steps it."""
    batch = _batch_shape(data)
    size = batch.numel()
    return batch, data.d0.expand(batch).reshape(size), data.ctrl.expand(*batch, *data.ctrl.shape[-2:]).reshape(
        size, *data.ctrl.shape[-2:])


def _batch_shape(data: Recording) -> torch.Size:
    """The broadcast batch shape of d0, ctrl and the measurements."""
    return torch.broadcast_shapes(tuple(data.d0.batch_size), tuple(data.ctrl.shape[:-2]),
                                  *(tuple(getattr(data, s).shape[:-2]) for s in _measured(data)))


def _intervals(params, layout, x: Tensor, r: Tensor, J: Tensor, alpha: float, rank_tol: float):
    """Covariance s^2 (J'J)^-1 by eigendecomposition and the confidence intervals; see SysIdResult."""
    nr, n = J.shape
    dof = max(nr - n, 1)
    s2 = (r @ r) / dof
    lam, V = torch.linalg.eigh(J.mT @ J)
    null = lam <= rank_tol * lam.max().clamp_min(torch.finfo(lam.dtype).tiny)
    inv = torch.where(null, torch.zeros_like(lam), 1 / lam)
    covariance = s2 * (V * inv) @ V.mT
    # a component of x touched by a null eigenvector is undetermined: infinite variance
    unseen = ((V.abs() > 1e-8) & null).any(-1)
    variance = torch.where(unseen, torch.full_like(lam, math.inf), covariance.diagonal())
    half = float(scipy.stats.t.ppf(1 - alpha / 2, dof)) * variance.sqrt()
    confidence, unidentified = {}, []
    sizes = [shape.numel() for _, shape, _ in layout]
    for (p, shape, _), xi, hi, un in zip(layout, x.split(sizes), half.split(sizes), unseen.split(sizes)):
        low, high = xi - hi, xi + hi
        if p.log:
            low, high = low.exp(), high.exp()
        confidence[p.label] = (low.reshape(shape), high.reshape(shape))
        if un.any():
            unidentified.append(p.label)
    return covariance, confidence, bool(null.any()), tuple(unidentified)


def box_qp(M: Tensor, g: Tensor, low: Tensor, high: Tensor, max_iterations: int = 100) -> Tensor:
    """argmin over low <= d <= high of 0.5 d'M d + g'd: d [n]; M [n, n] symmetric positive definite, g, low
    (may be -inf), high (may be inf) [n], low <= 0 <= high.

    Projected Newton (Bertsekas 1982; the method of MuJoCo's ``mju_boxQP``), for the few variables of a
    Levenberg-Marquardt step: components at a bound whose gradient points outward are held there and a
    Newton step is taken on the others. Inside the box it is taken whole; else its projection onto the box
    if that lowers the value enough (Armijo), else the step up to the first bound it meets (the value falls
    all the way there: along the step's ray the minimum is at its end), else a backtracking search along
    the projection. Stops when a whole step stays inside the box and leaves the held set unchanged (the
    KKT conditions then hold), when no step lowers the value (they hold to roundoff), or after
    ``max_iterations`` (d then lies in the box, no worse than 0, but is not necessarily the minimiser).
    """
    d = torch.zeros_like(g)
    value = lambda d: 0.5 * d @ M @ d + g @ d  # noqa: E731
    held_before, whole = None, False
    for _ in range(max_iterations):
        q = M @ d + g
        held = ((d <= low) & (q > 0)) | ((d >= high) & (q < 0))
        if whole and torch.equal(held, held_before):
            break
        free = ~held
        newton = torch.zeros_like(d)
        newton[free] = torch.linalg.solve(M[free][:, free], -q[free])
        # the fraction of the step that stays inside the box
        room = torch.where(newton > 0, (high - d) / newton, torch.where(newton < 0, (low - d) / newton, math.inf))
        reach = min(1.0, max(0.0, room.min().item()))
        start = value(d)
        enough = lambda trial: value(trial) <= start + 1e-4 * (q @ (trial - d))  # noqa: E731
        trial, whole = (d + newton).clamp(low, high), reach == 1.0
        if not whole and not enough(trial):
            if reach > 0:
                trial = (d + reach * newton).clamp(low, high)
            else:
                alpha = 0.5
                while not enough(trial := (d + alpha * newton).clamp(low, high)):
                    alpha *= 0.5
                    if alpha < 1e-12:
                        return d
        d, held_before = trial, held
    return d


def fit(
    m: Model,
    params: Sequence[Parameter],
    data: Recording,
    *,
    max_iterations: int = 100,
    ftol: float = 1e-12,
    xtol: float = 1e-10,
    gtol: float = 1e-12,
    mode: str = "auto",
    compile: CompileArg = False,
    alpha: float = 0.05,
    rank_tol: float = 1e-12,
    callback: Callable[[int, float, Tensor], None] | None = None,
    mj_model: mujoco.MjModel | None = None,
) -> SysIdResult:
    """Fit ``params`` to ``data`` by Levenberg-Marquardt on exact Jacobians, with box bounds.

    Each iteration minimises the model 0.5 |r + J dx|^2 + 0.5 mu dx' diag(J'J) dx (Marquardt's
    scaling, so the damping does not depend on the parameters' units) within the bounds
    (``box_qp``, as ``mujoco.minimize`` does; clipping the unbounded step instead ended fits with
    contacts at twice the cost, benchmarks/README.md) and accepts the step if the cost 0.5 |r|^2
    decreases; mu follows Nielsen's schedule (shrunk by max(1/3, 1 - (2 rho -
    1)^3) after a step whose actual / predicted decrease is rho, doubled-and-growing after a
    rejection). Stops when the gradient's largest projected component is <= gtol, a step is <=
    xtol (|x| + xtol), an accepted step lowers the cost by <= ftol times it, or mu exceeds 1e16.
    callback(iteration, cost, x) after each iteration. Warns when J'J is singular at the end.
    compile: False evaluates the residual at trial points (one rollout each) and its Jacobian at accepted
    points (``mode``; with ``"auto"`` / ``"steps"`` from the accepted trial's own rollout, kept); True (or
    ``torch.compile``'s keyword arguments) evaluates both at every trial point by
    ``residual_and_jacobian_function`` with compiled steps (forward mode, ``mode`` "auto" or "forward";
    ``wall_time`` includes the compile, paid by the process's first fit of a model and batch shape).
    mj_model: the MjModel m was made from: the residual's rollouts run in MuJoCo C (``mujoco_model`` at each
    trial point, ``mj_step``), the Jacobians stay diffmj's exact ones along them (``mode`` "auto" / "steps",
    not compiled). The same physics, a rounding apart, without eager PyTorch's per-step cost.
    See ``SysIdResult`` for the output and the confidence intervals' formula.
    """
    start = time.perf_counter()
    layout = _layout(m, params)
    x = initial_vector(m, params)
    lower, upper = bounds(m, params)
    _check_mujoco(mj_model, m, params, x, mode, compile)

    if compile is False and mode in ("auto", "steps"):
        _check_recording(m, data)

        def evaluate(x: Tensor) -> tuple[Tensor, float, dict[str, Tensor]]:
            traj, r = _rolled_out(m, params, data, x, mj_model)
            return r, 0.5 * float(r @ r), traj

        def jacobian_at(x: Tensor, traj: dict[str, Tensor]) -> Tensor:  # the rollout at x is the residual's
            return _steps_jacobian(m, params, data, x, traj)
    elif compile is False:
        def evaluate(x: Tensor) -> tuple[Tensor, float, None]:
            with torch.no_grad():
                r = residual(m, params, data, x)
            return r, 0.5 * float(r @ r), None

        def jacobian_at(x: Tensor, _) -> Tensor:
            return jacobian(m, params, data, x, mode)
    else:
        if mode not in ("auto", "forward"):
            raise ValueError(f"compile= evaluates Jacobians in forward mode: use mode='auto' or 'forward', got {mode!r}")
        joint = residual_and_jacobian_function(m, params, data, compile)

        def evaluate(x: Tensor) -> tuple[Tensor, float, Tensor | None]:
            r, J = joint(x)
            return r, 0.5 * float(r @ r), J

        def jacobian_at(x: Tensor, J: Tensor | None) -> Tensor:
            return J

    r, cost, found = evaluate(x)
    J = jacobian_at(x, found)
    history = [cost]
    mu, grow, status = 1e-3, 2.0, "max_iterations"
    iteration = 0
    for iteration in range(1, max_iterations + 1):
        g = J.mT @ r
        # the gradient's components that the bounds do not block
        free = ~(((x <= lower) & (g > 0)) | ((x >= upper) & (g < 0)))
        if (g * free).abs().max() <= gtol:
            status, iteration = "gradient", iteration - 1
            break
        H = J.mT @ J
        scale = H.diagonal().clamp_min(torch.finfo(H.dtype).eps * H.diagonal().max())
        dx = box_qp(H + mu * torch.diag(scale), g, lower - x, upper - x)
        move = (x + dx).clamp(lower, upper) - x  # x + dx can round past a bound
        if move.norm() <= xtol * (x.norm() + xtol):
            status, iteration = "step", iteration - 1
            break
        r_new, cost_new, found_new = evaluate(x + move)
        predicted = -float(g @ move + 0.5 * move @ H @ move)
        if cost_new < cost:
            rho = (cost - cost_new) / predicted if predicted > 0 else 1.0
            mu *= max(1 / 3, 1 - (2 * rho - 1) ** 3)
            grow = 2.0
            decrease = cost - cost_new
            x, r, cost = x + move, r_new, cost_new
            J = jacobian_at(x, found_new)
            history.append(cost)
            if callback is not None:
                callback(iteration, cost, x)
            if decrease <= ftol * (cost + decrease):
                status = "cost"
                break
        else:
            mu *= grow
            grow *= 2.0
            history.append(cost)
            if callback is not None:
                callback(iteration, cost, x)
            if mu > 1e16:
                status = "regularization"
                break
    covariance, confidence, singular, unidentified = _intervals(params, layout, x, r, J, alpha, rank_tol)
    if singular:
        warnings.warn(f"J'J is singular: the residual does not determine {list(unidentified) or 'a combination of the parameters'}; "
                      "their confidence intervals are infinite", RuntimeWarning, stacklevel=2)
    return SysIdResult(
        x=x, params=values(m, params, x), cost=cost, cost_history=torch.tensor(history, dtype=torch.float64),
        iterations=iteration, status=status, converged=status in ("gradient", "step", "cost"),
        wall_time=time.perf_counter() - start, jacobian=J, covariance=covariance, confidence=confidence,
        singular=singular, unidentified=unidentified)


def least_squares_functions(m: Model, params: Sequence[Parameter], data: Recording, mode: str = "auto",
                            mj_model: mujoco.MjModel | None = None):
    """The problem in ``mujoco.minimize.least_squares``' terms: (x0, residual, jacobian, bounds), numpy.

    x0 [n] float64; residual(x [n, k]) -> [nr, k] float64 (vectorised over columns, as
    least_squares evaluates several points at once); jacobian(x [n, 1], r [nr, 1]) -> [nr, n]
    float64, diffmj's exact Jacobian; bounds: [lower [n], upper [n]] or None when unbounded
    (least_squares needs finite bounds: infinite ones are passed as +-1e300). Use as
    ``mujoco.minimize.least_squares(x0, residual, jacobian=jacobian, bounds=bounds)``.
    mj_model: as ``fit``'s, the rollouts (residuals, and those the Jacobians follow) in MuJoCo C.
    """
    _check_recording(m, data)
    _check_mujoco(mj_model, m, params, initial_vector(m, params), mode)
    x0 = initial_vector(m, params).double().cpu().numpy()
    lower, upper = (b.double().cpu().numpy() for b in bounds(m, params))

    def to_torch(x: np.ndarray) -> Tensor:
        return torch.as_tensor(np.asarray(x, dtype=np.float64), device=m.device).to(m.dtype)

    def residual_np(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x).reshape(x0.shape[0], -1)
        with torch.no_grad():
            columns = [residual(m, params, data, to_torch(x[:, k])) if mj_model is None
                       else _rolled_out(m, params, data, to_torch(x[:, k]), mj_model)[1] for k in range(x.shape[1])]
        return torch.stack(columns, -1).double().cpu().numpy()

    def jacobian_np(x: np.ndarray, r: np.ndarray | None = None) -> np.ndarray:
        x = to_torch(np.asarray(x).reshape(-1))
        J = (jacobian(m, params, data, x, mode) if mj_model is None
             else _steps_jacobian(m, params, data, x, _trajectory_mujoco(mj_model, m, params, data, x)))
        return J.double().cpu().numpy()

    box = None
    if np.isfinite(lower).any() or np.isfinite(upper).any():
        box = [np.nan_to_num(lower, neginf=-1e300), np.nan_to_num(upper, posinf=1e300)]
    return x0, residual_np, jacobian_np, box
