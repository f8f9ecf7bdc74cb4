"""Shared helpers: models, random MuJoCo C states, field comparison with one tolerance table."""

from __future__ import annotations

import dataclasses
import pathlib

import mujoco
import numpy as np
import pytest
import torch

import diffmj
from diffmj.collision.driver import collision
from diffmj.smooth import kinematics

# The test models are small: one thread avoids MKL's threading overhead on tiny
# matrices, which is large when the machine's other core is busy.
torch.set_num_threads(1)

MODELS = pathlib.Path(__file__).parent / "models"
BENCHMARK_MODELS = pathlib.Path(__file__).parents[1] / "models"  # the five benchmark models

# One tolerance table (float64, scale-aware: |a - b| <= tol * (1 + |b|)). A bound is about 10x the
# worst error measured in the default (not slow) tests, rounded to a power of ten; the last three
# are wider on purpose, as explained.
TOL = {
    "smooth": 1e-11,  # kinematics, inertia, forces, one step (measured 3e-13: qacc of random models)
    "rollout": 1e-10,  # a few steps, where differences grow (measured 7e-12: sensors after two steps)
    "rows": 1e-11,  # contacts and constraint rows (measured 4e-13: efc_aref of random contact models)
    # rows that go through the impedance imp(dist) (efc_D, efc_R, efc_KBIP, efc_aref): its slope, up to
    # ~(dmax - dmin) / width ~ 1e2, amplifies a contact distance that differs by ~1e-13 where MuJoCo's
    # plane-cylinder formula divides by the sine of a small tilt (random contact seed 95, slow
    # sweep): measured 5.2e-11 on efc_R there, 4e-13 elsewhere
    "impedance": 1e-9,
    "sensor": 1e-9,
    # float32 against float64, or compiled float32 against eager: roundings of 6e-8 grown through one
    # step (measured 1.9e-7: qacc of a compiled float32 step)
    "float32": 1e-5,
    # derived constants (set_const) against mj_setConst: M^-1 at qpos0 rounds with M's condition number
    # (measured 1.2e-14: humanoid's dof_invweight0 after its parameters changed)
    "setconst": 1e-12,
    # central differences with step 1e-6 against exact derivatives: truncation (eps^2 |f'''|) plus
    # rounding (1e-16 / eps) by bound; measured 1.5e-7 through contacts, 1e-14 on smooth losses
    "finite_difference": 1e-6,  # sensors, which read constraint forces (measured 1.4e-10: cfrc_int)
    # one computation batched, vmapped, compiled or checkpointed vs alone, and short computations
    # done in another order than MuJoCo's (integrate / differentiate positions: measured 5e-16)
    "batch": 1e-14,
    # inductor's generated kernels against eager's ATen ones: vectorised reductions and fused multiply-adds
    # round differently (aot_eager, the same graph without inductor, gives eager's bits on the humanoid);
    # a contact solve amplifies that (measured 2.1e-14: qacc of the compiled vmapped humanoid step, slow)
    "compiled": 1e-13,
    # converged qacc and efc_force, relative to their largest entry: the bound; the solver stops
    # at its own tolerance (measured 4e-10 on random contact models; a step after it 1.3e-13)
    "solver": 1e-6,
    # convex-pair distances: MuJoCo's GJK / EPA answer certifies the true distance only to about this
    # even at 1e-14 ccd_tolerance (test_collision_convex.py; measured 7e-14 on convex_pairs.xml)
    "ccd_dist": 1e-9,
    # convex contacts' pos / frame and efc_J carry MuJoCo's own EPA error (measured 2e-7)
    "ccd_contact": 1e-6,
}


# A small contact model: a box on a plane with an actuated capsule arm (few rows, cheap to compile).
ARM_ON_BOX = """
    <mujoco><option timestep="0.005" iterations="{iterations}" ls_iterations="8"/>
      <worldbody><geom type="plane" size="2 2 .1"/>
        <body pos="0 0 .12"><freejoint/><geom type="box" size=".1 .1 .1"/>
          <body pos=".1 0 0"><joint name="j" axis="0 1 0" range="-1 1"/>
            <geom type="capsule" fromto="0 0 0 .2 0 0" size=".03"/></body></body>
      </worldbody><actuator><motor joint="j"/></actuator></mujoco>"""


