"""Shared helpers: models, random MuJoCo C states, field comparison with one tolerance table."""

from __future__ import annotations

import pathlib

import mujoco
import numpy as np
import pytest
import torch

import diffmj

MODELS = pathlib.Path(__file__).parent / "models"
SHARED_MODELS = pathlib.Path(__file__).parents[1].parent / "shared" / "models"

# One tolerance table (float64, scale-aware: |a - b| <= tol * (1 + |b|)).
TOL = {
    "smooth": 1e-10,  # kinematics, inertia, forces, one step
    "rollout": 1e-9,  # a few steps, where differences grow with the dynamics
}


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
