"""Contacts between named geoms or bodies: their slots in ``d.contact`` and their forces.

``d.contact`` is a fixed array of slots, a few per candidate geom pair (see
``diffmj.types.Contact``). ``contact_slots`` finds a pair's slots once, from
the model; index any per-slot field with them::

    slots = diffmj.contact_slots(m, geom1="foot", geom2="floor")
    d.contact.dist[..., slots], d.contact.active[..., slots]
    normal_force = diffmj.contact_force(m, d, slots)[..., 0].sum(-1)
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffmj import smooth
from diffmj.types import Data, Model


def _geoms(m: Model, geom: str | int | None, body: str | int | None, side: str) -> set[int] | None:
    """Geom ids of one side of the pair: a geom, every geom of a body, or None (anything)."""
    if geom is not None and body is not None:
        raise ValueError(f"give geom{side} or body{side}, not both")
    if geom is not None:
        return {m.names.id_of("geom", geom)}
    if body is not None:
        b = m.names.id_of("body", body)
        return {g for g in range(m.ngeom) if m.geom_bodyid[g] == b}
    return None


def contact_slots(m: Model, *, geom1: str | int | None = None, geom2: str | int | None = None,
                  body1: str | int | None = None, body2: str | int | None = None) -> Tensor:
    """Indices of the contact slots between two geoms or bodies (names or ids). [k] long, on m.device

    One side is required (``geom1`` or ``body1``); without the other (``geom2`` / ``body2``) the
    slots of every pair involving the first come back. The order of the two sides does not
    matter. Reads the model's slot table on the host: call it once, outside compiled code.
    Raises ValueError for unknown names and for objects that can never touch (contype /
    conaffinity, ``<exclude>``, same body), whose contacts would otherwise silently be empty.
    """
    first = _geoms(m, geom1, body1, "1")
    second = _geoms(m, geom2, body2, "2")
    if first is None:
        raise ValueError("contact_slots needs geom1 or body1")
    pairs = m.collision_plan.contact_geom.tolist()  # [ncon, 2]
    slots = [
        s for s, (a, b) in enumerate(pairs)
        if (a in first and (second is None or b in second)) or (b in first and (second is None or a in second))
    ]
    if not slots:
        named = [f"{k}={v!r}" for k, v in (("geom1", geom1), ("body1", body1), ("geom2", geom2), ("body2", body2))
                 if v is not None]
        raise ValueError(f"no contact slots for {', '.join(named)}: these geoms never collide "
                         "(contype / conaffinity, <exclude>, same or parent body, or no geoms)")
    return torch.tensor(slots, dtype=torch.long, device=m.device)


def contact_force(m: Model, d: Data, slots: Tensor | None = None) -> Tensor:
    """Force and torque of contact slots in their contact frames, as mj_contactForce. [*batch, k, 6]

    Components: normal, two tangential frictions, torsional and two rolling frictions (zero
    beyond the slot's condim). ``slots`` from ``contact_slots`` (all ncon slots when None).
    Empty and inactive slots give zero. ``d`` must hold a solved state (after ``forward`` or
    ``step``): the forces are read from ``d.efc_force``. Differentiable.
    """
    if d.batch_dims:
        flat = torch.vmap(smooth.contact_force, in_dims=(None, 0))(m, d.reshape(-1))
        force = flat.reshape(*d.batch_size, *flat.shape[1:])
    else:
        force = smooth.contact_force(m, d)
    return force if slots is None else force[..., slots, :]