# the actuator test models and the scale of random_state's controls for each (DC motors take volts:
# at 10 their currents reach their rate limit)
ACTUATOR_MODELS = {"actuators": 1.0, "muscles": 1.0, "dcmotors": 10.0}


def mj_model(name: str) -> mujoco.MjModel:
    """A test model from tests/models (name without .xml)."""
    return mujoco.MjModel.from_xml_path(str(MODELS / f"{name}.xml"))


def random_state(mjm: mujoco.MjModel, seed: int, scale: float = 0.3) -> mujoco.MjData:
    """A non-trivial MuJoCo C state: random pose, velocity, controls, activations and loads."""
    rng = np.random.default_rng(seed)
    mjd = mujoco.MjData(mjm)
    mjd.qpos[:] = mjm.qpos0 + scale * rng.standard_normal(mjm.nq)
    mujoco.mj_normalizeQuat(mjm, mjd.qpos)
    mjd.qvel[:] = rng.standard_normal(mjm.nv)
    mjd.ctrl[:] = rng.standard_normal(mjm.nu)
    mjd.act[:] = 0.3 * rng.standard_normal(mjm.na)
    mjd.qfrc_applied[:] = rng.standard_normal(mjm.nv)
    mjd.xfrc_applied[1:] = rng.standard_normal((mjm.nbody - 1, 6))
    mjd.mocap_pos[:] += 0.1 * rng.standard_normal((mjm.nmocap, 3))
    mjd.time = float(rng.uniform(0, 10))
    return mjd


def as_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def assert_close(name: str, actual, expected, tol: float = TOL["smooth"], empty_ok: bool = False,
                 largest: bool = False) -> None:
    """Scale-aware comparison with a message naming the field and the worst entry.

    Empty arrays compare nothing, so they are an error unless ``empty_ok``. ``largest``: every entry
    against 1 + the largest |expected| instead of its own 1 + |expected|, for vectors whose small entries
    are sums of large terms (a gradient through a rollout), whose roundings are relative to those terms.
    """
    a, b = as_numpy(actual), as_numpy(expected)
    assert a.shape == b.shape, f"{name}: shape {a.shape} != {b.shape}"
    if not a.size:
        assert empty_ok, f"{name}: empty arrays compare nothing (pass empty_ok=True where that is meant)"
        return
    err = np.abs(a - b) / (1 + (np.abs(b).max() if largest else np.abs(b)))
    worst = np.unravel_index(np.argmax(err), err.shape)
    assert err[worst] <= tol, (
        f"{name}: relative error {err[worst]:.3e} > {tol:.0e} at {worst}: {a[worst]!r} vs {b[worst]!r}"
    )


def reference(m: diffmj.Model, mjd: mujoco.MjData) -> diffmj.Data:
    """MuJoCo C's computed fields in diffmj's layout (for comparison)."""
    return diffmj.put_data(m, mjd)


@pytest.fixture(params=["chain", "actuators"])
def smooth_model(request) -> mujoco.MjModel:
    """Each hand-written contact-free model."""
    return mj_model(request.param)


CONTACT_TYPES = (
    diffmj.ConstraintType.CONTACT_FRICTIONLESS, diffmj.ConstraintType.CONTACT_PYRAMIDAL,
    diffmj.ConstraintType.CONTACT_ELLIPTIC,
)


def match_contacts(m: diffmj.Model, d: diffmj.Data, mjd: mujoco.MjData) -> dict[int, int]:
    """MuJoCo contact index -> diffmj contact slot: same geom pair, nearest position."""
    geoms = m.collision_plan.contact_geom.cpu().numpy()
    dist = as_numpy(d.contact.dist)
    pos = as_numpy(d.contact.pos)
    result = {}
    for k in range(mjd.ncon):
        con = mjd.contact[k]
        slots = [
            s for s in range(len(geoms))
            if sorted(geoms[s]) == sorted(con.geom) and np.isfinite(dist[s]) and s not in result.values()
        ]
        assert slots, f"MuJoCo contact {k} between geoms {tuple(con.geom)} has no diffmj slot"
        result[k] = min(slots, key=lambda s: np.abs(pos[s] - con.pos).max())
    return result


def mj_efc_J(mjm: mujoco.MjModel, mjd: mujoco.MjData) -> np.ndarray:
    """MuJoCo's constraint Jacobian as a dense [nefc, nv] array."""
    if mujoco.mj_isSparse(mjm):
        out = np.zeros((mjd.nefc, mjm.nv))
        mujoco.mju_sparse2dense(out, mjd.efc_J, mjd.efc_J_rownnz, mjd.efc_J_rowadr, mjd.efc_J_colind)
        return out
    return mjd.efc_J.reshape(mjd.nefc, mjm.nv)


