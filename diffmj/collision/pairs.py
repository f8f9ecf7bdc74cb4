"""The narrow-phase table: which function collides each pair of geom types, and how many contacts it returns.

Keys are (type of geom1, type of geom2) with geom1 of the lower type, as the
broad phase orders its candidate pairs. A type pair missing here is refused
by ``put_model``.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

from torch import Tensor

from diffmj.collision import box, convex, hfield, mesh, mesh_convex, polytope, primitive
from diffmj.collision.common import Candidates, GeomPose, HFieldPose, MeshPose
from diffmj.enums import GeomType


class Collider(NamedTuple):
    """Narrow phase of one type pair."""

    # (geom1, geom2, margin [n]) -> [n, max_contacts]; a mesh geom comes as a MeshPose, an hfield as an HFieldPose
    collide: Callable[[GeomPose | MeshPose | HFieldPose, GeomPose | MeshPose, Tensor], Candidates]
    # contact slots per pair (MuJoCo's mj_maxContact, unless noted; hfield pairs: at most this, see
    # hfield.contact_slots)
    max_contacts: int
    general_convex: bool = False  # MuJoCo collides the pair with its general convex collision (mjc_Convex)
    single_ccd: bool = False  # one convex collision per contact (hfield prisms): multi-CCD plays no part


def _general_convex(types: tuple[GeomType, GeomType], max_contacts: int) -> Collider:
    return Collider(functools.partial(convex.collide, types, max_contacts=max_contacts), max_contacts, True)


_G = GeomType
# geom1 type, geom2 type -> max contacts of mjc_Convex: more than one only through multi-CCD (on by default)
_GENERAL_CONVEX = {
    (_G.SPHERE, _G.ELLIPSOID): 1,
    (_G.CAPSULE, _G.ELLIPSOID): 1,
    (_G.ELLIPSOID, _G.ELLIPSOID): 1,
    (_G.CAPSULE, _G.CYLINDER): 2,  # the capsule's side line clipped by a cap
    (_G.ELLIPSOID, _G.CYLINDER): 1,
    (_G.CYLINDER, _G.CYLINDER): 4,  # cap on cap, side line on cap
    (_G.ELLIPSOID, _G.BOX): 1,
    (_G.CYLINDER, _G.BOX): 4,  # cap on face, side line on face, box edge on cap
}
# in this order the plan lays out its contact slots
COLLIDERS: dict[tuple[GeomType, GeomType], Collider] = {
    (_G.PLANE, _G.SPHERE): Collider(primitive.plane_sphere, 1),
    (_G.PLANE, _G.CAPSULE): Collider(primitive.plane_capsule, 2),
    (_G.PLANE, _G.ELLIPSOID): Collider(primitive.plane_ellipsoid, 1),
    (_G.PLANE, _G.CYLINDER): Collider(primitive.plane_cylinder, 4),
    (_G.PLANE, _G.BOX): Collider(primitive.plane_box, 4),
    (_G.PLANE, _G.MESH): Collider(mesh.plane_mesh, mesh.PLANE_CONTACTS),
    (_G.SPHERE, _G.MESH): Collider(mesh.sphere_mesh, 1, general_convex=True),
    (_G.SPHERE, _G.SPHERE): Collider(primitive.sphere_sphere, 1),
    (_G.SPHERE, _G.CAPSULE): Collider(primitive.sphere_capsule, 1),
    (_G.SPHERE, _G.CYLINDER): Collider(primitive.sphere_cylinder, 1),
    (_G.SPHERE, _G.BOX): Collider(primitive.sphere_box, 1),
    (_G.CAPSULE, _G.CAPSULE): Collider(primitive.capsule_capsule, 2),
    (_G.CAPSULE, _G.MESH): Collider(mesh_convex.capsule_mesh, mesh_convex.CAPSULE_CONTACTS, general_convex=True),
    (_G.ELLIPSOID, _G.MESH): Collider(mesh_convex.ellipsoid_mesh, 1, general_convex=True),
    (_G.CYLINDER, _G.MESH): Collider(mesh_convex.cylinder_mesh, polytope.MAX_CONTACTS, general_convex=True),
    (_G.CAPSULE, _G.BOX): Collider(primitive.capsule_box, 2),  # MuJoCo 4 emits at most two (mj_maxContact: four)
    (_G.BOX, _G.BOX): Collider(box.box_box, 8),
    (_G.BOX, _G.MESH): Collider(polytope.box_mesh, polytope.MAX_CONTACTS, general_convex=True),
    (_G.MESH, _G.MESH): Collider(polytope.mesh_mesh, polytope.MAX_CONTACTS, general_convex=True),
    **{types: _general_convex(types, n) for types, n in _GENERAL_CONVEX.items()},
    # each prism of the cells under the geom collided by mjc_Convex's single-contact path (hfield.py)
    **{(_G.HFIELD, kind): Collider(hfield.collider(kind), hfield.MAX_CONTACTS, general_convex=True, single_ccd=True)
       for kind in (_G.SPHERE, _G.CAPSULE, _G.ELLIPSOID, _G.CYLINDER, _G.BOX, _G.MESH)},
}
