"""Census of MJCF models: does MuJoCo compile each, does diffmj load it, and does it match MuJoCo C?

Run from the repository root in diffmj's venv, naming each collection ``NAME=DIR`` (or a bare
directory, named after itself); ``scripts/census_models.sh`` gathers the published collections:

    python benchmarks/census.py dm_control=/tmp/census/dm_control gymnasium=/tmp/census/gymnasium
    python benchmarks/census.py --table benchmarks/results/census.json      # the tables of a result

Every ``*.xml`` under a directory (recursively) whose root element is ``<mujoco>`` is examined in a
worker process that is killed after ``--timeout`` seconds:

1. **compiled**: ``mujoco.MjModel.from_xml_path``. Files that do not compile are included
   fragments (a robot's ``<mujoco>`` body without its assets, defaults or scene) or miss an
   asset; they are counted with the compiler's message, not as models.
2. **loaded**: ``diffmj.put_model(..., dtype=float64)``, or **refused**: its NotImplementedError,
   whose message names the first unsupported feature and element; ``feature`` drops the element
   names so that refusals group by what is missing.
3. **matches**: from ``--states`` states (keyframe 0, else qpos0; then a seeded perturbation of
   qpos, qvel and ctrl: ``initial_state``) MuJoCo C and diffmj (eager, float64) compute

   - ``forward``: ``mj_forward``'s kinematics, smooth forces, sensors and ``qacc`` (``FORWARD_FIELDS``);
   - ``step``: ``--steps`` steps of MuJoCo C; at each, one diffmj step from MuJoCo C's state
     (the same qpos, qvel, act, warm start and inputs) against MuJoCo C's next state;
   - ``rollout``: diffmj's own ``--steps`` steps from the first state against MuJoCo C's, where
     differences may grow (contacts that make or break one step apart, chaotic models).

   The error of a field is ``max |diffmj - C| / (1 + |C|)``, the scale-aware relative error of
   the test suite. A model **matches** when every forward and step error is within ``--tol``;
   the rollout's error is reported beside it (``diverges`` when over ``--tol``). Where MuJoCo C
   resets an unstable simulation (``mj_checkPos`` / ``Vel`` / ``Acc``: a value NaN or over 1e10), the
   state it stepped from or diffmj's qacc must be as bad at that step.
4. **match_ccd**: a model with general convex pairs that does not match is compared again with
   MuJoCo C's contacts of those pairs replaced by diffmj's, where each is certified to lie within
   MuJoCo C's own GJK / EPA error (``certify``: by support values, as test_collision_convex.py
   judges those pairs); it matches then, so the difference was MuJoCo C's convex collision stopping
   at ``opt.ccd_tolerance`` or ``opt.ccd_iterations``.
5. **match_newton**: a model that asks for PGS (which diffmj solves by Newton, the same convex
   problem) and does not match is compared again with MuJoCo C solving it by Newton.

Why 1e-9 (``TOL``): the two sides evaluate the same formulas in nearly the same order, so
they differ by rounding: the test suite measures at most 3e-13 on forward fields and 7e-12
after a few steps of random models. Robot models are stiffer (light links with small
armature): ``qacc = M^-1 f`` multiplies a rounding of 1e-16 by cond(M), which stays below 1e-10
for cond(M) <= 1e6. 1e-9 leaves a factor of ten above that and is still orders below any
missing or different term of the physics. A constraint solve that stops one iteration apart
from MuJoCo's differs by about ``opt.tolerance`` (1e-8 by default) and fails it: that is a
difference to find, not rounding.
"""

from __future__ import annotations

import argparse
import copy
import fnmatch
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter, defaultdict
from pathlib import Path

import mujoco
import numpy as np
import torch

import diffmj
from diffmj.collision.pairs import COLLIDERS
from diffmj.collision.plan import convex_pair

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import harness  # noqa: E402
from step_throughput import machine_info  # noqa: E402

TOL = 1e-9
MEMORY_GIB = 8.0  # resident memory of a worker: two side by side leave room on a 24 GiB machine
POLL_S = 0.2  # how often the worker's time and memory are checked
FORWARD_FIELDS = ("xpos", "xquat", "qfrc_bias", "qfrc_passive", "actuator_force", "sensordata", "qacc")
STEP_FIELDS = ("qpos", "qvel", "act")
QPOS_NOISE = 0.02  # rad or m per dof, applied as a velocity integrated for one unit of time
QVEL_NOISE = 0.1
CTRL_NOISE = 0.1  # of the half range for limited controls, absolute otherwise

ERROR_BANDS = (1e-12, 1e-9, 1e-6, float("inf"))  # the summary's bands of worst errors
# what a model's record says in one word
STATUSES = ("match", "match_ccd", "match_newton", "mismatch", "static", "refused", "error", "timeout", "not_compiled")
SIMULATED = ("match", "match_ccd", "match_newton", "mismatch")  # the statuses of a model compared with MuJoCo C


