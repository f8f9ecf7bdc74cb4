"""The planners' forward passes run by MuJoCo C instead of diffmj: the same physics (diffmj matches
MuJoCo C to rounding), without gradients, at C's speed. The planners need no derivative of their
rollouts (the sampling planners none, iLQR the per-step Jacobians only), so given the ``MjModel`` a
diffmj ``Model`` was made from they roll out here and score the states with diffmj's costs.

    rollout_mujoco            open loop, by ``mujoco.rollout`` (CPU threads)
    rollout_feedback_mujoco   under iLQR's feedback law, by ``mj_step``, one trial after another

Both step the model with MuJoCo's automatic reset disabled (``mjDSBL_AUTORESET``): where a state goes bad
(NaN or beyond 1e10), mj_step would otherwise put the simulation back at qpos0 and go on, and a blown-up
rollout would be scored as a harmless one. diffmj never resets either: the rollout's cost is huge or NaN
on both. The flag is set on the caller's MjModel for the call and restored after it (so do not step the
same MjModel from another thread meanwhile): a copy of the model cost 5-15 ms a call on the swing-ups,
whose skybox texture is 11.8 MB, and an iLQR iteration makes up to 11 calls.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import mujoco
import mujoco.rollout
import numpy as np
import torch
from torch import Tensor

from diffmj import Data, Model, State, get_state, set_state


def check_sizes(mj_model: mujoco.MjModel, m: Model) -> None:
    """ValueError unless mj_model has m's sizes (a quick test that m was made from it)."""
    if (mj_model.nq, mj_model.nv, mj_model.na, mj_model.nu, mj_model.nsensordata) != (
            m.nq, m.nv, m.na, m.nu, m.nsensordata):
        raise ValueError("mj_model's sizes (nq, nv, na, nu, nsensordata) differ from the model's")


def _check(mj_model: mujoco.MjModel, m: Model, d: Data, ctrl: Tensor, batched_start: bool = False) -> None:
    check_sizes(mj_model, m)
    if not isinstance(ctrl, Tensor) or ctrl.dim() < 2 or ctrl.shape[-1] != m.nu:
        shape = tuple(ctrl.shape) if isinstance(ctrl, Tensor) else type(ctrl).__name__
        raise ValueError(f"ctrl must be a tensor [..., T, nu={m.nu}], got {shape}")
    if not isinstance(d, Data) or (d.batch_dims and not (batched_start and d.batch_size == ctrl.shape[:-2])):
        batch = f" or a batch [{', '.join(map(str, ctrl.shape[:-2]))}] as ctrl's" if batched_start else ""
        raise ValueError(f"d must be one unbatched diffmj.Data (the initial state){batch}")


@contextlib.contextmanager
def _without_autoreset(mj_model: mujoco.MjModel) -> Iterator[mujoco.MjModel]:
    """mj_model with mjDSBL_AUTORESET set until the block ends, then its own flags again."""
    flags = mj_model.opt.disableflags
    mj_model.opt.disableflags = flags | mujoco.mjtDisableBit.mjDSBL_AUTORESET
    try:
        yield mj_model
    finally:
        mj_model.opt.disableflags = flags


def _numpy(x: Tensor) -> np.ndarray:
    return x.detach().to("cpu", torch.float64).numpy()


def rollout_mujoco(mj_model: mujoco.MjModel, m: Model, d: Data, ctrl: Tensor, *, threads: int = 1) -> Data:
    """``diffmj.rollout`` (no gradient) by MuJoCo C's ``mujoco.rollout``: the Data [..., T] after each step.

    mj_model: the MjModel m was made from. d: one unbatched Data; its FULLPHYSICS state, qacc_warmstart
    and user inputs (mjSTATE_USER: qfrc_applied, xfrc_applied, mocap, eq_active) start every rollout.
    ctrl [..., T, nu]. The returned Data holds the state (FULLPHYSICS), ctrl and sensordata of each step;
    its other fields are copied from d (a cost with ``forward=True`` recomputes them). threads: CPU threads.
    """
    _check(mj_model, m, d, ctrl)
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    batch, horizon = ctrl.shape[:-2], ctrl.shape[-2]
    initial = _numpy(get_state(m, d, State.FULLPHYSICS))
    # every step's input vector is d's user inputs with ctrl (their first component) replaced
    user = _numpy(get_state(m, d, State.USER))
    control = np.repeat(user[None, None], math.prod(batch), 0).repeat(horizon, 1)
    control[..., : m.nu] = _numpy(ctrl).reshape(-1, horizon, m.nu)
    with _without_autoreset(mj_model) as model:
        states, sensordata = mujoco.rollout.rollout(
            model, [mujoco.MjData(model) for _ in range(threads)], initial[None], control,
            control_spec=int(State.USER), initial_warmstart=_numpy(d.qacc_warmstart)[None])
    as_tensor = lambda x: torch.as_tensor(x, device=m.device).to(m.dtype).reshape(*batch, horizon, -1)  # noqa: E731
    trajectory = set_state(m, d.detach().expand(*batch, horizon), as_tensor(states), State.FULLPHYSICS)
    return trajectory.replace(ctrl=ctrl.detach().clone(), sensordata=as_tensor(sensordata))


