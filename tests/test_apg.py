"""optim_examples/apg.py: APG and PPO see the same problem; the smallest setting learns (slow).

Needs the ``envs`` extra (torchrl), imported plainly as tests/test_envs.py does: a missing extra fails the
suite instead of passing it unnoticed.
"""

from __future__ import annotations

import json

import pytest
import torch

import diffmj
from diffmj import optim
from diffmj.envs.torchrl import DiffMJEnv
from optim_examples import apg


@pytest.mark.parametrize("name", ["cartpole", "hopper"])
def test_apg_and_ppo_start_and_reward_alike(name):
    """The worlds APG draws are the ones DiffMJEnv resets to with the same seed (around the task's initial
    pose), and the environment's reward of a step is minus the task's running cost at the action, as the
    return APG differentiates."""
    problem = apg.make_problem(name, torch.float64)
    m = problem.m
    env = DiffMJEnv(m, (3,), reset_noise_scale=problem.reset_noise, observe=apg.observation,
                    reward=apg.reward_of(problem))
    env.set_seed(5)
    reset = env.reset()
    d = apg.initial_states(problem, 3, torch.Generator().manual_seed(5))
    torch.testing.assert_close(reset["observation"], apg.observation(m, d), rtol=0, atol=0)
    pose = torch.tensor(getattr(apg.tasks, name)().qpos0, dtype=m.dtype)
    assert (d.qpos - pose).abs().max() <= problem.reset_noise  # hinges and slides: the noise adds to qpos0
    assert (d.qpos - pose).abs().max() > 0
    action = torch.tensor([[0.5], [-0.2], [0.9]], dtype=m.dtype).expand(3, m.nu).contiguous()
    out = env.step(reset.set("action", action))["next"]
    after = diffmj.step(m, d.replace(ctrl=action))
    torch.testing.assert_close(out["reward"][:, 0], -optim.running_cost(m, problem.cost, after), rtol=1e-12, atol=0)
    assert (out["reward"] < 0).all()


def test_squash_maps_onto_ctrlrange():
    m = apg.make_problem("hopper", torch.float64).m
    z = torch.tensor([[-50.0, 0.0, 50.0]], dtype=m.dtype)
    torch.testing.assert_close(apg.squash(m, z), torch.tensor([[-1.0, 0.0, 1.0]], dtype=m.dtype))


@pytest.mark.slow  # ~2-4 min on a loaded 2-core machine
def test_smallest_setting_improves_the_return(tmp_path):
    """The README's smallest run: APG's evaluation return improves over its budget on the cart-pole; PPO's
    curve starts from the same policy (the same return) and is recorded on the same axes."""
    curves = tmp_path / "apg.json"
    apg.main(["--tasks", "cartpole", "--budget", "30", "--evaluations", "3", "--no-video",
              "--json", str(curves), "--out", str(tmp_path)])
    result = json.loads(curves.read_text())["tasks"]["cartpole"]
    returns = result["apg"]["return"]
    assert returns[-1] > returns[0], returns
    # the same weights; PPO's last layer has nu more rows (the scale), which float32 matmuls round differently
    assert result["ppo"]["return"][0] == pytest.approx(returns[0], rel=1e-6)
    assert result["ppo"]["simulator_steps"][-1] > 0 and len(result["ppo"]["return"]) >= 2
