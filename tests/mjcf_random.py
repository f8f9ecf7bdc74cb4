"""Seeded random MJCF models exercising every contact-free feature diffmj supports
(``random_mjcf``) and, on top of them, contacts and constraints (``random_contact_mjcf``).

``random_mjcf(seed)`` returns the XML of a valid, non-degenerate model: a
random forest of 2..``max_bodies`` bodies (up to ``max_depth`` deep) with
random frames and inertial frames (explicit ``<inertial>`` with diagonal or
full inertia, or from geoms), 0-3 joints per body (free / ball / slide /
hinge with random axes, anchors, refs, springs, dampers, armature and
actuator options), geoms of every primitive type with collisions off,
sites, mocap bodies (some carrying moving subtrees), gravity compensation,
fixed tendons over hinge / slide joints, and actuators of every supported
transmission, dynamics, gain and bias type with random clamps, muscles among
them (drawn from a stream of their own, so the other elements of a seed's
model do not depend on them). The option
block draws the integrator, timestep, gravity and, sometimes, disable
flags and disabled actuator groups.

``random_mjcf(seed, fluid=True)`` is the same model in a fluid: random density,
viscosity and wind, and in about half the bodies, geoms with ``fluidshape="ellipsoid"``
and random fluid coefficients (the other bodies use the inertia-box model); these
draws come from a stream of their own, so the model is otherwise that of the seed.

The same seed always gives the same string. Magnitudes stay physical:
body masses 0.1-5, inertias of solids at least 4 cm across (positive,
triangle inequality), small damping and velocity gains, timestep
1e-3..5e-3, and each body's joint set well conditioned (see
``_Builder._add_joints``), so the mass matrix stays far from singular.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

INTEGRATORS = ("Euler", "RK4", "implicit", "implicitfast")
# MJCF <flag> names of the disable bits diffmj implements
DISABLE_FLAGS = ("gravity", "spring", "damper", "actuation", "clampctrl", "eulerdamp")
GEOM_TYPES = ("sphere", "capsule", "ellipsoid", "cylinder", "box")
DYN_TYPES = ("none", "integrator", "filter", "filterexact")
CONES = ("pyramidal", "elliptic")
CONDIMS = (1, 3, 4, 6)
# MJCF <flag> names of the constraint disable bits diffmj implements (contacts always stay on)
CONSTRAINT_DISABLE_FLAGS = ("equality", "frictionloss", "limit", "warmstart", "filterparent", "refsafe")
# contype / conaffinity by geom type, so that only pairs diffmj's narrow phase implements can
# collide: spheres, capsules and boxes with each other, cylinders with spheres, all with the floor
COLLISION_BITS = {
    "plane": (0, 7),
    "sphere": (1, 3),
    "capsule": (1, 1),
    "box": (1, 1),
    "cylinder": (2, 0),
    "ellipsoid": (4, 0),
}


@dataclass
class _Joint:
    name: str
    type: str


@dataclass
class _Body:
    name: str
    depth: int
    pos: np.ndarray = field(default_factory=lambda: np.zeros(3))  # in the parent's frame
    quat: np.ndarray | None = None  # None: identity
    attrs: str = ""  # mocap and gravcomp attributes (each with a leading space)
    joints: list[_Joint] = field(default_factory=list)
    children: list["_Body"] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # inertial, joints, geoms, sites
    weld: str = "world"  # the body it moves with: the nearest of itself and its ancestors with a joint

    @property
    def moving(self) -> bool:
        return self.weld != "world"


def _fmt(x) -> str:
    return " ".join(f"{v:.6g}" for v in np.atleast_1d(np.asarray(x, dtype=float)))


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal(n)
    return v / np.linalg.norm(v)


def _axis(rng: np.random.Generator) -> np.ndarray:
    """A coordinate axis (either sign) or a random direction."""
    if rng.random() < 0.4:
        return np.eye(3)[rng.integers(3)] * rng.choice((-1.0, 1.0))
    return _unit(rng, 3)


def _random_quat(rng: np.random.Generator, p: float = 0.7) -> np.ndarray | None:
    """A random orientation, or None (identity) with probability 1 - p."""
    return _unit(rng, 4) if rng.random() < p else None


def _quat_attr(rng: np.random.Generator, p: float = 0.7) -> str:
    return _quat_xml(_random_quat(rng, p))


def _quat_xml(quat: np.ndarray | None) -> str:
    return f' quat="{_fmt(quat)}"' if quat is not None else ""


def _quat_to_mat(q: np.ndarray) -> np.ndarray:
    w, x, y, z = q
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def _inertial(rng: np.random.Generator) -> str:
    """An explicit <inertial> of a solid box: positive, satisfies the triangle inequality."""
    mass = rng.uniform(0.1, 5.0)
    a, b, c = rng.uniform(0.05, 0.3, 3) ** 2
    diag = mass / 3 * np.array([b + c, a + c, a + b])
    pos = f'pos="{_fmt(rng.uniform(-0.1, 0.1, 3))}"'
    if rng.random() < 0.5:
        return f'<inertial {pos}{_quat_attr(rng)} mass="{mass:.6g}" diaginertia="{_fmt(diag)}"/>'
    rot = _quat_to_mat(_unit(rng, 4))
    full = rot @ np.diag(diag) @ rot.T
    values = (full[0, 0], full[1, 1], full[2, 2], full[0, 1], full[0, 2], full[1, 2])
    return f'<inertial {pos} mass="{mass:.6g}" fullinertia="{_fmt(values)}"/>'


@dataclass
class _Shape:
    """A geom's solid in its body's frame."""

    kind: str
    size: np.ndarray  # MuJoCo's geom_size
    center: np.ndarray
    rot: np.ndarray  # the geom frame's axes as columns

    def support(self, direction: np.ndarray) -> float:
        """The largest ``direction . x`` over the solid (``direction`` a unit vector)."""
        u = self.rot.T @ direction
        s = self.size
        extent = {
            "sphere": lambda: s[0],
            "capsule": lambda: s[1] * abs(u[2]) + s[0],
            "ellipsoid": lambda: np.linalg.norm(s * u),
            "cylinder": lambda: s[1] * abs(u[2]) + s[0] * np.hypot(u[0], u[1]),
            "box": lambda: np.abs(u) @ s,
        }[self.kind]()
        return float(direction @ self.center + extent)

    def moved(self, pos: np.ndarray, rot: np.ndarray) -> "_Shape":
        """The solid in the frame in which its frame sits at (pos, rot)."""
        return _Shape(self.kind, self.size, pos + rot @ self.center, rot @ self.rot)

    def apart(self, other: "_Shape") -> bool:
        """Whether a plane separates the two solids; the normals tried are the line between the
        centers and both frames' axes, so touching solids may be reported as not apart."""
        between = other.center - self.center
        directions = [*self.rot.T, *other.rot.T]
        if np.linalg.norm(between) > 0:
            directions.append(between / np.linalg.norm(between))
        return any(self.support(d) + other.support(-d) < 0 for u in directions for d in (u, -u))