def rollout_feedback_mujoco(mj_model: mujoco.MjModel, m: Model, d: Data, ctrl: Tensor, gains: Tensor | None,
                            reference: Data | None, *, ctrl_range: tuple[Tensor, Tensor] | None = None) -> Data:
    """``diffmj.rollout_feedback`` (no gradient) by MuJoCo C: u_t = clip(ctrl_t + K_t dx_t), dx_t the tangent
    deviation of the state before step t from reference[t] (``mj_differentiatePos`` for positions), then
    ``mj_step``; the Data [..., T] after each step, holding the state (FULLPHYSICS and qacc_warmstart) and
    the u_t applied in ctrl and the step's sensordata, other fields copied from d (as ``rollout_mujoco``'s).

    mj_model: the MjModel m was made from. d: one unbatched Data (its state, warm start and user inputs
    start every trial), or a batch of them [...] as ctrl's (one start per trial: ``diffmj.optim.sysid``'s
    recorded sequences). ctrl [..., T, nu]: a batch of feedforward controls (iLQR's step sizes); gains
    [T, nu, 2 nv + na] and reference (Data [T]) shared by the batch, or both None: open loop (u_t =
    clip(ctrl_t), the warm start recorded too, unlike ``rollout_mujoco``). ctrl_range: (lower, upper), each
    [nu]; None: no clamp. The trials step one after another in Python, so this suits small batches.
    """
    _check(mj_model, m, d, ctrl, batched_start=True)
    horizon = ctrl.shape[-2]
    ns = 2 * m.nv + m.na
    if (gains is None) != (reference is None):
        raise ValueError("give both gains and reference (feedback) or neither (open loop)")
    if gains is not None and gains.shape != (horizon, m.nu, ns):
        raise ValueError(f"gains must be [T={horizon}, nu={m.nu}, 2nv+na={ns}], got {tuple(gains.shape)}")
    if reference is not None and (not isinstance(reference, Data) or reference.batch_size != (horizon,)):
        raise ValueError(f"reference must be a Data of batch [T={horizon}]")
    batch = ctrl.shape[:-2]
    feedforward = _numpy(ctrl).reshape(-1, horizon, m.nu)
    K = None if gains is None else _numpy(gains)
    if reference is not None:
        ref_qpos, ref_qvel, ref_act = (_numpy(x) for x in (reference.qpos, reference.qvel, reference.act))
    lower, upper = (np.full(m.nu, -np.inf), np.full(m.nu, np.inf)) if ctrl_range is None else map(_numpy, ctrl_range)

    starts = _numpy(get_state(m, d, State.INTEGRATION)).reshape(-1, mujoco.mj_stateSize(mj_model, int(State.INTEGRATION)))
    recorded = State.FULLPHYSICS | State.WARMSTART
    states = np.empty((len(feedforward), horizon, mujoco.mj_stateSize(mj_model, int(recorded))))
    applied = np.empty((len(feedforward), horizon, m.nu))
    sensordata = np.empty((len(feedforward), horizon, m.nsensordata))
    dx = np.empty(ns)
    with _without_autoreset(mj_model) as model:
        for i, u in enumerate(feedforward):
            data = mujoco.MjData(model)
            mujoco.mj_setState(model, data, starts[0 if len(starts) == 1 else i], int(State.INTEGRATION))
            for t in range(horizon):
                if K is not None:
                    mujoco.mj_differentiatePos(model, dx[:m.nv], 1.0, ref_qpos[t], data.qpos)
                    dx[m.nv:2 * m.nv] = data.qvel - ref_qvel[t]
                    dx[2 * m.nv:] = data.act - ref_act[t]
                data.ctrl[:] = applied[i, t] = np.clip(u[t] if K is None else u[t] + K[t] @ dx, lower, upper)
                mujoco.mj_step(model, data)
                mujoco.mj_getState(model, data, states[i, t], int(recorded))
                sensordata[i, t] = data.sensordata
    as_tensor = lambda x: torch.as_tensor(x, device=m.device).to(m.dtype).reshape(*batch, horizon, -1)  # noqa: E731
    start = (d.detach().unsqueeze(-1) if d.batch_dims else d.detach()).expand(*batch, horizon)
    trajectory = set_state(m, start, as_tensor(states), recorded)
    return trajectory.replace(ctrl=as_tensor(applied), sensordata=as_tensor(sensordata))
