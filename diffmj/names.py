"""MuJoCo's object names, kept in the model's structure for lookups by name."""

from __future__ import annotations

from typing import NamedTuple

import mujoco

# object types by MuJoCo's field prefix, with the word errors use
KINDS = {
    "body": (mujoco.mjtObj.mjOBJ_BODY, "body"),
    "jnt": (mujoco.mjtObj.mjOBJ_JOINT, "joint"),
    "geom": (mujoco.mjtObj.mjOBJ_GEOM, "geom"),
    "site": (mujoco.mjtObj.mjOBJ_SITE, "site"),
    "tendon": (mujoco.mjtObj.mjOBJ_TENDON, "tendon"),
    "actuator": (mujoco.mjtObj.mjOBJ_ACTUATOR, "actuator"),
    "sensor": (mujoco.mjtObj.mjOBJ_SENSOR, "sensor"),
    "eq": (mujoco.mjtObj.mjOBJ_EQUALITY, "equality"),
    "pair": (mujoco.mjtObj.mjOBJ_PAIR, "pair"),
}


class Names(NamedTuple):
    """Names of the objects of each type, by id ('' where unnamed). Hashable, compared by value."""

    body: tuple[str, ...]
    jnt: tuple[str, ...]
    geom: tuple[str, ...]
    site: tuple[str, ...]
    tendon: tuple[str, ...]
    actuator: tuple[str, ...]
    sensor: tuple[str, ...]
    eq: tuple[str, ...]
    pair: tuple[str, ...]

    def id_of(self, kind: str, obj: str | int) -> int:
        """Id of the object of type ``kind`` (a key of KINDS) named ``obj`` (or with id ``obj``).

        Raises ValueError for an unknown name or an id out of range.
        """
        names = getattr(self, kind)
        word = KINDS[kind][1]
        if isinstance(obj, int) and not isinstance(obj, bool):
            if not 0 <= obj < len(names):
                raise ValueError(f"{word} id {obj} is out of range: the model has {len(names)}")
            return obj
        if isinstance(obj, str) and obj and obj in names:
            return names.index(obj)
        other = [KINDS[k][1] for k in KINDS if k != kind and obj in getattr(self, k)]
        hint = f" ({obj!r} is a {' and a '.join(other)})" if other else ""
        known = ", ".join(repr(n) for n in names if n) or "none"
        raise ValueError(f"no {word} named {obj!r}{hint}; the model's {word} names: {known}")


def build_names(mjm: mujoco.MjModel) -> Names:
    """The names of ``mjm``'s objects."""
    counts = {"body": mjm.nbody, "jnt": mjm.njnt, "geom": mjm.ngeom, "site": mjm.nsite, "tendon": mjm.ntendon,
              "actuator": mjm.nu, "sensor": mjm.nsensor, "eq": mjm.neq, "pair": mjm.npair}
    return Names(**{
        kind: tuple(mujoco.mj_id2name(mjm, obj, i) or "" for i in range(counts[kind]))
        for kind, (obj, _) in KINDS.items()
    })
