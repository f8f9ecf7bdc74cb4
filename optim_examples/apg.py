"""Policy learning through the simulator: analytic policy gradients (APG) against torchrl's PPO.

A small MLP policy (state -> tanh -> ctrlrange) is trained on each task by backpropagating the
return of batched, checkpointed closed-loop rollouts (``diffmj.rollout_policy``) through every
step of the episode, contact solves included, as Brax's APG does, with Adam and a clipped gradient
norm. ``--window`` cuts an episode into windows, each one gradient step (the state carried over,
detached): SHAC's truncation without SHAC's critic. On the cart-pole, windows of 30 and 100 steps
made the evaluation return worse in this project's trials (so did a quickly written SHAC-style
critic, not kept), where whole episodes improved it.

The baseline is torchrl's PPO (``ClipPPOLoss``, GAE, a ``Collector``) on
``diffmj.envs.torchrl.DiffMJEnv`` over the same model: the same reward (minus the task's running
cost, ``optim.running_cost``), the same episode length, the same per-world initial-state noise, the
same number of worlds and network sizes, the same wall-clock training budget.

Both are evaluated the same way, with the clock stopped: the deterministic policy (APG's MLP; PPO's
distribution's median, the squashed mean) from a fixed batch of initial states, the return being the
sum of rewards over one episode. Simulator steps count every step taken forward (APG's backward pass
recomputes the checkpointed segments once more; those are not counted).

Tasks (``optim_examples/tasks.py``): MJPC's cart-pole swing-up (no contact) and the hopper standing up
from a crouch (contact). Writes ``apg.png`` (return against training wall time and against simulator
steps), ``apg_<task>.gif`` (the trained APG policy from the first evaluation state) to ``--out`` and
the curves as JSON to ``--json`` (default ``benchmarks/results/apg.json``).
Needs the ``envs`` extra (torchrl) besides diffmj.

Run: python optim_examples/apg.py [--tasks cartpole hopper] [--budget 300] [--worlds 16] [--out DIR]
Smallest: python optim_examples/apg.py --tasks cartpole --budget 30 --evaluations 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import platform
import time
from typing import Any, Callable, NamedTuple

import mujoco
import torch
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import Tensor, nn
from torchrl.collectors import Collector
from torchrl.envs import StepCounter, TransformedEnv
from torchrl.modules import ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

import diffmj
from diffmj import optim
from diffmj.envs import common
from diffmj.envs.torchrl import DiffMJEnv
from optim_examples import report, tasks

DEFAULT_JSON = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "apg.json"


class Problem(NamedTuple):
    """A task as both learners see it.

    m: the model, with qpos0 the task's initial pose (the environment's resets are around qpos0).
    episode: steps per episode. reset_noise: the half-width of the uniform per-world noise on the
    initial pose and velocity (``DiffMJEnv``'s reset_noise_scale). camera: the video's camera.
    """

    name: str
    mj_model: mujoco.MjModel
    m: diffmj.Model
    cost: optim.Cost
    episode: int
    reset_noise: float
    camera: str


# per task: steps per episode, reset noise
SETTINGS = {"cartpole": (200, 0.1), "hopper": (100, 0.05)}


def make_problem(name: str, dtype: torch.dtype) -> Problem:
    task = getattr(tasks, name)()
    mj_model, m, d = tasks.load(task, dtype)
    episode, reset_noise = SETTINGS[name]
    return Problem(name, mj_model, m.replace(qpos0=d.qpos), task.cost, episode, reset_noise, "fixed")


def observation(m: diffmj.Model, d: diffmj.Data) -> Tensor:
    """What both policies see: the physics state (qpos, qvel, act) [*batch, nq + nv + na], as
    ``rollout_policy`` passes it."""
    return diffmj.get_state(m, d, diffmj.State.PHYSICS)


def reward_of(problem: Problem) -> common.Reward:
    """The environment's reward: minus the task's running cost of the state a step ends in, at the
    step's action (d.ctrl is the action there)."""
    return lambda m, d, action: -optim.running_cost(m, problem.cost, d)


def mlp(n_in: int, n_out: int, hidden: int, dtype: torch.dtype) -> nn.Sequential:
    """Two tanh hidden layers, a linear output (both learners' networks)."""
    return nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, n_out)).to(dtype)


