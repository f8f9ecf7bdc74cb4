"""System identification: mujoco.sysid against diffmj's exact Jacobians, same recordings, one process.

Run in the ``sysid`` anchor's venv (``python benchmarks/setup_anchors.py sysid``: torch, MuJoCo
with its sysid extra, and this checkout of diffmj), from the repository root:

    benchmarks/.venvs/sysid/bin/python benchmarks/sysid.py                 # every problem
    benchmarks/.venvs/sysid/bin/python benchmarks/sysid.py --problems spring_mass arm

Each problem is recorded once in MuJoCo C (``mujoco.rollout`` from one initial state, as
mujoco.sysid's tests generate their data), split into chunks of ``chunk_steps`` steps with
mujoco.sysid's ``SystemTrajectory.split`` (each chunk starts from the recorded state), and the
same parameters are fitted from the same initial guess within the same bounds by

- ``mujoco.sysid``: ``sysid.optimize(..., optimizer="mujoco")`` on ``build_residual_fn`` of a
  ``ModelSequences`` holding the chunks, as its own tests call it (``mujoco.minimize`` on
  finite-difference Jacobians; every residual recompiles the model from its MjSpec);
- ``diffmj.optim.sysid.fit``: Levenberg-Marquardt on exact Jacobians (every step's Jacobians in one
  reverse-mode batch, chained along the residual's rollout), the chunks one batched recording;
- ``mujoco.minimize.least_squares`` given diffmj's residual and exact Jacobian
  (``sysid.least_squares_functions``).

diffmj's residual is weighted like mujoco.sysid's (``normalize_residual``: each signal of each
chunk divided by its measured norm / sqrt 2), so all three minimise the same cost; the run checks
that the residuals agree at the initial guess. diffmj's model is the XML compiled at the initial
guess, its parameters then set by ``diffmj.set_param`` (which, unlike recompiling, keeps the
compile-time ``*_invweight0``; see the README).

The problems: three from mujoco.sysid's own tests (XML read from the installed package's test
files, so they are the same text) and a bouncing ball of ours, where every datum comes through
contact. Prints a markdown table and writes ``benchmarks/results/sysid.json``.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import mujoco
import mujoco.minimize
import mujoco.rollout
import numpy as np
import torch
from torch import Tensor
from mujoco import sysid as mjsysid

import diffmj
from diffmj.optim import sysid

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from step_throughput import machine_info  # noqa: E402

SYSID_TESTS = Path(mujoco.__file__).parent / "sysid" / "tests"
THREADS = 2


def sysid_test_constant(filename: str, name: str):
    """A module-level constant of mujoco.sysid's test file ``filename``, read without importing it
    (the tests import pytest)."""
    for node in ast.parse((SYSID_TESTS / filename).read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"{name} not found in {SYSID_TESTS / filename}")


@dataclass(frozen=True)
class Param:
    """One identified parameter on both sides.

    diffmj: ``sysid.Parameter(field, obj, index)``; mujoco.sysid: ``set_spec(spec, value)`` on the
    MjSpec. ``true`` generates the recording; the fit starts from ``initial`` within ``bounds``.
    """

    label: str
    field: str
    obj: str
    index: int | None
    set_spec: Callable[[mujoco.MjSpec, float], None]
    true: float
    initial: float
    bounds: tuple[float, float]


@dataclass(frozen=True)
class Problem:
    """A recording and the parameters to fit.

    ctrl(t [n]) -> [n, nu]; the recording has ``round(duration / timestep)`` control samples and
    one step fewer (mujoco.sysid's ``_generate_data``). qvel0: the initial velocity (zero if None).
    add_sensors: sensors added to the MjSpec (mujoco.sysid's box model has none).
    """

    name: str
    source: str
    xml: str
    params: tuple[Param, ...]
    ctrl: Callable[[np.ndarray], np.ndarray]
    duration: float
    chunk_steps: int
    qvel0: tuple[float, ...] | None = None
    add_sensors: Callable[[mujoco.MjSpec], None] | None = None
    notes: str = ""


def _set_body_mass(body: str) -> Callable[[mujoco.MjSpec, float], None]:
    return lambda spec, value: setattr(spec.body(body), "mass", value)


def _set_armature(joint: str) -> Callable[[mujoco.MjSpec, float], None]:
    return lambda spec, value: setattr(spec.joint(joint), "armature", value)


def _set_pair(pair: str, attribute: str, index: int) -> Callable[[mujoco.MjSpec, float], None]:
    return lambda spec, value: getattr(spec.pair(pair), attribute).__setitem__(index, value)


def _add_frame_sensors(body: str) -> Callable[[mujoco.MjSpec], None]:
    """framepos and framelinvel of ``body``, named (mujoco.sysid maps signals by sensor name)."""
    def add(spec: mujoco.MjSpec) -> None:
        for suffix, kind in (("pos", mujoco.mjtSensor.mjSENS_FRAMEPOS), ("linvel", mujoco.mjtSensor.mjSENS_FRAMELINVEL)):
            spec.add_sensor(name=f"{body}_{suffix}", type=kind, objtype=mujoco.mjtObj.mjOBJ_BODY, objname=body)
    return add


BALL_XML = """\
<mujoco model="bouncing_ball">
  <option timestep="0.002"/>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 .1"/>
    <body name="ball" pos="0 0 0.3">
      <freejoint name="ball_free"/>
      <geom name="ball" type="sphere" size="0.05" mass="0.2"/>
    </body>
  </worldbody>
  <actuator><motor name="push_x" joint="ball_free" gear="1 0 0 0 0 0"/></actuator>
  <contact>
    <pair name="ball_floor" geom1="ball" geom2="floor" friction="0.8 0.005 0.0001" solref="0.02 0.3"/>
  </contact>
  <sensor>
    <framepos name="ball_pos" objtype="body" objname="ball"/>
    <framelinvel name="ball_linvel" objtype="body" objname="ball"/>
  </sensor>
</mujoco>
"""


def problems() -> dict[str, Problem]:
    arm_true = sysid_test_constant("test_integration.py", "TRUE_ARMATURE")
    return {p.name: p for p in (
        Problem(
            "spring_mass", "mujoco/sysid/tests/test_integration.py: SPRING_MASS_XML, test_spring_mass_recover_mass",
            sysid_test_constant("test_integration.py", "SPRING_MASS_XML"),
            (Param("mass", "body_mass", "ball", None, _set_body_mass("ball"), 1.0, 2.0, (0.3, 3.0)),),
            lambda t: (5.0 * np.sin(2 * np.pi * 1.5 * t) + 3.0 * np.sin(2 * np.pi * 3.7 * t))[:, None],
            duration=3.0, chunk_steps=50),
        Problem(
            "arm", "mujoco/sysid/tests/test_integration.py: ARM_XML, test_arm_recover_armature",
            sysid_test_constant("test_integration.py", "ARM_XML"),
            tuple(Param(f"{j}_armature", "dof_armature", j, None, _set_armature(j), arm_true[j], 0.01, (0.001, 1.0))
                  for j in arm_true),
            lambda t: np.column_stack([
                5.0 * np.sin(2 * np.pi * 0.5 * t), 4.0 * np.sin(2 * np.pi * 0.7 * t + 0.5),
                3.0 * np.sin(2 * np.pi * 0.4 * t + 1.0), 2.0 * np.sin(2 * np.pi * 0.9 * t + 1.5),
                1.0 * np.sin(2 * np.pi * 0.6 * t + 2.0)]),
            duration=2.0, chunk_steps=50),
        Problem(
            "box", "mujoco/sysid/tests/conftest.py: BOX_XML (its box_params name mass and pair box_floor); data ours",
            sysid_test_constant("conftest.py", "BOX_XML"),
            (Param("box_mass", "body_mass", "box", None, _set_body_mass("box"), 5.0, 4.6, (4.5, 5.5)),
             Param("friction1", "pair_friction", "box_floor", 0, _set_pair("box_floor", "friction", 0), 0.6, 0.4,
                   (0.2, 0.9))),
            lambda t: (20.0 * np.sin(2 * np.pi * 4.0 * t))[:, None],
            duration=0.3, chunk_steps=50, qvel0=(0.0, 3.0, 0.0, 0.0, 0.0, 0.0), add_sensors=_add_frame_sensors("box"),
            notes="conftest defines the model but no data: the box is thrown along y at 3 m/s (the pair's first "
            "tangent, whose friction is fitted; its second, 0.005, lets the motor push it along x almost freely); "
            "true friction 0.6, not the XML's 1.6, above the box's half width / height (1), under which it tumbles "
            "(130 degrees within 0.3 s); it still hops (7 mm, contacts in about 1 step of 10), so the residual "
            "depends on impact times; framepos / framelinvel sensors added"),
        Problem(
            "bouncing_ball", "ours (benchmarks/sysid.py: BALL_XML)", BALL_XML,
            (Param("solref_timeconst", "pair_solref", "ball_floor", 0, _set_pair("ball_floor", "solref", 0), 0.02,
                   0.03, (0.005, 0.1)),
             Param("solref_dampratio", "pair_solref", "ball_floor", 1, _set_pair("ball_floor", "solref", 1), 0.3,
                   0.6, (0.05, 2.0)),
             Param("friction1", "pair_friction", "ball_floor", 0, _set_pair("ball_floor", "friction", 0), 0.8, 0.5,
                   (0.1, 2.0))),
            lambda t: (0.2 * np.sin(2 * np.pi * 2.0 * t))[:, None],
            duration=1.0, chunk_steps=50, qvel0=(1.0, 0.3, 0.0, 5.0, -20.0, 0.0),
            notes="a ball with backspin bouncing on a plane: impacts (solref) and sliding at each impact (friction)"),
    )}


def compile_spec(problem: Problem, values: dict[str, float]) -> tuple[mujoco.MjSpec, mujoco.MjModel]:
    """The problem's MjSpec (sensors added) and its model with the parameters set to ``values``."""
    spec = mujoco.MjSpec.from_string(problem.xml)
    if problem.add_sensors is not None:
        problem.add_sensors(spec)
    for p in problem.params:
        p.set_spec(spec, values[p.label])
    return spec, spec.compile()


@dataclass
class Recording:
    """The chunks both sides fit: mujoco.sysid's trajectories and the same arrays for diffmj."""

    chunks: list  # mujoco.sysid SystemTrajectory per chunk
    initial_state: np.ndarray  # [B, nstate] mjSTATE_FULLPHYSICS
    ctrl: np.ndarray  # [B, T, nu]
    sensordata: np.ndarray  # [B, T, nsensordata]
    steps: int  # recorded steps (before the incomplete last chunk is dropped)


def record(problem: Problem, max_chunks: int | None = None) -> Recording:
    """MuJoCo C's recording with the true parameters, split into chunks (mujoco.sysid's ``_generate_data``
    followed by ``SystemTrajectory.split``); the first ``max_chunks`` of them if given."""
    spec, mjm = compile_spec(problem, {p.label: p.true for p in problem.params})
    mjd = mujoco.MjData(mjm)
    if problem.qvel0 is not None:
        mjd.qvel[:] = problem.qvel0
    n = round(problem.duration / mjm.opt.timestep)
    t = np.arange(n) * mjm.opt.timestep
    ctrl = problem.ctrl(t)
    initial_state = mjsysid.create_initial_state(mjm, mjd.qpos, mjd.qvel, mjd.act)
    state, sensor = mujoco.rollout.rollout(mjm, mjd, initial_state, ctrl[:-1])
    state, sensor = np.squeeze(state, 0), np.squeeze(sensor, 0)
    sequences = mjsysid.ModelSequences(
        problem.name, spec, "recorded", initial_state, mjsysid.TimeSeries(t, ctrl),
        mjsysid.TimeSeries.from_names(state[:, 0], sensor, mjm))
    # split starts each chunk from the recorded state before it
    whole = sequences.measured_rollout[0].replace(state=mjsysid.TimeSeries(state[:, 0], state))
    # split drops the sensor names that the residual needs (mujoco 4.0.0): put them back
    chunks = [c.replace(sensordata=mjsysid.TimeSeries(c.sensordata.times, c.sensordata.data,
                                                      whole.sensordata.signal_mapping))
              for c in whole.split(problem.chunk_steps)[:max_chunks]]
    return Recording(
        chunks=chunks,
        initial_state=np.stack([c.initial_state for c in chunks]),
        ctrl=np.stack([c.control.data for c in chunks]),
        sensordata=np.stack([c.sensordata.data for c in chunks]),
        steps=len(sensor))


def max_relative_error(problem: Problem, found: dict[str, float]) -> float:
    return max(abs(found[p.label] - p.true) / abs(p.true) for p in problem.params)


class Counter:
    """Wraps a residual function: how many calls and points (columns) it evaluated, and when each single
    point's evaluation returned (``evaluated``: (seconds since ``start``, when the Counter was made; x [n]), for ``trace``)."""

    def __init__(self, fn: Callable):
        self.fn, self.calls, self.points, self.evaluated = fn, 0, 0, []
        self.start = time.perf_counter()

    def __call__(self, x, *args, **kwargs):
        self.calls += 1
        self.points += 1 if np.ndim(x) == 1 else np.shape(x)[1]
        out = self.fn(x, *args, **kwargs)
        if np.ndim(x) == 1 or np.shape(x)[1] == 1:
            self.evaluated.append((time.perf_counter() - self.start, np.array(x, dtype=np.float64).reshape(-1)))
        return out

    def trace(self, problem: Problem, iterates: list[np.ndarray], found: Callable[[np.ndarray], dict]
              ) -> list[tuple[float, float]]:
        """[(seconds, largest relative error)] of the optimiser's iterates (x [n] each; found(x): label ->
        value), each at the time its residual was first evaluated: when the optimiser could first have
        stopped there (an iterate the residual never saw alone, none here, is left out)."""
        out = []
        for x in iterates:
            seen = next((t for t, y in self.evaluated if np.array_equal(y, x)), None)
            if seen is not None:
                out.append((seen, max_relative_error(problem, found(x))))
        return out


@dataclass
class MujocoSysid:
    """mujoco.sysid's problem on the chunks, built as its tests build theirs."""

    params: object  # mjsysid.ParameterDict at the initial guess
    residual_fn: Callable  # build_residual_fn(...)

    @classmethod
    def build(cls, problem: Problem, rec: Recording, resample: bool) -> MujocoSysid:
        """resample: ``build_residual_fn``'s ``resample_true`` (its default True resamples the controls and the
        predictions in time; False takes them sample by sample and leaves out each chunk's first sample)."""
        spec, _ = compile_spec(problem, {p.label: p.initial for p in problem.params})
        params = mjsysid.ParameterDict()
        for p in problem.params:
            params.add(mjsysid.Parameter(p.label, nominal=p.true, min_value=p.bounds[0], max_value=p.bounds[1],
                                         modifier=lambda s, q, p=p: p.set_spec(s, q.value[0])))
            params[p.label].value[:] = p.initial
        chunks = rec.chunks
        sequences = mjsysid.ModelSequences(
            problem.name, spec, [f"chunk{i}" for i in range(len(chunks))], [c.initial_state for c in chunks],
            [c.control for c in chunks], [c.sensordata for c in chunks])
        return cls(params, mjsysid.build_residual_fn(models_sequences=[sequences], n_threads=THREADS,
                                                     resample_true=resample))

    def residual(self, x: np.ndarray) -> np.ndarray:
        """measured - predicted, normalised, at x [n], flattened as ``optimize`` does."""
        residuals, _, _ = self.residual_fn(np.asarray(x, dtype=np.float64), self.params.copy())
        return np.concatenate(residuals)

    def kept(self, rec: Recording) -> np.ndarray:
        """[B, T] bool: the recorded samples the residual compares (resampling keeps those whose time lies in
        the predicted rollout's span, which float rounding cuts by one sample in some chunks)."""
        _, _, measured = self.residual_fn(self.params.as_vector(), self.params.copy(), return_pred_all=True)
        # one list per chunk, of one TimeSeries per evaluated point
        return np.stack([np.isin(c.sensordata.times, w[0].times) for c, w in zip(rec.chunks, measured)])

    def optimize(self, problem: Problem, max_iters: int) -> dict:
        """``sysid.optimize(..., optimizer="mujoco")`` with its defaults but for the iteration limit (and the
        chunk count: ``rollouts`` are chunk rollouts)."""
        count = Counter(self.residual_fn)
        start = count.start
        opt_params, result = mjsysid.optimize(initial_params=self.params, residual_fn=count, optimizer="mujoco",
                                              verbose=False, max_iters=max_iters, output=io.StringIO())
        wall = time.perf_counter() - start
        found = {p.label: float(opt_params[p.label].value[0]) for p in problem.params}
        chunks = len(self.residual_fn(self.params.as_vector(), self.params.copy())[0])
        return {
            "params": found, "max_relative_error": max_relative_error(problem, found),
            "iterations": len(result.extras["objective"]), "residual_evaluations": count.points,
            "rollouts": count.points * chunks, "jacobian_evaluations": None, "wall_s": wall,
            "cost": 0.5 * float(np.sum(self.residual(result.x) ** 2)),
            "trace": count.trace(problem, result.extras["candidate"],
                                 lambda x: {p.label: float(v) for p, v in zip(problem.params, x)}),
        }


def diffmj_problem(problem: Problem, rec: Recording, kept: np.ndarray
                   ) -> tuple[mujoco.MjModel, diffmj.Model, list[sysid.Parameter], sysid.Recording]:
    """The XML compiled at the initial guess, diffmj's model of it, parameters and the chunks as one batched
    recording, weighted as mujoco.sysid's residual: the samples it keeps (kept [B, T]), each signal of
    each chunk divided by their norm / sqrt 2 (``normalize_residual``)."""
    _, mjm = compile_spec(problem, {p.label: p.initial for p in problem.params})
    m = diffmj.put_model(mjm)
    params = [sysid.Parameter(p.field, p.obj, p.index, initial=p.initial, lower=p.bounds[0], upper=p.bounds[1])
              for p in problem.params]
    batch = rec.initial_state.shape[0]
    d0 = diffmj.set_state(m, diffmj.make_data(m, batch_shape=(batch,)), torch.tensor(rec.initial_state),
                          diffmj.State.FULLPHYSICS)
    mask = kept[..., None].astype(np.float64)
    weights = mask * math.sqrt(2) / np.linalg.norm(rec.sensordata * mask, axis=1, keepdims=True)  # [B, T, ns]
    data = sysid.Recording(d0, torch.tensor(rec.ctrl), sensordata=torch.tensor(rec.sensordata),
                           weights={"sensordata": torch.tensor(weights)})
    return mjm, m, params, data


def labels(problem: Problem, params: list[sysid.Parameter]) -> dict[str, str]:
    """diffmj's label -> the problem's label."""
    return {q.label: p.label for p, q in zip(problem.params, params)}


def found_at(problem: Problem, m: diffmj.Model, params: list[sysid.Parameter], x) -> dict[str, float]:
    """The problem's label -> value at diffmj's parameter vector x [n] (a tensor or an array)."""
    names = labels(problem, params)
    return {names[k]: v.item() for k, v in sysid.values(m, params, torch.as_tensor(x)).items()}


def run_diffmj_fit(problem: Problem, m: diffmj.Model, params: list[sysid.Parameter], data: sysid.Recording,
                   max_iters: int, compiled: bool = False, mj_model: mujoco.MjModel | None = None) -> dict:
    """``sysid.fit``, eager (a residual per trial point, a Jacobian per accepted one; with ``mj_model`` the residual's
    rollouts in MuJoCo C) or compiled (residual and
    Jacobian together per trial point, each step one Inductor graph). Compiled, it fits twice: the first fit's
    wall time includes compiling (into this run's fresh TORCHINDUCTOR_CACHE_DIR), the second's is what a fit
    costs once the graphs exist (``wall_cached_s``); torch runs on one thread there, as Inductor's OpenMP
    regions around kernels this small cost more than they save on loaded cores.
    The trace's times are those of ``fit``'s callback, which follows the Jacobian at an accepted point: later
    than the iterate's residual, the time the other methods' traces take."""
    threads = torch.get_num_threads()
    trace, start = [], time.perf_counter()

    def record(iteration: int, cost: float, x: Tensor) -> None:
        trace.append((time.perf_counter() - start, max_relative_error(problem, found_at(problem, m, params, x))))

    if compiled:
        torch.set_num_threads(1)
    try:
        result = sysid.fit(m, params, data, max_iterations=max_iters, compile=compiled, mj_model=mj_model,
                           callback=record)
        cached = sysid.fit(m, params, data, max_iterations=max_iters, compile=compiled) if compiled else None
    finally:
        torch.set_num_threads(threads)
    found = found_at(problem, m, params, result.x)
    accepted = int((result.cost_history.diff() < 0).sum())
    out = {
        "params": found, "max_relative_error": max_relative_error(problem, found), "iterations": result.iterations,
        "residual_evaluations": result.iterations + 1, "rollouts": (result.iterations + 1) * data.ctrl.shape[0],
        "jacobian_evaluations": result.iterations + 1 if compiled else accepted + 1, "wall_s": result.wall_time,
        "cost": result.cost, "status": result.status, "trace": trace,
    }
    if compiled:
        # Dynamo's timers, summed over the process's compiles so far (one problem per process: its own)
        stages, seconds = torch._dynamo.utils.compile_times(repr="csv", aggregate=True)
        out.update(threads=1, wall_cached_s=cached.wall_time, compile_s=result.wall_time - cached.wall_time,
                   same_result_cached=bool(torch.equal(result.x, cached.x)),
                   compile_stages_s={k: float(v) for k, v in zip(stages, seconds)})
    return out


def run_minimize_exact(problem: Problem, m: diffmj.Model, params: list[sysid.Parameter], data: sysid.Recording,
                       max_iters: int, mj_model: mujoco.MjModel | None = None) -> dict:
    """mujoco.minimize.least_squares on diffmj's residual and exact Jacobian (with ``mj_model``: both along
    MuJoCo C's rollouts)."""
    x0, residual, jacobian, box = sysid.least_squares_functions(m, params, data, mj_model=mj_model)
    residual, jacobian = Counter(residual), Counter(jacobian)
    start = residual.start
    x, trace = mujoco.minimize.least_squares(x0, residual, jacobian=jacobian, bounds=box, max_iter=max_iters,
                                             verbose=0)
    wall = time.perf_counter() - start
    found = found_at(problem, m, params, x)
    return {
        "params": found, "max_relative_error": max_relative_error(problem, found), "iterations": len(trace),
        "residual_evaluations": residual.points, "rollouts": residual.points * data.ctrl.shape[0],
        "jacobian_evaluations": jacobian.calls, "wall_s": wall, "cost": 0.5 * float(np.sum(residual.fn(x) ** 2)),
        "trace": residual.trace(problem, [log.candidate.reshape(-1) for log in trace] + [x],
                                lambda x: found_at(problem, m, params, x)),
    }


METHODS = {
    "mujoco_sysid": "mujoco.sysid (FD Jacobian, mujoco.minimize)",
    "mujoco_sysid_no_resample": "mujoco.sysid, resample_true=False",
    "diffmj_fit": "diffmj sysid.fit (exact Jacobian, LM)",
    "diffmj_fit_mujoco": "diffmj sysid.fit, rollouts in MuJoCo C (mj_model=)",
    "diffmj_fit_compiled": "diffmj sysid.fit(compile=True)",
    "minimize_exact": "mujoco.minimize + diffmj's exact Jacobian",
    "minimize_exact_mujoco": "mujoco.minimize + diffmj's exact Jacobian, rollouts in MuJoCo C",
}


def run_problem(problem: Problem, methods: list[str], max_iters: int, max_chunks: int | None,
                save: Callable[[dict], None]) -> None:
    """Runs the methods on the problem; save(the problem's results so far) after each, so that a run stopped
    during a long fit keeps the rows before it."""
    rec = record(problem, max_chunks)
    batch, horizon = rec.ctrl.shape[:2]
    print(f"{problem.name}: {rec.steps} steps recorded, {batch} chunks of {horizon}", flush=True)
    theirs = MujocoSysid.build(problem, rec, resample=True)
    mjm, m, params, data = diffmj_problem(problem, rec, theirs.kept(rec))
    out = {"source": problem.source, "notes": problem.notes, "recorded_steps": rec.steps, "chunks": batch,
           "chunk_steps": horizon, "true": {p.label: p.true for p in problem.params},
           "initial": {p.label: p.initial for p in problem.params},
           "bounds": {p.label: p.bounds for p in problem.params}, "methods": {}}
    # the same cost on both sides: diffmj's residual is minus mujoco.sysid's (with zeros where it drops a sample)
    x0 = sysid.initial_vector(m, params)
    with torch.no_grad():
        ours = sysid.residual(m, params, data, x0).numpy()
    reference = theirs.residual(x0.numpy())
    out["residual_difference_at_initial"] = float(np.abs(ours[np.repeat(theirs.kept(rec).reshape(-1), m.nsensordata)]
                                                         + reference).max())
    out["residual_norm_at_initial"] = float(np.linalg.norm(reference))
    print(f"  residuals at the initial guess: |r| {out['residual_norm_at_initial']:.3e}, "
          f"largest difference diffmj vs mujoco.sysid {out['residual_difference_at_initial']:.1e}", flush=True)
    runs = {
        "mujoco_sysid": lambda: theirs.optimize(problem, max_iters),
        "mujoco_sysid_no_resample": lambda: MujocoSysid.build(problem, rec, resample=False).optimize(problem, max_iters),
        "diffmj_fit": lambda: run_diffmj_fit(problem, m, params, data, max_iters),
        "diffmj_fit_mujoco": lambda: run_diffmj_fit(problem, m, params, data, max_iters, mj_model=mjm),
        "diffmj_fit_compiled": lambda: run_diffmj_fit(problem, m, params, data, max_iters, compiled=True),
        "minimize_exact": lambda: run_minimize_exact(problem, m, params, data, max_iters),
        "minimize_exact_mujoco": lambda: run_minimize_exact(problem, m, params, data, max_iters, mj_model=mjm),
    }
    save(out)
    for name in methods:
        try:
            r = out["methods"][name] = runs[name]()
        except Exception as error:  # recorded, and the other methods still run
            out["methods"][name] = {"error": f"{type(error).__name__}: {error}"[:2000]}
            print(f"  {name} failed: {out['methods'][name]['error'][:300]}", flush=True)
        else:
            cached = f" ({r['wall_cached_s']:.1f} s with the graphs compiled)" if "wall_cached_s" in r else ""
            print(f"  {name}: {r['wall_s']:.1f} s{cached}, error {r['max_relative_error']:.1e}", flush=True)
        save(out)


def time_to_error(r: dict, error: float) -> float | None:
    """Seconds until the method's trace first reached ``error`` or less (None: never)."""
    return next((t for t, e in r.get("trace", ()) if e <= error), None)


def markdown(result: dict) -> str:
    lines = ["| problem | steps (chunks) | parameters | method | max rel. error | iterations | residual evals "
             "(rollouts) | Jacobians | wall s | s to mujoco.sysid's error |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, prob in result["problems"].items():
        reference = prob["methods"].get("mujoco_sysid", {}).get("max_relative_error")
        for method, label in METHODS.items():
            r = prob["methods"].get(method)
            if r is None or "error" in r:
                continue
            jac = "FD" if r["jacobian_evaluations"] is None else r["jacobian_evaluations"]
            cached = f" ({r['wall_cached_s']:.1f} once compiled)" if "wall_cached_s" in r else ""
            reached = None if reference is None else time_to_error(r, reference)
            lines.append(f"| {name} | {prob['chunks'] * prob['chunk_steps']} ({prob['chunks']}) | {len(prob['true'])} "
                         f"| {label} | {r['max_relative_error']:.1e} | {r['iterations']} | "
                         f"{r['residual_evaluations']} ({r['rollouts']}) | {jac} | {r['wall_s']:.1f}{cached} | "
                         f"{'' if reference is None else 'never' if reached is None else f'{reached:.1f}'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    all_problems = problems()
    parser.add_argument("--problems", nargs="+", default=list(all_problems), choices=list(all_problems))
    parser.add_argument("--max-iters", type=int, default=100, help="iterations allowed to every method")
    parser.add_argument("--max-chunks", type=int, help="fit only the first chunks of each recording (a quick look)")
    parser.add_argument("--methods", nargs="+", choices=list(METHODS),
                        default=["mujoco_sysid", "mujoco_sysid_no_resample", "diffmj_fit", "diffmj_fit_mujoco",
                                 "minimize_exact_mujoco"],
                        help="diffmj_fit_compiled compiles for minutes per problem")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "sysid.json")
    parser.add_argument("--table", type=Path, help="print the table of an existing result and exit")
    args = parser.parse_args()
    if args.table:
        print(markdown(json.loads(args.table.read_text())))
        return
    torch.set_num_threads(THREADS)
    # compile times are cold: Inductor's cache starts empty in every run
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="sysid_inductor_")
    result = {"machine": machine_info(), "settings": {"problems": args.problems, "methods": args.methods,
                                                      "max_iters": args.max_iters,
                                                      "max_chunks": args.max_chunks, "threads": THREADS}, "problems": {}}
    for name in args.problems:

        def save(problem_result: dict, name: str = name) -> None:
            result["problems"][name] = problem_result
            result["machine"]["load_average_end"] = os.getloadavg()
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1, default=float))

        run_problem(all_problems[name], args.methods, args.max_iters, args.max_chunks, save)
    print(markdown(result))


if __name__ == "__main__":
    main()
