"""Broad phase, done once in ``put_model``: every geom pair that may ever touch.

MuJoCo filters pairs twice. Static rules (contype / conaffinity, same or
parent weld body, both bodies dof-less, ``<exclude>``, explicit ``<pair>``)
decide which pairs can collide at all; runtime bounding-volume tests only
skip pairs that are too far apart to produce a contact. diffmj applies the
static rules here and runs the narrow phase on every remaining pair each
step, so the number of contact slots is fixed (vmap- and compile-friendly);
a pair that is too far apart simply yields no active contact.
"""

from __future__ import annotations

import math

import mujoco
import numpy as np
import torch
from torch import Tensor

from diffmj.collision.hfield import HFields, build_hfields, candidate_cells, contact_slots, hfield_unsupported
from diffmj.collision.mesh import Meshes, build_meshes, mesh_unsupported
from diffmj.collision.pairs import COLLIDERS
from diffmj.dataclass import PyTreeNode, pytree_dataclass, static_field
from diffmj.enums import DisableBit, GeomType, ObjType

@pytree_dataclass
class PairGroup(PyTreeNode):
    """Candidate pairs sharing one narrow-phase function."""

    types: tuple[GeomType, GeomType] = static_field()
    pair: Tensor  # [n] indices into the candidate pair list
    cells: Tensor  # [K, 2] long: hfield pairs: offsets (row, column) of the cells to collide ([0, 2] otherwise)
    # [n] hfield pairs: the geom_rbound + margin + gap each pair's cells cover (hfield.planned_reach); inf otherwise
    reach: Tensor


@pytree_dataclass
class CollisionPlan(PyTreeNode):
    """Candidate geom pairs, grouped by type, and the fixed layout of contact slots."""

    geom1: Tensor  # [npair] first geom (lower type) of each candidate pair
    geom2: Tensor  # [npair]
    explicit: Tensor  # [npair] bool: pair comes from <pair> (parameters from pair_*)
    pair_id: Tensor  # [npair] index into the model's pair_* arrays (0 if not explicit)
    priority1: Tensor  # [npair] 1 where geom1's priority wins, 0 where geom2's, 0.5 if equal
    groups: tuple[PairGroup, ...]
    contact_pair: Tensor  # [ncon] candidate pair of each contact slot
    contact_geom: Tensor  # [ncon, 2] geom ids of each contact slot
    meshes: Meshes  # the meshes of the mesh geoms in candidate pairs
    geom_mesh: Tensor  # [ngeom] row of each geom's mesh in ``meshes`` (0 for other geoms)
    hfields: HFields  # the hfields of the hfield geoms in candidate pairs
    geom_hfield: Tensor  # [ngeom] row of each geom's hfield in ``hfields`` (0 for other geoms)
    contact_dim: tuple[int, ...] = static_field()  # condim of each contact slot
    contact_order: tuple[int, ...] = static_field()  # the slots in the order MuJoCo lists their contacts
    ncon: int = static_field()


def _weld_info(mjm: mujoco.MjModel, body: int) -> tuple[int, int, int]:
    weld = int(mjm.body_weldid[body])
    return weld, int(mjm.body_weldid[mjm.body_parentid[weld]]), int(mjm.body_dofnum[weld])


def _bodies_may_collide(mjm: mujoco.MjModel, b1: int, b2: int) -> bool:
    """MuJoCo's filterBodyPair (sleep aside), plus the body-level bitmask and <exclude>."""
    weld1, parent1, dofs1 = _weld_info(mjm, b1)
    weld2, parent2, dofs2 = _weld_info(mjm, b2)
    if weld1 == weld2 or (dofs1 == 0 and dofs2 == 0):
        return False
    filterparent = not mjm.opt.disableflags & DisableBit.FILTERPARENT
    if filterparent and weld1 and weld2 and (weld1 == parent2 or weld2 == parent1):
        return False
    signature = (min(b1, b2) << 16) + max(b1, b2)
    return signature not in set(int(s) for s in mjm.exclude_signature)


def _bitmask_ok(mjm: mujoco.MjModel, g1: int, g2: int) -> bool:
    ct, ca = mjm.geom_contype, mjm.geom_conaffinity
    return bool((ct[g1] & ca[g2]) or (ct[g2] & ca[g1]))