def _rotation(quat: np.ndarray | None) -> np.ndarray:
    return np.eye(3) if quat is None else _quat_to_mat(quat)


def _axis_frame(axis: np.ndarray) -> np.ndarray:
    """Orthonormal axes (as columns) whose third is ``axis``."""
    helper = np.eye(3)[np.argmin(np.abs(axis))]
    x = np.cross(helper, axis)
    x /= np.linalg.norm(x)
    return np.column_stack([x, np.cross(axis, x), axis])


def _geom(rng: np.random.Generator, mass: float, extra: str = "") -> str:
    return _shaped_geom(rng, rng.choice(GEOM_TYPES), mass, extra)[0]


def _shaped_geom(rng: np.random.Generator, kind: str, mass: float, extra: str = "") -> tuple[str, _Shape]:
    """A geom of type ``kind`` with random size and frame, and ``extra`` attributes (each with a
    leading space): its XML and its solid."""
    tail = f'mass="{mass:.6g}"{extra}'
    if kind in ("capsule", "cylinder") and rng.random() < 0.5:
        start = rng.uniform(-0.1, 0.1, 3)
        length, axis = rng.uniform(0.1, 0.4), _unit(rng, 3)
        end = start + length * axis
        radius = rng.uniform(0.04, 0.07)
        shape = _Shape(kind, np.r_[radius, length / 2], (start + end) / 2, _axis_frame(axis))
        return f'<geom type="{kind}" fromto="{_fmt(np.r_[start, end])}" size="{radius:.6g}" {tail}/>', shape
    size = {
        "sphere": rng.uniform(0.05, 0.12, 1),
        "capsule": np.r_[rng.uniform(0.04, 0.07), rng.uniform(0.05, 0.2)],
        "ellipsoid": rng.uniform(0.04, 0.15, 3),
        "cylinder": np.r_[rng.uniform(0.04, 0.08), rng.uniform(0.05, 0.2)],
        "box": rng.uniform(0.04, 0.15, 3),
    }[kind]
    pos = rng.uniform(-0.15, 0.15, 3)
    quat = _random_quat(rng, 0.5)
    shape = _Shape(kind, size, pos, np.eye(3) if quat is None else _quat_to_mat(quat))
    return f'<geom type="{kind}" size="{_fmt(size)}" pos="{_fmt(pos)}"{_quat_xml(quat)} {tail}/>', shape


def _site(rng: np.random.Generator, name: str) -> str:
    return f'<site name="{name}" pos="{_fmt(rng.uniform(-0.2, 0.2, 3))}"{_quat_attr(rng)}/>'


def _spread_axis(rng: np.random.Generator, others: list[np.ndarray]) -> np.ndarray:
    """An axis well away from the span of ``others`` (Gram determinant >= 0.3).

    Joints of one kind in one body with nearly dependent axes make the mass
    matrix nearly singular; this keeps every body's joint set well conditioned.
    """
    while True:
        axis = _axis(rng)
        basis = np.array([*others, axis])
        if np.linalg.det(basis @ basis.T) >= 0.3:
            return axis


def _joint_attrs(rng: np.random.Generator, jtype: str, axis: np.ndarray | None) -> str:
    """Axis, anchor, refs, springs, dampers, armature and actuator options of one joint."""
    attrs = []
    if axis is not None:
        attrs.append(f'axis="{_fmt(axis)}"')
        spread = 1.0 if jtype == "hinge" else 0.2
        if rng.random() < 0.5:
            attrs.append(f'ref="{rng.uniform(-spread, spread):.6g}"')
        if rng.random() < 0.5:
            attrs.append(f'springref="{rng.uniform(-spread, spread):.6g}"')
    if jtype != "free":
        attrs.append(f'pos="{_fmt(rng.uniform(-0.1, 0.1, 3))}"')
    if rng.random() < 0.5:
        attrs.append(f'stiffness="{rng.uniform(0.0, 5.0):.6g}"')
    if rng.random() < 0.6:
        attrs.append(f'damping="{rng.uniform(0.0, 0.1):.6g}"')
    if rng.random() < 0.4:
        attrs.append(f'armature="{rng.uniform(0.0, 0.05):.6g}"')
    if rng.random() < 0.2:
        lo, hi = rng.uniform(-2.0, -0.2), rng.uniform(0.2, 2.0)
        attrs.append(f'actuatorfrcrange="{lo:.6g} {hi:.6g}"')
    if rng.random() < 0.2:
        attrs.append('actuatorgravcomp="true"')
    return " ".join(attrs)


def _section(tag: str, items: list[str]) -> list[str]:
    return [f"  <{tag}>", *[f"    {item}" for item in items], f"  </{tag}>"] if items else []


