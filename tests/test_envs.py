"""diffmj.envs: the torchrl and Gymnasium environments against diffmj's own stepping and gradients.

These need the ``envs`` extra (torchrl, gymnasium), which scripts/run_tests.sh installs: they are imported
plainly, not skipped, so a missing extra fails the suite instead of passing it unnoticed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import mujoco
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from tensordict.nn import TensorDictModule
from torchrl.data import Bounded, Unbounded
from torchrl.envs.utils import check_env_specs
from torchrl.modules import ValueOperator
from torchrl.modules.planners import CEMPlanner, MPPIPlanner
from torchrl.objectives.value import TDLambdaEstimator

import diffmj
from diffmj.envs import common
from diffmj.envs.gymnasium import DiffMJGymEnv, DiffMJVectorEnv
from diffmj.envs.torchrl import DiffMJEnv, DiffMJModelEnv
from tests.conftest import MODELS, TOL

# every actuator ctrl-limited (a Bounded action spec) and sensors (sensordata in the observation)
CARTPOLE = """
    <mujoco><option timestep="0.01"/>
      <worldbody><body name="cart"><joint name="slider" type="slide" axis="1 0 0" damping="0.1"/>
          <geom type="box" size=".2 .1 .05" mass="1"/>
          <body name="pole"><joint name="hinge" axis="0 1 0" damping="0.01"/>
            <geom type="capsule" fromto="0 0 0 0 0 .6" size=".03" mass=".2"/></body></body>
      </worldbody>
      <actuator><motor joint="slider" gear="5" ctrlrange="-1 1"/></actuator>
      <sensor><jointpos joint="hinge"/><framepos objtype="body" objname="pole"/></sensor></mujoco>"""


def cartpole(dtype=torch.float64) -> diffmj.Model:
    return diffmj.put_model(mujoco.MjModel.from_xml_string(CARTPOLE), dtype=dtype)


def pendulum() -> diffmj.Model:
    """A ball joint (nq != nv), an unlimited actuator (an Unbounded action spec), no sensors."""
    return diffmj.load(str(MODELS / "pendulum.xml"))


def replay(actions: torch.Tensor):
    """A torchrl policy writing actions [*batch, T, nu] one step after another."""
    steps = iter(range(actions.shape[-2]))

    def policy(td):
        return td.set("action", actions[..., next(steps), :])

    return policy


def step_loop(m: diffmj.Model, d: diffmj.Data, actions: torch.Tensor, frame_skip: int) -> list[diffmj.Data]:
    """diffmj.step by hand: the Data after each environment step of actions [*batch, T, nu]."""
    out = []
    for t in range(actions.shape[-2]):
        for _ in range(frame_skip):
            d = diffmj.step(m, d.replace(ctrl=actions[..., t, :]))
        out.append(d)
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_torchrl_specs(dtype):
    m = cartpole(dtype)
    env = DiffMJEnv(m, (3,), frame_skip=2)
    env.set_seed(0)
    check_env_specs(env)
    assert isinstance(env.action_spec, Bounded) and env.action_spec.shape == (3, 1)
    assert env.action_spec.dtype == dtype and env.observation_spec["observation"].dtype == dtype
    torch.testing.assert_close(env.action_spec.space.low, m.actuator_ctrlrange[:, 0].expand(3, 1))
    assert env.observation_spec["observation"].shape == (3, m.nq + m.nv + m.na + m.nsensordata)
    model_env = DiffMJModelEnv(m)
    check_env_specs(model_env)
    assert model_env.observation_spec["state"].shape == (diffmj.state_size(m, diffmj.State.INTEGRATION),)
    assert isinstance(DiffMJEnv(pendulum(), 2).action_spec, Unbounded)  # the elbow's actuator is not limited
    with pytest.raises(ValueError, match="frame_skip"):
        DiffMJEnv(m, 2, frame_skip=0)
    with pytest.raises(ValueError, match="diffmj.Model"):
        DiffMJEnv(mujoco.MjModel.from_xml_string(CARTPOLE))


def test_torchrl_reset_is_seeded_per_world_and_partial():
    m = pendulum()
    env = DiffMJEnv(m, 4, reset_noise_scale=0.1)
    env.set_seed(3)
    first = env.reset()["observation"]
    env.set_seed(3)
    torch.testing.assert_close(env.reset()["observation"], first, rtol=0, atol=0)
    assert (first[1:] != first[:1]).any(-1).all()  # each world drew its own state
    qpos = env.data.qpos
    torch.testing.assert_close(torch.linalg.vector_norm(qpos[:, 2:6], dim=-1), torch.ones(4, dtype=m.dtype))
    start, before = env.reset(), env.data
    reset = torch.tensor([[True], [False], [True], [False]])
    out = env.reset(start.clone().set("_reset", reset))
    kept = ~reset.squeeze(-1)
    for name in ("qpos", "qvel", "sensordata", "xpos", "time"):
        assert torch.equal(getattr(env.data, name)[kept], getattr(before, name)[kept])
    assert (env.data.qvel[~kept] != before.qvel[~kept]).all()
    assert torch.equal(out["observation"][kept], start["observation"][kept])
    torch.testing.assert_close(out["observation"][~kept], common.state_observation(m, env.data)[~kept], rtol=0, atol=0)

    model_env = DiffMJModelEnv(m, reset_noise_scale=0.1)  # stateless: torchrl keeps the unmarked states
    start = model_env.reset(model_env.reset().expand(4).clone())
    out = model_env.reset(start.clone().set("_reset", reset))
    assert torch.equal(out["state"][kept], start["state"][kept])
    assert (out["state"][~kept] != start["state"][~kept]).any(-1).all()


@pytest.mark.parametrize("make_model", [cartpole, pendulum])
def test_torchrl_stepping_is_diffmj_stepping(make_model):
    """Both environments' rollouts are diffmj.step's, bit for bit: observation, reward, Data, state."""
    m, frame_skip, steps = make_model(), 3, 4
    env = DiffMJEnv(m, 2, frame_skip=frame_skip, reset_noise_scale=0.1)
    env.set_seed(1)
    start = env.reset()
    d0 = env.data
    actions = torch.randn(2, steps, m.nu, dtype=m.dtype, generator=torch.Generator().manual_seed(0))
    traj = env.rollout(steps, replay(actions), auto_reset=False, tensordict=start)
    expected = step_loop(m, d0, actions, frame_skip)
    for t, d in enumerate(expected):
        assert torch.equal(traj["next", "observation"][:, t], common.state_observation(m, d))
        assert torch.equal(traj["next", "reward"][:, t, 0], common.regulation_reward(m, d, actions[:, t]))
    assert torch.equal(env.data.qacc, expected[-1].qacc)

    # the stateless environment from the same states: the integration state reproduces every step
    model_env = DiffMJModelEnv(m, frame_skip=frame_skip)
    state = diffmj.get_state(m, d0, diffmj.State.INTEGRATION)
    traj = model_env.rollout(steps, replay(actions), auto_reset=False,
                             tensordict=model_env.reset().expand(2).clone().set("state", state))
    for t, d in enumerate(expected):
        assert torch.equal(traj["next", "state"][:, t], diffmj.get_state(m, d, diffmj.State.INTEGRATION))
        assert torch.equal(traj["next", "observation"][:, t], common.state_observation(m, d))


def test_gradients_through_env_rollout_are_diffmj_rollouts():
    """Open loop (actions and a model parameter) against diffmj.rollout, closed loop (a policy's weights)
    against diffmj.rollout_policy: env.rollout detaches nothing."""
    m, steps, frame_skip = cartpole(), 6, 2
    mass = m.body_mass.clone().requires_grad_()
    m = m.replace(body_mass=mass)
    actions = torch.randn(3, steps, m.nu, dtype=m.dtype, generator=torch.Generator().manual_seed(2))
    actions.requires_grad_()
    env = DiffMJEnv(m, 3, frame_skip=frame_skip, reset_noise_scale=0.2)
    env.set_seed(0)
    start = env.reset()
    d0 = env.data
    ret = env.rollout(steps, replay(actions), auto_reset=False, tensordict=start)["next", "reward"].sum()
    grads = torch.autograd.grad(ret, (actions, mass))

    traj = diffmj.rollout(m, d0, actions.repeat_interleave(frame_skip, -2))[:, frame_skip - 1 :: frame_skip]
    expected = torch.autograd.grad(common.regulation_reward(m, traj, actions).sum(), (actions, mass))
    for got, want in zip(grads, expected):
        assert want.abs().max() > 1e-3  # the return depends on both
        torch.testing.assert_close(got, want, rtol=TOL["batch"], atol=TOL["batch"])

    # closed loop; frame_skip 1 and no sensors, so the observation is rollout_policy's state
    m = pendulum()
    net = torch.nn.Linear(m.nq + m.nv, m.nu, dtype=m.dtype)
    env = DiffMJEnv(m, 2, reset_noise_scale=0.2)
    env.set_seed(0)
    start = env.reset()
    d0 = env.data
    actor = TensorDictModule(lambda x: torch.tanh(net(x)), in_keys=["observation"], out_keys=["action"])
    loss = env.rollout(steps, actor, auto_reset=False, tensordict=start)["next", "observation"][..., 0].sum()
    grads = torch.autograd.grad(loss, tuple(net.parameters()))
    params = dict(net.named_parameters())
    traj = diffmj.rollout_policy(m, d0, lambda p, x: torch.tanh(torch.func.functional_call(net, p, (x,))),
                                 params, steps, observe=("qpos",))
    expected = torch.autograd.grad(traj["qpos"][..., 0].sum(), tuple(params.values()))
    for got, want in zip(grads, expected):
        assert want.abs().max() > 1e-3
        torch.testing.assert_close(got, want, rtol=TOL["batch"], atol=TOL["batch"])


def cem(env: DiffMJModelEnv) -> CEMPlanner:
    return CEMPlanner(env, planning_horizon=5, optim_steps=2, num_candidates=6, top_k=2)


def mppi(env: DiffMJModelEnv) -> MPPIPlanner:
    """MPPI with an (untrained) linear value of the observation for its advantage."""
    n_obs = env.observation_spec["observation"].shape[-1]
    value = ValueOperator(torch.nn.Linear(n_obs, 1, dtype=env.model.dtype), in_keys=["observation"])
    advantage = TDLambdaEstimator(gamma=0.99, lmbda=0.95, value_network=value)
    return MPPIPlanner(env, advantage, temperature=1.0, planning_horizon=5, optim_steps=2, num_candidates=6,
                       top_k=2)


@pytest.mark.parametrize("make_planner", [cem, mppi])
def test_torchrl_planners_plan_over_the_stateless_env(make_planner):
    """torchrl's planners expand the state over their candidates; the plan is a bounded action of the right
    shape, planning does not move the environment's state, and the planner runs as a policy."""
    m = cartpole()
    env = DiffMJModelEnv(m, reset_noise_scale=0.1)
    env.set_seed(0)
    planner = make_planner(env)
    start = env.reset()
    planned = planner(start.clone())
    assert planned["action"].shape == (m.nu,) and planned["action"].abs().max() <= 1
    assert torch.equal(planned["state"], start["state"])
    assert env.rollout(2, planner)["next", "state"].shape == (2, start["state"].shape[-1])


@pytest.mark.filterwarnings("ignore:.*(infinity|symmetric and normalized|alternative render modes)")
@pytest.mark.parametrize("xml", [CARTPOLE, (MODELS / "pendulum.xml").read_text()])
def test_gymnasium_env_checker_and_stepping(xml):
    """Gymnasium's checker passes (its advice on infinite bounds and normalised actions aside: MuJoCo's
    observations are unbounded and ctrlrange is the model's); steps are diffmj.step's, float64."""
    mj_model = mujoco.MjModel.from_xml_string(xml)
    env = DiffMJGymEnv(mj_model, frame_skip=2, max_episode_steps=3, reset_noise_scale=0.1)
    check_env(env, skip_render_check=True)
    observation, _ = env.reset(seed=5)
    assert observation.dtype == np.float64 and env.observation_space.contains(observation)
    m, d = env.sim.model, env.data
    actions = torch.from_numpy(np.stack([env.action_space.sample() for _ in range(3)]))
    for t, expected in enumerate(step_loop(m, d, actions, 2)):
        observation, reward, terminated, truncated, _ = env.step(actions[t].numpy())
        assert np.array_equal(observation, common.state_observation(m, expected).numpy())
        assert reward == common.regulation_reward(m, expected, actions[t]).item()
        assert not terminated and truncated == (t == 2)


def test_gymnasium_vector_env_steps_a_batch_and_autoresets():
    mj_model = mujoco.MjModel.from_xml_string(CARTPOLE)
    env = DiffMJVectorEnv(mj_model, 3, max_episode_steps=2, reset_noise_scale=0.1)
    assert env.observation_space.shape == (3, env.single_observation_space.shape[0])
    first, _ = env.reset(seed=0)
    again, _ = env.reset(seed=0)
    assert np.array_equal(first, again) and not np.array_equal(first[0], first[1])
    d0, m = env.data, env.sim.model
    actions = torch.from_numpy(np.stack([env.action_space.sample() for _ in range(2)], 1))  # [3, 2, nu]
    for t, expected in enumerate(step_loop(m, d0, actions, 1)):
        observation, reward, terminated, truncated, _ = env.step(actions[:, t].numpy())
        assert np.array_equal(observation, common.state_observation(m, expected).numpy())
        assert np.array_equal(reward, common.regulation_reward(m, expected, actions[:, t]).numpy())
        assert not terminated.any() and truncated.all() == (t == 1)
    observation, reward, terminated, truncated, _ = env.step(actions[:, 0].numpy())  # the autoreset step
    assert not np.array_equal(observation, common.state_observation(m, expected).numpy())
    assert (reward == 0).all() and not (terminated | truncated).any()
    assert (env.data.time == 0).all() and np.array_equal(observation, common.state_observation(m, env.data).numpy())


RENDER = """
import mujoco, numpy as np
from diffmj.envs.gymnasium import DiffMJGymEnv, DiffMJVectorEnv
from tests.test_envs import CARTPOLE
mj_model = mujoco.MjModel.from_xml_string(CARTPOLE)
env = DiffMJGymEnv(mj_model, render_mode="rgb_array", render_size=(60, 80), reset_noise_scale=1.0)
env.reset(seed=0)
image = env.render()
mj_data = mujoco.MjData(mj_model)
mj_data.qpos[:] = env.data.qpos.numpy()
mujoco.mj_forward(mj_model, mj_data)
with mujoco.Renderer(mj_model, 60, 80) as renderer:
    renderer.update_scene(mj_data)
    expected = renderer.render()
frames = DiffMJVectorEnv(mj_model, 2, render_mode="rgb_array", render_size=(60, 80)).render()
print(image.shape, image.dtype, np.array_equal(image, expected), image.std() > 0, len(frames), frames[0].shape)
"""


def test_gymnasium_render_is_mujocos():
    """render() draws the Data as mujoco.Renderer draws MuJoCo C's (a subprocess: MUJOCO_GL must be set
    before mujoco is imported; egl renders headless)."""
    root = MODELS.parents[1]
    out = subprocess.run([sys.executable, "-c", RENDER], capture_output=True, text=True, cwd=root,
                         env=dict(os.environ, MUJOCO_GL="egl", PYTHONPATH=str(root)), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "(60, 80, 3) uint8 True True 2 (60, 80, 3)"


def test_user_reward_and_termination():
    """A user's reward and termination replace the defaults; a terminal state ends torchrl's rollout and
    Gymnasium's episode. The default reward is the documented quadratic."""
    m = cartpole()
    cart_x = lambda m, d, action: d.qpos[..., 0]  # noqa: E731
    far = lambda m, d: d.qpos[..., 0].abs() > 0.05  # noqa: E731
    env = DiffMJEnv(m, 2, reward=cart_x, terminated=far, reset_noise_scale=0.0)
    env.set_seed(0)
    push = torch.ones(2, 50, m.nu, dtype=m.dtype)
    traj = env.rollout(50, replay(push))  # stops at the first done
    assert traj["next", "done"][:, -1].all() and not traj["next", "done"][:, :-1].any()
    assert torch.equal(traj["next", "reward"][..., 0], traj["next", "observation"][..., 0])
    gym_env = DiffMJGymEnv(mujoco.MjModel.from_xml_string(CARTPOLE), reward=cart_x, terminated=far,
                           reset_noise_scale=0.0)
    gym_env.reset(seed=0)
    ends = [gym_env.step(np.ones(m.nu))[2] for _ in range(traj.shape[-1])]
    assert ends[-1] and not any(ends[:-1])

    d = diffmj.make_data(pendulum()).replace(qpos=torch.tensor([0.1, -0.2, 0.0, 1.0, 0.0, 0.0], dtype=m.dtype),
                                             qvel=torch.arange(5, dtype=m.dtype))
    rotation = np.pi  # the ball joint's quaternion (0, 1, 0, 0) is half a turn from qpos0's (1, 0, 0, 0)
    expected = -(0.1**2 + 0.2**2 + rotation**2 + 0.1 * 30 + 0.01 * 5)
    reward = common.regulation_reward(pendulum(), d, torch.tensor([1.0, 2.0], dtype=m.dtype))
    torch.testing.assert_close(reward, torch.tensor(expected, dtype=m.dtype), rtol=TOL["batch"], atol=TOL["batch"])