def initial_policy(m: diffmj.Model, args: argparse.Namespace) -> nn.Sequential:
    """The policy both learners start from: an MLP state [nq + nv + na] -> pre-squash ctrl [nu], seeded."""
    torch.manual_seed(args.seed)
    return mlp(m.nq + m.nv + m.na, m.nu, args.hidden, m.dtype)


def squash(m: diffmj.Model, z: Tensor) -> Tensor:
    """z [..., nu] squashed into the actuators' ctrlrange by tanh (TanhNormal's map of its sample)."""
    low, high = m.actuator_ctrlrange.unbind(-1)
    return low + (high - low) * (torch.tanh(z) + 1) / 2


def initial_states(problem: Problem, worlds: int, generator: torch.Generator) -> diffmj.Data:
    """A batch [worlds] of initial Data drawn as ``DiffMJEnv``'s reset draws them."""
    return common.random_initial_data(problem.m, (worlds,), problem.reset_noise, generator)


def episode_return(problem: Problem, control: Callable[[Any, Tensor], Tensor], params: Any,
                   d: diffmj.Data) -> float:
    """The mean over the batch d of the return of one episode under the deterministic control."""
    reward = reward_of(problem)
    with torch.no_grad():
        rewards = diffmj.rollout_policy(problem.m, d, control, params, problem.episode,
                                        observe=lambda m, d: reward(m, d, d.ctrl))
    return float(rewards.sum(-1).mean())


class Stopwatch:
    """Training wall time: runs except inside ``paused()`` (evaluation)."""

    def __init__(self):
        self.start, self.paused_s = time.perf_counter(), 0.0

    def seconds(self) -> float:
        return time.perf_counter() - self.start - self.paused_s

    @contextlib.contextmanager
    def paused(self):
        begin = time.perf_counter()
        yield
        self.paused_s += time.perf_counter() - begin


class Curve:
    """A learning curve: the evaluation return after each ``evaluations``-th of the budget."""

    def __init__(self, budget: float, evaluations: int, evaluate: Callable[[], float], label: str):
        self.budget, self.every, self.evaluate, self.label = budget, budget / evaluations, evaluate, label
        self.seconds, self.steps, self.returns = [], [], []
        self.watch = Stopwatch()
        self.record(0)

    def record(self, steps: int) -> None:
        with self.watch.paused():
            self.seconds.append(self.watch.seconds())
            self.steps.append(steps)
            self.returns.append(self.evaluate())

    def tick(self, steps: int) -> bool:
        """After a training step that brought the total to ``steps`` simulator steps: evaluate when due;
        False once the budget is spent (after a last evaluation)."""
        elapsed = self.watch.seconds()
        if elapsed >= self.every * len(self.seconds) or elapsed >= self.budget:
            self.record(steps)
            print(f"{self.label}: {self.seconds[-1]:6.1f} s, {steps:8d} steps, return {self.returns[-1]:10.2f}",
                  flush=True)
        return elapsed < self.budget

    def as_dict(self) -> dict:
        return {"train_seconds": self.seconds, "simulator_steps": self.steps, "return": self.returns}


