"""get_state / set_state against mj_getState / mj_setState; integrate_pos / differentiate_pos against MuJoCo C."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj import State
from tests.conftest import MODELS, TOL, assert_close, mj_model, random_state

MODEL_NAMES = ("chain", "actuators", "constraints", "contacts", "sensors")
SPECS = [State(1 << i) for i in range(15)] + [
    State.PHYSICS, State.FULLPHYSICS, State.USER, State.INTEGRATION, State.QPOS | State.CTRL | State.MOCAP_QUAT]


def mj_state(mjm: mujoco.MjModel, mjd: mujoco.MjData, spec: int) -> np.ndarray:
    state = np.empty(mujoco.mj_stateSize(mjm, spec))
    mujoco.mj_getState(mjm, mjd, state, spec)
    return state


def busy_state(mjm: mujoco.MjModel, seed: int) -> mujoco.MjData:
    """random_state with every state component non-trivial (warmstart, mocap orientation, eq_active)."""
    rng = np.random.default_rng(seed)
    mjd = random_state(mjm, seed)
    mjd.qacc_warmstart[:] = rng.standard_normal(mjm.nv)
    mjd.mocap_quat[:] = rng.standard_normal((mjm.nmocap, 4))
    mjd.eq_active[:] = rng.integers(0, 2, mjm.neq)
    return mjd


def tensor(x: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_get_state_matches_mj_getState(name):
    mjm = mj_model(name)
    m = diffmj.put_model(mjm)
    mjd = busy_state(mjm, seed=1)
    d = diffmj.put_data(m, mjd)
    for spec in SPECS:
        assert diffmj.state_size(m, spec) == mujoco.mj_stateSize(mjm, spec), spec
        np.testing.assert_array_equal(diffmj.get_state(m, d, spec).numpy(), mj_state(mjm, mjd, spec), str(spec))
    mj_spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    np.testing.assert_array_equal(diffmj.get_state(m, d, mj_spec).numpy(), mj_state(mjm, mjd, mj_spec))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_set_state_matches_mj_setState(name):
    mjm = mj_model(name)
    m = diffmj.put_model(mjm)
    mjd = busy_state(mjm, seed=2)
    for spec in (State.INTEGRATION, State.PHYSICS, State.USER, State.TIME | State.MOCAP_POS):
        state = mj_state(mjm, mjd, spec)
        expected = mujoco.MjData(mjm)
        mujoco.mj_setState(mjm, expected, state, spec)
        d = diffmj.set_state(m, diffmj.make_data(m), tensor(state), spec)
        np.testing.assert_array_equal(diffmj.get_state(m, d, State.INTEGRATION).numpy(),
                                      mj_state(mjm, expected, State.INTEGRATION), str(spec))
        actual = diffmj.get_data(mjm, d)
        for field in ("time", "qpos", "qvel", "act", "qacc_warmstart", "ctrl", "qfrc_applied", "xfrc_applied",
                      "eq_active", "mocap_pos", "mocap_quat"):
            np.testing.assert_array_equal(getattr(actual, field), getattr(expected, field), f"{spec} {field}")


def test_round_trip_batched_and_pure():
    mjm = mj_model("chain")
    m = diffmj.put_model(mjm)
    states = torch.stack([tensor(mj_state(mjm, busy_state(mjm, seed), State.INTEGRATION)) for seed in range(6)])
    states = states.reshape(2, 3, -1)
    d = diffmj.make_data(m, (2, 3))
    before = d.qpos.clone()
    out = diffmj.set_state(m, d, states, State.INTEGRATION)
    assert torch.equal(d.qpos, before)
    assert torch.equal(diffmj.get_state(m, out, State.INTEGRATION), states)
    assert torch.equal(diffmj.get_state(m, out[1, 2], State.PHYSICS),
                       diffmj.get_state(m, out, State.PHYSICS)[1, 2])


def test_state_is_differentiable():
    m = diffmj.load(MODELS / "chain.xml")
    d = diffmj.make_data(m)
    state = diffmj.get_state(m, d, State.PHYSICS).requires_grad_(True)
    out = diffmj.step(m, diffmj.set_state(m, d, state, State.PHYSICS))
    grad, = torch.autograd.grad(diffmj.get_state(m, out, State.PHYSICS).square().sum(), state)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_state_refuses_bad_input():
    m = diffmj.load(MODELS / "chain.xml")
    d = diffmj.make_data(m)
    with pytest.raises(ValueError, match="spec"):
        diffmj.get_state(m, d, 1 << 15)
    with pytest.raises(ValueError, match="shape"):
        diffmj.set_state(m, d, torch.zeros(3, dtype=torch.float64), State.QPOS)
    with pytest.raises(ValueError, match="float32"):
        diffmj.set_state(m, d, torch.zeros(m.nq), State.QPOS)
    userdata = mujoco.MjModel.from_xml_string('<mujoco><size nuserdata="2"/><worldbody/></mujoco>')
    with pytest.raises(ValueError, match="nuserdata"):
        diffmj.get_state(diffmj.put_model(userdata), diffmj.make_data(diffmj.put_model(userdata)), State.USER)


def test_integrate_and_differentiate_pos_match_mujoco():
    mjm = mj_model("chain")  # free, ball, hinge and slide joints
    m = diffmj.put_model(mjm)
    rng = np.random.default_rng(3)
    qpos, qvel, dts, expected_qpos, expected_qvel = [], [], [], [], []
    for seed in range(4):
        q1 = random_state(mjm, seed).qpos.copy()
        v = rng.standard_normal(mjm.nv)
        dt = float(rng.uniform(0.01, 0.5))
        q2 = q1.copy()
        mujoco.mj_integratePos(mjm, q2, v, dt)
        back = np.empty(mjm.nv)
        mujoco.mj_differentiatePos(mjm, back, dt, q1, q2)
        qpos.append(q1), qvel.append(v), dts.append(dt), expected_qpos.append(q2), expected_qvel.append(back)
        assert_close("integrate_pos", diffmj.integrate_pos(m, tensor(q1), tensor(v), dt), q2, TOL["batch"])
        assert_close("differentiate_pos", diffmj.differentiate_pos(m, tensor(q1), tensor(q2), dt), back, TOL["batch"])
    q1, v, dt = tensor(qpos), tensor(qvel), tensor(dts)
    batched = diffmj.integrate_pos(m, q1.reshape(2, 2, -1), v.reshape(2, 2, -1), dt.reshape(2, 2))
    assert_close("batched integrate_pos", batched.reshape(4, -1), np.array(expected_qpos), TOL["batch"])
    batched = diffmj.differentiate_pos(m, q1, tensor(expected_qpos), dt)
    assert_close("batched differentiate_pos", batched, np.array(expected_qvel), TOL["batch"])
    # one configuration against a batch of velocities, one dt for all
    broadcast = diffmj.integrate_pos(m, q1[0], v, 0.1)
    assert broadcast.shape == (4, m.nq)
    np.testing.assert_allclose(broadcast[2].numpy(), diffmj.integrate_pos(m, q1[0], v[2], 0.1).numpy(), atol=0)


def test_integrate_pos_refuses_bad_shapes():
    m = diffmj.load(MODELS / "chain.xml")
    with pytest.raises(ValueError, match="qvel"):
        diffmj.integrate_pos(m, m.qpos0, m.qpos0, 0.1)
    with pytest.raises(ValueError, match="broadcast"):
        diffmj.differentiate_pos(m, m.qpos0.expand(2, -1), m.qpos0.expand(3, -1))


def test_compiles_without_graph_breaks():
    """Batched set_state, integrate_pos, differentiate_pos, get_state in one graph (aot_eager: no inductor time)."""
    m = diffmj.load(MODELS / "chain.xml")
    d = diffmj.make_data(m, 3)
    velocity = torch.linspace(0, 1, 3 * m.nv, dtype=m.dtype).reshape(3, m.nv)

    def advance(state: torch.Tensor) -> torch.Tensor:
        d1 = diffmj.set_state(m, d, state, State.PHYSICS)
        qpos = diffmj.integrate_pos(m, d1.qpos, velocity, 0.1)
        back = diffmj.differentiate_pos(m, d1.qpos, qpos, 0.1)
        return diffmj.get_state(m, d1.replace(qpos=qpos, qvel=back), State.PHYSICS)

    state = diffmj.get_state(m, d, State.PHYSICS)
    compiled = torch.compile(advance, fullgraph=True, backend="aot_eager")
    assert_close("compiled", compiled(state), advance(state), TOL["batch"])