def candidate_pairs(mjm: mujoco.MjModel) -> list[tuple[int, int, int]]:
    """(geom1, geom2, pair id or -1) for every pair that may collide, geom1 of lower type."""
    if mjm.opt.disableflags & (DisableBit.CONTACT | DisableBit.CONSTRAINT):
        return []
    explicit = {}
    for p in range(mjm.npair):
        g1, g2 = int(mjm.pair_geom1[p]), int(mjm.pair_geom2[p])
        explicit[(min(g1, g2), max(g1, g2))] = p
    pairs = []
    geom_body = mjm.geom_bodyid
    for g1 in range(mjm.ngeom):
        for g2 in range(g1 + 1, mjm.ngeom):
            if (g1, g2) in explicit:
                continue
            b1, b2 = int(geom_body[g1]), int(geom_body[g2])
            if _bitmask_ok(mjm, g1, g2) and _bodies_may_collide(mjm, b1, b2):
                pairs.append((g1, g2, -1))
    pairs += [(g1, g2, p) for (g1, g2), p in explicit.items()]
    typed = []
    for g1, g2, p in pairs:
        if mjm.geom_type[g1] > mjm.geom_type[g2]:
            g1, g2 = g2, g1
        typed.append((g1, g2, p))
    return typed


def _priority1(mjm: mujoco.MjModel, g1: int, g2: int) -> float:
    """1 where geom1's priority wins, 0 where geom2's, 0.5 if equal (mj_contactParam)."""
    pr1, pr2 = mjm.geom_priority[g1], mjm.geom_priority[g2]
    return 0.5 if pr1 == pr2 else float(pr1 > pr2)


def _condim(mjm: mujoco.MjModel, g1: int, g2: int, p: int, priority1: float) -> int:
    """condim of a candidate pair: the pair's own, the winner's, else the larger (mj_contactParam)."""
    if p >= 0:
        return int(mjm.pair_dim[p])
    if priority1 != 0.5:
        return int(mjm.geom_condim[g1] if priority1 == 1.0 else mjm.geom_condim[g2])
    return int(max(mjm.geom_condim[g1], mjm.geom_condim[g2]))


def _margin_gap(mjm: mujoco.MjModel, g1: int, g2: int, p: int) -> float:
    """margin + gap of a candidate pair as compiled (the pair's own for a <pair>)."""
    if p >= 0:
        return float(mjm.pair_margin[p] + mjm.pair_gap[p])
    return float(mjm.geom_margin[g1] + mjm.geom_margin[g2] + mjm.geom_gap[g1] + mjm.geom_gap[g2])


def _describe(mjm: mujoco.MjModel, g1: int, g2: int) -> str:
    n1 = mujoco.mj_id2name(mjm, ObjType.GEOM, g1) or f"#{g1}"
    n2 = mujoco.mj_id2name(mjm, ObjType.GEOM, g2) or f"#{g2}"
    type1, type2 = (GeomType(mjm.geom_type[g]).name.lower() for g in (g1, g2))
    return f"geom pair '{n1}' ({type1}) - '{n2}' ({type2})"


def _first_pair(mjm: mujoco.MjModel, types) -> str | None:
    """A description of the first candidate pair whose type pair is in ``types``, if any."""
    for g1, g2, _ in candidate_pairs(mjm):
        if (int(mjm.geom_type[g1]), int(mjm.geom_type[g2])) in types:
            return _describe(mjm, g1, g2)
    return None


def _pair_assets(mjm: mujoco.MjModel, kind: GeomType) -> list[int]:
    """The meshes (or hfields) of the mesh (hfield) geoms in candidate pairs, in order of first use."""
    assets = []
    for g in (g for pair in candidate_pairs(mjm) for g in pair[:2]):
        if mjm.geom_type[g] == kind and mjm.geom_dataid[g] not in assets:
            assets.append(int(mjm.geom_dataid[g]))
    return assets


def _asset_rows(mjm: mujoco.MjModel, kind: GeomType, assets: list[int]) -> list[int]:
    """Each geom's row in ``assets`` (its mesh or hfield; 0 for geoms of other types)."""
    return [assets.index(int(k)) if t == kind and k in assets else 0 for t, k in zip(mjm.geom_type, mjm.geom_dataid)]


def unsupported_pair(mjm: mujoco.MjModel) -> str | None:
    """A description of the first candidate pair without a narrow-phase function, if any."""
    missing = {(a, b) for a in GeomType for b in GeomType if a <= b} - set(COLLIDERS)
    pair = _first_pair(mjm, missing)
    if pair:
        return f"{pair}: collision"
    for g1, g2, p in candidate_pairs(mjm):
        why = mjm.geom_type[g1] == GeomType.HFIELD and hfield_unsupported(mjm, g2, _margin_gap(mjm, g1, g2, p))
        if why:
            return f"{_describe(mjm, g1, g2)}: {why}"
        for g in (g1, g2):
            why = mjm.geom_type[g] == GeomType.MESH and mesh_unsupported(mjm, int(mjm.geom_dataid[g]))
            if why:
                return f"{_describe(mjm, g1, g2)}: mesh {mujoco.mj_id2name(mjm, ObjType.MESH, mjm.geom_dataid[g])}: {why}"
    return None