class _Builder:
    """Draws a contact-free model; the hook methods (marked below) are where subclasses add features."""

    disable_flag_names = DISABLE_FLAGS
    model_name = "random"

    def __init__(self, seed: int, max_bodies: int, max_depth: int, max_tendons: int, max_actuators: int,
                 integrator: str | None, disable_flags: bool):
        self.rng = np.random.default_rng(seed)
        self.muscle_rng = np.random.default_rng([seed, 2])
        self.seed = seed
        self.max_bodies = max_bodies
        self.max_depth = max_depth
        self.max_tendons = max_tendons
        self.max_actuators = max_actuators
        self.integrator = integrator
        self.disable_flags = disable_flags
        self.world = _Body("world", 0)
        self.bodies: list[_Body] = []
        self.joints: list[_Joint] = []
        self.sites: list[str] = []
        self.tendons: list[str] = []

    # ---- tree
    def _pick_parent(self) -> _Body:
        """The world, the newest body (to grow deep chains) or any body with room below it."""
        rng = self.rng
        open_bodies = [b for b in self.bodies if b.depth < self.max_depth]
        if not open_bodies or rng.random() < 0.25:
            return self.world
        if rng.random() < 0.6:
            return open_bodies[-1]
        return open_bodies[rng.integers(len(open_bodies))]

    def _joint_kinds(self, top_level: bool) -> list[str]:
        """No joint (welded), one free joint (top level only), or 1-3 ball / slide / hinge joints.

        MuJoCo allows at most 6 dofs per body and no rotation after a ball joint;
        a hinge before a ball would nearly duplicate one of its rotations, so a
        ball is the body's only rotational joint.
        """
        rng = self.rng
        draw = rng.random()
        if draw < 0.1:
            kinds = []
        elif top_level and draw < 0.45:
            kinds = ["free"]
        else:
            kinds = []
            for _ in range(rng.integers(1, 4)):
                kind = str(rng.choice(("ball", "slide", "hinge", "hinge")))
                rotations = [k for k in kinds if k != "slide"]
                if kind == "slide" or not rotations or (kind == "hinge" and "ball" not in rotations):
                    kinds.append(kind)
            if "ball" in kinds:  # slides may follow the ball; put it first among rotations
                kinds.remove("ball")
                kinds.insert(0, "ball")
        return kinds

    def _add_joints(self, body: _Body, top_level: bool) -> None:
        """The body's joints; hinge axes and slide axes are each kept well apart."""
        rng = self.rng
        axes: dict[str, list[np.ndarray]] = {"hinge": [], "slide": []}
        for kind in self._joint_kinds(top_level):
            axis = None
            if kind in axes:
                axis = _spread_axis(rng, axes[kind])
                axes[kind].append(axis)
            joint = _Joint(f"j{len(self.joints)}", kind)
            self.joints.append(joint)
            body.joints.append(joint)
            attrs = _joint_attrs(rng, kind, axis) + self._joint_constraint_attrs(kind)
            body.lines.append(f'<joint name="{joint.name}" type="{kind}" {attrs}/>')

    def _add_body(self) -> None:
        rng = self.rng
        parent = self._pick_parent()
        top_level = parent is self.world
        mocap = top_level and rng.random() < 0.12
        pos, quat = self._body_pos(top_level), _random_quat(rng)
        attrs = ' mocap="true"' if mocap else ""
        if rng.random() < 0.25:
            attrs += f' gravcomp="{rng.uniform(0.0, 1.2):.6g}"'
        body = _Body(f"b{len(self.bodies)}", parent.depth + 1, pos, quat, attrs)
        if not mocap:
            self._add_joints(body, top_level)
        body.weld = body.name if body.joints else parent.weld
        explicit = rng.random() < 0.4
        if explicit:
            body.lines.insert(0, _inertial(rng))
        # MuJoCo needs mass on bodies with joints; welded, static and mocap bodies may have none
        massless_ok = explicit or (not body.joints and rng.random() < 0.3)
        for _ in range(rng.integers(0 if massless_ok else 1, 3)):
            body.lines.append(self._body_geom(body, rng.uniform(0.1, 2.5)))
        for _ in range(rng.integers(0, 3)):
            name = f"s{len(self.sites)}"
            self.sites.append(name)
            body.lines.append(_site(rng, name))
        parent.children.append(body)
        self.bodies.append(body)

    def _body_xml(self, body: _Body, indent: str) -> list[str]:
        out = [f'{indent}<body name="{body.name}" pos="{_fmt(body.pos)}"{_quat_xml(body.quat)}{body.attrs}>']
        out += [f"{indent}  {line}" for line in body.lines]
        for child in body.children:
            out += self._body_xml(child, indent + "  ")
        out.append(f"{indent}</body>")
        return out

    # ---- tendons and actuators
    def _tendon(self, index: int) -> str:
        rng = self.rng
        scalar = [j for j in self.joints if j.type in ("hinge", "slide")]
        chosen = rng.choice(len(scalar), size=min(len(scalar), rng.integers(1, 4)), replace=False)
        attrs = [f'name="t{index}"']
        if rng.random() < 0.6:
            attrs.append(f'stiffness="{rng.uniform(0.0, 5.0):.6g}"')
        if rng.random() < 0.5:
            lo = rng.uniform(-0.5, 0.5)
            length = f"{lo:.6g}" if rng.random() < 0.5 else f"{lo:.6g} {lo + rng.uniform(0.0, 0.4):.6g}"
            attrs.append(f'springlength="{length}"')
        if rng.random() < 0.5:
            attrs.append(f'damping="{rng.uniform(0.0, 0.1):.6g}"')
        if rng.random() < 0.4:
            attrs.append(f'armature="{rng.uniform(0.0, 0.05):.6g}"')
        if rng.random() < 0.3:
            attrs.append(f'actuatorfrcrange="{rng.uniform(-2.0, -0.2):.6g} {rng.uniform(0.2, 2.0):.6g}"')
        attrs += self._tendon_constraint_attrs()
        entries = [f'<joint joint="{scalar[k].name}" coef="{rng.uniform(-1.5, 1.5):.6g}"/>' for k in chosen]
        return f'<fixed {" ".join(attrs)}>' + "".join(entries) + "</fixed>"

    def _actuator(self, index: int) -> str:
        rng = self.rng
        targets = ["joint", "jointinparent"] * bool(self.joints)
        targets += ["tendon"] * bool(self.tendons) + ["site"] * bool(self.sites)
        trn = rng.choice(targets)
        gear = rng.uniform(-2.0, 2.0, 6)
        if trn in ("joint", "jointinparent"):
            joint = self.joints[rng.integers(len(self.joints))]
            target = f'{trn}="{joint.name}"'
            width = {"free": 6, "ball": 3}.get(joint.type, 1)
        elif trn == "tendon":
            target, width = f'tendon="{self.tendons[rng.integers(len(self.tendons))]}"', 1
        else:
            target, width = f'site="{self.sites[rng.integers(len(self.sites))]}"', 6
        attrs = [f'name="a{index}"', target, f'gear="{_fmt(gear[:width])}"']

        dyn = rng.choice(DYN_TYPES)
        attrs.append(f'dyntype="{dyn}"')
        if dyn in ("filter", "filterexact"):
            attrs.append(f'dynprm="{rng.uniform(0.01, 0.3):.6g}"')
        if dyn != "none":
            if rng.random() < 0.5:
                lo = rng.uniform(-1.0, -0.1)
                attrs.append(f'actrange="{lo:.6g} {rng.uniform(0.1, 1.0):.6g}"')
            if rng.random() < 0.4:
                attrs.append('actearly="true"')
        if rng.random() < 0.5:
            attrs.append(f'gaintype="fixed" gainprm="{rng.uniform(-3.0, 3.0):.6g}"')
        else:
            attrs.append(f'gaintype="affine" gainprm="{_fmt(self._affine_gain())}"')
        if rng.random() < 0.5:
            prm = (rng.uniform(-1.0, 1.0), rng.uniform(-5.0, 0.0), rng.uniform(-0.3, 0.0))
            attrs.append(f'biastype="affine" biasprm="{_fmt(prm)}"')
        if rng.random() < 0.5:
            attrs.append(f'ctrlrange="{rng.uniform(-2.0, -0.2):.6g} {rng.uniform(0.2, 2.0):.6g}"')
        if rng.random() < 0.4:
            attrs.append(f'forcerange="{rng.uniform(-3.0, -0.3):.6g} {rng.uniform(0.3, 3.0):.6g}"')
        attrs.append(f'group="{rng.integers(0, 4)}"')
        return f'<general {" ".join(attrs)}/>'

    def _muscle(self, index: int) -> str:
        """A muscle on a hinge / slide joint or a tendon: MuJoCo's muscle dynamics, gain and bias (or some
        of them beside other types), a given lengthrange (the compiler's own is a slow simulation)."""
        rng = self.muscle_rng
        scalar = [j.name for j in self.joints if j.type in ("hinge", "slide")]
        targets = [f'joint="{j}"' for j in scalar] + [f'jointinparent="{j}"' for j in scalar]
        targets += [f'tendon="{t}"' for t in self.tendons]
        lo = rng.uniform(0.5, 0.9)
        prm = (lo, lo + rng.uniform(0.2, 0.5), -1.0 if rng.random() < 0.5 else rng.uniform(1.0, 20.0),
               rng.uniform(50.0, 300.0), rng.uniform(0.3, 0.7), rng.uniform(1.3, 1.8), rng.uniform(0.5, 3.0),
               rng.uniform(0.5, 2.0), rng.uniform(1.1, 1.8))
        dynprm = (rng.uniform(0.005, 0.03), rng.uniform(0.02, 0.08), rng.choice([0.0, rng.uniform(0.05, 0.3)]))
        dyn = rng.choice(["muscle", "muscle", "none", "filterexact"])
        lengthrange = np.sort(rng.uniform(-1.0, 1.0, 2)) + (-0.1, 0.1)
        attrs = [f'name="m{index}"', targets[rng.integers(len(targets))], f'gear="{rng.uniform(0.5, 2.0):.6g}"',
                 f'lengthrange="{_fmt(lengthrange)}"', f'dyntype="{dyn}"', f'dynprm="{_fmt(dynprm)}"',
                 f'gaintype="muscle" gainprm="{_fmt(prm)}"']
        if rng.random() < 0.7:
            attrs.append(f'biastype="muscle" biasprm="{_fmt(prm)}"')
        if dyn != "none" and rng.random() < 0.3:
            attrs.append('actearly="true"')
        if dyn != "none" and rng.random() < 0.3:
            attrs.append('actrange="0 1"')
        if rng.random() < 0.5:
            attrs.append('ctrlrange="0 1"')
        if rng.random() < 0.3:
            attrs.append(f'forcerange="{-rng.uniform(1.0, 20.0):.6g} 0"')
        return f'<general {" ".join(attrs)}/>'

    # ---- hooks: the contact-free model's choices; _ContactBuilder overrides them
    def _body_pos(self, top_level: bool) -> np.ndarray:
        return self.rng.uniform(-0.3, 0.3, 3)

    def _body_geom(self, body: _Body, mass: float) -> str:
        return _geom(self.rng, mass)

    def _joint_constraint_attrs(self, kind: str) -> str:
        """Limit and frictionloss attributes of a joint (each with a leading space)."""
        return ""

    def _affine_gain(self) -> tuple[float, float, float]:
        """An affine actuator gain's constant, length and velocity coefficients."""
        rng = self.rng
        return rng.uniform(-3.0, 3.0), rng.uniform(-2.0, 2.0), rng.uniform(-0.3, 0.3)

    def _tendon_constraint_attrs(self) -> list[str]:
        return []

    def _gravity(self) -> np.ndarray:
        return np.r_[self.rng.uniform(-3.0, 3.0, 2), self.rng.uniform(-12.0, 0.0)]

    def _option_attrs(self) -> str:
        """Further <option> attributes (with a leading space)."""
        return ""

    def _world_geoms(self) -> list[str]:
        return ['<geom type="plane" size="2 2 .1"/>'] if self.rng.random() < 0.3 else []

    def _extra_sections(self) -> list[tuple[str, list[str]]]:
        """(tag, elements) of sections after <actuator>, drawn after everything else."""
        return []

    # ---- whole model
    def _option(self) -> str:
        rng = self.rng
        integrator = self.integrator or rng.choice(INTEGRATORS)
        attrs = f'timestep="{rng.uniform(1e-3, 5e-3):.6g}" integrator="{integrator}"'
        if rng.random() < 0.7:
            attrs += f' gravity="{_fmt(self._gravity())}"'
        if rng.random() < 0.2:
            attrs += f' actuatorgroupdisable="{rng.integers(1, 4)}"'
        attrs += self._option_attrs()
        flags = [f for f in self.disable_flag_names if self.disable_flags and rng.random() < 0.08]
        flag_xml = "<flag " + " ".join(f'{f}="disable"' for f in flags) + "/>" if flags else ""
        return f"<option {attrs}>{flag_xml}</option>"

    def build(self) -> str:
        rng = self.rng
        option = self._option()
        for _ in range(rng.integers(2, self.max_bodies + 1)):
            self._add_body()
        world_lines = self._world_geoms()
        for _ in range(rng.integers(0, 2)):
            name = f"s{len(self.sites)}"
            self.sites.append(name)
            world_lines.append(_site(rng, name))
        if any(j.type in ("hinge", "slide") for j in self.joints):
            for t in range(rng.integers(0, self.max_tendons + 1)):
                self.tendons.append(f"t{t}")
        tendons = [self._tendon(t) for t in range(len(self.tendons))]
        actuators = [self._actuator(i) for i in range(rng.integers(0, self.max_actuators + 1))]
        if self.max_actuators and (self.tendons or any(j.type in ("hinge", "slide") for j in self.joints)):
            actuators += [self._muscle(i) for i in range(self.muscle_rng.integers(0, 3))]

        lines = [
            f'<mujoco model="{self.model_name}_{self.seed}">',
            f"  {option}",
            '  <default><geom contype="0" conaffinity="0"/></default>',
            "  <worldbody>",
            *[f"    {line}" for line in world_lines],
        ]
        for body in self.world.children:
            lines += self._body_xml(body, "    ")
        lines.append("  </worldbody>")
        lines += _section("tendon", tendons) + _section("actuator", actuators)
        for tag, items in self._extra_sections():
            lines += _section(tag, items)
        lines.append("</mujoco>")
        return "\n".join(lines) + "\n"


