"""Gymnasium environments over diffmj: ``DiffMJGymEnv`` (one world) and ``DiffMJVectorEnv`` (a batch of
worlds stepped as one diffmj batch), numpy in and out, float64, on the CPU.

Spaces: the observation is a float64 ``Box`` (-inf, inf) of what ``observe(m, d)`` returns (default
qpos, qvel, act and sensordata concatenated); the action a float64 ``Box`` of [nu] bounded by
``actuator_ctrlrange`` where an actuator is ctrl-limited, (-inf, inf) where not, written into ``ctrl`` and
held for ``frame_skip`` steps. Reward and termination come from ``reward(m, d, action)`` and
``terminated(m, d)`` (``diffmj.envs.common``; defaults: regulation to qpos0, never terminated);
``max_episode_steps`` (None: no limit) truncates. Reset draws qpos0 moved by a velocity uniform in
[-reset_noise_scale, reset_noise_scale] per degree of freedom and qvel uniform in the same range from the
environment's ``np_random`` (seeded by ``reset(seed=...)``), then runs ``forward``.

``render()`` (``render_mode="rgb_array"``) draws through ``mujoco.Renderer``, which needs an OpenGL
context: on a headless machine set ``MUJOCO_GL=egl`` (or ``osmesa``) before importing mujoco.
These environments run without gradients (numpy in and out); ``diffmj.envs.torchrl`` keeps them.
"""

from __future__ import annotations

import gymnasium
import mujoco
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from diffmj.envs import common
from diffmj.io import get_data_into, make_data, put_model
from diffmj.types import Data


class _Simulation:
    """What both environments do with a batch of worlds: spaces, reset, step and render, numpy in and out."""

    def __init__(self, mj_model: mujoco.MjModel, *, frame_skip: int = 1, reset_noise_scale: float = 0.01,
                 observe: common.Observe = common.state_observation,
                 reward: common.Reward = common.regulation_reward,
                 terminated: common.Terminated = common.never_terminated, max_episode_steps: int | None = None,
                 render_size: tuple[int, int] = (240, 320)):
        if not isinstance(mj_model, mujoco.MjModel):
            raise ValueError(f"mj_model must be a mujoco.MjModel, got {type(mj_model).__name__}")
        common.check_options(frame_skip, reset_noise_scale)
        if max_episode_steps is not None and max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be positive or None, got {max_episode_steps}")
        self.mj_model, self.model = mj_model, put_model(mj_model)
        self.frame_skip, self.reset_noise_scale = frame_skip, reset_noise_scale
        self.observe, self.reward, self.terminated = observe, reward, terminated
        self.max_episode_steps, self.render_size = max_episode_steps, render_size
        self.renderer = None
        self.render_fps = round(1 / (mj_model.opt.timestep * frame_skip))
        n_obs = observe(self.model, make_data(self.model)).shape[-1]
        self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (n_obs,), np.float64)
        limited = np.asarray(mj_model.actuator_ctrllimited, bool)
        low = np.where(limited, mj_model.actuator_ctrlrange[:, 0], -np.inf)
        high = np.where(limited, mj_model.actuator_ctrlrange[:, 1], np.inf)
        self.action_space = gymnasium.spaces.Box(low, high, (mj_model.nu,), np.float64)

    def reset(self, batch: tuple[int, ...], rng: np.random.Generator) -> tuple[Data, np.ndarray]:
        """Fresh initial Data of a batch drawn from rng, and its observation [*batch, n_obs]."""
        noise = rng.uniform(-self.reset_noise_scale, self.reset_noise_scale, (2, *batch, self.model.nv))
        with torch.no_grad():
            d = common.initial_data(self.model, *torch.from_numpy(noise))
            return d, self.observe(self.model, d).numpy()

    def step(self, d: Data, action: np.ndarray) -> tuple[Data, np.ndarray, np.ndarray, np.ndarray]:
        """d after one environment step under action [*batch, nu]: (Data, observation, reward, terminated)."""
        action = np.asarray(action, np.float64)
        with torch.no_grad():
            action = torch.from_numpy(action).reshape(d.ctrl.shape)
            d = common.advance(self.model, d, action, self.frame_skip)
            m = self.model
            return d, self.observe(m, d).numpy(), self.reward(m, d, action).numpy(), self.terminated(m, d).numpy()

    def render(self, d: Data) -> np.ndarray:
        """An RGB image [height, width, 3] uint8 of one unbatched Data from the free camera."""
        if self.renderer is None:
            self.renderer = mujoco.Renderer(self.mj_model, *self.render_size)
        mj_data = mujoco.MjData(self.mj_model)
        get_data_into(mj_data, self.mj_model, d)
        self.renderer.update_scene(mj_data)
        return self.renderer.render()

    def close(self) -> None:
        if self.renderer is not None:
            self.renderer.close()
            self.renderer = None