def convex_pair(mjm: mujoco.MjModel, multi: bool = False) -> str | None:
    """A description of the first candidate pair MuJoCo collides with mjc_Convex (with ``multi``:
    one that multi-CCD may give more than one contact), if any."""
    return _first_pair(mjm, [key for key, collider in COLLIDERS.items()
                             if collider.general_convex
                             and (not multi or (collider.max_contacts > 1 and not collider.single_ccd))])


def _mujoco_pair_order(mjm: mujoco.MjModel, pairs: list[tuple[int, int, int]]) -> list[tuple]:
    """Sort key of each candidate pair: where mj_collision lists its contacts in d.contact.

    Body pairs come in order of signature (lower body << 16 + higher body); within one, the
    <pair> elements first (by pair id), then the other geom pairs by (geom of the lower body,
    geom of the higher body), as its all-to-all loop and its sort after the midphase do.
    """
    keys = []
    for g1, g2, p in pairs:
        b1, b2 = int(mjm.geom_bodyid[g1]), int(mjm.geom_bodyid[g2])
        signature = (min(b1, b2) << 16) + max(b1, b2)
        low, high = (g1, g2) if b1 < b2 else (g2, g1)
        keys.append((signature, 0, p, 0) if p >= 0 else (signature, 1, low, high))
    return keys


def build_collision_plan(mjm: mujoco.MjModel, dtype: torch.dtype, device: torch.device) -> CollisionPlan:
    pairs = candidate_pairs(mjm)

    def long(x) -> Tensor:
        return torch.as_tensor(np.asarray(x, dtype=np.int64).reshape(-1), device=device)

    g1 = [g for g, _, _ in pairs]
    g2 = [g for _, g, _ in pairs]
    pid = [p for _, _, p in pairs]
    priority1 = [_priority1(mjm, a, b) for a, b in zip(g1, g2)]

    groups, contact_pair, contact_dim = [], [], []
    for key, collider in COLLIDERS.items():
        members = [i for i, (a, b, _) in enumerate(pairs) if (mjm.geom_type[a], mjm.geom_type[b]) == key]
        if not members:
            continue
        cells, reach = candidate_cells(mjm, [(g1[i], g2[i], _margin_gap(mjm, g1[i], g2[i], pid[i])) for i in members]) \
            if key[0] == GeomType.HFIELD else ([], [math.inf] * len(members))
        slots = contact_slots(len(cells)) if cells else collider.max_contacts
        groups.append(PairGroup(types=key, pair=long(members), cells=long(cells).reshape(-1, 2),
                                reach=torch.as_tensor(reach, dtype=dtype, device=device)))
        for i in members:
            contact_pair += [i] * slots
            contact_dim += [_condim(mjm, g1[i], g2[i], pid[i], priority1[i])] * slots
    pair_order = _mujoco_pair_order(mjm, pairs)
    contact_order = sorted(range(len(contact_pair)), key=lambda s: (pair_order[contact_pair[s]], s))
    meshes = _pair_assets(mjm, GeomType.MESH)
    hfields = _pair_assets(mjm, GeomType.HFIELD)
    geoms = np.stack([np.asarray(g1, dtype=np.int64), np.asarray(g2, dtype=np.int64)], -1)
    contact_geom = geoms[np.asarray(contact_pair, dtype=np.int64)] if contact_pair else np.zeros((0, 2))
    return CollisionPlan(
        geom1=long(g1),
        geom2=long(g2),
        explicit=torch.as_tensor([p >= 0 for p in pid], dtype=torch.bool, device=device),
        pair_id=long([max(p, 0) for p in pid]),
        priority1=torch.as_tensor(priority1, dtype=dtype, device=device),
        groups=tuple(groups),
        contact_pair=long(contact_pair),
        contact_geom=torch.as_tensor(contact_geom.astype(np.int64), device=device).reshape(-1, 2),
        meshes=build_meshes(mjm, meshes, dtype, device),
        geom_mesh=long(_asset_rows(mjm, GeomType.MESH, meshes)),
        hfields=build_hfields(mjm, hfields, dtype, device),
        geom_hfield=long(_asset_rows(mjm, GeomType.HFIELD, hfields)),
        contact_dim=tuple(contact_dim),
        contact_order=tuple(contact_order),
        ncon=len(contact_pair),
    )