def is_mjcf(path: Path) -> bool:
    """Whether ``path``'s root element is <mujoco> (URDF, ``<mujocoinclude>`` and other XML are not models)."""
    try:
        for _, element in ElementTree.iterparse(path, events=("start",)):
            return element.tag == "mujoco"
    except ElementTree.ParseError:
        return False
    return False


def excluded(model: str, patterns: list[str]) -> bool:
    """Whether a file's path relative to its collection matches one of the ``fnmatch`` patterns."""
    return any(fnmatch.fnmatch(model, pattern) for pattern in patterns)


def model_files(root: Path, exclude: list[str] = ()) -> list[Path]:
    """The MJCF files under ``root`` not ``excluded``, sorted."""
    return sorted(p for p in root.rglob("*.xml")
                  if p.is_file() and not excluded(str(p.relative_to(root)), exclude) and is_mjcf(p))


def status(record: dict) -> str:
    """A record's status for the tables: a compared model without degrees of freedom (a prop, an
    arena) is ``static``, since nothing in it moves."""
    compared = record["status"] in SIMULATED
    return "static" if compared and record["size"]["nv"] == 0 else record["status"]


def feature(message: str) -> str:
    """A refusal message without the names of elements, so refusals group by the missing feature.

    ``actuator 'elbow': gain 'muscle' is not supported by diffmj`` -> ``actuator: gain 'muscle'``;
    ``geom pair 'a' (mesh) - 'b' (box): collision ...`` -> ``geom pair (mesh) - (box): collision``.
    """
    text = message.removesuffix(" is not supported by diffmj")
    text = re.sub(r"^(actuator|sensor|joint|tendon|equality) ('.*?'|#\d+)", r"\1", text)
    text = re.sub(r"('.*?'|#\d+) (\(\w+\))", r"\2", text)  # geom names of a pair
    return re.sub(r" geom ('.*?'|#\d+)$", " geom", text)  # the geom a rangefinder ray meets


def initial_state(mjm: mujoco.MjModel, seed: int) -> mujoco.MjData:
    """Keyframe 0 (else qpos0) with qpos, qvel and ctrl perturbed by ``seed``'s noise; not forwarded."""
    rng = np.random.default_rng(seed)
    mjd = mujoco.MjData(mjm)
    if mjm.nkey:
        mujoco.mj_resetDataKeyframe(mjm, mjd, 0)
    mujoco.mj_integratePos(mjm, mjd.qpos, QPOS_NOISE * rng.standard_normal(mjm.nv), 1.0)
    mjd.qvel += QVEL_NOISE * rng.standard_normal(mjm.nv)
    limited = mjm.actuator_ctrllimited.astype(bool)
    low, high = mjm.actuator_ctrlrange.T
    scale = np.where(limited, (high - low) / 2, 1.0)
    ctrl = mjd.ctrl + CTRL_NOISE * scale * rng.standard_normal(mjm.nu)
    mjd.ctrl[:] = np.where(limited, np.clip(ctrl, low, high), ctrl)
    return mjd


def field_error(actual: torch.Tensor, expected: np.ndarray) -> float:
    """max |actual - expected| / (1 + |expected|) over the field (0 for an empty one; NaN propagates)."""
    a = actual.detach().to("cpu", torch.float64).numpy().reshape(-1)
    b = np.asarray(expected, dtype=np.float64).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"shape {a.shape} != MuJoCo's {b.shape}")
    if not a.size:
        return 0.0
    err = np.abs(a - b) / (1 + np.abs(b))
    return float(np.nan if np.isnan(err).any() else err.max())


def worst(errors: dict[str, float], into: dict[str, float]) -> None:
    """Keep in ``into`` the larger error of each field (NaN wins: it is the worst)."""
    for name, err in errors.items():
        old = into.get(name, 0.0)
        into[name] = err if np.isnan(err) or err > old else old


def solver_effort(mjm: mujoco.MjModel, mjd: mujoco.MjData, into: dict[str, int]) -> None:
    """Keep in ``into`` the most contacts, solver iterations and line-search evaluations MuJoCo C used
    (of island 0). A solve that ran out of ``opt.iterations`` or ``opt.ls_iterations`` ends where the
    algorithm's path ends, not at the optimum, so only the same algorithm reproduces it."""
    iterations = int(mjd.solver_niter[0])
    evals = max((mjd.solver[i].neval for i in range(min(iterations, mujoco.mjNSOLVER))), default=0)
    for key, value in (("ncon", mjd.ncon), ("iterations", iterations), ("ls_evals", evals)):
        into[key] = max(into.get(key, 0), int(value))


# what makes mj_step reset the simulation to qpos0 (mj_checkPos, mj_checkVel, mj_checkAcc)
RESETS = (mujoco.mjtWarning.mjWARN_BADQPOS, mujoco.mjtWarning.mjWARN_BADQVEL, mujoco.mjtWarning.mjWARN_BADQACC)


def bad(x: torch.Tensor | np.ndarray) -> bool:
    """Whether MuJoCo C's checks reset at these values: an entry NaN or beyond ``mjMAXVAL`` (1e10)."""
    x = torch.as_tensor(x)
    return bool((x.isnan() | (x.abs() > mujoco.mjMAXVAL)).any())


