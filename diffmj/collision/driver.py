"""Collision driver: narrow phase over the candidate pairs and contact parameters (mj_collision).

Every candidate pair (see ``plan.py``) is collided every step by the
function of its geom-type pair; the results fill a fixed array of contact
slots. A slot holds a contact when its distance is below the pair's margin
+ gap (``dist = +inf`` otherwise) and is ``active`` (produces constraint
rows) when its distance is below the margin, as in MuJoCo.

Contact parameters are mixed from geom parameters at run time, so that
gradients reach ``geom_friction``, ``geom_solref``, ``geom_solimp``,
``geom_solmix``, ``geom_margin`` and ``geom_gap``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffmj import math, workarounds
from diffmj.collision.common import Candidates, GeomPose, HFieldPose, MeshPose, make_frame
from diffmj.collision.hfield import hfield_shape
from diffmj.collision.mesh import mesh_shape
from diffmj.collision.pairs import COLLIDERS
from diffmj.enums import GeomType
from diffmj.types import Contact, Data, EnableBit, Model

MINMU = 1e-5  # mjMINMU: smallest friction coefficient MuJoCo allows


def _mix_geom_params(m: Model, g1: Tensor, g2: Tensor, priority1: Tensor):
    """MuJoCo's mixing of geom contact parameters (mj_contactParam): friction [n, 3], solref, solimp."""
    s1, s2 = m.geom_solmix[g1], m.geom_solmix[g2]
    ok1, ok2 = s1 >= math.MINVAL, s2 >= math.MINVAL
    total = torch.where(ok1 & ok2, s1 + s2, 1.0)
    mix = torch.where(ok1 & ok2, s1 / total, torch.where(ok1, 1.0, torch.where(ok2, 0.0, 0.5)))
    mix = mix[:, None]
    ref1, ref2 = m.geom_solref[g1], m.geom_solref[g2]
    standard = (ref1[:, :1] > 0) & (ref2[:, :1] > 0)
    solref = torch.where(standard, mix * ref1 + (1 - mix) * ref2, torch.minimum(ref1, ref2))
    solimp = mix * m.geom_solimp[g1] + (1 - mix) * m.geom_solimp[g2]
    friction = torch.maximum(m.geom_friction[g1], m.geom_friction[g2])

    # unequal priority: take the winner's parameters unmixed
    w = priority1[:, None]
    first = w == 1.0
    second = w == 0.0

    def pick(a, b, mixed):
        return torch.where(first, a, torch.where(second, b, mixed))

    return (
        pick(m.geom_friction[g1], m.geom_friction[g2], friction),
        pick(ref1, ref2, solref),
        pick(m.geom_solimp[g1], m.geom_solimp[g2], solimp),
    )


def contact_params(m: Model) -> dict[str, Tensor]:
    """Per candidate pair: friction [npair, 5], solref, solreffriction, solimp, margin, gap."""
    plan = m.collision_plan
    g1, g2 = plan.geom1, plan.geom2
    friction3, solref, solimp = _mix_geom_params(m, g1, g2, plan.priority1)
    friction = torch.cat((friction3[:, :1], friction3[:, :1], friction3[:, 1:2], friction3[:, 2:], friction3[:, 2:]), -1)
    margin = m.geom_margin[g1] + m.geom_margin[g2]
    gap = m.geom_gap[g1] + m.geom_gap[g2]
    solreffriction = torch.zeros_like(solref)
    if m.npair:
        p = plan.pair_id
        explicit = plan.explicit
        e = explicit[:, None]
        friction = torch.where(e, m.pair_friction[p], friction)
        solref = torch.where(e, m.pair_solref[p], solref)
        solimp = torch.where(e, m.pair_solimp[p], solimp)
        solreffriction = torch.where(e, m.pair_solreffriction[p], solreffriction)
        margin = torch.where(explicit, m.pair_margin[p], margin)
        gap = torch.where(explicit, m.pair_gap[p], gap)
    opt = m.opt
    if opt.enabled(EnableBit.OVERRIDE):
        friction = opt.o_friction.expand_as(friction)
        solref = opt.o_solref.expand_as(solref)
        solimp = opt.o_solimp.expand_as(solimp)
        margin = opt.o_margin.expand_as(margin)
    return {
        "friction": torch.clamp(friction, min=MINMU),
        "solref": solref,
        "solreffriction": solreffriction,
        "solimp": solimp,
        "margin": margin,
        "gap": gap,
    }


def check_hfield_reach(m: Model, margin_gap: Tensor | None = None) -> None:
    """ValueError where a geom of an hfield pair reaches farther than put_model planned cells for.

    The hfield cells collided per pair are fixed at put_model from the geom's bounding radius, margin
    and gap (hfield.candidate_cells); a geom grown since (``geom_size`` through ``geom_rbound``,
    ``geom_margin``, ``geom_gap``, ``pair_margin``, ``pair_gap``, ``opt.o_margin``) would lose the cells
    past them without a word. Checked in eager mode, under vmap for every element (``margin_gap``
    [npair]: margin + gap per candidate pair, as ``contact_params`` gives; computed if None); not under
    torch.compile, whose shapes stay as planned: check a changed model eagerly (set_param does).
    """
    if torch.compiler.is_compiling():
        return
    plan = m.collision_plan
    for group in plan.groups:
        if group.types[0] != GeomType.HFIELD:
            continue
        if margin_gap is None:
            params = contact_params(m)
            margin_gap = params["margin"] + params["gap"]
        geom = plan.geom2[group.pair]
        need = (m.geom_rbound[geom] + margin_gap[group.pair]).detach()  # [npair of the group]
        over = need >= group.reach
        if workarounds.unwrapped(over).any():  # under vmap: of any element
            i = next(i for i in range(geom.shape[0]) if workarounds.unwrapped(over[i]).any())
            g, hfield = int(geom[i]), int(plan.geom1[group.pair[i]])
            raise ValueError(
                f"geom {m.names.geom[g] or g!r} now reaches {workarounds.unwrapped(need[i]).max():.6g} "
                f"(geom_rbound, from geom_size, plus margin and gap: geom_margin + geom_gap, pair_margin + "
                f"pair_gap or opt.o_margin), past the {float(group.reach[i]):.6g} that put_model planned the "
                f"cells of hfield geom {m.names.geom[hfield] or hfield!r} for, whose cells past them would be "
                "dropped; call diffmj.put_model on a mujoco.MjModel with the new values")


