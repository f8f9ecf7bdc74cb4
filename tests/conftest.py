"""Shared helpers: models, random MuJoCo C states, field comparison with one tolerance table."""

from __future__ import annotations

import pathlib

import mujoco
import numpy as np
import pytest
import torch

import diffmj

# The test models are small: one thread avoids MKL's threading overhead on tiny
# matrices, which is large when the machine's other core is busy.
torch.set_num_threads(1)

MODELS = pathlib.Path(__file__).parent / "models"
BENCHMARK_MODELS = pathlib.Path(__file__).parents[1] / "models"  # the five benchmark models

# One tolerance table (float64, scale-aware: |a - b| <= tol * (1 + |b|)).
TOL = {
    "smooth": 1e-10,  # kinematics, inertia, forces, one step
    "rollout": 1e-9,  # a few steps, where differences grow with the dynamics
}


# A small contact model: a box on a plane with an actuated capsule arm (few rows, cheap to compile).
ARM_ON_BOX = """
    <mujoco><option timestep="0.005" iterations="{iterations}" ls_iterations="8"/>
      <worldbody><geom type="plane" size="2 2 .1"/>
        <body pos="0 0 .12"><freejoint/><geom type="box" size=".1 .1 .1"/>
          <body pos=".1 0 0"><joint name="j" axis="0 1 0" range="-1 1"/>
            <geom type="capsule" fromto="0 0 0 .2 0 0" size=".03"/></body></body>
      </worldbody><actuator><motor joint="j"/></actuator></mujoco>"""


def mj_model(name: str) -> mujoco.MjModel:
    """A test model from tests/models (name without .xml)."""
    return mujoco.MjModel.from_xml_path(str(MODELS / f"{name}.xml"))


def random_state(mjm: mujoco.MjModel, seed: int, scale: float = 0.3) -> mujoco.MjData:
    """A non-trivial MuJoCo C state: random pose, velocity, controls, activations and loads."""
    rng = np.random.default_rng(seed)
    mjd = mujoco.MjData(mjm)
    mjd.qpos[:] = mjm.qpos0 + scale * rng.standard_normal(mjm.nq)
    mujoco.mj_normalizeQuat(mjm, mjd.qpos)
    mjd.qvel[:] = rng.standard_normal(mjm.nv)
    mjd.ctrl[:] = rng.standard_normal(mjm.nu)
    mjd.act[:] = 0.3 * rng.standard_normal(mjm.na)
    mjd.qfrc_applied[:] = rng.standard_normal(mjm.nv)
    mjd.xfrc_applied[1:] = rng.standard_normal((mjm.nbody - 1, 6))
    mjd.mocap_pos[:] += 0.1 * rng.standard_normal((mjm.nmocap, 3))
    mjd.time = float(rng.uniform(0, 10))
    return mjd


def as_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def assert_close(name: str, actual, expected, tol: float = TOL["smooth"]) -> None:
    """Scale-aware comparison with a message naming the field and the worst entry."""
    a, b = as_numpy(actual), as_numpy(expected)
    assert a.shape == b.shape, f"{name}: shape {a.shape} != {b.shape}"
    if not a.size:
        return
    err = np.abs(a - b) / (1 + np.abs(b))
    worst = np.unravel_index(np.argmax(err), err.shape)
    assert err[worst] <= tol, (
        f"{name}: relative error {err[worst]:.3e} > {tol:.0e} at {worst}: {a[worst]!r} vs {b[worst]!r}"
    )


def reference(m: diffmj.Model, mjd: mujoco.MjData) -> diffmj.Data:
    """MuJoCo C's computed fields in diffmj's layout (for comparison)."""
    return diffmj.put_data(m, mjd)


@pytest.fixture(params=["chain", "actuators"])
def smooth_model(request) -> mujoco.MjModel:
    """Each hand-written contact-free model."""
    return mj_model(request.param)


CONTACT_TYPES = (
    diffmj.ConstraintType.CONTACT_FRICTIONLESS, diffmj.ConstraintType.CONTACT_PYRAMIDAL,
    diffmj.ConstraintType.CONTACT_ELLIPTIC,
)


def match_contacts(m: diffmj.Model, d: diffmj.Data, mjd: mujoco.MjData) -> dict[int, int]:
    """MuJoCo contact index -> diffmj contact slot: same geom pair, nearest position."""
    geoms = m.collision_plan.contact_geom.cpu().numpy()
    dist = as_numpy(d.contact.dist)
    pos = as_numpy(d.contact.pos)
    result = {}
    for k in range(mjd.ncon):
        con = mjd.contact[k]
        slots = [
            s for s in range(len(geoms))
            if sorted(geoms[s]) == sorted(con.geom) and np.isfinite(dist[s]) and s not in result.values()
        ]
        assert slots, f"MuJoCo contact {k} between geoms {tuple(con.geom)} has no diffmj slot"
        result[k] = min(slots, key=lambda s: np.abs(pos[s] - con.pos).max())
    return result


def mj_efc_J(mjm: mujoco.MjModel, mjd: mujoco.MjData) -> np.ndarray:
    """MuJoCo's constraint Jacobian as a dense [nefc, nv] array."""
    if mujoco.mj_isSparse(mjm):
        out = np.zeros((mjd.nefc, mjm.nv))
        mujoco.mju_sparse2dense(out, mjd.efc_J, mjd.efc_J_rownnz, mjd.efc_J_rowadr, mjd.efc_J_colind)
        return out
    return mjd.efc_J.reshape(mjd.nefc, mjm.nv)


def match_efc(m: diffmj.Model, d: diffmj.Data, mjd: mujoco.MjData) -> tuple[np.ndarray, np.ndarray]:
    """(diffmj rows, MuJoCo rows) of every MuJoCo constraint row, matched by type, object and order."""
    plan = m.constraint_plan
    types, ids = np.asarray(plan.efc_type), np.asarray(plan.efc_id)
    active = as_numpy(d.efc_active).astype(bool)
    slot_of = match_contacts(m, d, mjd)
    ours, theirs = [], []
    k = 0
    while k < mjd.nefc:
        typ, obj = int(mjd.efc_type[k]), int(mjd.efc_id[k])
        end = k
        while end < mjd.nefc and mjd.efc_type[end] == typ and mjd.efc_id[end] == obj:
            end += 1
        group = list(range(k, end))
        our_id = slot_of[obj] if typ in CONTACT_TYPES else obj
        rows = np.flatnonzero((types == typ) & (ids == our_id) & active)
        assert len(rows) == len(group), f"efc type {typ} id {obj}: {len(rows)} rows vs MuJoCo's {len(group)}"
        ours += list(rows)
        theirs += group
        k += len(group)
    assert len(ours) == int(active.sum()), "diffmj has active rows MuJoCo does not"
    return np.asarray(ours, dtype=int), np.asarray(theirs, dtype=int)


def settled_state(mjm: mujoco.MjModel, steps: int, seed: int = 0, ctrl_scale: float = 0.5) -> mujoco.MjData:
    """A MuJoCo C state after ``steps`` steps of random controls (contacts made and broken)."""
    rng = np.random.default_rng(seed)
    mjd = mujoco.MjData(mjm)
    for _ in range(steps):
        mjd.ctrl[:] = ctrl_scale * rng.uniform(-1, 1, mjm.nu)
        mujoco.mj_step(mjm, mjd)
    mujoco.mj_forward(mjm, mjd)
    return mjd