class _FluidBuilder(_Builder):
    """The contact-free model in a fluid; fluid draws use a stream apart from the model's."""

    model_name = "random_fluid"

    def __init__(self, *args):
        super().__init__(*args)
        self.fluid_rng = np.random.default_rng([self.seed, 2])
        self.ellipsoid_bodies: dict[str, bool] = {}

    def _option_attrs(self) -> str:
        """Density and viscosity (each sometimes zero, never both) and a wind."""
        rng = self.fluid_rng
        density, viscosity = rng.uniform(0.5, 300.0), rng.uniform(0.001, 0.5)
        draw = rng.random()
        density, viscosity = (0.0, viscosity) if draw < 0.2 else (density, 0.0) if draw < 0.4 else (density, viscosity)
        wind = rng.uniform(-2.0, 2.0, 3) * (rng.random() < 0.7)
        return f' density="{density:.6g}" viscosity="{viscosity:.6g}" wind="{_fmt(wind)}"'

    def _body_geom(self, body: _Body, mass: float) -> str:
        """In an ellipsoid-model body most geoms get fluidshape and random coefficients."""
        rng = self.fluid_rng
        ellipsoid = self.ellipsoid_bodies.setdefault(body.name, bool(rng.random() < 0.5))
        extra = ""
        if ellipsoid and rng.random() < 0.8:
            coef = (*rng.uniform(0.0, 1.0, 2), *rng.uniform(0.0, 2.0, 3))  # blunt, slender, angular, Kutta, Magnus
            extra = f' fluidshape="ellipsoid" fluidcoef="{_fmt(coef)}"'
        return _geom(self.rng, mass, extra)


