"""MJPC's cart-pole and acrobot swing-up tasks and a hopper standing up: the models and the costs, written once.

The examples and the planner benchmarks share these. The swing-ups follow MuJoCo MPC's
(github.com/google-deepmind/mujoco_mpc, ``mjpc/tasks/cartpole/`` and ``mjpc/tasks/acrobot/``):
the model is dm_control's (``dm_control/suite/cartpole.xml``, ``acrobot.xml``) with MJPC's
changes, the cost has MJPC's residuals, norms and default weights (the ``user`` attributes of its
``task.xml`` sensors: norm, weight, ...). Only the model description and the cost's definition
are reproduced; MJPC's code is not.

Differences from MJPC, each for a reason:

- the model's timestep is MJPC's planning step (``agent_timestep`` 0.01 s) for both tasks, so
  a plan's steps and the simulated ones are the same (MJPC simulates the cart-pole at 1 ms);
- the cost has terminal terms (MJPC evaluates the same running cost at the last state; here the
  state terms are repeated at x_T with the same weights, without the control term);
- no time normalisation (MJPC divides the total by the horizon; diffmj's ``Cost`` does not scale);
- the cart-pole's slider has no joint limit (dm_control's and MJPC's: +-1.8 m, soft): iLQR's open-loop
  swing-up runs the cart past it (to about -1.9 m), and with the limit it stalled (cost 287 after 7
  iterations, steps of 1/512, against 157 without).

Each swing-up starts hanging down at rest (MJPC's acrobot keyframe; the cart-pole's keyframe
starts upright, a swing-up starts with the pole down).

The hopper (``hopper``, a contact task) is not MJPC's: its cost is modelled on MJPC's humanoid "stand"
(head height, balance over the feet, velocities, controls) for ``models/hopper.xml``, which starts
crouched on its foot at rest and must stand up straight and balance on its one foot.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import mujoco
import numpy as np
import torch

import diffmj
from diffmj import optim

# visual assets of MJPC's tasks/common.xml that the two models use (rendering only)
_ASSETS = """
  <visual><headlight ambient=".4 .4 .4" diffuse=".8 .8 .8" specular="0.1 0.1 0.1"/><map znear=".01"/></visual>
  <asset>
    <texture name="blue_grid" type="2d" builtin="checker" rgb1=".02 .14 .44" rgb2=".27 .55 1" width="300"
             height="300" mark="edge" markrgb="1 1 1"/>
    <material name="blue_grid" texture="blue_grid" texrepeat="1 1" texuniform="true" reflectance=".2"/>
    <texture name="skybox" type="skybox" builtin="gradient" rgb1=".66 .79 1" rgb2=".9 .91 .93" width="800"
             height="800"/>
    <material name="self" rgba=".7 .5 .3 1"/>
    <material name="decoration" rgba=".2 .6 .3 1"/>
    <material name="target" rgba=".6 .3 .3 1"/>
  </asset>
"""

# dm_control's cartpole.xml with MJPC's changes (contact disabled, Euler, lighter damping, a tip site),
# without the slider's limit
CARTPOLE_XML = f"""
<mujoco model="cartpole">
  {_ASSETS}
  <option timestep="0.01" integrator="Euler">
    <flag contact="disable"/>
  </option>
  <default>
    <default class="pole">
      <joint type="hinge" axis="0 1 0" damping="2e-6"/>
      <geom type="capsule" fromto="0 0 0 0 0 1" size="0.045" material="self" mass=".1"/>
    </default>
  </default>
  <worldbody>
    <light name="light" pos="0 0 6"/>
    <camera name="fixed" pos="0 -4 1" zaxis="0 -1 0"/>
    <geom name="floor" pos="0 0 -.05" size="4 4 .2" type="plane" material="blue_grid"/>
    <geom name="rail1" type="capsule" pos="0  .07 1" zaxis="1 0 0" size="0.02 2" material="decoration"/>
    <geom name="rail2" type="capsule" pos="0 -.07 1" zaxis="1 0 0" size="0.02 2" material="decoration"/>
    <body name="cart" pos="0 0 1">
      <joint name="slider" type="slide" axis="1 0 0" damping="1e-4"/>
      <geom name="cart" type="box" size="0.2 0.15 0.1" material="self" mass="1"/>
      <body name="pole_1" childclass="pole">
        <joint name="hinge_1" damping="1e-4"/>
        <geom name="pole_1"/>
        <site name="tip" pos="0 0 1"/>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor name="slide" joint="slider" gear="10" ctrllimited="true" ctrlrange="-1 1"/>
  </actuator>