_SPHERE_SLACK = 1e-6  # relative: pairs this close to touching bounding spheres are collided anyway


def _spheres_apart(m: Model, d: Data, g1: Tensor, g2: Tensor, margin_gap: Tensor) -> Tensor:
    """Pairs [n] whose bounding spheres (geom_rbound, 0 for planes: unbounded) are farther apart than
    margin + gap: they hold no contact (MuJoCo's bounding-sphere filter)."""
    r1, r2 = m.geom_rbound[g1], m.geom_rbound[g2]
    offset = d.geom_xpos[g2] - d.geom_xpos[g1]
    reach = (r1 + r2 + margin_gap) * (1 + _SPHERE_SLACK)
    return (r1 > 0) & (r2 > 0) & (math.dot(offset, offset) > reach * reach)


def _collide_group(m: Model, d: Data, group, margin_gap: Tensor) -> Candidates:
    """The group's contact slots [npair, k] fields."""
    plan = m.collision_plan
    g1, g2 = plan.geom1[group.pair], plan.geom2[group.pair]
    poses = [GeomPose(d.geom_xpos[g], d.geom_xmat[g], m.geom_size[g]) for g in (g1, g2)]
    pose1, pose2 = (MeshPose(pose, mesh_shape(plan.meshes, plan.geom_mesh[g])) if kind == GeomType.MESH else
                    HFieldPose(pose, hfield_shape(plan.hfields, plan.geom_hfield[g], group.cells))
                    if kind == GeomType.HFIELD else pose
                    for pose, g, kind in zip(poses, (g1, g2), group.types))
    return COLLIDERS[group.types].collide(pose1, pose2, margin_gap[group.pair])


def _empty_slots(found: Candidates) -> Candidates:
    """Slots without a contact (dist = +inf) all alike: pos and tangent zero, normal +z. A slot's values
    then do not depend on whether its pair was collided (see _narrow_phase)."""
    empty = torch.isinf(found.dist)[..., None]
    up = torch.zeros_like(found.normal)
    up[..., 2] = 1.0
    return Candidates(found.dist, torch.where(empty, 0.0, found.pos), torch.where(empty, up, found.normal),
                      torch.where(empty, 0.0, found.tangent))


def _narrow_phase(m: Model, d: Data, margin_gap: Tensor) -> Candidates:
    """All contact slots, group by group in the plan's order: [ncon] fields.

    Eager and unbatched, a group's pairs whose bounding spheres are apart are not collided (a robot's
    candidate pairs are mostly far apart; their slots are empty either way). Compiled or under a
    torch.func transform every pair is collided: the shapes stay fixed.
    """
    plan = m.collision_plan
    check_hfield_reach(m, margin_gap)
    select = not workarounds.transform_active([d.geom_xpos]) and d.geom_xpos.dim() == 2
    parts = []
    for group in plan.groups:
        near = None
        if select and group.types[0] != GeomType.HFIELD:  # (an hfield pair's slots are its planned cells')
            near = ~_spheres_apart(m, d, plan.geom1[group.pair], plan.geom2[group.pair], margin_gap[group.pair])
        if near is None or near.all():
            found = _collide_group(m, d, group, margin_gap)
        else:
            found = _some_pairs(m, d, group, margin_gap, torch.nonzero(near)[:, 0])
        parts.append(Candidates(*(x.flatten(0, 1) for x in found)))
    return _empty_slots(Candidates(*(torch.cat(fields) for fields in zip(*parts))))


def _some_pairs(m: Model, d: Data, group, margin_gap: Tensor, subset: Tensor) -> Candidates:
    """The group's contact slots [npair, k] fields with only the pairs ``subset`` [s] collided (the
    others' slots dist +inf; _empty_slots sets their other fields)."""
    npair, k = group.pair.shape[0], COLLIDERS[group.types].max_contacts
    xpos = d.geom_xpos
    full = Candidates(torch.full((npair, k), torch.inf, dtype=xpos.dtype, device=xpos.device),
                      *(xpos.new_zeros(npair, k, 3) for _ in range(3)))
    if not subset.numel():
        return full
    found = _collide_group(m, d, group.replace(pair=group.pair[subset]), margin_gap)
    return Candidates(*(x.index_copy(0, subset, y) for x, y in zip(full, found)))


def collision(m: Model, d: Data) -> Data:
    """Contacts between all candidate geom pairs (mj_collision)."""
    plan = m.collision_plan
    if not plan.ncon:
        return d
    params = contact_params(m)
    found = _narrow_phase(m, d, params["margin"] + params["gap"])
    per_contact = {k: v[plan.contact_pair] for k, v in params.items()}
    includemargin = per_contact["margin"]
    contact = Contact(
        dist=found.dist,
        pos=found.pos,
        frame=make_frame(found.normal, found.tangent),
        includemargin=includemargin,
        friction=per_contact["friction"],
        solref=per_contact["solref"],
        solreffriction=per_contact["solreffriction"],
        solimp=per_contact["solimp"],
        active=found.dist < includemargin,
        batch_size=d.batch_size,
    )
    return d.replace(contact=contact)