def _check_options(max_bodies: int, max_depth: int, integrator: str | None) -> None:
    if integrator is not None and integrator not in INTEGRATORS:
        raise ValueError(f"integrator must be one of {INTEGRATORS}, got {integrator!r}")
    if max_bodies < 2 or max_depth < 1:
        raise ValueError("need max_bodies >= 2 and max_depth >= 1")


def random_mjcf(
    seed: int,
    *,
    max_bodies: int = 8,
    max_depth: int = 5,
    max_tendons: int = 3,
    max_actuators: int = 8,
    integrator: str | None = None,
    disable_flags: bool = True,
    fluid: bool = False,
) -> str:
    """The MJCF text of a random contact-free model; equal seeds give equal strings.

    ``integrator`` fixes the integrator (one of ``INTEGRATORS``) instead of
    drawing it; ``disable_flags=False`` keeps every physics flag enabled;
    ``fluid=True`` puts the model in a fluid (see the module's docstring).
    """
    _check_options(max_bodies, max_depth, integrator)
    builder = (_FluidBuilder if fluid else _Builder)(
        seed, max_bodies, max_depth, max_tendons, max_actuators, integrator, disable_flags)
    return builder.build()


# ---- models with contacts and constraints


def collides(kind1: str, kind2: str) -> bool:
    """Whether geoms of these types collide under COLLISION_BITS."""
    (type1, affinity1), (type2, affinity2) = COLLISION_BITS[kind1], COLLISION_BITS[kind2]
    return bool(type1 & affinity2 or type2 & affinity1)


def _solref(rng: np.random.Generator) -> str:
    """Standard (time constant, damping ratio; sometimes under two timesteps, which refsafe
    raises) or direct (-stiffness, -damping) solver reference."""
    if rng.random() < 0.7:
        return _fmt((rng.uniform(0.004, 0.05), rng.uniform(0.7, 1.5)))
    return _fmt((-rng.uniform(500.0, 5000.0), -rng.uniform(10.0, 120.0)))


def _solimp(rng: np.random.Generator) -> str:
    """dmin <= dmax, width, midpoint and power (sometimes exactly 1, MuJoCo's linear case)."""
    dmin = rng.uniform(0.5, 0.95)
    power = 1.0 if rng.random() < 0.25 else rng.uniform(1.5, 4.0)
    return _fmt((dmin, rng.uniform(dmin, 0.995), rng.uniform(5e-4, 0.02), rng.uniform(0.2, 0.8), power))


def _friction(rng: np.random.Generator, pair: bool = False) -> str:
    """Sliding, torsional and rolling friction; an explicit pair gives each tangent its own."""
    sliding = rng.uniform(0.3, 1.2, 2 if pair else 1)
    rolling = rng.uniform(1e-4, 5e-3, 2 if pair else 1)
    return _fmt(np.r_[sliding, rng.uniform(1e-3, 0.05), rolling])


def _attrs(attrs: list[str]) -> str:
    return "".join(f" {a}" for a in attrs)