</mujoco>
"""

# dm_control's acrobot.xml with MJPC's change: Euler instead of RK4
ACROBOT_XML = f"""
<mujoco model="acrobot">
  {_ASSETS}
  <default>
    <joint damping=".05"/>
    <geom type="capsule" mass="1"/>
  </default>
  <option timestep="0.01">
    <flag constraint="disable" energy="enable"/>
  </option>
  <worldbody>
    <light name="light" pos="0 0 6"/>
    <geom name="floor" size="3 3 .2" type="plane" material="blue_grid"/>
    <site name="target" type="sphere" pos="0 0 4" size="0.2" material="target" group="3"/>
    <camera name="fixed" pos="0 -6 2" zaxis="0 -1 0"/>
    <body name="upper_arm" pos="0 0 2">
      <joint name="shoulder" type="hinge" axis="0 1 0"/>
      <geom name="upper_arm_decoration" material="decoration" type="cylinder" fromto="0 -.06 0 0 .06 0"
            size="0.051" mass="0"/>
      <geom name="upper_arm" fromto="0 0 0 0 0 1" size="0.05" material="self"/>
      <body name="lower_arm" pos="0 0 1">
        <joint name="elbow" type="hinge" axis="0 1 0"/>
        <geom name="lower_arm" fromto="0 0 0 0 0 1" size="0.049" material="self"/>
        <site name="tip" pos="0 0 1" size="0.01"/>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor name="elbow" joint="elbow" gear="2" ctrllimited="true" ctrlrange="-1 1"/>
  </actuator>
