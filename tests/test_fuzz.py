"""NaN / Inf fuzzing: gradients stay finite over many random states, float32 and float64.

States mix random poses (contacts made, broken, deep and exactly touching),
zero velocities, identity quaternions and large velocities; gradients flow to
the state, the controls and model parameters through a batched step.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from tests.conftest import BENCHMARK_MODELS, mj_model, settled_state

MODELS = ["humanoid", "ant", "walker2d", "halfcheetah", "hopper", "contacts", "muscles", "dcmotors"]


def _load(name: str) -> mujoco.MjModel:
    path = BENCHMARK_MODELS / f"{name}.xml"
    mjm = mujoco.MjModel.from_xml_path(str(path)) if path.exists() else mj_model(name)
    mjm.opt.iterations, mjm.opt.ls_iterations = min(mjm.opt.iterations, 8), min(mjm.opt.ls_iterations, 8)
    return mjm


def fuzz_states(mjm: mujoco.MjModel, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n states (qpos, qvel, ctrl) around a settled pose, with degenerate cases mixed in."""
    rng = np.random.default_rng(seed)
    base = settled_state(mjm, 5, seed=seed)
    qpos = base.qpos + rng.normal(0, 0.15, (n, mjm.nq)) * rng.uniform(0, 1, (n, 1))
    qvel = rng.normal(0, 1, (n, mjm.nv)) * rng.choice([0.0, 0.1, 1.0, 10.0], (n, 1))
    ctrl = rng.uniform(-1, 1, (n, mjm.nu))
    free, ball = diffmj.JointType.FREE, diffmj.JointType.BALL
    quats = [(mjm.jnt_qposadr[j] + (3 if mjm.jnt_type[j] == free else 0)) for j in range(mjm.njnt)
             if mjm.jnt_type[j] in (free, ball)]
    identity = rng.uniform(size=n) < 0.2
    for adr in quats:
        qpos[identity, adr : adr + 4] = (1, 0, 0, 0)
    for i in range(n):
        mujoco.mj_normalizeQuat(mjm, qpos[i])
    # free bodies resting exactly on z = 0 planes at their lowest geom's half height
    for j in range(mjm.njnt):
        if mjm.jnt_type[j] == free:
            body = mjm.jnt_bodyid[j]
            geoms = range(mjm.body_geomadr[body], mjm.body_geomadr[body] + mjm.body_geomnum[body])
            radius = min((mjm.geom_size[g, 0] for g in geoms if mjm.geom_type[g] == diffmj.GeomType.SPHERE), default=None)
            if radius is not None:
                touching = rng.uniform(size=n) < 0.2
                qpos[touching, mjm.jnt_qposadr[j] + 2] = radius
    return qpos, qvel, ctrl


def _check_finite(name: str, n: int, dtype: torch.dtype, seed: int = 0) -> None:
    mjm = _load(name)
    m = diffmj.put_model(mjm, dtype=dtype)
    qpos, qvel, ctrl = (torch.as_tensor(x, dtype=dtype) for x in fuzz_states(mjm, n, seed))
    batch = diffmj.make_data(m, (n,))
    leaves = {
        "qpos": qpos, "qvel": qvel, "ctrl": ctrl,
        "body_mass": m.body_mass, "geom_friction": m.geom_friction, "geom_solref": m.geom_solref,
        "dof_damping": m.dof_damping,
    }
    leaves = {k: v.clone().requires_grad_(True) for k, v in leaves.items()}
    model = m.replace(**{k: leaves[k] for k in ("body_mass", "geom_friction", "geom_solref", "dof_damping")})
    out = diffmj.step(model, batch.replace(qpos=leaves["qpos"], qvel=leaves["qvel"], ctrl=leaves["ctrl"]))
    assert bool(out.efc_active.any()), "no constraint active in any fuzzed state"
    assert torch.isfinite(out.qacc).all(), "non-finite qacc"
    loss = (out.qvel**2).sum() + out.efc_force.abs().sum() + (out.qacc**2).sum() * 1e-3
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True, materialize_grads=True)
    for key, g in zip(leaves, grads):
        bad = (~torch.isfinite(g)).nonzero()
        assert not len(bad), f"{name} {dtype}: non-finite gradient w.r.t. {key} at {bad[:5].tolist()}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", MODELS)
def test_gradients_finite(name, dtype):
    _check_finite(name, 128, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", MODELS)
def test_gradients_finite_ten_thousand_states(name, dtype):
    for seed in range(10):
        _check_finite(name, 1000, dtype, seed)