def match_efc(m: diffmj.Model, d: diffmj.Data, mjd: mujoco.MjData) -> tuple[np.ndarray, np.ndarray]:
    """(diffmj rows, MuJoCo rows) of every MuJoCo constraint row, matched by type, object and order."""
    plan = m.constraint_plan
    types, ids = np.asarray(plan.efc_type), np.asarray(plan.efc_id)
    active = as_numpy(d.efc_active).astype(bool)
    slot_of = match_contacts(m, d, mjd)
    ours, theirs = [], []
    k = 0
    while k < mjd.nefc:
        typ, obj = int(mjd.efc_type[k]), int(mjd.efc_id[k])
        end = k
        while end < mjd.nefc and mjd.efc_type[end] == typ and mjd.efc_id[end] == obj:
            end += 1
        group = list(range(k, end))
        our_id = slot_of[obj] if typ in CONTACT_TYPES else obj
        rows = np.flatnonzero((types == typ) & (ids == our_id) & active)
        assert len(rows) == len(group), f"efc type {typ} id {obj}: {len(rows)} rows vs MuJoCo's {len(group)}"
        ours += list(rows)
        theirs += group
        k += len(group)
    assert len(ours) == int(active.sum()), "diffmj has active rows MuJoCo does not"
    return np.asarray(ours, dtype=int), np.asarray(theirs, dtype=int)


def settled_state(mjm: mujoco.MjModel, steps: int, seed: int = 0, ctrl_scale: float = 0.5) -> mujoco.MjData:
    """A MuJoCo C state after ``steps`` steps of random controls (contacts made and broken)."""
    rng = np.random.default_rng(seed)
    mjd = mujoco.MjData(mjm)
    for _ in range(steps):
        mjd.ctrl[:] = ctrl_scale * rng.uniform(-1, 1, mjm.nu)
        mujoco.mj_step(mjm, mjd)
    mujoco.mj_forward(mjm, mjd)
    return mjd


def settled_arm_on_box(iterations: int, ls_iterations: int = 8) -> tuple[diffmj.Model, diffmj.Data]:
    """ARM_ON_BOX with these solver limits, settled for 40 steps: contact and limit rows active."""
    mjm = mujoco.MjModel.from_xml_string(ARM_ON_BOX.format(iterations=iterations))
    mjm.opt.ls_iterations = ls_iterations
    m = diffmj.put_model(mjm)
    d = diffmj.put_data(m, settled_state(mjm, 40))
    assert bool(diffmj.forward(m, d).efc_active.any())
    return m, d


@pytest.fixture(scope="module")
def arm_on_box():
    """ARM_ON_BOX (6 iterations) settled for 40 steps (small, cheap to compile)."""
    return settled_arm_on_box(6)


# ---------------------------------------------------------------- stage tests

CONTACT_FIELDS = tuple(f.name for f in dataclasses.fields(diffmj.types.Contact))


def _tol(tol: float | dict[str, float], name: str) -> float:
    return tol.get(name, TOL["smooth"]) if isinstance(tol, dict) else tol


def compare_contacts(m, out, mjd, fields=CONTACT_FIELDS, tol: float | dict = TOL["rows"]) -> None:
    """Each MuJoCo contact against diffmj's slot of the same geom pair (match_contacts).

    ``active`` is MuJoCo's ``exclude == 0``. Slots without a MuJoCo contact have no MuJoCo
    counterpart: they are only required to be empty (dist = +inf).
    """
    slot_of = match_contacts(m, out, mjd)
    assert np.isfinite(as_numpy(out.contact.dist)).sum() == mjd.ncon, "diffmj has contacts MuJoCo does not"
    if not mjd.ncon:
        return
    ks, slots = list(slot_of), list(slot_of.values())
    for name in fields:
        theirs = as_numpy(mjd.contact.exclude == 0 if name == "active" else getattr(mjd.contact, name))[ks]
        ours = as_numpy(getattr(out.contact, name))[slots].reshape(theirs.shape)
        assert_close(f"contact.{name}", ours, theirs, _tol(tol, f"contact.{name}"))