</mujoco>
"""


class Task(NamedTuple):
    """A task (a swing-up or the hopper standing up).

    xml: the MJCF model. cost: the MJPC-style ``optim.Cost``. qpos0 [nq]: the initial (hanging) pose,
    at rest. horizon: MJPC's planning horizon in seconds (``agent_horizon``). describe(qpos, qvel): how
    far a state [nq], [nv] (numpy) is from the goal, in words. error(qpos): the distance from the goal
    pose (the task's docstring gives its unit); the pose counts as up when it is below ``tolerance``.
    """

    name: str
    xml: str
    cost: optim.Cost
    qpos0: tuple[float, ...]
    horizon: float
    describe: Callable[[np.ndarray, np.ndarray], str]
    error: Callable[[np.ndarray], float]
    tolerance: float


def _cost(state: tuple, control: tuple, terminal_weight: float, forward: bool = False) -> optim.Cost:
    """Running terms: the state terms and the control term; terminal: the state terms, weights scaled.

    Each term is (residual, weight[, norm]) as ``optim.Term`` takes them.
    """
    running = tuple(optim.Term(*term) for term in (*state, control))
    terminal = tuple(optim.Term(residual, weight * terminal_weight, *norm) for residual, weight, *norm in state)
    return optim.Cost(running=running, terminal=terminal, forward=forward)


def _ctrl(m: diffmj.Model, d: diffmj.Data) -> torch.Tensor:
    return d.ctrl


def _pole_angle(qpos: np.ndarray) -> float:
    """The pole's angle from upright in (-pi, pi]."""
    return math.remainder(float(qpos[1]), 2 * math.pi)


def cartpole(open_loop: bool = False) -> Task:
    """MJPC's cart-pole: the pole up, the cart centred, the pole slow, small controls (``cartpole.cc``).

    open_loop: a cost for one plan over a fixed horizon (iLQR, no replanning) instead of MJPC's:
    quadratic norms and the end weighted heavily. iLQR's Gauss-Newton model of MJPC's
    ``SmoothAbs(0.01)`` on cos(angle) - 1 is nearly flat away from upright (curvature p^2 / |r|^3): from
    hanging, 10 iterations on MJPC's cost (end x100) left it at 2630 with steps of 1/64, where this
    cost converges. error: the pole's angle from upright (rad); up within 0.2 rad.
    """

    def vertical(m, d):  # 0 when upright (hinge angle 0)
        return torch.cos(d.qpos[1:2]) - 1

    def upright(m, d):
        # the tip's offset from upright per metre of pole, (sin a, cos a - 1): its squared norm
        # 2 - 2 cos a is quadratic near upright (where 1 - cos a alone would be quartic and flat)
        angle = d.qpos[1]
        return torch.stack((torch.sin(angle), torch.cos(angle) - 1))

    def centered(m, d):  # MJPC's goal parameter: 0
        return d.qpos[:1]

    def pole_velocity(m, d):
        return d.qvel[1:2]

    def velocity(m, d):
        return d.qvel

    if open_loop:
        cost = optim.Cost(running=(optim.Term(upright, 1.0), optim.Term(centered, 0.1), optim.Term(_ctrl, 0.1)),
                          terminal=(optim.Term(upright, 1000.0), optim.Term(velocity, 100.0)))
    else:
        state = ((vertical, 10.0, optim.SmoothAbs(0.01)), (centered, 10.0, optim.SmoothAbs(0.1)),
                 (pole_velocity, 0.1))
        cost = _cost(state, (_ctrl, 0.1), 1.0)

    def describe(qpos, qvel):
        return (f"pole {_pole_angle(qpos):+.4f} rad from upright, cart at {qpos[0]:+.3f} m, "
                f"velocities ({qvel[0]:+.3f} m/s, {qvel[1]:+.3f} rad/s)")

    return Task("cartpole", CARTPOLE_XML, cost, (0.0, math.pi), 1.0, describe, lambda qpos: abs(_pole_angle(qpos)),
                0.2)


TARGET = (0.0, 4.0)  # the acrobot's target site, (x, z)


def acrobot_tip(qpos: torch.Tensor) -> torch.Tensor:
    """The acrobot's tip site (x, z) [..., 2] from qpos [..., 2]: two 1 m links from the shoulder at
    (0, 2), angles from upright about y. MJPC reads ``site_xpos``; computed from qpos, the cost needs no
    ``forward`` pass (which made each plan 10x slower)."""
    shoulder, elbow = qpos[..., 0], qpos[..., 0] + qpos[..., 1]
    return torch.stack((torch.sin(shoulder) + torch.sin(elbow), 2 + torch.cos(shoulder) + torch.cos(elbow)), -1)


def acrobot() -> Task:
    """MJPC's acrobot: the tip at the target 4 m up, slow joints, small controls (``acrobot.cc``).

    Checked against MJPC's ``task.xml`` (quadratic norms, weights 50 / 1 / 0.05, agent timestep 0.01 s,
    horizon 2 s, planner 0: predictive sampling, 10 knots, noise 0.05) and dm_control's ``acrobot.xml``
    (gear 2, ctrlrange [-1, 1], damping 0.05): the same. A swing-up is long: upright holds 39.2 J more
    potential energy than hanging and the elbow motor delivers at most 2 N m times the elbow's speed; the
    greedy pump u = sign(elbow velocity) gains it only after 5.2 s (MuJoCo C). A 2-3 s plan cannot contain
    a swing-up, and the cost's nearest minimum is the lower link balanced upright on the hanging upper one
    (the tip 2 m short).

    error: the tip's distance from the target (m); up within 0.2 m.
    """

    def distance(m, d):  # the target minus the tip, in z and x
        tip = acrobot_tip(d.qpos)
        return torch.stack((TARGET[1] - tip[1], TARGET[0] - tip[0]))

    def velocity(m, d):
        return d.qvel

    cost = _cost(((distance, 50.0), (velocity, 1.0)), (_ctrl, 0.05), 1.0)

    def tip_distance(qpos):
        x, z = acrobot_tip(torch.as_tensor(qpos)).tolist()
        return math.hypot(TARGET[0] - x, TARGET[1] - z)

    def describe(qpos, qvel):
        return (f"tip {tip_distance(qpos):.4f} m from the target, joint velocities "
                f"({qvel[0]:+.3f}, {qvel[1]:+.3f}) rad/s")

    return Task("acrobot", ACROBOT_XML, cost, (math.pi, 0.0), 2.0, describe, tip_distance, 0.2)


def load(task: Task, dtype: torch.dtype = torch.float64,
         timestep: float | None = None) -> tuple[mujoco.MjModel, diffmj.Model, diffmj.Data]:
    """The task's MjModel, diffmj Model (dtype) and initial Data (qpos0, at rest).

    timestep: replaces the model's (0.01 s) in both models (a coarser step makes a plan of the same
    duration cheaper).
    """
    mj_model = mujoco.MjModel.from_xml_string(task.xml)
    if timestep is not None:
        if not timestep > 0:
            raise ValueError(f"timestep must be positive, got {timestep}")
        mj_model.opt.timestep = timestep
    m = diffmj.put_model(mj_model, dtype=dtype)
    d = diffmj.make_data(m).replace(qpos=torch.tensor(task.qpos0, dtype=dtype))
    return mj_model, m, d


# models/hopper.xml (gym's hopper: torso, thigh, leg and foot in the x-z plane, three hinge motors of gear
# 200) with the task's changes: controls limited to [-1, 1] (gym's range; the sampling planners' noise is in
# these units) and MJPC's 0.01 s step (the model's 0.005 s doubles every plan's cost; the contact's default
# solref time constant 0.02 s is still twice the step)
HOPPER_XML = """
<mujoco model="hopper">
  <compiler autolimits="true"/>
  <option integrator="Euler" timestep="0.01"/>
  <worldbody>
    <light pos="0 0 3"/>
    <camera name="fixed" pos="0 -4 0.8" zaxis="0 -1 0" mode="trackcom"/>
    <geom name="floor" type="plane" size="5 5 0.1" contype="1" conaffinity="1"/>
    <body name="torso" pos="0 0 1.25">
      <joint name="rootx" type="slide" axis="1 0 0"/>
      <joint name="rootz" type="slide" axis="0 0 1"/>
      <joint name="rooty" type="hinge" axis="0 1 0"/>
      <geom type="capsule" fromto="0 0 0 0 0 -0.4" size="0.05" mass="3" friction="1 0.005 0.0001" condim="3"/>
      <body name="thigh" pos="0 0 -0.4">
        <joint name="thigh_joint" type="hinge" axis="0 1 0" damping="5"/>
        <geom type="capsule" fromto="0 0 0 0 0 -0.45" size="0.05" mass="3" friction="1 0.005 0.0001" condim="3"/>
        <body name="leg" pos="0 0 -0.45">
          <joint name="leg_joint" type="hinge" axis="0 1 0" damping="5"/>
          <geom type="capsule" fromto="0 0 0 0 0 -0.5" size="0.04" mass="3" friction="1 0.005 0.0001" condim="3"/>
          <body name="foot" pos="0 0 -0.5">
            <joint name="foot_joint" type="hinge" axis="0 1 0" damping="5"/>
            <geom type="capsule" fromto="-0.13 0 0 0.16 0 0" size="0.06" mass="2" friction="2 0.005 0.0001"
                  condim="3"/>
          </body>
        </body>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor joint="thigh_joint" gear="200" ctrlrange="-1 1"/>
    <motor joint="leg_joint" gear="200" ctrlrange="-1 1"/>
    <motor joint="foot_joint" gear="200" ctrlrange="-1 1"/>
  </actuator>
</mujoco>
"""
HOPPER_LINKS = (0.4, 0.45, 0.5)  # torso, thigh, leg: from the torso's top (its body origin) down to the ankle
HOPPER_TORSO_Z = 1.25  # the torso body's height at rootz = 0
# standing straight with the foot's capsule (radius 0.06) on the floor: the torso's top this high
HOPPER_STAND_HEIGHT = 0.06 + sum(HOPPER_LINKS)


def hopper_points(qpos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The hopper's torso top and ankle (x, z), each [..., 2], from qpos [..., 6] (rootx, rootz, rooty and
    the three hinges, all about y): MuJoCo's ``xpos`` of the bodies "torso" and "foot", computed from qpos so
    that the cost needs no ``forward`` pass (as ``acrobot_tip``)."""
    top = torch.stack((qpos[..., 0], HOPPER_TORSO_Z + qpos[..., 1]), -1)
    ankle, angle = top, qpos[..., 2]
    for length, joint in zip(HOPPER_LINKS, range(3, 6)):  # each link hangs from its parent's end
        ankle = ankle - length * torch.stack((torch.sin(angle), torch.cos(angle)), -1)
        angle = angle + qpos[..., joint]
    return top, ankle


def hopper_crouch() -> tuple[float, ...]:
    """The hopper's initial pose: crouched (torso leaning forward 0.5 rad, knee forward, foot flat) with the
    foot on the floor, the torso's top 0.27 m below standing and ahead of the ankle: at rest it falls."""
    angles = (0.5, -1.3, 1.4, -0.6)  # rooty and the three hinges; they sum to 0: the foot is flat
    _, ankle = hopper_points(torch.tensor((0.0, 0.0, *angles), dtype=torch.float64))
    return (0.0, 0.06 - float(ankle[1]), *angles)


def hopper() -> Task:
    """The hopper stands up from a crouch and balances on its foot: an MJPC-like cost after its humanoid
    "stand" task (``humanoid/stand``: head height, balance as the centre of mass over the feet, velocities,
    controls) with the torso's top for the head and the ankle for the feet.

    Running terms: the top's height below standing (100, ``SmoothAbs(0.1)`` as MJPC's height), the top's
    horizontal offset from the ankle (50, ``SmoothAbs(0.1)``: upright over the foot), the joint velocities
    (0.1) and the controls (0.1); terminal: the state terms again. error: the distance of the torso's top
    from where it is standing straight over the ankle (m); standing within 0.1 m.
    """

    def height(m, d):
        top, _ = hopper_points(d.qpos)
        return top[1:] - HOPPER_STAND_HEIGHT

    def balance(m, d):
        top, ankle = hopper_points(d.qpos)
        return top[:1] - ankle[:1]

    def velocity(m, d):
        return d.qvel

    state = ((height, 100.0, optim.SmoothAbs(0.1)), (balance, 50.0, optim.SmoothAbs(0.1)), (velocity, 0.1))
    cost = _cost(state, (_ctrl, 0.1), 1.0)

    def standing_error(qpos):
        top, ankle = hopper_points(torch.as_tensor(qpos, dtype=torch.float64))
        return math.hypot(float(top[0] - ankle[0]), float(top[1]) - HOPPER_STAND_HEIGHT)

    def describe(qpos, qvel):
        top, ankle = hopper_points(torch.as_tensor(qpos, dtype=torch.float64))
        return (f"torso top {standing_error(qpos):.4f} m from standing (height {float(top[1]):.3f} m, "
                f"{float(top[0] - ankle[0]):+.3f} m ahead of the ankle), speed {np.linalg.norm(qvel):.3f}")

    return Task("hopper", HOPPER_XML, cost, hopper_crouch(), 0.5, describe, standing_error, 0.1)
