"""Heightfield collision (collision/hfield.py) against MuJoCo C (float64).

A bumpy hfield (seeded random elevations, its frame moved and turned) and a
free geom at seeded random poses over it, partly outside its extent, with and
without margin: the contacts (count, MuJoCo's order, dist, pos, frame) of
every prism under the geom. diffmj's prism contacts are exact; MuJoCo's come
from its GJK / EPA at ccd_tolerance 1e-14, so the distances agree to
TOL["ccd_dist"] and positions and frames to TOL["ccd_contact"] (the
ellipsoid's are not compared: see ELLIPSOID_FIELDS). Then one step at a time over a short drop of a ball and a
box onto the terrain, vmap against the batched call, and gradients through
contact make and break.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj.collision.common import GeomPose, HFieldPose
from diffmj.collision.driver import collision
from diffmj.collision import hfield, mesh_convex
from diffmj.collision.hfield import collider, hfield_shape
from diffmj.enums import GeomType
from tests.conftest import (CCD_TOL, CONTACT_FIELDS, TOL, as_numpy, assert_close, compare_contacts,
                            finite_gradients_when_lowered, mujoco_states, vmap_equals_batched)
from tests.test_collision_convex import SQRT_FACTOR, VALUE_ROUNDING
from tests.test_solver import converged

NROW, NCOL = 7, 9
GEOMS = {
    "sphere": '<geom type="sphere" size=".06" margin="{margin}"/>',
    "capsule": '<geom type="capsule" size=".03 .06" margin="{margin}"/>',
    "ellipsoid": '<geom type="ellipsoid" size=".05 .04 .03" margin="{margin}"/>',
    "box": '<geom type="box" size=".05 .04 .03" margin="{margin}"/>',
    "mesh": '<geom type="mesh" mesh="rock" margin="{margin}"/>',
    "cylinder": '<geom type="cylinder" size=".03 .05" margin="{margin}"/>',
}
# MuJoCo's EPA on a smooth geom locates the normal only to ~sqrt of its support-sum error (the
# ellipsoid-mesh test, test_collision_mesh_convex.py, bounds it so, measured 6e-6 there; up to 2e-5
# here): the ellipsoid's positions and frames are left out, its distances compared
ELLIPSOID_FIELDS = tuple(f for f in CONTACT_FIELDS if f not in ("pos", "frame"))


def _terrain(geom: str, margin: float, seed: int = 0, elevation: bool = True, gravity: bool = False) -> str:
    """MJCF of a bumpy hfield (moved and turned) and one free geom above it."""
    rng = np.random.default_rng(seed)
    data = f'elevation="{" ".join(map(str, rng.uniform(0, 1, NROW * NCOL)))}"' if elevation else ""
    rock = rng.standard_normal((12, 3)) * 0.04
    flag = "" if gravity else '<flag gravity="disable"/>'
    return f"""<mujoco><option ccd_tolerance="1e-14" ccd_iterations="3000">{flag}</option>
      <asset><hfield name="terrain" nrow="{NROW}" ncol="{NCOL}" size=".4 .3 .08 .05" {data}/>
        <mesh name="rock" vertex="{" ".join(map(str, rock.ravel()))}"/></asset>
      <worldbody><geom name="ground" type="hfield" hfield="terrain" pos=".05 -.02 .01" euler="4 -3 20"/>
        <body pos="0 0 .2"><freejoint/>{GEOMS[geom].format(margin=margin)}</body></worldbody></mujoco>"""


def _poses(count: int, seed: int = 1):
    """qpos of the free geom: over the hfield and past its edges, from touching its base to above its top."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        quat = rng.standard_normal(4)
        yield np.concatenate((rng.uniform(-0.45, 0.45, 2), [rng.uniform(-0.02, 0.12)], quat / np.linalg.norm(quat)))


CASES = [(kind, margin) for kind in ("sphere", "capsule", "ellipsoid") for margin in (0.0, 0.02)] + \
    [("box", 0.02), ("mesh", 0.02), ("box", 1e-4)]


@pytest.mark.parametrize("kind, margin", CASES)
def test_matches_mujoco(kind, margin):
    mjm = mujoco.MjModel.from_xml_string(_terrain(kind, margin))
    m = diffmj.put_model(mjm)
    counts = []
    for mjd, d in mujoco_states(mjm, m, _poses(40)):
        counts.append(mjd.ncon)
        out = collision(m, d)
        compare_contacts(m, out, mjd, ELLIPSOID_FIELDS if kind == "ellipsoid" else CONTACT_FIELDS, tol=CCD_TOL)
        # one pair: its emitted slots, in slot order, are MuJoCo's contacts in its order (matched by
        # distance: two prisms that meet the geom at their shared edge give the same position)
        dist = out.contact.dist
        assert_close("dist in order", dist[torch.isfinite(dist)], mjd.contact.dist[:mjd.ncon], TOL["ccd_dist"],
                     empty_ok=True)
    # outcomes exercised: misses, one prism, several prisms of several cells
    assert counts.count(0) > 5 and sum(c > 4 for c in counts) > 5 and any(c == 1 or c == 2 for c in counts), counts