def compare_rows(m, out, mjd, fields, tol: float | dict = TOL["rows"], kbip_columns=slice(None)) -> None:
    """Every constraint row MuJoCo has against diffmj's row it matches (match_efc, which also
    requires diffmj to have exactly those rows active: efc_active). Inactive rows have no MuJoCo
    counterpart. ``kbip_columns`` picks which of efc_KBIP's K, B, I, P are compared."""
    ours, theirs = match_efc(m, out, mjd)
    if not mjd.nefc:
        return
    for name in fields:
        if name == "efc_active":
            continue  # compared by match_efc
        expected = mj_efc_J(mjd.model, mjd) if name == "efc_J" else getattr(mjd, name)
        actual = as_numpy(getattr(out, name))[ours]
        if name == "efc_KBIP":
            actual, expected = actual[:, kbip_columns], expected.reshape(-1, 4)[:, kbip_columns]
        assert_close(name, actual, expected[theirs], _tol(tol, name))


def poison(x: torch.Tensor) -> torch.Tensor:
    """A value no stage computes: NaN for floats, -1 for ints, flipped for bools."""
    if x.dtype == torch.bool:
        return ~x
    return torch.full_like(x, torch.nan if x.is_floating_point() else -1)


def _leaves(d: diffmj.Data) -> dict[str, torch.Tensor]:
    """Every field of d by name, the contact's dotted (contact.pos)."""
    items = d.to_tensordict().items(include_nested=True, leaves_only=True)
    return {k if isinstance(k, str) else ".".join(k): v for k, v in items}


def check_stage(stage, m, mjd, writes, tol: float | dict = TOL["smooth"], d=None, empty_ok=False) -> diffmj.Data:
    """Run one stage with its outputs poisoned; compare what it writes with MuJoCo, the rest unchanged.

    The stage gets ``d`` (default put_data(m, mjd) of the mj_forward'ed ``mjd``) with every field
    in ``writes`` poisoned. ``writes`` names exactly the fields the stage writes ("contact" for all
    of d.contact), or maps a name to the entries written (an index into its first dimension).
    After the stage, (a) no poison is left in them and each equals MuJoCo's value: put_data(m, mjd)
    (for qLD, which MuJoCo stores in another layout, the Cholesky factor of MuJoCo's qM), contacts
    by geom pair (compare_contacts), constraint rows by type and object (compare_rows); (b) every
    other field (and entry) is bit-identical to the input. ``tol``: one tolerance or field -> tolerance
    (others TOL["smooth"]). Returns the stage's output.
    """
    d = diffmj.put_data(m, mjd) if d is None else d
    writes = writes if isinstance(writes, dict) else dict.fromkeys(writes)
    if "contact" in writes:
        writes = {**{f"contact.{f}": None for f in CONTACT_FIELDS}, **writes}
        del writes["contact"]
    inputs = _leaves(d)
    assert set(writes) <= set(inputs), f"no such fields: {set(writes) - set(inputs)}"
    masks, poisoned = {}, d.clone()
    for name, index in writes.items():
        x = inputs[name]
        mask = torch.ones_like(x, dtype=torch.bool)
        if index is not None:
            mask = torch.zeros_like(mask).index_fill(0, torch.as_tensor(index, dtype=torch.long), True)
        masks[name] = mask
        poisoned.set(tuple(name.split(".")), torch.where(mask, poison(x), x))

    out = stage(m, poisoned)
    before, after = _leaves(poisoned), _leaves(out)
    for name, x in after.items():
        keep = ~masks[name] if name in masks else torch.ones_like(x, dtype=torch.bool)
        torch.testing.assert_close(x[keep], before[name][keep], rtol=0, atol=0, equal_nan=True,
                                   msg=lambda msg, name=name: f"{name}: changed, and not in writes\n{msg}")
    for name, mask in masks.items():
        assert not after[name][mask].isnan().any(), f"{name}: some entries not written (still NaN)"

    contact = [n.removeprefix("contact.") for n in masks if n.startswith("contact.")]
    if contact:
        assert mjd.ncon > 0 and out.contact.active.any(), "no contacts to compare"
        compare_contacts(m, out, mjd, contact, tol)
    efc = [n for n in masks if n.startswith("efc_")]
    if efc:
        assert mjd.nefc > 0, "no constraint rows to compare"
        compare_rows(m, out, mjd, efc, tol)
    expected = _leaves(diffmj.put_data(m, mjd))
    for name, mask in masks.items():
        if not name.startswith(("contact.", "efc_")):
            actual, theirs = torch.where(mask, after[name], 0), torch.where(mask, expected[name], 0)
            assert_close(name, actual, theirs, _tol(tol, name), empty_ok)
    return out