def compare_state(mjm: mujoco.MjModel, m: diffmj.Model, mjd: mujoco.MjData, steps: int, effort: dict) -> dict:
    """The worst error of each field over ``forward``, ``step`` and ``rollout`` from ``mjd``; MuJoCo
    C's ``solver_effort`` into ``effort``, with how often it reset an unstable simulation. diffmj never
    resets: at a step MuJoCo C reset, the qpos or qvel it stepped from (the same on both sides) or diffmj's
    qacc must be ``bad`` (``bad_at_reset``: 0, else inf) instead of the step's outcome matching. MuJoCo C
    discards that qacc, reached by a solve that often ran out of iterations; the steps before and after are
    compared as any other."""
    out = {"forward": {}, "step": {}, "rollout": {}}
    expected = mujoco.MjData(mjm)
    mujoco.mj_copyData(expected, mjm, mjd)
    mujoco.mj_forward(mjm, expected)
    solver_effort(mjm, expected, effort)
    d = diffmj.forward(m, diffmj.put_data(m, mjd))
    worst({f: field_error(getattr(d, f), getattr(expected, f)) for f in FORWARD_FIELDS}, out["forward"])

    current = mujoco.MjData(mjm)
    mujoco.mj_copyData(current, mjm, mjd)
    free = None
    for k in range(steps):
        synced = diffmj.step(m, diffmj.put_data(m, current))
        qpos, qvel = current.qpos.copy(), current.qvel.copy()
        for warning in RESETS:
            current.warning[warning].number = 0  # a reset clears the counts, then counts itself
        mujoco.mj_step(mjm, current)
        reset = any(current.warning[warning].number for warning in RESETS)
        solver_effort(mjm, current, effort)
        effort["resets"] = effort.get("resets", 0) + reset
        free = synced if k == 0 else diffmj.step(m, free)  # both start from mjd
        if reset:  # MuJoCo C reset the state, which diffmj never does: what it found bad must be bad for diffmj
            worst({"bad_at_reset": 0.0 if bad(qpos) or bad(qvel) or bad(synced.qacc) else np.inf}, out["step"])
        else:
            worst({f: field_error(getattr(synced, f), getattr(current, f)) for f in STEP_FIELDS}, out["step"])
        worst({f: field_error(getattr(free, f), getattr(current, f)) for f in STEP_FIELDS}, out["rollout"])
    return out


def max_error(errors: dict[str, float]) -> float:
    values = list(errors.values())
    return float(np.nan) if any(np.isnan(v) for v in values) else max(values, default=0.0)


def examine(path: str, states: int, steps: int, tol: float) -> dict:
    """Everything the census records about one file (run in the worker process)."""
    record: dict = {"seconds": {}}
    start = time.perf_counter()
    try:
        mjm = mujoco.MjModel.from_xml_path(path)
    except Exception as e:  # noqa: BLE001 - any compile failure is recorded
        return record | {"status": "not_compiled", "compile_error": harness.reason(e)}
    record["seconds"]["compile"] = time.perf_counter() - start
    record["size"] = {k: int(getattr(mjm, k)) for k in ("nq", "nv", "nu", "na", "nbody", "ngeom", "nsensor")}
    record["options"] = harness.solver_settings(mjm) | {"cone": mujoco.mjtCone(mjm.opt.cone).name}
    try:
        m = diffmj.put_model(mjm, dtype=torch.float64)
    except NotImplementedError as e:
        return record | {"status": "refused", "refusal": str(e), "feature": feature(str(e))}
    except Exception as e:  # noqa: BLE001 - a crash of put_model is a diffmj bug to record
        return record | {"status": "error", "stage": "put_model", "error": harness.reason(e)}
    start = time.perf_counter()
    effort: dict = {}
    try:
        errors = compare_model(mjm, m, states, steps, effort)
        worst_of = {part: max_error(values) for part, values in errors.items()}
        matches = all(worst_of[part] <= tol for part in ("forward", "step"))  # False for NaN
        if not matches and convex_pair(mjm) is not None:
            record["exact_contacts"] = exact_contact_errors(mjm, m, states, steps)
        if not matches and mjm.opt.solver == mujoco.mjtSolver.mjSOL_PGS:
            record["newton"] = newton_errors(mjm, m, states, steps)
    except Exception as e:  # noqa: BLE001 - a crash while simulating is a diffmj bug to record
        return record | {"status": "error", "stage": "simulate", "error": harness.reason(e)}
    record["seconds"]["simulate"] = time.perf_counter() - start
    return record | {
        "status": "match" if matches else "match_ccd" if record.get("exact_contacts", {}).get(
            "error", np.inf) <= tol else "match_newton" if record.get("newton", np.inf) <= tol else "mismatch",
        "errors": errors,
        "worst": worst_of,
        "mujoco_solver": effort,
        "diverges": not worst_of["rollout"] <= tol,
    }