def _pair_poses(m: diffmj.Model, d: diffmj.Data) -> tuple[HFieldPose, GeomPose]:
    """The hfield (geom 0) and the free geom (geom 1) of the terrain model, batched over one pair."""
    plan = m.collision_plan
    ground = GeomPose(d.geom_xpos[[0]], d.geom_xmat[[0]], m.geom_size[[0]])
    return (HFieldPose(ground, hfield_shape(plan.hfields, plan.geom_hfield[[0]], plan.groups[0].cells)),
            GeomPose(d.geom_xpos[[1]], d.geom_xmat[[1]], m.geom_size[[1]]))


def _cylinder_excess(m: diffmj.Model, d: diffmj.Data, margin: float, mujoco_normal: np.ndarray) -> np.ndarray:
    """Per emitted contact (in slot order, MuJoCo's order): f(u) = h_cylinder(u) + h_prism(-u) at MuJoCo's
    normal less f at diffmj's (u from the cylinder to its prism): >= 0, as diffmj's normal is the exact
    minimiser."""
    ground, cylinder = _pair_poses(m, d)
    low, high = hfield._local_box(GeomType.CYLINDER, cylinder, ground.pose)
    vert, inside = hfield._prisms(ground, low - margin, high + margin)
    vert = vert.flatten(0, 2)  # every candidate prism [2K, 6, 3], in slot order
    cylinders = GeomPose(*(x.expand(vert.shape[0], *x.shape[1:]) for x in cylinder))
    con = mesh_convex.cylinder_contact(cylinders, hfield._prism_polytope(vert))
    emitted = inside[0].repeat_interleave(2) & (con.dist < margin)
    vert, cylinders = vert[emitted], GeomPose(*(x[emitted] for x in cylinders))

    def support_sum(u):
        return mesh_convex._cylinder_support(cylinders, u) + (-(vert @ u[..., None])[..., 0]).amax(-1)

    return as_numpy(support_sum(-torch.as_tensor(mujoco_normal)) - support_sum(con.normal[emitted]))


@pytest.mark.parametrize("margin", [0.0, 0.02])
def test_cylinder_matches_mujoco(margin):
    """hfield-cylinder: one contact per prism (MuJoCo's single-contact path, no multi-contact: a cap
    flat on a prism's top gives one contact, measured on these poses), in MuJoCo's order. A rim point
    against a prism edge is a curved contact, where MuJoCo's EPA locates the normal only to ~sqrt of its
    error in the support sum (as in test_collision_cylinder_mesh.py): each pose's positions and frames
    are compared to 1e-9 + SQRT_FACTOR sqrt(excess) where that exceeds TOL["ccd_contact"] (the largest
    of its contacts' excess; measured normal differences up to 1e-5), distances to TOL["ccd_dist"]."""
    mjm = mujoco.MjModel.from_xml_string(_terrain("cylinder", margin))
    m = diffmj.put_model(mjm)
    counts = []
    for mjd, d in mujoco_states(mjm, m, _poses(40)):
        counts.append(mjd.ncon)
        out = collision(m, d)
        dist = out.contact.dist
        assert_close("dist in order", dist[torch.isfinite(dist)], mjd.contact.dist[:mjd.ncon], TOL["ccd_dist"],
                     empty_ok=True)
        if not mjd.ncon:
            continue
        excess = _cylinder_excess(m, d, margin, mjd.contact.frame[:mjd.ncon, :3])
        assert excess.min() >= -VALUE_ROUNDING, f"MuJoCo's normal has a lower support sum by {-excess.min():.1e}"
        curved = 1e-9 + SQRT_FACTOR * np.sqrt(excess.max() + VALUE_ROUNDING)
        compare_contacts(m, out, mjd, tol={**CCD_TOL, "contact.pos": max(TOL["ccd_contact"], curved),
                                           "contact.frame": max(TOL["ccd_contact"], curved)})
    assert counts.count(0) > 5 and sum(c > 4 for c in counts) > 5 and any(c == 1 or c == 2 for c in counts), counts


def test_elevation_set_on_the_model():
    """Elevations written to MjModel.hfield_data before put_model (no elevation in the XML) are used."""
    mjm = mujoco.MjModel.from_xml_string(_terrain("sphere", 0.01, elevation=False))
    mjm.hfield_data[:] = np.random.default_rng(5).uniform(0, 1, mjm.hfield_data.shape)
    m = diffmj.put_model(mjm)
    counts = []
    for mjd, d in mujoco_states(mjm, m, _poses(20)):
        counts.append(mjd.ncon)
        compare_contacts(m, collision(m, d), mjd, tol=CCD_TOL)
    assert sum(c > 1 for c in counts) > 5, counts


