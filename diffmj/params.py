"""Model parameters read and replaced by MuJoCo's field and object names.

``get_param(m, "body_mass", "torso")`` is the torso's mass, ``get_param(m,
"opt.timestep")`` the timestep; ``set_param`` returns a new Model with a
field, or one object's rows of it, replaced (differentiable in the value,
usable under ``torch.func`` transforms).

A field's prefix names the object type of its rows, as in MuJoCo: ``body_``,
``jnt_``, ``geom_``, ``site_``, ``tendon_``, ``actuator_``, ``sensor_``,
``eq_``, ``pair_``. MuJoCo's dofs and qpos entries have no names: ``dof_*``
fields are read by joint name (the joint's dofs, [ndof, ...]: 1 for hinge /
slide, 3 for ball, 6 for free), and so are ``qpos0`` / ``qpos_spring`` (the
joint's qpos entries, [nqpos]), as ``mjModel.joint(name)`` does in MuJoCo's
Python bindings.

``set_param`` returns the model MuJoCo would simulate for the new value: when the parameter feeds
one of the constants MuJoCo derives at compile time (``diffmj.setconst.SET_CONST_INPUTS``:
masses, inertias, armature, body / joint geometry, qpos0, tendon coefficients, connect anchors,
geom sizes, site frames, actuator gears), it recomputes them with ``diffmj.set_const``, as a
MuJoCo user calls ``mj_setConst`` after changing an ``mjModel`` field. ``Model.replace`` is a raw
field replace that does not.

Fluid forces (``opt.density``, ``opt.viscosity``, ``opt.wind``, ``geom_fluid``) are parameters of a
model loaded with a positive density or viscosity; which bodies use the inertia-box model and which
geoms the ellipsoid model (``fluidshape``) is fixed by ``put_model``, as MuJoCo's compiler fixes it.
Likewise ``body_gravcomp`` is a parameter of a model loaded with some body's gravcomp non-zero
(MuJoCo skips gravity compensation when its compiler counted none, ``ngravcomp`` = 0).
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Iterable

import torch
from torch import Tensor

from diffmj.collision.driver import check_hfield_reach
from diffmj.names import KINDS
from diffmj.setconst import SET_CONST_INPUTS, SET_CONST_OUTPUTS, set_const
from diffmj.types import JointType, Model


def _tensor_fields(node) -> list[str]:
    return [f.name for f in dataclasses.fields(node) if isinstance(getattr(node, f.name), Tensor)]


def _field(m: Model, name: str) -> Tensor:
    """The tensor of parameter ``name``; ValueError for structure or an unknown name."""
    owner, attr = (m.opt, name[4:]) if isinstance(name, str) and name.startswith("opt.") else (m, name)
    if attr not in {f.name for f in dataclasses.fields(owner)}:
        known = _tensor_fields(m) + [f"opt.{n}" for n in _tensor_fields(m.opt)]
        close = difflib.get_close_matches(str(name), known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown model parameter {name!r}{hint}")
    value = getattr(owner, attr)
    if not isinstance(value, Tensor):
        raise ValueError(f"{name!r} is structure fixed by put_model, not a parameter: load a changed model instead")
    return value


def _rows(m: Model, name: str, obj: str | int) -> int | slice:
    """Rows of field ``name`` that belong to object ``obj`` (an index, or a joint's dof / qpos block)."""
    if name in ("qpos0", "qpos_spring"):
        joint = m.names.id_of("jnt", obj)
        start = m.jnt_qposadr[joint]
        return slice(start, start + JointType(m.jnt_type[joint]).nq)
    kind = name.split("_")[0]
    if kind == "dof":
        joint = m.names.id_of("jnt", obj)
        start = m.jnt_dofadr[joint]
        return slice(start, start + JointType(m.jnt_type[joint]).nv)
    if kind not in KINDS:
        raise ValueError(f"{name!r} has no rows per named object; call it without an object name")
    return m.names.id_of(kind, obj)


def get_param(m: Model, name: str, obj: str | int | None = None) -> Tensor:
    """Model parameter ``name`` (MuJoCo's field name, ``opt.*`` for options), whole or one object's rows.

    ``obj``: the object's name or id; None for the whole field. Shapes: the field's shape
    (``body_mass`` [nbody]); with ``obj`` its row (``body_mass`` [], ``geom_friction`` [3]), for
    ``dof_*`` fields the named joint's dofs [ndof, ...] and for ``qpos0`` / ``qpos_spring`` its
    qpos entries [nqpos]. Returns the model's tensor (or a view of it), not a copy.
    Raises ValueError for unknown fields or names and for structural (integer) fields.
    """
    value = _field(m, name)
    return value if obj is None else value[_rows(m, name, obj)]


FLUID_PARAMS = ("opt.density", "opt.viscosity", "opt.wind", "geom_fluid")
# what sets how far a geom reaches over an hfield, for which put_model fixed the cells collided
HFIELD_REACH_PARAMS = ("geom_size", "geom_rbound", "geom_margin", "geom_gap", "pair_margin", "pair_gap", "opt.o_margin")


def set_param(m: Model, name: str, value: Tensor | float, obj: str | int | None = None) -> Model:
    """A new Model with parameter ``name`` (or object ``obj``'s rows of it) set to ``value``.

    ``value`` broadcasts to ``get_param(m, name, obj)``'s shape; a tensor must have the model's
    dtype and device, numbers and lists are converted. ``m`` is unchanged. If ``name`` is in
    ``SET_CONST_INPUTS`` the derived constants (``body_invweight0``, ``dof_invweight0``, ...) are
    recomputed for the new value (``set_const``), so gradients reach the constraint rows through
    them. Differentiable in ``value`` and usable under ``torch.func`` (``grad``, ``vmap`` over
    values). Raises ValueError as ``get_param`` does, for a value that does not broadcast, and for
    fluid parameters (``FLUID_PARAMS``) of a model put_model loaded without fluid forces, for
    ``body_gravcomp`` of a model loaded without gravity compensation, ``geom_surfacevel`` of one loaded
    without surface velocities, and for a geom that would reach
    past the hfield cells put_model planned for it (``HFIELD_REACH_PARAMS``; ``check_hfield_reach``).
    """
    return set_params(m, [(name, value, obj)])


def set_params(m: Model, changes: Iterable[tuple[str, Tensor | float, str | int | None]]) -> Model:
    """``set_param`` for each (name, value, obj) of ``changes`` in turn, with the derived constants
    recomputed once where set_param would recompute them after each: the same Model, one ``set_const``
    instead of one per mass or armature (as a MuJoCo user sets several fields, then calls
    ``mj_setConst`` once). Raises ValueError as ``set_param`` does.
    """
    stale, reach = False, False  # derived constants not yet recomputed; an hfield reach to check
    for name, value, obj in changes:
        if stale and name in SET_CONST_OUTPUTS:  # set_param would have recomputed it before this change
            m, stale = set_const(m), False
        m = replace_param(m, name, value, obj)
        stale |= name in SET_CONST_INPUTS
        reach |= name in HFIELD_REACH_PARAMS
    m = set_const(m) if stale else m
    if reach:
        check_hfield_reach(m)
    return m


def replace_param(m: Model, name: str, value: Tensor | float, obj: str | int | None = None) -> Model:
    """``set_param`` without recomputing the derived constants: ``Model.replace`` by MuJoCo's field and
    object names (the raw write a MuJoCo user makes before calling ``mj_setConst``; ``diffmj.set_const``
    is its counterpart). Raises ValueError as ``set_param`` does, but for the hfield reach (it checks
    nothing derived)."""
    current = _field(m, name)
    if name in FLUID_PARAMS and not m.fluid_plan.enabled:
        raise ValueError(f"{name!r}: the model was loaded without fluid forces (density = viscosity = 0), so "
                         "put_model planned none; set opt.density or opt.viscosity on the mujoco.MjModel and "
                         "call diffmj.put_model again")
    if name == "body_gravcomp" and not m.tree.gravcomp_body.shape[0]:
        raise ValueError("'body_gravcomp': the model was loaded with no body's gravcomp set (MuJoCo's ngravcomp = "
                         "0), so put_model planned no gravity compensation; set a gravcomp on the "
                         "mujoco.MjModel and call diffmj.put_model again")
    if name == "geom_surfacevel" and not m.constraint_plan.surface_velocity:
        raise ValueError("'geom_surfacevel': the model was loaded with no geom's surface velocity set (MuJoCo's "
                         "flg_surfacevel = 0), so its constraint rows add none; set a surfacevel on the "
                         "mujoco.MjModel and call diffmj.put_model again")
    if not isinstance(value, Tensor):
        value = torch.as_tensor(value, dtype=current.dtype, device=current.device)
    if value.dtype != current.dtype or value.device != current.device:
        raise ValueError(f"value for {name!r} is {value.dtype} on {value.device}, "
                         f"the model is {current.dtype} on {current.device}")
    rows = None if obj is None else _rows(m, name, obj)
    target = current if obj is None else current[rows]
    try:
        value = torch.broadcast_to(value, target.shape)
    except RuntimeError:
        raise ValueError(f"value of shape {tuple(value.shape)} does not broadcast to {name!r}"
                         f"{'' if obj is None else f'[{obj!r}]'} of shape {tuple(target.shape)}") from None
    if obj is None:
        new = value.contiguous()
    else:
        index = torch.arange(current.shape[0], device=current.device)[rows].reshape(-1)
        new = current.index_copy(0, index, value.reshape(index.shape[0], *current.shape[1:]))
    if name.startswith("opt."):
        return m.replace(opt=m.opt.replace(**{name[4:]: new}))
    return m.replace(**{name: new})