def train_apg(problem: Problem, args: argparse.Namespace, d_eval: diffmj.Data) -> tuple[Curve, nn.Module]:
    """APG: Adam on the gradient of the batch's mean return over each window of ``--window`` steps,
    backpropagated through the window's checkpointed closed-loop rollout; the episode goes on from the
    window's last state, detached (one window per episode: Brax's APG; shorter: SHAC's truncation)."""
    m = problem.m
    net = initial_policy(m, args)

    def control(params, x):
        return squash(m, torch.func.functional_call(net, params, (x,)))

    optimiser = torch.optim.Adam(net.parameters(), lr=args.apg_lr)
    generator = torch.Generator().manual_seed(args.seed)
    reward = reward_of(problem)

    def reward_and_state(m, d):  # per step: the reward and the state that continues the episode
        return reward(m, d, d.ctrl), diffmj.get_state(m, d, diffmj.State.INTEGRATION)

    curve = Curve(args.budget, args.evaluations, lambda: episode_return(problem, control, dict(net.named_parameters()),
                                                                         d_eval), f"{problem.name} APG")
    steps, t, d = 0, 0, None
    while True:
        if t == 0:
            d = initial_states(problem, args.worlds, generator)
        window = min(args.window or problem.episode, problem.episode - t)
        rewards, states = diffmj.rollout_policy(m, d, control, dict(net.named_parameters()), window,
                                                observe=reward_and_state)
        optimiser.zero_grad()
        (-rewards.mean()).backward()  # the mean return per step: the same scale for any window
        nn.utils.clip_grad_norm_(net.parameters(), args.clip)
        optimiser.step()
        d = diffmj.set_state(m, diffmj.make_data(m, (args.worlds,)), states[:, -1].detach(),
                             diffmj.State.INTEGRATION)
        steps += args.worlds * window
        t = (t + window) % problem.episode
        if not curve.tick(steps):
            return curve, net