def newton_errors(mjm: mujoco.MjModel, m: diffmj.Model, states: int, steps: int) -> float:
    """A PGS model's worst ``forward`` and ``step`` error against MuJoCo C solving it by Newton, as diffmj
    does (``put_model`` warns): the two minimise the same convex problem, and PGS stops elsewhere within
    its tolerance."""
    newton = copy.copy(mjm)
    newton.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
    errors = compare_model(newton, m, states, steps, {})
    return max_error({part: max_error(errors[part]) for part in ("forward", "step")})


def compare_model(mjm: mujoco.MjModel, m: diffmj.Model, states: int, steps: int, effort: dict) -> dict:
    """``compare_state``'s worst errors over ``states`` initial states."""
    errors: dict = {"forward": {}, "step": {}, "rollout": {}}
    for seed in range(states):
        for part, values in compare_state(mjm, m, initial_state(mjm, seed), steps, effort).items():
            worst(values, errors[part])
    return errors


# ---------------------------------------------------------------- MuJoCo C's own convex-collision error
# MuJoCo C collides the general convex pairs (ellipsoids, cylinders, meshes, ...) by GJK / EPA, which stop
# at ``opt.ccd_tolerance`` or ``opt.ccd_iterations``; diffmj's contacts are exact to rounding. So a mismatch
# may be MuJoCo C's error. Each of MuJoCo C's contacts of such a pair is *certified* against diffmj's with
# support values computed here, independently of diffmj (``support``):
#
# - f(u) = h1(u) + h2(-u) is the support function of the Minkowski difference D of the two geoms; its
#   least value over unit u is the penetration depth (minus the distance when apart), at the contact
#   normal. EPA's depth -dist_C is a lower bound on it and f at EPA's normal an upper bound: diffmj's
#   depth f(normal) = -dist must lie in [-dist_C, f(normal_C)] (to CCD_DIST below, VALUE_ROUNDING above).
#   A diffmj normal off the minimum shows as a MuJoCo normal with a lower support value.
# - The normal: D is a convex set plus a ball of radius rho, the sum of the geoms' rolling radii (sphere
#   and capsule radius, an ellipsoid's least radius of curvature c^2 / a; a ball rolls inside each), so
#   D holds the ball of radius rho touching its supporting plane at depth * normal, and
#   f(u) >= depth + (rho - depth) (1 - cos angle(u, normal)). The excess f(normal_C) - depth thus bounds
#   MuJoCo's angle from diffmj's normal. Without a rolling ball (rho <= depth: boxes, cylinders, meshes)
#   the normals must agree to CCD_DIST.
# - Positions within that angle times the sum of the geoms' reaches (the largest radius of curvature
#   of a sphere or ellipsoid, the bounding radius of the others, whose witness points may slide).
#
# Contacts of a pair that gives several (multi-CCD: flat faces clipped, exact on both sides) must agree
# within CCD_DIST. Where every contact is certified, MuJoCo C's forward and step are run again with those
# contacts replaced by diffmj's (``exact_contact_errors``); a match there is ``match_ccd``.
CCD_DIST = 1e-9  # tests/conftest.py's TOL["ccd_dist"]
VALUE_ROUNDING = 1e-15  # rounding of a support value, relative to 1 + |depth| (test_collision_convex.py)


def support(mjm: mujoco.MjModel, mjd: mujoco.MjData, geom: int, u: np.ndarray) -> float:
    """max x.u over the points x of ``geom`` (a mesh: its vertices, whose hull MuJoCo collides)."""
    size, kind, g = mjm.geom_size[geom], mjm.geom_type[geom], mujoco.mjtGeom
    v = mjd.geom_xmat[geom].reshape(3, 3).T @ u  # u in the geom's frame
    if kind == g.mjGEOM_SPHERE:
        extent = size[0] * np.linalg.norm(v)
    elif kind == g.mjGEOM_CAPSULE:
        extent = size[0] * np.linalg.norm(v) + size[1] * abs(v[2])
    elif kind == g.mjGEOM_CYLINDER:
        extent = size[0] * np.hypot(v[0], v[1]) + size[1] * abs(v[2])
    elif kind == g.mjGEOM_BOX:
        extent = size @ np.abs(v)
    elif kind == g.mjGEOM_ELLIPSOID:
        extent = np.linalg.norm(size * v)
    elif kind == g.mjGEOM_MESH:
        mesh = mjm.geom_dataid[geom]
        start = mjm.mesh_vertadr[mesh]
        extent = (mjm.mesh_vert[start:start + mjm.mesh_vertnum[mesh]].astype(np.float64) @ v).max()
    else:
        raise ValueError(f"no support function for geom type {mujoco.mjtGeom(kind).name}")
    return float(mjd.geom_xpos[geom] @ u + extent)


def rolling_radius(mjm: mujoco.MjModel, geom: int) -> float:
    """The largest ball that rolls freely inside ``geom`` (0 for geoms with flat faces or edges)."""
    size, kind, g = mjm.geom_size[geom], mjm.geom_type[geom], mujoco.mjtGeom
    if kind in (g.mjGEOM_SPHERE, g.mjGEOM_CAPSULE):
        return float(size[0])
    return float(size.min() ** 2 / size.max()) if kind == g.mjGEOM_ELLIPSOID else 0.0


