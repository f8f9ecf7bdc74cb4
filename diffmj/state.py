"""The simulation state as one vector (mj_getState / mj_setState) and motion on the position manifold.

``get_state`` / ``set_state`` use MuJoCo's ``mjtState`` layout: the components
picked by ``spec`` are concatenated in the order of their bits. Components
diffmj models cannot hold (history buffers, plugin state, plasticity) are
empty, as ``put_model`` refuses models that have them; userdata is refused
when the model has some (``nuserdata > 0``), as diffmj's Data holds none.
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffmj import math, workarounds
from diffmj.types import Data, Model, State


# the Data field of each component diffmj holds, in MuJoCo's order; the others are always empty
_FIELDS = {
    State.TIME: "time",
    State.QPOS: "qpos",
    State.QVEL: "qvel",
    State.ACT: "act",
    State.WARMSTART: "qacc_warmstart",
    State.CTRL: "ctrl",
    State.QFRC_APPLIED: "qfrc_applied",
    State.XFRC_APPLIED: "xfrc_applied",
    State.EQ_ACTIVE: "eq_active",
    State.MOCAP_POS: "mocap_pos",
    State.MOCAP_QUAT: "mocap_quat",
}


def _components(m: Model, spec: int) -> list[tuple[str, tuple[int, ...]]]:
    """(Data field, unbatched shape) of each component of ``spec`` that is not empty, in order."""
    if not hasattr(spec, "__index__") or not 0 <= int(spec) <= State.INTEGRATION:
        raise ValueError(f"spec must be a combination of diffmj.State (mjtState) bits, got {spec!r}")
    spec = State(int(spec))
    if spec & State.USERDATA and m.nuserdata:
        raise ValueError(f"State.USERDATA: the model has nuserdata = {m.nuserdata}, diffmj's Data holds none")
    shapes = {
        "time": (),
        "qpos": (m.nq,),
        "qvel": (m.nv,),
        "act": (m.na,),
        "qacc_warmstart": (m.nv,),
        "ctrl": (m.nu,),
        "qfrc_applied": (m.nv,),
        "xfrc_applied": (m.nbody, 6),
        "eq_active": (m.neq,),
        "mocap_pos": (m.nmocap, 3),
        "mocap_quat": (m.nmocap, 4),
    }
    return [(name, shapes[name]) for bit, name in _FIELDS.items() if spec & bit]


def state_size(m: Model, spec: int) -> int:
    """Length of the state vector of ``spec`` (mj_stateSize)."""
    return sum(torch.Size(shape).numel() for _, shape in _components(m, spec))


def get_state(m: Model, d: Data, spec: int) -> Tensor:
    """The components ``spec`` picks, concatenated in MuJoCo's order (mj_getState). [*batch, size]

    ``spec``: ``diffmj.State`` (or ``mujoco.mjtState``) bits, e.g. ``State.PHYSICS``.
    ``eq_active`` comes out as 0.0 / 1.0. Differentiable in every float component.
    """
    batch = tuple(d.batch_size)
    parts = []
    for name, shape in _components(m, spec):
        value = getattr(d, name)
        if value.shape != (*batch, *shape):
            raise ValueError(f"d.{name} has shape {tuple(value.shape)}, the model needs {(*batch, *shape)}")
        parts.append(value.to(m.dtype).reshape(*batch, -1))
    if not parts:
        return torch.zeros((*batch, 0), dtype=m.dtype, device=m.device)
    return torch.cat(parts, -1)


def set_state(m: Model, d: Data, state: Tensor, spec: int) -> Data:
    """A new Data with the components ``spec`` picks read from ``state`` (mj_setState).

    ``state``: [*batch, state_size(m, spec)] with the Data's batch shape, the model's dtype
    and device. Other fields are copied from ``d`` unchanged (derived quantities are not
    recomputed: call ``forward``). ``eq_active`` is set where the entry is non-zero.
    """
    batch = tuple(d.batch_size)
    components = _components(m, spec)
    size = state_size(m, spec)
    if not isinstance(state, Tensor) or state.shape != (*batch, size):
        shape = tuple(state.shape) if isinstance(state, Tensor) else type(state).__name__
        raise ValueError(f"state must be a tensor of shape {(*batch, size)} (Data batch shape, state size); "
                         f"got {shape}")
    if state.dtype != m.dtype or state.device != m.device:
        raise ValueError(f"state is {state.dtype} on {state.device}, the model is {m.dtype} on {m.device}")
    changes = {}
    start = 0
    for name, shape in components:
        n = torch.Size(shape).numel()
        # a copy: fields that are views of one tensor would make a compiled step recompile
        value = state[..., start : start + n].reshape((*batch, *shape)).clone()
        start += n
        changes[name] = value != 0 if name == "eq_active" else value
    return d.replace(**changes)


def _integrate_pos(m: Model, qpos: Tensor, qvel: Tensor, dt: Tensor) -> Tensor:
    """integrate_pos of one unbatched configuration. [nq]"""
    tree = m.tree
    new = workarounds.add_at_distinct(qpos, tree.scalar_qposadr, dt * qvel[tree.scalar_dofadr])

    def rotate(new: Tensor, qadr: Tensor, dofadr: Tensor) -> Tensor:
        quat = math.quat_integrate(math.gather_blocks(qpos, qadr, 4), math.gather_blocks(qvel, dofadr, 3), dt)
        index = qadr[:, None] + torch.arange(4, device=qadr.device)
        return new.index_copy(0, index.reshape(-1), quat.reshape(-1))

    if tree.ball_jnt.shape[0]:
        new = rotate(new, tree.ball_qposadr, tree.ball_dofadr)
    if tree.free_jnt.shape[0]:
        new = workarounds.add_blocks(new, tree.free_qposadr, dt * math.gather_blocks(qvel, tree.free_dofadr, 3))
        new = rotate(new, tree.free_qposadr + 3, tree.free_dofadr + 3)
    return new


def _differentiate_pos(m: Model, qpos1: Tensor, qpos2: Tensor, dt: Tensor) -> Tensor:
    """differentiate_pos of one unbatched pair of configurations. [nv]"""
    tree = m.tree
    qvel = qpos1.new_zeros(m.nv)
    dif = qpos2[tree.scalar_qposadr] - qpos1[tree.scalar_qposadr]
    qvel = qvel.index_copy(0, tree.scalar_dofadr, dif)

    def rotation(qvel: Tensor, qadr: Tensor, dofadr: Tensor) -> Tensor:
        q1 = math.gather_blocks(qpos1, qadr, 4)
        q2 = math.gather_blocks(qpos2, qadr, 4)
        index = dofadr[:, None] + torch.arange(3, device=dofadr.device)
        return qvel.index_copy(0, index.reshape(-1), math.quat_sub(q2, q1).reshape(-1))

    if tree.ball_jnt.shape[0]:
        qvel = rotation(qvel, tree.ball_qposadr, tree.ball_dofadr)
    if tree.free_jnt.shape[0]:
        pos = math.gather_blocks(qpos2, tree.free_qposadr, 3) - math.gather_blocks(qpos1, tree.free_qposadr, 3)
        index = tree.free_dofadr[:, None] + torch.arange(3, device=qpos1.device)
        qvel = qvel.index_copy(0, index.reshape(-1), pos.reshape(-1))
        qvel = rotation(qvel, tree.free_qposadr + 3, tree.free_dofadr + 3)
    return qvel / dt


def _map_configurations(fn, m: Model, names: tuple[str, str], a: Tensor, size_a: int, b: Tensor, size_b: int,
                        dt: Tensor | float) -> Tensor:
    """fn(m, a, b, dt) over the broadcast leading dimensions of a [..., size_a], b [..., size_b], dt [...]."""
    for name, x, size in ((names[0], a, size_a), (names[1], b, size_b)):
        if not isinstance(x, Tensor) or x.dim() < 1 or x.shape[-1] != size:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{name} must be a tensor [..., {size}], got {shape}")
    dt = torch.as_tensor(dt, dtype=a.dtype, device=a.device)
    try:
        batch = torch.broadcast_shapes(a.shape[:-1], b.shape[:-1], dt.shape)
    except RuntimeError:
        raise ValueError(f"batch shapes of {names[0]} {tuple(a.shape[:-1])}, {names[1]} {tuple(b.shape[:-1])} "
                         f"and dt {tuple(dt.shape)} do not broadcast") from None
    if not batch:
        return fn(m, a, b, dt)
    a = a.expand(*batch, size_a).reshape(-1, size_a)
    b = b.expand(*batch, size_b).reshape(-1, size_b)
    out = torch.vmap(fn, in_dims=(None, 0, 0, 0))(m, a, b, dt.expand(batch).reshape(-1))
    return out.reshape(*batch, -1)


def integrate_pos(m: Model, qpos: Tensor, qvel: Tensor, dt: Tensor | float) -> Tensor:
    """qpos advanced by the velocity qvel over time dt, quaternions on the manifold (mj_integratePos).

    qpos [..., nq], qvel [..., nv], dt [...] or a float; leading dimensions broadcast.
    Returns [..., nq]. Ball and free-joint quaternions are normalised before rotating.
    """
    return _map_configurations(_integrate_pos, m, ("qpos", "qvel"), qpos, m.nq, qvel, m.nv, dt)


def differentiate_pos(m: Model, qpos1: Tensor, qpos2: Tensor, dt: Tensor | float = 1.0) -> Tensor:
    """The velocity that integrate_pos turns qpos1 into qpos2 with over dt (mj_differentiatePos).

    qpos1, qpos2 [..., nq], dt [...] or a float; leading dimensions broadcast. Returns [..., nv].
    """
    return _map_configurations(_differentiate_pos, m, ("qpos1", "qpos2"), qpos1, m.nq, qpos2, m.nq, dt)