def _contact_attrs(rng: np.random.Generator) -> str:
    """condim, friction, solref, solimp, margin, gap, priority and solmix of a geom."""
    attrs = [f'condim="{rng.choice(CONDIMS)}"']
    if rng.random() < 0.6:
        attrs.append(f'friction="{_friction(rng)}"')
    if rng.random() < 0.4:
        attrs.append(f'solref="{_solref(rng)}"')
    if rng.random() < 0.4:
        attrs.append(f'solimp="{_solimp(rng)}"')
    if rng.random() < 0.3:
        margin = rng.uniform(0.0, 0.02)
        attrs.append(f'margin="{margin:.6g}"')
        if rng.random() < 0.5:
            attrs.append(f'gap="{rng.uniform(0.0, margin):.6g}"')
    if rng.random() < 0.3:
        attrs.append(f'priority="{rng.integers(0, 3)}"')
    if rng.random() < 0.3:
        attrs.append(f'solmix="{0.0 if rng.random() < 0.2 else rng.uniform(0.1, 2.0):.6g}"')
    return _attrs(attrs)


def _limit_attrs(rng: np.random.Generator, prefix: str) -> list[str]:
    """Optional margin, solref and solimp of a limit (prefix "limit") or a frictionloss ("friction")."""
    attrs = []
    if prefix == "limit" and rng.random() < 0.4:
        attrs.append(f'margin="{rng.uniform(0.0, 0.05):.6g}"')
    if rng.random() < 0.4:
        attrs.append(f'solref{prefix}="{_solref(rng)}"')
    if rng.random() < 0.4:
        attrs.append(f'solimp{prefix}="{_solimp(rng)}"')
    return attrs


@dataclass
class _ContactGeom:
    name: str
    kind: str
    body: _Body
    shape: _Shape | None  # in the body's frame; None for the floor