def reach(mjm: mujoco.MjModel, geom: int) -> float:
    """How far ``geom``'s witness point may move per radian of normal (see above)."""
    size, kind, g = mjm.geom_size[geom], mjm.geom_type[geom], mujoco.mjtGeom
    if kind == g.mjGEOM_SPHERE:
        return float(size[0])
    return float(size.max() ** 2 / size.min()) if kind == g.mjGEOM_ELLIPSOID else float(mjm.geom_rbound[geom])


def certify(mjm: mujoco.MjModel, mjd: mujoco.MjData, contact, ours: tuple) -> str:
    """"" if MuJoCo C's single contact ``contact`` of a general convex pair lies within its own GJK / EPA
    error of diffmj's ``ours`` (dist, pos [3], normal [3]) by the bounds above, else why not."""
    dist, pos, normal = ours
    g1, g2 = contact.geom
    f = lambda u: support(mjm, mjd, g1, u) + support(mjm, mjd, g2, -u)  # noqa: E731
    depth, theirs = f(normal), contact.frame[:3].copy()
    rounding = VALUE_ROUNDING * (1 + abs(depth))
    if abs(depth + dist) > 1e3 * rounding:
        return f"diffmj's dist {dist:.6e} is not its support value {-depth:.6e}"
    if -contact.dist > depth + CCD_DIST:
        return f"MuJoCo's depth {-contact.dist:.6e} exceeds diffmj's {depth:.6e}"
    excess = f(theirs) - depth
    if excess < -rounding:
        return f"MuJoCo's normal has a support value {-excess:.1e} below diffmj's"
    curvature = sum(rolling_radius(mjm, g) for g in (g1, g2)) - depth
    angle = 2 * np.arcsin(min(np.linalg.norm(theirs - normal) / 2, 1.0))
    bound = CCD_DIST + (np.arccos(max(1 - (excess + rounding) / curvature, -1.0)) if curvature > 0 else 0.0)
    moved = np.abs(contact.pos - pos).max()
    if angle > bound or moved > CCD_DIST + bound * (reach(mjm, g1) + reach(mjm, g2)):
        return f"normal {angle:.1e} rad or position {moved:.1e} off, bound {bound:.1e} rad"
    return ""


def replace_convex_contacts(mjm: mujoco.MjModel, mjd: mujoco.MjData, m: diffmj.Model, d: diffmj.Data,
                            into: dict) -> str:
    """Replace in ``mjd`` (after mj_forward) MuJoCo C's contacts of general convex pairs by diffmj's
    (``d``'s, of the same state) where each is certified, and make MuJoCo C's constraints again; "" or
    why not. ``into``: the count of contacts replaced and the largest distance between the two unit
    normals (their angle, for small ones)."""
    geoms = m.collision_plan.contact_geom.cpu().numpy()
    dist = d.contact.dist.detach().cpu().numpy()
    pos, frame = d.contact.pos.detach().cpu().numpy(), d.contact.frame.detach().cpu().numpy()
    by_pair = defaultdict(list)
    for c in mjd.contact[:mjd.ncon]:
        types = tuple(sorted(diffmj.GeomType(int(t)) for t in mjm.geom_type[c.geom]))
        if COLLIDERS[types].general_convex:
            by_pair[tuple(c.geom)].append(c)
    for pair, contacts in by_pair.items():
        if mujoco.mjtGeom.mjGEOM_HFIELD in mjm.geom_type[list(pair)]:
            return f"geoms {int(pair[0])}, {int(pair[1])}: hfield prisms have no support function here"
        slots = [i for i in np.flatnonzero(np.isfinite(dist)) if tuple(geoms[i]) == pair]
        if len(slots) != len(contacts):
            return f"geoms {pair}: MuJoCo C has {len(contacts)} contacts, diffmj {len(slots)}"
        for c in contacts:
            i = min(slots, key=lambda i: np.linalg.norm(pos[i] - c.pos))
            slots.remove(i)
            ours = (float(dist[i]), pos[i], frame[i, 0])
            if len(contacts) == 1:
                reason = certify(mjm, mjd, c, ours)
            else:  # multi-CCD: clipped flat features, exact on both sides
                off = max(abs(c.dist - ours[0]), np.abs(c.pos - ours[1]).max(), np.abs(c.frame[:3] - ours[2]).max())
                reason = f"multi-CCD contact {off:.1e} off" if off > CCD_DIST else ""
            if reason:
                return f"geoms {int(pair[0])}, {int(pair[1])}: {reason}"
            into["replaced"] += 1
            into["normal_angle"] = max(into["normal_angle"], float(np.linalg.norm(c.frame[:3] - ours[2])))
            c.dist, c.pos[:], c.frame[:] = ours[0], pos[i], frame[i].reshape(-1)
    mujoco.mj_makeConstraint(mjm, mjd)
    mujoco.mj_island(mjm, mjd)
    mujoco.mj_projectConstraint(mjm, mjd)
    mujoco.mj_transmission(mjm, mjd)  # last of mj_fwdPosition: adhesion's moment arms read the contacts
    mujoco.mj_forwardSkip(mjm, mjd, mujoco.mjtStage.mjSTAGE_POS, 0)
    return ""