def train_ppo(problem: Problem, args: argparse.Namespace, d_eval: diffmj.Data) -> Curve:
    """torchrl's PPO on DiffMJEnv: collect ``--ppo-steps`` steps in every world, GAE, clipped PPO epochs."""
    m = problem.m
    torch.manual_seed(args.seed)
    env = TransformedEnv(DiffMJEnv(m, (args.worlds,), reset_noise_scale=problem.reset_noise, observe=observation,
                                   reward=reward_of(problem)), StepCounter(max_steps=problem.episode))
    env.set_seed(args.seed)
    n_obs = m.nq + m.nv + m.na
    actor_net = mlp(n_obs, 2 * m.nu, args.hidden, m.dtype)  # loc [nu] then scale [nu] (NormalParamExtractor)
    with torch.no_grad():  # the mean starts as APG's policy: both curves start from the same return
        for layer, start in zip(actor_net, initial_policy(m, args)):
            if isinstance(start, nn.Linear):
                layer.weight[: start.out_features] = start.weight
                layer.bias[: start.out_features] = start.bias
    low, high = m.actuator_ctrlrange.unbind(-1)
    actor = ProbabilisticActor(
        TensorDictModule(nn.Sequential(actor_net, NormalParamExtractor()), in_keys=["observation"],
                         out_keys=["loc", "scale"]),
        spec=env.action_spec, in_keys=["loc", "scale"], distribution_class=TanhNormal,
        distribution_kwargs={"low": low, "high": high}, return_log_prob=True)
    critic = ValueOperator(mlp(n_obs, 1, args.hidden, m.dtype), in_keys=["observation"])
    advantage = GAE(gamma=args.gamma, lmbda=0.95, value_network=critic, average_gae=True)
    loss_module = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=1e-3, critic_coeff=1.0,
                              loss_critic_type="smooth_l1")
    optimiser = torch.optim.Adam(loss_module.parameters(), lr=args.ppo_lr)

    def control(params, x):  # the median action: TanhNormal's squash of its mean
        return squash(m, torch.func.functional_call(actor_net, params, (x,))[..., : m.nu])

    curve = Curve(args.budget, args.evaluations,
                  lambda: episode_return(problem, control, dict(actor_net.named_parameters()), d_eval),
                  f"{problem.name} PPO")
    frames = args.worlds * args.ppo_steps
    collector = Collector(env, actor, frames_per_batch=frames, total_frames=-1,
                          auto_register_policy_transforms=False)  # a feed-forward policy: no InitTracker
    steps = 0
    for batch in collector:  # [worlds, ppo_steps]
        with torch.no_grad():
            advantage(batch)
        flat = batch.reshape(-1)
        for _ in range(args.ppo_epochs):
            for index in torch.randperm(frames).split(args.ppo_minibatch):
                losses = loss_module(flat[index])
                total = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                optimiser.zero_grad()
                total.backward()
                nn.utils.clip_grad_norm_(loss_module.parameters(), args.clip)
                optimiser.step()
        steps += frames
        collector.update_policy_weights_()
        if not curve.tick(steps):
            collector.shutdown()
            return curve
    raise AssertionError("the collector has no end (total_frames=-1)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["cartpole", "hopper"], choices=sorted(SETTINGS))
    parser.add_argument("--budget", type=float, default=300, help="training wall seconds per method and task")
    parser.add_argument("--evaluations", type=int, default=10, help="evaluations over the budget")
    parser.add_argument("--worlds", type=int, default=16, help="parallel worlds (both methods)")
    parser.add_argument("--eval-worlds", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64, help="units per hidden layer (both methods)")
    parser.add_argument("--clip", type=float, default=1.0, help="gradient norm clip (both methods)")
    parser.add_argument("--apg-lr", type=float, default=1e-3)
    parser.add_argument("--window", type=int, help="APG's steps per gradient step (default: the episode)")
    parser.add_argument("--ppo-lr", type=float, default=3e-4)
    parser.add_argument("--ppo-steps", type=int, default=64, help="steps per world per PPO batch")
    parser.add_argument("--ppo-epochs", type=int, default=4)
    parser.add_argument("--ppo-minibatch", type=int, default=256)
    parser.add_argument("--gamma", type=float, default=0.99, help="PPO's discount (GAE)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=pathlib.Path, default=DEFAULT_JSON, help="where the curves go")
    report.add_output_arguments(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # small matrices: threading costs more than it saves
    dtype = getattr(torch, args.dtype)

    results = {"settings": {k: v for k, v in vars(args).items() if k not in ("json", "out", "no_video")},
               "machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                           "date": time.strftime("%Y-%m-%d %H:%M"), "load_average_at_start": os.getloadavg()},
               "tasks": {}}
    panels = []
    for name in args.tasks:
        problem = make_problem(name, dtype)
        d_eval = initial_states(problem, args.eval_worlds, torch.Generator().manual_seed(args.seed + 1))
        print(f"{name}: {problem.episode} steps per episode, {args.worlds} worlds, {args.budget:g} s per method",
              flush=True)
        apg, net = train_apg(problem, args, d_eval)
        ppo = train_ppo(problem, args, d_eval)
        results["tasks"][name] = {"episode_steps": problem.episode, "reset_noise": problem.reset_noise,
                                  "apg": apg.as_dict(), "ppo": ppo.as_dict()}
        print(f"{name}: final return APG {apg.returns[-1]:.2f} (from {apg.returns[0]:.2f}), "
              f"PPO {ppo.returns[-1]:.2f} (from {ppo.returns[0]:.2f})", flush=True)
        curves = {"APG": apg, "PPO": ppo}
        panels += [(f"{name}: return vs training time", "training wall time (s)", "episode return",
                    {label: (c.seconds, c.returns) for label, c in curves.items()}),
                   (f"{name}: return vs simulator steps", "simulator steps", "episode return",
                    {label: (c.steps, c.returns) for label, c in curves.items()})]
        if not args.no_video:
            with torch.no_grad():
                qpos = diffmj.rollout_policy(problem.m, d_eval[0], lambda p, x: squash(problem.m, net(x)), {},
                                             problem.episode, observe=("qpos",))["qpos"]
            report.save_video(args.out / f"apg_{name}.gif", problem.mj_model, qpos.double().numpy(),
                              camera=problem.camera)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1))
    print(f"curves: {args.json}", flush=True)
    report.save_curves(args.out / "apg.png", f"APG (diffmj gradients) vs PPO (torchrl), {args.budget:g} s each",
                       panels)


if __name__ == "__main__":
    main()