def test_refused_by_name():
    """Boxes without margin (MuJoCo's EPA stops early on prisms: hfield.hfield_unsupported) are refused,
    naming the pair."""
    with pytest.raises(NotImplementedError, match="'ground' \\(hfield\\)"):
        diffmj.put_model(mujoco.MjModel.from_xml_string(_terrain("box", 0.0)))


def _sphere_over_terrain(radius: float, margin: float) -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_string(_terrain("sphere", margin).replace('size=".06"', f'size="{radius}"'))


def test_growing_within_the_planned_cells_matches_mujoco():
    """put_model plans the cells per hfield pair from the geom's reach, rbound + margin + gap: the sphere
    (radius .06 over cells .1 wide) gets 3 x 3 cells, which cover a reach up to .1. Grown to radius .095
    by set_param, it collides as MuJoCo C does with the grown sphere compiled (contacts over 4 cells)."""
    m = diffmj.put_model(_sphere_over_terrain(0.06, 0.0))
    group = next(g for g in m.collision_plan.groups if g.types[0] == GeomType.HFIELD)
    assert group.cells.shape[0] == 9 and float(group.reach[0]) == pytest.approx(0.1)
    grown = diffmj.set_param(m, "geom_size", torch.tensor([0.095, 0, 0], dtype=m.dtype), 1)
    mjm = _sphere_over_terrain(0.095, 0.0)
    counts = []
    for mjd, d in mujoco_states(mjm, grown, _poses(30)):
        counts.append(mjd.ncon)
        compare_contacts(grown, collision(grown, d), mjd, tol=CCD_TOL)
    assert max(counts) >= 4, counts


def test_reaching_past_the_planned_cells_is_refused():
    """A geom grown past the reach its planned cells cover would lose the cells past them without a
    word: set_param refuses it (geom_size, geom_margin; also under vmap, where one element does), and so
    does a step of a model whose margin was replaced raw."""
    mjm = _sphere_over_terrain(0.06, 0.0)
    m = diffmj.put_model(mjm)
    with pytest.raises(ValueError, match="geom 1 now reaches 0.12 .*geom_size.* past the 0.1 .*'ground'"):
        diffmj.set_param(m, "geom_size", torch.tensor([0.12, 0, 0], dtype=m.dtype), 1)
    with pytest.raises(ValueError, match="geom_margin"):
        diffmj.set_param(m, "geom_margin", 0.05, 1)
    with pytest.raises(ValueError, match="now reaches 0.11"):
        torch.vmap(lambda margin: diffmj.set_param(m, "geom_margin", margin, 1).geom_margin)(
            torch.tensor([0.0, 0.05], dtype=m.dtype))
    wider = m.replace(geom_margin=m.geom_margin + 0.05)
    with pytest.raises(ValueError, match="put_model"):
        diffmj.step(wider, diffmj.make_data(wider))
    diffmj.step(m, diffmj.make_data(m))  # as planned


# the ball's contacts are exact in MuJoCo too (its centre's distance); the box's (with margin: a smooth
# geom to MuJoCo's EPA) carry its pos / frame error into the step (measured 2e-9 on qvel)
@pytest.mark.parametrize("kind, margin, tol", [("sphere", 0.0, TOL["smooth"]), ("box", 0.002, TOL["ccd_contact"])])
def test_drop_onto_terrain_matches_mujoco(kind, margin, tol):
    """A ball and a box dropped onto the terrain: each of 60 steps of diffmj from MuJoCo's state against
    mj_step (the geom lands, rolls or slides over several cells)."""
    mjm = converged(mujoco.MjModel.from_xml_string(_terrain(kind, margin, gravity=True)))
    mjm.opt.timestep = 0.005
    m = diffmj.put_model(mjm)
    mjd = mujoco.MjData(mjm)
    mjd.qpos[:3] = [0.02, 0.03, 0.15]
    mjd.qvel[:3] = [0.6, -0.4, 0.0]
    touching = 0
    for _ in range(60):
        d = diffmj.put_data(m, mjd)
        mujoco.mj_step(mjm, mjd)
        touching += mjd.ncon > 0
        out = diffmj.step(m, d)
        assert_close("qpos", out.qpos, mjd.qpos, tol)
        assert_close("qvel", out.qvel, mjd.qvel, tol)
    assert touching > 20, touching