class DiffMJGymEnv(gymnasium.Env):
    """One diffmj world as a ``gymnasium.Env`` (see the module docstring).

    mj_model: the MuJoCo model (diffmj's float64 Model is built from it; rendering uses it).
    options (keywords; defaults): frame_skip (1), reset_noise_scale (0.01), observe, reward, terminated
    (``diffmj.envs.common``'s defaults), max_episode_steps (None), render_size ((240, 320): height, width
    of ``render()``'s images).
    """

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, mj_model: mujoco.MjModel, *, render_mode: str | None = None, **options):
        self.sim = _Simulation(mj_model, **options)
        self.observation_space, self.action_space = self.sim.observation_space, self.sim.action_space
        self.render_mode = render_mode
        self.metadata = {**self.metadata, "render_fps": self.sim.render_fps}
        self.data, self.steps = make_data(self.sim.model), 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.data, observation = self.sim.reset((), self.np_random)
        self.steps = 0
        return observation, {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.data, observation, reward, terminated = self.sim.step(self.data, action)
        self.steps += 1
        truncated = self.sim.max_episode_steps is not None and self.steps >= self.sim.max_episode_steps
        return observation, float(reward), bool(terminated), truncated, {}

    def render(self) -> np.ndarray | None:
        return self.sim.render(self.data) if self.render_mode == "rgb_array" else None

    def close(self) -> None:
        self.sim.close()


class DiffMJVectorEnv(gymnasium.vector.VectorEnv):
    """``num_envs`` diffmj worlds stepped as one batch, a ``gymnasium.vector.VectorEnv`` (see the module
    docstring). Autoreset is Gymnasium's default, next step: a world that terminated or was truncated is
    reset by the following ``step``, whose action for it is ignored (reward 0, not terminated).
    ``render()`` returns one image per world. Other arguments as DiffMJGymEnv's.
    """

    metadata = {"render_modes": ["rgb_array"], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, mj_model: mujoco.MjModel, num_envs: int, *, render_mode: str | None = None, **options):
        if num_envs < 1:
            raise ValueError(f"num_envs must be positive, got {num_envs}")
        self.sim = _Simulation(mj_model, **options)
        self.num_envs, self.render_mode = num_envs, render_mode
        self.single_observation_space, self.single_action_space = self.sim.observation_space, self.sim.action_space
        self.observation_space = gymnasium.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gymnasium.vector.utils.batch_space(self.single_action_space, num_envs)
        self.metadata = {**self.metadata, "render_fps": self.sim.render_fps}
        self.data = make_data(self.sim.model, (num_envs,))
        self.steps = np.zeros(num_envs, np.int64)
        self.needs_reset = np.zeros(num_envs, bool)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.data, observation = self.sim.reset((self.num_envs,), self.np_random)
        self.steps[:] = 0
        self.needs_reset[:] = False
        return observation, {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        stepped, observation, reward, terminated = self.sim.step(self.data, actions)
        self.steps += 1
        if self.needs_reset.any():  # next-step autoreset: these worlds start over instead of stepping
            fresh, fresh_observation = self.sim.reset((self.num_envs,), self.np_random)
            stepped = common.select_worlds(torch.from_numpy(~self.needs_reset), stepped, fresh)
            observation = np.where(self.needs_reset[:, None], fresh_observation, observation)
            reward = np.where(self.needs_reset, 0.0, reward)
            terminated = terminated & ~self.needs_reset
            self.steps[self.needs_reset] = 0
        limit = self.sim.max_episode_steps
        truncated = self.steps >= limit if limit is not None else np.zeros(self.num_envs, bool)
        self.data, self.needs_reset = stepped, terminated | truncated
        return observation, reward, terminated, truncated, {}

    def render(self) -> tuple[np.ndarray, ...] | None:
        if self.render_mode != "rgb_array":
            return None
        return tuple(self.sim.render(self.data[i]) for i in range(self.num_envs))

    def close_extras(self, **kwargs) -> None:
        self.sim.close()