# MuJoCo C's integrators that do not collide again within a step (RK4 does, at its stages)
INTEGRATE = {mujoco.mjtIntegrator.mjINT_EULER: mujoco.mj_Euler, mujoco.mjtIntegrator.mjINT_IMPLICIT: mujoco.mj_implicit,
             mujoco.mjtIntegrator.mjINT_IMPLICITFAST: mujoco.mj_implicit}


def exact_contact_state(mjm: mujoco.MjModel, m: diffmj.Model, mjd: mujoco.MjData, steps: int, into: dict) -> dict:
    """``compare_state``'s forward and step errors from ``mjd`` against MuJoCo C with its general-convex
    contacts replaced by diffmj's, each certified (``replace_convex_contacts``; MuJoCo C steps with them
    too); {"refused": why} where one is not. ``into``: as ``replace_convex_contacts``'."""
    integrate = INTEGRATE.get(mujoco.mjtIntegrator(mjm.opt.integrator))
    if integrate is None:
        return {"refused": "MuJoCo C's RK4 collides again at its stages"}
    errors: dict[str, float] = {}
    current = mujoco.MjData(mjm)
    mujoco.mj_copyData(current, mjm, mjd)
    for k in range(steps):
        ours = diffmj.step(m, diffmj.put_data(m, current))  # its contacts and forward fields are of ``current``
        mujoco.mj_forward(mjm, current)
        refused = replace_convex_contacts(mjm, current, m, ours, into)
        if refused:
            return {"refused": refused}
        if k == 0:
            worst({f: field_error(getattr(ours, f), getattr(current, f)) for f in FORWARD_FIELDS}, errors)
        integrate(mjm, current)
        worst({f: field_error(getattr(ours, f), getattr(current, f)) for f in STEP_FIELDS}, errors)
    return errors


def exact_contact_errors(mjm: mujoco.MjModel, m: diffmj.Model, states: int, steps: int) -> dict:
    """``exact_contact_state``'s worst error over ``states`` initial states (as ``compare_model``'s):
    {"error", "replaced" (contacts), "normal_angle" (as ``replace_convex_contacts``')}, or
    {"refused": why}."""
    out: dict = {"replaced": 0, "normal_angle": 0.0}
    errors: dict[str, float] = {}
    for seed in range(states):
        state = exact_contact_state(mjm, m, initial_state(mjm, seed), steps, out)
        if "refused" in state:
            return state
        worst(state, errors)
    return out | {"error": max_error(errors)}


def serve(states: int, steps: int, tol: float) -> None:
    """The worker: examine each path read from stdin, answering with one JSON line per path."""
    torch.set_num_threads(1)
    for line in sys.stdin:
        print(harness.JSON_PREFIX + json.dumps(jsonable(examine(line.rstrip("\n"), states, steps, tol))), flush=True)