class _ContactBuilder(_Builder):
    """A floor and free or articulated bodies near it, with colliding geoms, limits, frictionloss,
    equalities, explicit pairs and excludes on top of everything the contact-free model draws."""

    # gravity stays on: it brings the bodies to the floor
    disable_flag_names = tuple(f for f in DISABLE_FLAGS if f != "gravity") + CONSTRAINT_DISABLE_FLAGS
    model_name = "random_contact"

    def __init__(self, seed: int, max_bodies: int, max_depth: int, max_tendons: int, max_actuators: int,
                 max_pairs: int, max_excludes: int, max_equalities: int, integrator: str | None,
                 cone: str | None, disable_flags: bool):
        super().__init__(seed, max_bodies, max_depth, max_tendons, max_actuators, integrator, disable_flags)
        self.max_pairs = max_pairs
        self.max_excludes = max_excludes
        self.max_equalities = max_equalities
        self.cone = cone
        self.geoms: list[_ContactGeom] = []

    def _body_pos(self, top_level: bool) -> np.ndarray:
        """Top-level bodies close together (their height is set in _world_geoms); children near their parent."""
        rng = self.rng
        if top_level:
            return np.r_[rng.uniform(-0.25, 0.25, 2), 0.0]
        return rng.uniform(-0.2, 0.2, 3)

    def _pick_parent(self) -> _Body:
        """As the contact-free model, but the second body always starts a second tree (one may
        land on the other)."""
        return self.world if len(self.bodies) == 1 else super()._pick_parent()

    def _joint_kinds(self, top_level: bool) -> list[str]:
        """The first top-level body that is not mocap and half the others are free, to fall."""
        if top_level and (not self._free_trees() or self.rng.random() < 0.5):
            return ["free"]
        return super()._joint_kinds(top_level)

    def _free_trees(self) -> list[_Body]:
        return [b for b in self.world.children if b.joints and b.joints[0].type == "free"]

    @staticmethod
    def _subtree(body: _Body) -> list[_Body]:
        return [body, *(b for child in body.children for b in _ContactBuilder._subtree(child))]

    def _body_geom(self, body: _Body, mass: float) -> str:
        rng = self.rng
        kind = str(rng.choice(GEOM_TYPES))
        name = f"g{len(self.geoms)}"
        contype, conaffinity = COLLISION_BITS[kind]
        extra = f' name="{name}" contype="{contype}" conaffinity="{conaffinity}"' + _contact_attrs(rng)
        xml, shape = _shaped_geom(rng, kind, mass, extra)
        self.geoms.append(_ContactGeom(name, kind, body, shape))
        return xml

    def _solids(self, top: _Body) -> list[tuple[_ContactGeom, _Shape]]:
        """The geoms of a top-level body's tree and their solids in the world frame (joints at qpos0)."""
        frames = {}

        def visit(body: _Body, pos: np.ndarray, rot: np.ndarray) -> None:
            frames[body.name] = pos, rot
            for child in body.children:
                visit(child, pos + rot @ child.pos, rot @ _rotation(child.quat))

        visit(top, top.pos, _rotation(top.quat))
        return [(g, g.shape.moved(*frames[g.body.name])) for g in self.geoms if g.body.name in frames]

    def _affine_gain(self) -> tuple[float, float, float]:
        """No velocity coefficient (drawn, then dropped, to keep the stream). Times a random-sign
        control it is anti-damping half the time, which the implicit integrators amplify
        (1 / (1 - h g) > 1 + h g): over the settling rollout MuJoCo C itself blew up (seed 82)."""
        gain, length, _ = super()._affine_gain()
        return gain, length, 0.0

    def _joint_constraint_attrs(self, kind: str) -> str:
        """Sometimes a range (hinge and ball in degrees), sometimes frictionloss."""
        rng = self.rng
        attrs = []
        if kind != "free" and rng.random() < 0.5:
            if kind == "hinge":
                limits = (rng.uniform(-70.0, -5.0), rng.uniform(5.0, 70.0))
            elif kind == "slide":
                limits = (rng.uniform(-0.2, -0.01), rng.uniform(0.01, 0.2))
            else:  # a ball's range is its largest rotation angle
                limits = (0.0, rng.uniform(10.0, 70.0))
            attrs += [f'limited="true" range="{_fmt(limits)}"', *_limit_attrs(rng, "limit")]
        if rng.random() < 0.3:
            attrs += [f'frictionloss="{rng.uniform(0.01, 0.5):.6g}"', *_limit_attrs(rng, "friction")]
        return _attrs(attrs)

    def _tendon_constraint_attrs(self) -> list[str]:
        rng = self.rng
        attrs = []
        if rng.random() < 0.5:
            limits = (rng.uniform(-0.6, -0.05), rng.uniform(0.05, 0.6))
            attrs += [f'limited="true" range="{_fmt(limits)}"', *_limit_attrs(rng, "limit")]
        if rng.random() < 0.4:
            attrs += [f'frictionloss="{rng.uniform(0.01, 0.3):.6g}"', *_limit_attrs(rng, "friction")]
        return attrs

    def _gravity(self) -> np.ndarray:
        """Mostly downward, so that bodies land on the floor."""
        return np.r_[self.rng.uniform(-1.0, 1.0, 2), self.rng.uniform(-12.0, -4.0)]

    def _option_attrs(self) -> str:
        rng = self.rng
        attrs = f' cone="{self.cone or rng.choice(CONES)}"'
        if rng.random() < 0.3:
            attrs += f' impratio="{rng.uniform(1.0, 4.0):.6g}"'
        return attrs

    def _world_geoms(self) -> list[str]:
        """The floor: a plane at about z = 0, sometimes tilted a little. The top-level bodies are
        then placed onto it one by one, each just above (sometimes 5 mm into) the floor or the
        bodies placed before it below it, so that nothing starts deep inside anything else."""
        rng = self.rng
        self.geoms.append(_ContactGeom("floor", "plane", self.world, None))
        contype, conaffinity = COLLISION_BITS["plane"]
        height = rng.uniform(-0.05, 0.05)
        quat = None
        if rng.random() < 0.5:
            angle, direction = rng.uniform(0.0, 0.15), _unit(rng, 2)
            quat = np.r_[np.cos(angle / 2), np.sin(angle / 2) * direction, 0.0]
        normal = _rotation(quat)[:, 2]
        self._drop_bodies(normal, normal[2] * height)
        return [f'<geom name="floor" type="plane" size="3 3 .1" pos="0 0 {height:.6g}"{_quat_xml(quat)} '
                f'contype="{contype}" conaffinity="{conaffinity}"{_contact_attrs(rng)}/>']

    def _drop_bodies(self, normal: np.ndarray, floor: float) -> None:
        """Set each top-level body's height: heights are measured along the floor's ``normal``,
        the floor at ``floor``; a body rests on the highest body before it whose x-y box overlaps."""
        placed: list[tuple[np.ndarray, np.ndarray, float]] = []  # x-y box low, high and top of each body
        placed_solids: list[tuple[_ContactGeom, _Shape]] = []
        for body in self.world.children:
            if body.moving and placed_solids and self.rng.random() < 0.7:
                self._align_above(body, placed_solids, normal)
            solids = [solid for _, solid in self._solids(body)]
            if not solids:
                continue

            def extent(direction: np.ndarray) -> float:
                return max(solid.support(direction) for solid in solids)

            low = -np.array([extent(-axis) for axis in np.eye(3)[:2]])
            high = np.array([extent(axis) for axis in np.eye(3)[:2]])
            base = max([top for lo, hi, top in placed if np.all(lo < high) and np.all(low < hi)], default=floor)
            lift = (base + self.rng.uniform(-0.005, 0.03) + extent(-normal)) / normal[2]
            body.pos = body.pos + [0.0, 0.0, lift]
            placed.append((low, high, extent(normal) + lift * normal[2]))
            placed_solids += self._solids(body)

    def _align_above(self, body: _Body, placed: list[tuple["_ContactGeom", _Shape]], normal: np.ndarray) -> None:
        """Shift a top-level body in x-y so that its lowest geom that can collide with the highest
        geom placed before it sits (within 2 cm) right above it, so that the two touch on landing."""
        own = self._solids(body)
        targets = [(g, s) for g, s in placed if any(collides(g.kind, h.kind) for h, _ in own)]
        if not targets:
            return
        target_geom, target = max(targets, key=lambda t: t[1].support(normal))
        lowest = max((t for h, t in own if collides(target_geom.kind, h.kind)), key=lambda t: t.support(-normal))
        shift = target.center[:2] - lowest.center[:2] + self.rng.uniform(-0.02, 0.02, 2)
        body.pos = body.pos + np.r_[shift, 0.0]

    def _distinct(self, candidates: list, most: int) -> list:
        """Up to ``most`` different entries of ``candidates``."""
        count = min(len(candidates), self.rng.integers(0, most + 1))
        return [candidates[k] for k in self.rng.choice(len(candidates), size=count, replace=False)]

    def _overlapping(self) -> set[tuple[str, str]]:
        """Names of the geom pairs of one tree (bodies apart) that may collide and are not
        certainly apart in the initial pose."""
        found = set()
        for top in self.world.children:
            solids = self._solids(top)
            for i, (a, solid_a) in enumerate(solids):
                for b, solid_b in solids[i + 1:]:
                    if a.body.weld != b.body.weld and collides(a.kind, b.kind) and not solid_a.apart(solid_b):
                        found.add((a.name, b.name))
        return found

    def _pairs(self, overlapping: set[tuple[str, str]]) -> list[str]:
        """Explicit <pair>s of geoms that may collide (not ``overlapping``: pairs ignore <exclude>),
        with their own contact parameters."""
        candidates = [
            (a, b) for i, a in enumerate(self.geoms) for b in self.geoms[i + 1:]
            if a.body.weld != b.body.weld and (a.body.moving or b.body.moving) and collides(a.kind, b.kind)
            and (a.name, b.name) not in overlapping
        ]
        return [self._pair(a, b) for a, b in self._distinct(candidates, self.max_pairs)]

    def _pair(self, a: _ContactGeom, b: _ContactGeom) -> str:
        rng = self.rng
        attrs = [f'geom1="{a.name}" geom2="{b.name}" condim="{rng.choice(CONDIMS)}"']
        if rng.random() < 0.7:
            attrs.append(f'friction="{_friction(rng, pair=True)}"')
        if rng.random() < 0.5:
            attrs.append(f'solref="{_solref(rng)}"')
        if rng.random() < 0.3:
            attrs.append(f'solreffriction="{_solref(rng)}"')
        if rng.random() < 0.5:
            attrs.append(f'solimp="{_solimp(rng)}"')
        if rng.random() < 0.3:
            margin = rng.uniform(0.0, 0.02)
            attrs.append(f'margin="{margin:.6g}" gap="{rng.uniform(0.0, margin):.6g}"')
        return f"<pair{_attrs(attrs)}/>"

    def _excludes(self, overlapping: set[tuple[str, str]]) -> list[str]:
        """Random body pairs, and those with ``overlapping`` geoms (which would start deep in contact)."""
        order = {b.name: i for i, b in enumerate(self.bodies)}
        candidates = [
            (a.name, b.name) for i, a in enumerate(self.bodies) for b in self.bodies[i + 1:]
            if a.weld != b.weld and (a.moving or b.moving)
        ]
        owner = {g.name: g.body.name for g in self.geoms}
        chosen = set(self._distinct(candidates, self.max_excludes))
        chosen |= {tuple(sorted((owner[a], owner[b]), key=order.get)) for a, b in overlapping}
        return [f'<exclude body1="{a}" body2="{b}"/>' for a, b in sorted(chosen, key=lambda p: (order[p[0]], order[p[1]]))]

    def _equality(self, index: int) -> str | None:
        """A connect or weld (body semantics), joint or tendon equality.

        A connect or weld holds a body of a falling tree to a body of another tree or, for a
        connect, sometimes to the world (the tree then hangs from the anchor): the tree's free
        joint gives every row a nonzero Jacobian. (A row with J = 0, say a weld's rotation rows
        on a body that can only slide, has a force of 1e15 times round-off in MuJoCo.)
        """
        rng = self.rng
        names = [b.name for b in self.bodies]
        trees = [[b.name for b in self._subtree(top)] for top in self._free_trees()]
        tethered = [tree for tree in trees if len(tree) < len(names)]  # some body is outside
        scalar = [j.name for j in self.joints if j.type in ("hinge", "slide")]
        kinds = ["connect"] * bool(trees) + ["weld"] * bool(tethered)
        kinds += ["joint"] * bool(scalar) + ["tendon"] * bool(self.tendons)
        if not kinds:
            return None
        kind = str(rng.choice(kinds))
        if kind in ("connect", "weld"):
            choices = trees if kind == "connect" else tethered
            tree = choices[rng.integers(len(choices))]
            others = [name for name in names if name not in tree]
            attrs = [f'body1="{tree[rng.integers(len(tree))]}"']
            if others and (kind == "weld" or rng.random() < 0.7):
                attrs.append(f'body2="{others[rng.integers(len(others))]}"')
            if kind == "connect" or rng.random() < 0.5:
                attrs.append(f'anchor="{_fmt(rng.uniform(-0.1, 0.1, 3))}"')
            if kind == "weld" and rng.random() < 0.5:
                attrs.append(f'torquescale="{rng.uniform(0.1, 3.0):.6g}"')
        else:
            targets = scalar if kind == "joint" else self.tendons
            first = rng.integers(len(targets))
            attrs = [f'{kind}1="{targets[first]}"']
            others = [n for k, n in enumerate(targets) if k != first]
            if others and rng.random() < 0.7:
                attrs.append(f'{kind}2="{others[rng.integers(len(others))]}"')
            # a joint equality starts a little violated; a tendon's, whose coefficients may be tiny, not
            offset = rng.uniform(-0.05, 0.05) if kind == "joint" else 0.0
            coef = np.r_[offset, rng.uniform(-1.2, 1.2), rng.uniform(-0.3, 0.3, 3)]
            attrs.append(f'polycoef="{_fmt(coef)}"')
        if rng.random() < 0.4:
            attrs.append(f'solref="{_solref(rng)}"')
        if rng.random() < 0.4:
            attrs.append(f'solimp="{_solimp(rng)}"')
        if rng.random() < 0.1:
            attrs.append('active="false"')
        return f'<{kind} name="e{index}"{_attrs(attrs)}/>'

    def _extra_sections(self) -> list[tuple[str, list[str]]]:
        rng = self.rng
        overlapping = self._overlapping()
        contact = self._pairs(overlapping) + self._excludes(overlapping)
        equality = [self._equality(i) for i in range(rng.integers(0, self.max_equalities + 1))]
        return [("contact", contact), ("equality", [e for e in equality if e])]