@pytest.mark.parametrize("kind", [GeomType.CAPSULE, GeomType.CYLINDER])
def test_vmap_equals_batched(kind):
    """vmap over the pairs (each call sees one pair) equals the batched call."""
    mjm = mujoco.MjModel.from_xml_string(_terrain(kind.name.lower(), 0.02))
    m = diffmj.put_model(mjm)
    margin = torch.full((1,), 0.02, dtype=torch.float64)
    counts = vmap_equals_batched(collider(kind), [(*_pair_poses(m, d), margin)
                                                   for _, d in mujoco_states(mjm, m, _poses(8))])
    assert len(counts) > 2, counts


@pytest.mark.parametrize("kind", ["sphere", "capsule", "cylinder", "box"])
def test_gradients_finite_through_make_and_break(kind):
    """d(contacts) / d(qpos) is finite as the geom is lowered through the terrain: no contact, within
    the margin, touching, penetrating one and several prisms."""
    mjm = mujoco.MjModel.from_xml_string(_terrain(kind, 0.01))
    seen = finite_gradients_when_lowered(mjm, list(_poses(2, seed=4)), 2, np.linspace(0.2, -0.02, 9))
    assert 0 in seen and max(seen) > 2, seen


@pytest.mark.slow  # the compile takes about a minute (58 s on the loaded 2-core machine)
def test_compiled_equals_eager():
    """collision compiled (fullgraph) equals eager for hfield-sphere at poses with several contacts."""
    mjm = mujoco.MjModel.from_xml_string(_terrain("sphere", 0.02))
    m = diffmj.put_model(mjm)
    compiled = torch.compile(lambda d: collision(m, d).contact, fullgraph=True)
    counts = []
    for _, d in mujoco_states(mjm, m, _poses(4)):
        a, b = compiled(d), collision(m, d).contact
        counts.append(int(torch.isfinite(b.dist).sum()))
        for name in ("dist", "pos", "frame", "active"):
            torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=TOL["compiled"])
    assert max(counts) > 4, counts


def _rangefinder_model(count: int) -> mujoco.MjModel:
    """Two hfields of different grids (one turned) and ``count`` rangefinder sites at seeded random
    poses around them: above, beside and below, pointing anywhere (half of them downwards)."""
    rng = np.random.default_rng(2)
    sites, sensors = [], []
    for i in range(count):
        pos = rng.uniform([-0.6, -0.5, -0.12], [1.2, 0.5, 0.3])
        euler = rng.uniform(-180, 180, 3) if i % 2 else [*rng.uniform(150, 210, 1), *rng.uniform(-30, 30, 1), 0]
        sites.append(f'<site name="s{i}" pos="{" ".join(map(str, pos))}" euler="{" ".join(map(str, euler))}"/>')
        sensors.append(f'<rangefinder site="s{i}" data="dist dir origin point normal depth"/>')
    bumps = [" ".join(map(str, rng.uniform(0, 1, n))) for n in (NROW * NCOL, 5 * 4)]
    xml = f"""<mujoco><asset>
        <hfield name="a" nrow="{NROW}" ncol="{NCOL}" size=".4 .3 .08 .05" elevation="{bumps[0]}"/>
        <hfield name="b" nrow="5" ncol="4" size=".2 .3 .1 .02" elevation="{bumps[1]}"/></asset>
      <worldbody><geom type="hfield" hfield="a" pos=".05 -.02 .01" euler="4 -3 20"/>
        <geom type="hfield" hfield="b" pos=".8 0 0"/>
        <body><freejoint/>{"".join(sites)}<geom size=".01" pos="0 0 -3" contype="0" conaffinity="0"/></body>
      </worldbody><sensor>{"".join(sensors)}</sensor></mujoco>"""
    return mujoco.MjModel.from_xml_string(xml)


def test_rangefinder_matches_mujoco():
    """Rangefinders against hfields (mj_rayHfield: the base box, the grid's triangles, the sides below
    the edge's elevation): every field of the sensor against MuJoCo's."""
    count = 160
    mjm = _rangefinder_model(count)
    mjd = mujoco.MjData(mjm)
    mujoco.mj_forward(mjm, mjd)
    m = diffmj.put_model(mjm)
    d = diffmj.forward(m, diffmj.put_data(m, mjd))
    assert_close("sensordata", d.sensordata, mjd.sensordata, TOL["sensor"])
    # outcomes exercised: misses, hits on triangles (tilted normals), on the base or sides (axis normals)
    data = mjd.sensordata.reshape(count, -1)
    normal = data[:, 10:13] @ mjd.geom_xmat[0].reshape(3, 3)  # in the first hfield's frame
    hit = data[:, 0] >= 0
    axis_normal = np.isclose(np.abs(normal).max(1), 1, atol=1e-12)
    assert (~hit).sum() > 20 and (hit & ~axis_normal).sum() > 30 and (hit & axis_normal).sum() > 3