def resident_gib(pid: int) -> float:
    """The resident memory of process ``pid`` (Linux's /proc), GiB; 0 when unreadable."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(found.group(1)) / 2 ** 20 if found else 0.0


class Worker:
    """A worker process (``census.py --serve``), replaced when a model runs past the timeout, past
    ``memory_gib`` of resident memory (stopped before the kernel's out-of-memory killer picks a process
    of its own choosing; address-space limits would also refuse MuJoCo's large untouched arenas), or kills
    it."""

    def __init__(self, states: int, steps: int, tol: float, memory_gib: float = MEMORY_GIB):
        self.command = [sys.executable, __file__, "--serve", "--states", str(states), "--steps", str(steps),
                        "--tol", repr(tol)]
        self.memory_gib = memory_gib
        self.process = None

    def _start(self) -> None:
        self.process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.results: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(self.process.stdout, self.results), daemon=True).start()

    @staticmethod
    def _read(stream, results: queue.Queue) -> None:
        for line in stream:
            if line.startswith(harness.JSON_PREFIX):
                results.put(json.loads(line[len(harness.JSON_PREFIX):]))
        results.put(None)  # the worker exited

    def examine(self, path: Path, timeout: float) -> dict:
        if self.process is None or self.process.poll() is not None:
            self._start()
        start = time.perf_counter()
        self.process.stdin.write(f"{path}\n")
        self.process.stdin.flush()
        while True:
            try:
                result = self.results.get(timeout=POLL_S)
            except queue.Empty:
                if time.perf_counter() - start > timeout:
                    result = {"status": "timeout", "error": f"no result after {timeout:g} s"}
                    break
                if resident_gib(self.process.pid) > self.memory_gib:
                    result = {"status": "error", "stage": "worker",
                              "error": f"resident memory over {self.memory_gib:g} GiB (--memory)"}
                    break
            else:
                if result is not None:
                    return result
                result = {"status": "error", "stage": "worker",
                          "error": f"worker died (exit code {self.process.wait()})"}
                break
        self.close()
        return result | {"seconds": {"total": time.perf_counter() - start}}

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
        self.process = None


def collections(specs: list[str]) -> dict[str, Path]:
    """``NAME=DIR`` (or ``DIR``, named after its last part) -> {name: directory}."""
    out = {}
    for spec in specs:
        name, _, folder = spec.rpartition("=")
        folder = Path(folder)
        if not folder.is_dir():
            raise ValueError(f"not a directory: {folder}")
        out[name or folder.name] = folder
    return out


def fmt_error(x: float | str | None) -> str:
    """An error for a table: blank when absent, "nan" / "inf" as written by ``jsonable``."""
    return "" if x is None else x if isinstance(x, str) else f"{x:.1e}"


def describe(record: dict) -> str:
    """A record's status and its reason or errors, on one line."""
    status = record["status"]
    if status == "refused":
        return f"refused: {record['refusal']}"
    if status in SIMULATED:
        worst_of = record["worst"]
        return (f"{status}: forward {fmt_error(worst_of['forward'])}, step {fmt_error(worst_of['step'])}, "
                f"rollout {fmt_error(worst_of['rollout'])}")
    return f"{status}: {record.get('error') or record.get('compile_error')}"


def summary_tables(records: list[dict], tol: float) -> str:
    """Markdown: counts per collection, refusals ranked by the models they block, the loaded models."""
    models = [r for r in records if status(r) not in ("not_compiled", "static")]
    counts: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        counts[r["collection"]][status(r)] += 1
    total = sum(counts.values(), Counter())
    lines = [f"{len(models)} models with degrees of freedom compiled by MuJoCo ({total['static']} static ones "
             f"and {total['not_compiled']} files that did not compile set aside); loaded by diffmj: "
             f"{sum(status(r) not in ('refused', 'timeout') for r in models)}; match MuJoCo C within {tol:g}: "
             f"{total['match']}, and {total['match_ccd']} more where MuJoCo C's convex contacts are replaced by "
             "diffmj's, each certified within MuJoCo C's own GJK / EPA error (match_ccd), and "
             f"{total['match_newton']} PGS models that match MuJoCo C solving them by Newton, as diffmj does "
             "(match_newton).", ""]
    lines += ["| collection | models | match | match_ccd | match_newton | mismatch | refused | error | timeout | (static) "
              "| (not compiled) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    columns = [s for s in STATUSES if s not in ("static", "not_compiled")] + ["static", "not_compiled"]
    for name, c in list(counts.items()) + [("**all**", total)]:
        lines.append(f"| {name} | {sum(c[s] for s in columns[:-2])} | " + " | ".join(str(c[s]) for s in columns) + " |")

    refused = [r for r in models if r["status"] == "refused"]
    by_feature: dict[str, list[dict]] = defaultdict(list)
    for r in refused:
        by_feature[r["feature"]].append(r)
    lines += ["", f"Refusals ({len(refused)} models), each model under the first feature `put_model` refuses:", "",
              "| feature (put_model's message, element names dropped) | models | collections | e.g. |",
              "|---|---:|---|---|"]
    for name, group in sorted(by_feature.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        cols = Counter(r["collection"] for r in group)
        where = ", ".join(f"{c} {n}" for c, n in cols.most_common())
        lines.append(f"| `{name}` | {len(group)} | {where} | {group[0]['collection']}/{group[0]['model']} |")

    compared = [r for r in models if status(r) in SIMULATED]
    bands = Counter(next(i for i, bound in enumerate(ERROR_BANDS) if error_of(r) <= bound) for r in compared)
    lines += ["", f"Worst error over `forward` and `step` of the {len(compared)} simulated models: " + ", ".join(
        f"{bands[i]} {label}" for i, label in enumerate(("<= 1e-12", "<= 1e-9", "<= 1e-6", "> 1e-6 (or NaN)")))
        + f"; the free rollout stays within {tol:g} on {sum(not r['diverges'] for r in compared)}."]

    loaded = [r for r in models if status(r) in SIMULATED + ("error",)]
    lines += ["", f"Loaded models ({len(loaded)}): worst error over the fields of `forward` and `step`, and "
              "of the free `rollout` (a mismatch of a model with convex pairs, its worst error against MuJoCo C with "
              "diffmj's certified convex contacts, or why they were not certified; of a PGS model, against MuJoCo C "
              "solving it by Newton); "
              "MuJoCo C's most contacts, and solver iterations and line-search evaluations used of those "
              "allowed (`opt.iterations`, `opt.ls_iterations`):", "",
              "| collection | model | nq | nv | nu | status | forward | step | rollout | C: ncon, iterations, ls | s |",
              "|---|---|---:|---:|---:|---|---:|---:|---:|---|---:|"]
    for r in loaded:
        size, worst_of, effort = r.get("size", {}), r.get("worst", {}), r.get("mujoco_solver")
        shown = r["status"] if r["status"] != "error" else f"error ({r['stage']}): {r['error'][:80]}"
        solver = (f"{effort['ncon']}, {effort['iterations']}/{r['options']['iterations']}, "
                  f"{effort['ls_evals']}/{r['options']['ls_iterations']}" if effort else "")
        if effort and effort["resets"]:
            solver += f"; C reset an unstable state {effort['resets']}x"
        exact = r.get("exact_contacts")
        if exact:
            shown += (f" (MuJoCo C with diffmj's {exact['replaced']} certified convex contacts: "
                      f"{fmt_error(exact['error'])})" if "error" in exact else f" (not certified: {exact['refused']})")
        if "newton" in r:
            shown += f" (MuJoCo C by Newton: {fmt_error(r['newton'])})"
        lines.append(f"| {r['collection']} | {r['model']} | {size.get('nq', '')} | {size.get('nv', '')} | "
                     f"{size.get('nu', '')} | {shown} | {fmt_error(worst_of.get('forward'))} | "
                     f"{fmt_error(worst_of.get('step'))} | {fmt_error(worst_of.get('rollout'))} | {solver} | "
                     f"{r['seconds'].get('simulate', 0):.0f} |")
    return "\n".join(lines)


def error_of(record: dict) -> float:
    """A compared record's worst error over ``forward`` and ``step`` (inf for NaN, written "nan")."""
    values = [record["worst"][part] for part in ("forward", "step")]
    return max(float("inf") if isinstance(v, str) else v for v in values)


def jsonable(x):
    """``x`` with non-finite floats as strings (JSON has no NaN)."""
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float) and not np.isfinite(x):
        return str(x)
    return x


def run_census(folders: dict[str, Path], timeout: float, states: int, steps: int, tol: float,
               exclude: list[str] = (), out: Path | None = None, header: dict | None = None,
               memory_gib: float = MEMORY_GIB, done: list[dict] = ()) -> list[dict]:
    """Examine every MJCF file of ``folders`` (but those ``exclude`` matches, and those ``done`` records);
    print a line per model; write JSON after each when ``out``, ``done``'s records first."""
    files = [(name, folder, path) for name, folder in folders.items() for path in model_files(folder, exclude)]
    seen = {(r["collection"], r["model"]) for r in done}
    worker = Worker(states, steps, tol, memory_gib)
    records = list(done)
    try:
        for i, (name, folder, path) in enumerate(files, 1):
            record = {"collection": name, "model": str(path.relative_to(folder))}
            if (name, record["model"]) in seen:
                continue
            record |= worker.examine(path, timeout)
            records.append(record)
            print(f"[{i}/{len(files)}] {name}/{record['model']}: {describe(record)}", flush=True)
            if out is not None:
                out.write_text(json.dumps(jsonable((header or {}) | {"records": records}), indent=1) + "\n")
    finally:
        worker.close()
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", help="NAME=DIR or DIR: collections of MJCF files, searched recursively")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed to one model")
    parser.add_argument("--states", type=int, default=2, help="initial states per model")
    parser.add_argument("--steps", type=int, default=10, help="steps per initial state")
    parser.add_argument("--tol", type=float, default=TOL, help="largest error of a match")
    parser.add_argument("--memory", type=float, default=MEMORY_GIB,
                        help="GiB of resident memory allowed to the worker")
    parser.add_argument("--exclude", nargs="*", default=[], metavar="PATTERN",
                        help="skip files whose path in their collection matches (fnmatch; --table: leave out)")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "census.json")
    parser.add_argument("--resume", action="store_true",
                        help="keep the records already in --out and examine only the other files")
    parser.add_argument("--table", type=Path, nargs="+", help="print the tables of these results and exit")
    parser.add_argument("--merged", type=Path, help="with --table: write the results as one JSON here")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the worker process
    args = parser.parse_args()
    if args.serve:
        serve(args.states, args.steps, args.tol)
        return
    if args.table:
        runs = [json.loads(path.read_text()) for path in args.table]
        records = [r for run in runs for r in run["records"] if not excluded(r["model"], args.exclude)]
        tol = max(run["settings"]["tol"] for run in runs)
        if args.merged:  # each run's machine and settings, then every record
            parts = [{k: v for k, v in run.items() if k != "records"} for run in runs]
            merged = {"runs": parts, "settings": {"tol": tol, "exclude": args.exclude}, "records": records}
            args.merged.write_text(json.dumps(merged, indent=1) + "\n")
        print(summary_tables(records, tol))
        return
    if not args.folders:
        parser.error("name at least one folder (or --table)")
    folders = collections(args.folders)
    unrecorded = ("out", "table", "merged", "serve", "resume")
    settings = {k: v for k, v in vars(args).items() if k not in unrecorded} | {"folders": {
        k: str(v) for k, v in folders.items()}}
    header = {"machine": machine_info(), "settings": settings}
    done = json.loads(args.out.read_text())["records"] if args.resume and args.out.exists() else []
    records = run_census(folders, args.timeout, args.states, args.steps, args.tol, args.exclude, args.out, header,
                         args.memory, done)
    header["machine"]["load_average_end"] = os.getloadavg()
    args.out.write_text(json.dumps(jsonable(header | {"records": records}), indent=1) + "\n")
    print(summary_tables(records, args.tol))


if __name__ == "__main__":
    main()