# contacts of MuJoCo's GJK / EPA (mjc_Convex, at ccd_tolerance 1e-14) against diffmj's exact ones
CCD_TOL = {"contact.dist": TOL["ccd_dist"], "contact.pos": TOL["ccd_contact"], "contact.frame": TOL["ccd_contact"]}


def mujoco_states(mjm: mujoco.MjModel, m: diffmj.Model, poses):
    """(MuJoCo's data after mj_forward, diffmj's data) at each qpos of ``poses``."""
    mjd = mujoco.MjData(mjm)
    for qpos in poses:
        mjd.qpos[:] = qpos
        mujoco.mj_forward(mjm, mjd)
        yield mjd, diffmj.put_data(m, mjd)


def _concatenated(parts: list):
    """Per-pose pair inputs (tensors, or named tuples of them, nested) concatenated along the pairs."""
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts)
    return type(parts[0])(*(_concatenated(list(x)) for x in zip(*parts)))


def vmap_equals_batched(fn, inputs: list[tuple]) -> set[int]:
    """Asserts that ``torch.vmap(fn)`` over the pairs (each call sees one pair) equals ``fn`` on all of them;
    ``inputs``: each pose's (geom 1, geom 2, margin), batched over one pair. Returns the contact counts met."""
    args = [_concatenated([x[k] for x in inputs]) for k in range(3)]
    batched = fn(*args)
    for a, b in zip(torch.vmap(fn)(*args), batched):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    return {int(torch.isfinite(d).sum()) for d in batched.dist}


def assert_contacts_match(mjm: mujoco.MjModel, poses, tol: float | dict = CCD_TOL) -> list[int]:
    """Contacts of each pose against MuJoCo's; returns MuJoCo's contact counts."""
    m = diffmj.put_model(mjm)
    counts = []
    for mjd, d in mujoco_states(mjm, m, poses):
        counts.append(mjd.ncon)
        compare_contacts(m, collision(m, d), mjd, tol=tol)
    return counts


def free_pair_model(assets: str, geom0: str, geom1: str) -> mujoco.MjModel:
    """Two free bodies with one geom each (MJCF ``<geom>`` elements), no gravity, MuJoCo's GJK / EPA at
    ccd_tolerance 1e-14, bounding filters off (the tests pose the bodies anywhere)."""
    xml = f"""<mujoco><option ccd_tolerance="1e-14" ccd_iterations="3000"><flag gravity="disable"/></option>
      <asset>{assets}</asset><worldbody><body><freejoint/>{geom0}</body>
      <body><freejoint/>{geom1}</body></worldbody></mujoco>"""
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjm.geom_rbound[:] = 100
    mjm.geom_aabb[:, 3:] = 100
    return mjm


def emitted_contacts(m: diffmj.Model, d: diffmj.Data):
    """qpos -> the emitted contacts' (dist, pos, frame), zero in empty slots (finite, for gradients)."""
    def fn(qpos):
        contact = collision(m, kinematics(m, d.replace(qpos=qpos))).contact
        finite = torch.isfinite(contact.dist)
        return torch.where(finite, contact.dist, 0), contact.pos * finite[..., None], \
            contact.frame * finite[..., None, None]
    return fn


def finite_gradients_when_lowered(mjm: mujoco.MjModel, poses, height: int, heights) -> set[int]:
    """For each qpos of ``poses``, with qpos[height] set to each of ``heights``: asserts that the emitted
    contacts' gradient with respect to qpos is finite; returns the contact counts met."""
    m = diffmj.put_model(mjm)
    mjd = mujoco.MjData(mjm)
    seen = set()
    for qpos in poses:
        for z in heights:
            qpos[height] = z
            mjd.qpos[:] = qpos
            mujoco.mj_kinematics(mjm, mjd)
            d = diffmj.put_data(m, mjd)
            x = d.qpos.clone().requires_grad_()
            out = emitted_contacts(m, d)(x)
            seen.add(int(torch.isfinite(collision(m, kinematics(m, d)).contact.dist).sum()))
            (grad,) = torch.autograd.grad(sum(y.sum() for y in out), x)
            assert torch.isfinite(grad).all(), f"qpos {qpos}"
    return seen