def random_contact_mjcf(
    seed: int,
    *,
    max_bodies: int = 6,
    max_depth: int = 3,
    max_tendons: int = 3,
    max_actuators: int = 6,
    max_pairs: int = 2,
    max_excludes: int = 1,
    max_equalities: int = 3,
    integrator: str | None = None,
    cone: str | None = None,
    disable_flags: bool = True,
) -> str:
    """The MJCF text of a random model with contacts and constraints; equal seeds give equal strings.

    On top of ``random_mjcf``'s features: a floor (sometimes tilted); at least
    two trees, whose top-level bodies start just above the floor or, mostly,
    just above a geom of a tree placed before (so that they land on each
    other); affine gains without a velocity term (see
    ``_ContactBuilder._affine_gain``); every body geom collides
    (COLLISION_BITS keeps type pairs diffmj does not implement apart) with
    random condim, friction, solref (standard or direct), solimp, margin, gap,
    priority and solmix; hinge / slide / ball limits and dof frictionloss;
    tendon limits and frictionloss (each with its own solref / solimp and
    limit margin); up to ``max_pairs`` explicit ``<pair>``, ``max_excludes``
    ``<exclude>`` and ``max_equalities`` connect / weld / joint / tendon
    equalities; a random friction cone (or ``cone``) and impratio; and, with
    ``disable_flags``, sometimes a constraint type disabled.
    """
    _check_options(max_bodies, max_depth, integrator)
    if cone is not None and cone not in CONES:
        raise ValueError(f"cone must be one of {CONES}, got {cone!r}")
    builder = _ContactBuilder(seed, max_bodies, max_depth, max_tendons, max_actuators, max_pairs, max_excludes,
                              max_equalities, integrator, cone, disable_flags)
    return builder.build()
