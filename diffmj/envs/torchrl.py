"""torchrl environments over diffmj: ``DiffMJEnv`` (batched, stateful) and ``DiffMJModelEnv`` (stateless,
the state in the tensordict, for torchrl's planners).

Keys (as torchrl's GymEnv and BraxEnv write them, so ``in_keys=["observation"]`` policies work unchanged):

- ``"observation"``: [*batch, n_obs] of the model's dtype; by default qpos, qvel, act and sensordata
  concatenated (``common.state_observation``), or what ``observe(m, d)`` returns.
- ``"action"``: [*batch, nu], written into ``ctrl`` and held for ``frame_skip`` steps. Its spec is
  ``Bounded`` by ``actuator_ctrlrange`` when every actuator is ctrl-limited (MuJoCo clamps to the same
  range), ``Unbounded`` otherwise (MuJoCo still clamps the limited ones).
- ``"reward"`` [*batch, 1] from ``reward(m, d, action)`` (default ``common.regulation_reward``);
  ``"terminated"`` and ``"done"`` [*batch, 1] from ``terminated(m, d)`` (default: never; add torchrl's
  ``StepCounter(max_steps)`` transform for time limits, which writes ``"truncated"``).
- ``DiffMJModelEnv`` only: ``"state"`` [*batch, state_size(m, State.INTEGRATION)], the state
  ``mj_getState`` calls integration state (time, qpos, qvel, act, warm start, ctrl, applied forces,
  mocap): what a step needs to be reproduced exactly.

Reset draws each world's state independently: qpos0 moved by a velocity uniform in
[-reset_noise_scale, reset_noise_scale] per degree of freedom (``integrate_pos``: quaternions stay unit)
and qvel uniform in the same range, from a ``torch.Generator`` on the model's device seeded by
``env.set_seed(seed)``; then ``forward`` (sensordata as at the start of an episode). A reset with
``"_reset"`` [*batch, 1] set redraws those worlds only.

Steps are differentiable: nothing is detached, so ``env.rollout(T, policy)`` run with gradients enabled
gives a tensordict whose rewards and observations backpropagate to the policy's parameters, the
actions and the model's parameters (``m.replace(body_mass=...)`` with a tensor requiring grad), through
every contact solve. The tape grows with T (no checkpointing: ``diffmj.rollout_policy`` checkpoints).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Bounded, Composite, Unbounded
from torchrl.envs import EnvBase

from diffmj.envs import common
from diffmj.io import make_data
from diffmj.state import get_state, set_state, state_size
from diffmj.types import Data, Model, State


class _DiffMJEnvBase(EnvBase):
    """Specs, reset noise, reward and termination shared by DiffMJEnv and DiffMJModelEnv."""

    # frame_skip is done in _step (one reward per environment step, of the state it ends in); without
    # this torchrl's metaclass would also wrap the environment in a FrameSkipTransform
    _has_frame_skip = True

    def __init__(self, m: Model, batch_size: tuple[int, ...] | int = (), *, frame_skip: int = 1,
                 reset_noise_scale: float = 0.01, observe: common.Observe = common.state_observation,
                 reward: common.Reward = common.regulation_reward,
                 terminated: common.Terminated = common.never_terminated):
        batch_size = (batch_size,) if isinstance(batch_size, int) else tuple(batch_size)
        if not isinstance(m, Model):
            raise ValueError(f"m must be a diffmj.Model (diffmj.put_model / diffmj.load), got {type(m).__name__}")
        common.check_options(frame_skip, reset_noise_scale)
        super().__init__(device=m.device, batch_size=torch.Size(batch_size))
        self.model, self.frame_skip, self.reset_noise_scale = m, frame_skip, reset_noise_scale
        self.observe, self.reward_fn, self.terminated_fn = observe, reward, terminated
        self.generator = torch.Generator(device=m.device)
        n_obs = observe(m, make_data(m)).shape[-1]
        batch = self.batch_size
        kwargs = dict(dtype=m.dtype, device=m.device)
        self.observation_spec = Composite(observation=Unbounded((*batch, n_obs), **kwargs), shape=batch)
        if m.nu and all(m.actuator_ctrllimited):
            low, high = m.actuator_ctrlrange.unbind(-1)
            self.action_spec = Bounded(low.expand(*batch, m.nu), high.expand(*batch, m.nu), (*batch, m.nu),
                                       **kwargs)
        else:
            self.action_spec = Unbounded((*batch, m.nu), **kwargs)
        self.reward_spec = Unbounded((*batch, 1), **kwargs)

    def _set_seed(self, seed: int | None) -> None:
        if seed is None:
            self.generator.seed()  # a non-deterministic seed for this generator alone
        else:
            self.generator.manual_seed(seed)

    def _initial_data(self, batch: torch.Size) -> Data:
        """Fresh per-world initial states for a batch."""
        return common.random_initial_data(self.model, tuple(batch), self.reset_noise_scale, self.generator)

    def _outputs(self, d: Data, action: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """observation, terminated, done and (after a step, action not None) reward of d."""
        m = self.model
        terminated = self.terminated_fn(m, d).unsqueeze(-1)
        outputs = {"observation": self.observe(m, d), "terminated": terminated, "done": terminated.clone()}
        if action is not None:
            outputs["reward"] = self.reward_fn(m, d, action).unsqueeze(-1)
        return outputs


class DiffMJEnv(_DiffMJEnvBase):
    """A batched torchrl environment over diffmj holding its worlds' Data (``env.data``, batch
    ``batch_size``). See the module docstring for keys, reset noise and gradients.

    m: the model (its dtype and device are the environment's). batch_size: the worlds, e.g. (64,).
    frame_skip: diffmj steps per environment step. observe, reward, terminated: functions of the Data
    (``diffmj.envs.common``'s signatures).
    """

    def __init__(self, m: Model, batch_size: tuple[int, ...] | int = (), **options):
        super().__init__(m, batch_size, **options)
        self.data = make_data(m, self.batch_size)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs) -> TensorDictBase:
        fresh = self._initial_data(self.batch_size)
        mask = None if tensordict is None else tensordict.get("_reset", None)
        if mask is not None:  # redraw the worlds marked in "_reset" only
            fresh = common.select_worlds(~mask.reshape(self.batch_size), self.data, fresh)
        self.data = fresh
        return TensorDict(self._outputs(fresh, None), batch_size=self.batch_size, device=self.device)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict.get("action")
        self.data = common.advance(self.model, self.data, action, self.frame_skip)
        return TensorDict(self._outputs(self.data, action), batch_size=self.batch_size, device=self.device)


class DiffMJModelEnv(_DiffMJEnvBase):
    """A stateless torchrl environment over diffmj: each step reads the state from the tensordict's
    ``"state"`` and writes the next one, so one environment steps any batch of states (torchrl's
    ``CEMPlanner`` / ``MPPIPlanner`` expand the current tensordict over their candidates and roll it out).
    Keys, reset noise and gradients as in the module docstring; arguments as DiffMJEnv's.

    batch_size: the batch of a reset without a tensordict (default (): one world); a reset or step with a
    tensordict uses the tensordict's batch.
    """

    batch_locked = False  # any batch of states steps (planners need this); torchrl's pendulum tutorial's way

    def __init__(self, m: Model, batch_size: tuple[int, ...] | int = (), **options):
        super().__init__(m, batch_size, **options)
        state = Unbounded((*self.batch_size, state_size(m, State.INTEGRATION)), dtype=m.dtype, device=m.device)
        self.observation_spec["state"] = state
        self.state_spec = Composite(state=state.clone(), shape=self.batch_size)

    def _outputs(self, d: Data, action: torch.Tensor | None) -> dict[str, torch.Tensor]:
        return {**super()._outputs(d, action), "state": get_state(self.model, d, State.INTEGRATION)}

    def _reset(self, tensordict: TensorDictBase | None, **kwargs) -> TensorDictBase:
        batch = self.batch_size if tensordict is None else tensordict.batch_size
        d = self._initial_data(batch)
        return TensorDict(self._outputs(d, None), batch_size=batch, device=self.device)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        m, batch, action = self.model, tensordict.batch_size, tensordict.get("action")
        d = set_state(m, make_data(m, batch), tensordict.get("state"), State.INTEGRATION)
        d = common.advance(m, d, action, self.frame_skip)
        return TensorDict(self._outputs(d, action), batch_size=batch, device=self.device)
