"""Seeded random MJCF models exercising every contact-free feature diffmj supports.

``random_mjcf(seed)`` returns the XML of a valid, non-degenerate model: a
random forest of 2..``max_bodies`` bodies (up to ``max_depth`` deep) with
random frames and inertial frames (explicit ``<inertial>`` with diagonal or
full inertia, or from geoms), 0-3 joints per body (free / ball / slide /
hinge with random axes, anchors, refs, springs, dampers, armature and
actuator options), geoms of every primitive type with collisions off,
sites, mocap bodies (some carrying moving subtrees), gravity compensation,
fixed tendons over hinge / slide joints, and actuators of every supported
transmission, dynamics, gain and bias type with random clamps. The option
block draws the integrator, timestep, gravity and, sometimes, disable
flags and disabled actuator groups.

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


@dataclass
class _Joint:
    name: str
    type: str


@dataclass
class _Body:
    name: str
    depth: int
    attrs: str = ""  # frame, mocap and gravcomp attributes
    joints: list[_Joint] = field(default_factory=list)
    children: list["_Body"] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # inertial, joints, geoms, sites


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


def _quat_attr(rng: np.random.Generator, p: float = 0.7) -> str:
    """A random orientation attribute, or none (identity) with probability 1 - p."""
    return f' quat="{_fmt(_unit(rng, 4))}"' if rng.random() < p else ""


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


def _geom(rng: np.random.Generator, mass: float) -> str:
    kind = rng.choice(GEOM_TYPES)
    mass_attr = f'mass="{mass:.6g}"'
    if kind in ("capsule", "cylinder") and rng.random() < 0.5:
        start = rng.uniform(-0.1, 0.1, 3)
        end = start + rng.uniform(0.1, 0.4) * _unit(rng, 3)
        radius = rng.uniform(0.04, 0.07)
        return f'<geom type="{kind}" fromto="{_fmt(np.r_[start, end])}" size="{radius:.6g}" {mass_attr}/>'
    size = {
        "sphere": rng.uniform(0.05, 0.12, 1),
        "capsule": np.r_[rng.uniform(0.04, 0.07), rng.uniform(0.05, 0.2)],
        "ellipsoid": rng.uniform(0.04, 0.15, 3),
        "cylinder": np.r_[rng.uniform(0.04, 0.08), rng.uniform(0.05, 0.2)],
        "box": rng.uniform(0.04, 0.15, 3),
    }[kind]
    pos = f'pos="{_fmt(rng.uniform(-0.15, 0.15, 3))}"'
    return f'<geom type="{kind}" size="{_fmt(size)}" {pos}{_quat_attr(rng, 0.5)} {mass_attr}/>'


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


class _Builder:
    def __init__(self, seed: int, max_bodies: int, max_depth: int, max_tendons: int, max_actuators: int,
                 integrator: str | None, disable_flags: bool):
        self.rng = np.random.default_rng(seed)
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

    def _add_joints(self, body: _Body, top_level: bool) -> None:
        """No joint (welded), one free joint (top level only), or 1-3 ball / slide / hinge joints.

        MuJoCo allows at most 6 dofs per body and no rotation after a ball joint;
        a hinge before a ball would nearly duplicate one of its rotations, so a
        ball is the body's only rotational joint. Hinge axes and slide axes are
        each kept well apart.
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
        axes: dict[str, list[np.ndarray]] = {"hinge": [], "slide": []}
        for kind in kinds:
            axis = None
            if kind in axes:
                axis = _spread_axis(rng, axes[kind])
                axes[kind].append(axis)
            joint = _Joint(f"j{len(self.joints)}", kind)
            self.joints.append(joint)
            body.joints.append(joint)
            body.lines.append(f'<joint name="{joint.name}" type="{kind}" {_joint_attrs(rng, kind, axis)}/>')

    def _add_body(self) -> None:
        rng = self.rng
        parent = self._pick_parent()
        top_level = parent is self.world
        mocap = top_level and rng.random() < 0.12
        attrs = f'pos="{_fmt(rng.uniform(-0.3, 0.3, 3))}"{_quat_attr(rng)}'
        if mocap:
            attrs += ' mocap="true"'
        if rng.random() < 0.25:
            attrs += f' gravcomp="{rng.uniform(0.0, 1.2):.6g}"'
        body = _Body(f"b{len(self.bodies)}", parent.depth + 1, attrs)
        if not mocap:
            self._add_joints(body, top_level)
        explicit = rng.random() < 0.4
        if explicit:
            body.lines.insert(0, _inertial(rng))
        # MuJoCo needs mass on bodies with joints; welded, static and mocap bodies may have none
        massless_ok = explicit or (not body.joints and rng.random() < 0.3)
        for _ in range(rng.integers(0 if massless_ok else 1, 3)):
            body.lines.append(_geom(rng, rng.uniform(0.1, 2.5)))
        for _ in range(rng.integers(0, 3)):
            name = f"s{len(self.sites)}"
            self.sites.append(name)
            body.lines.append(_site(rng, name))
        parent.children.append(body)
        self.bodies.append(body)

    def _body_xml(self, body: _Body, indent: str) -> list[str]:
        out = [f'{indent}<body name="{body.name}" {body.attrs}>']
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
            prm = (rng.uniform(-3.0, 3.0), rng.uniform(-2.0, 2.0), rng.uniform(-0.3, 0.3))
            attrs.append(f'gaintype="affine" gainprm="{_fmt(prm)}"')
        if rng.random() < 0.5:
            prm = (rng.uniform(-1.0, 1.0), rng.uniform(-5.0, 0.0), rng.uniform(-0.3, 0.0))
            attrs.append(f'biastype="affine" biasprm="{_fmt(prm)}"')
        if rng.random() < 0.5:
            attrs.append(f'ctrlrange="{rng.uniform(-2.0, -0.2):.6g} {rng.uniform(0.2, 2.0):.6g}"')
        if rng.random() < 0.4:
            attrs.append(f'forcerange="{rng.uniform(-3.0, -0.3):.6g} {rng.uniform(0.3, 3.0):.6g}"')
        attrs.append(f'group="{rng.integers(0, 4)}"')
        return f'<general {" ".join(attrs)}/>'

    # ---- whole model
    def _option(self) -> str:
        rng = self.rng
        integrator = self.integrator or rng.choice(INTEGRATORS)
        attrs = f'timestep="{rng.uniform(1e-3, 5e-3):.6g}" integrator="{integrator}"'
        if rng.random() < 0.7:
            attrs += f' gravity="{_fmt(rng.uniform(-3.0, 3.0, 2))} {rng.uniform(-12.0, 0.0):.6g}"'
        if rng.random() < 0.2:
            attrs += f' actuatorgroupdisable="{rng.integers(1, 4)}"'
        flags = [f for f in DISABLE_FLAGS if self.disable_flags and rng.random() < 0.08]
        flag_xml = "<flag " + " ".join(f'{f}="disable"' for f in flags) + "/>" if flags else ""
        return f"<option {attrs}>{flag_xml}</option>"

    def build(self) -> str:
        rng = self.rng
        option = self._option()
        for _ in range(rng.integers(2, self.max_bodies + 1)):
            self._add_body()
        world_lines = []
        if rng.random() < 0.3:
            world_lines.append('<geom type="plane" size="2 2 .1"/>')
        for _ in range(rng.integers(0, 2)):
            name = f"s{len(self.sites)}"
            self.sites.append(name)
            world_lines.append(_site(rng, name))
        if any(j.type in ("hinge", "slide") for j in self.joints):
            for t in range(rng.integers(0, self.max_tendons + 1)):
                self.tendons.append(f"t{t}")
        tendons = [self._tendon(t) for t in range(len(self.tendons))]
        actuators = [self._actuator(i) for i in range(rng.integers(0, self.max_actuators + 1))]

        lines = [
            f'<mujoco model="random_{self.seed}">',
            f"  {option}",
            '  <default><geom contype="0" conaffinity="0"/></default>',
            "  <worldbody>",
            *[f"    {line}" for line in world_lines],
        ]
        for body in self.world.children:
            lines += self._body_xml(body, "    ")
        lines.append("  </worldbody>")
        if tendons:
            lines += ["  <tendon>", *[f"    {t}" for t in tendons], "  </tendon>"]
        if actuators:
            lines += ["  <actuator>", *[f"    {a}" for a in actuators], "  </actuator>"]
        lines.append("</mujoco>")
        return "\n".join(lines) + "\n"


def random_mjcf(
    seed: int,
    *,
    max_bodies: int = 8,
    max_depth: int = 5,
    max_tendons: int = 3,
    max_actuators: int = 8,
    integrator: str | None = None,
    disable_flags: bool = True,
) -> str:
    """The MJCF text of a random contact-free model; equal seeds give equal strings.

    ``integrator`` fixes the integrator (one of ``INTEGRATORS``) instead of
    drawing it; ``disable_flags=False`` keeps every physics flag enabled.
    """
    if integrator is not None and integrator not in INTEGRATORS:
        raise ValueError(f"integrator must be one of {INTEGRATORS}, got {integrator!r}")
    if max_bodies < 2 or max_depth < 1:
        raise ValueError("need max_bodies >= 2 and max_depth >= 1")
    builder = _Builder(seed, max_bodies, max_depth, max_tendons, max_actuators, integrator, disable_flags)
    return builder.build()
