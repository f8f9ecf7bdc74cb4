"""Model, Option and Data: MuJoCo's field names, PyTorch tensors.

Model splits in two:

* **structure**: sizes and MuJoCo's integer arrays (``jnt_type``,
  ``body_parentid``, ...) as Python ints and tuples, plus the index plans
  derived from them once in ``put_model`` (``m.tree``). Compared by value,
  so two loads of one XML give equal structure and one compiled graph.
* **parameters**: every float field as a tensor (``body_mass``,
  ``dof_damping``, ``opt.timestep``, ...). Any of them may require grad, be
  replaced with ``m.replace(...)`` or be batched under ``torch.vmap``.

Data is a tensorclass with MuJoCo's field names; matrices MuJoCo stores
flattened or sparse are dense here (``xmat`` [nbody, 3, 3], ``qM`` [nv, nv],
``ten_J`` [ntendon, nv], ``actuator_moment`` [nu, nv]).

MuJoCo's enums (``JointType``, ``GeomType``, ``SensorType``, ...) are
defined in ``diffmj.enums``, which imports nothing from diffmj so that the
index plans this module holds can use them too; they are re-exported here
and from ``diffmj``.
"""

from __future__ import annotations

import enum

import torch
from tensordict import tensorclass
from torch import Tensor

from diffmj.dataclass import PyTreeNode, pytree_dataclass, static_field
from diffmj.collision.plan import CollisionPlan
from diffmj.enums import (  # noqa: F401  re-exported: this module is where users read the types
    BiasType,
    ConeType,
    ConstraintState,
    ConstraintType,
    DataType,
    DisableBit,
    DynType,
    EnableBit,
    EqType,
    GainType,
    GeomType,
    IntegratorType,
    JointType,
    ObjType,
    SensorType,
    SolverType,
    Stage,
    State,
    TrnType,
    WrapType,
)
from diffmj.names import Names
from diffmj.plan import ActuatorPlan, ConstraintPlan, FluidPlan, SensorPlan, TendonPlan
from diffmj.tree import TreePlan
from diffmj.workarounds import fields_read_directly, record_from_entries


class BackwardMode(enum.Enum):
    """How gradients pass through the constraint solver.

    IMPLICIT: implicit-function-theorem adjoint at the optimum (one Hessian solve;
    cost independent of the solver's iterations). UNROLL: backpropagate through
    every solver iteration as executed.
    """

    IMPLICIT = "implicit"
    UNROLL = "unroll"


@pytree_dataclass
class Option(PyTreeNode):
    """Physics options (mjOption). Tensors are parameters; the rest is structure."""

    timestep: Tensor  # []
    gravity: Tensor  # [3]
    impratio: Tensor  # []
    tolerance: Tensor  # []
    ls_tolerance: Tensor  # []
    noslip_tolerance: Tensor  # [] the noslip sweeps stop once their scaled improvement is below it
    o_margin: Tensor  # []
    o_solref: Tensor  # [2]
    o_solimp: Tensor  # [5]
    o_friction: Tensor  # [5]
    magnetic: Tensor  # [3] global magnetic flux (magnetometer sensors)
    density: Tensor  # [] fluid density (fluid forces; put_model plans them when density or viscosity > 0)
    viscosity: Tensor  # [] fluid viscosity
    wind: Tensor  # [3] fluid velocity in the world frame
    integrator: IntegratorType = static_field()
    cone: ConeType = static_field()
    solver: SolverType = static_field()
    iterations: int = static_field()
    ls_iterations: int = static_field()
    noslip_iterations: int = static_field()  # 0: no noslip post-processing of the contact friction
    disableflags: int = static_field()
    enableflags: int = static_field()
    disableactuator: int = static_field()

    def disabled(self, flag: DisableBit) -> bool:
        return bool(self.disableflags & flag)

    def enabled(self, flag: EnableBit) -> bool:
        return bool(self.enableflags & flag)

    def replace(self, **changes) -> Option:
        """A copy with some fields replaced; refuses changes put_model has baked into the model."""
        new = super().replace(**changes)
        check_option_change(self, new)
        return new


# What put_model builds from the options (constraint rows, contact candidates, actuator
# plan) or refuses: replacing these on a loaded model would leave the plans describing
# the old value. Every other option is read when a step runs and takes effect when replaced.
_PLANNED_DISABLE_BITS = (
    DisableBit.CONSTRAINT | DisableBit.EQUALITY | DisableBit.FRICTIONLOSS | DisableBit.LIMIT
    | DisableBit.CONTACT | DisableBit.FILTERPARENT | DisableBit.NATIVECCD | DisableBit.MULTICCD
)
_RUNTIME_ENABLE_BITS = EnableBit.OVERRIDE
# what diffmj runs (put_model refuses the others too)
SUPPORTED_INTEGRATORS = (IntegratorType.EULER, IntegratorType.RK4, IntegratorType.IMPLICIT, IntegratorType.IMPLICITFAST)
SUPPORTED_SOLVERS = (SolverType.CG, SolverType.NEWTON)


def check_option_change(old: Option, new: Option) -> None:
    """ValueError naming the option if ``new`` changes what put_model baked in from ``old``."""
    again = "set it on the mujoco.MjModel and call diffmj.put_model again"
    if new.cone != old.cone:
        raise ValueError(f"opt.cone shapes the constraint rows put_model built: {again}")
    if new.disableactuator != old.disableactuator:
        raise ValueError(f"opt.disableactuator shapes the actuator plan put_model built: {again}")
    planned = (new.disableflags ^ old.disableflags) & _PLANNED_DISABLE_BITS
    if planned:
        names = ", ".join(f.name.lower() for f in DisableBit if f & planned)
        raise ValueError(f"opt.disableflags ({names}) shape the rows and contacts put_model built: {again}")
    other = (new.enableflags ^ old.enableflags) & ~_RUNTIME_ENABLE_BITS
    if other:
        names = ", ".join(f.name.lower() for f in EnableBit if f & other)
        raise ValueError(f"opt.enableflags ({names}): only 'override' can change on a loaded model; {again}")
    if new.integrator not in SUPPORTED_INTEGRATORS:
        raise ValueError(f"opt.integrator {new.integrator!r} is not supported by diffmj")
    if new.solver not in SUPPORTED_SOLVERS:
        raise ValueError(
            f"opt.solver {new.solver!r} is not supported by diffmj: use Newton or CG (put_model solves a model "
            "that asks for PGS with Newton)"
        )
    if new.iterations < 0 or new.ls_iterations < 0:
        raise ValueError("opt.iterations and opt.ls_iterations must not be negative")


@pytree_dataclass
class Model(PyTreeNode):
    """A MuJoCo model on a torch device. Build it with ``diffmj.put_model`` or ``diffmj.load``.

    Shapes are MuJoCo's (``body_pos`` [nbody, 3], ``actuator_gainprm``
    [nu, 10], ...). Integer arrays are tuples (structure); float arrays are
    tensors (parameters).
    """

    # ---- sizes
    nq: int = static_field()
    nv: int = static_field()
    nu: int = static_field()
    na: int = static_field()
    nbody: int = static_field()
    njnt: int = static_field()
    ngeom: int = static_field()
    nsite: int = static_field()
    nmocap: int = static_field()
    ntendon: int = static_field()
    nwrap: int = static_field()
    neq: int = static_field()
    npair: int = static_field()
    nsensor: int = static_field()
    nsensordata: int = static_field()
    nuserdata: int = static_field()

    # ---- options and derived index plans
    opt: Option
    backward_mode: BackwardMode = static_field()
    early_exit: bool = static_field()  # the solver stops once converged (put_model's early_exit)
    names: Names = static_field()  # object names by type, for lookups by name
    tree: TreePlan
    tendon_plan: TendonPlan
    actuator_plan: ActuatorPlan
    collision_plan: CollisionPlan
    constraint_plan: ConstraintPlan
    sensor_plan: SensorPlan
    fluid_plan: FluidPlan

    # ---- bodies
    body_parentid: tuple[int, ...] = static_field()
    body_rootid: tuple[int, ...] = static_field()
    body_weldid: tuple[int, ...] = static_field()
    body_mocapid: tuple[int, ...] = static_field()
    body_jntnum: tuple[int, ...] = static_field()
    body_jntadr: tuple[int, ...] = static_field()
    body_dofnum: tuple[int, ...] = static_field()
    body_dofadr: tuple[int, ...] = static_field()
    body_geomnum: tuple[int, ...] = static_field()
    body_geomadr: tuple[int, ...] = static_field()
    body_simple: tuple[int, ...] = static_field()  # 1: diagonal M; 2: also slide joints only (set_const)
    body_pos: Tensor  # [nbody, 3]
    body_quat: Tensor  # [nbody, 4]
    body_ipos: Tensor  # [nbody, 3]
    body_iquat: Tensor  # [nbody, 4]
    body_mass: Tensor  # [nbody]
    body_inertia: Tensor  # [nbody, 3]
    body_gravcomp: Tensor  # [nbody]
    body_invweight0: Tensor  # [nbody, 2]
    stat_meaninertia: Tensor  # [] mean diagonal inertia at qpos0 (mjStatistic.meaninertia)

    # ---- joints and dofs
    jnt_type: tuple[int, ...] = static_field()
    jnt_qposadr: tuple[int, ...] = static_field()
    jnt_dofadr: tuple[int, ...] = static_field()
    jnt_bodyid: tuple[int, ...] = static_field()
    jnt_limited: tuple[int, ...] = static_field()
    jnt_actfrclimited: tuple[int, ...] = static_field()
    jnt_actgravcomp: tuple[int, ...] = static_field()
    qpos0: Tensor  # [nq]
    qpos_spring: Tensor  # [nq]
    jnt_pos: Tensor  # [njnt, 3]
    jnt_axis: Tensor  # [njnt, 3]
    jnt_stiffness: Tensor  # [njnt]
    jnt_range: Tensor  # [njnt, 2]
    jnt_actfrcrange: Tensor  # [njnt, 2]
    jnt_margin: Tensor  # [njnt]
    jnt_solref: Tensor  # [njnt, 2]
    jnt_solimp: Tensor  # [njnt, 5]
    dof_bodyid: tuple[int, ...] = static_field()
    dof_jntid: tuple[int, ...] = static_field()
    dof_parentid: tuple[int, ...] = static_field()
    dof_armature: Tensor  # [nv]
    dof_damping: Tensor  # [nv]
    dof_frictionloss: Tensor  # [nv]
    dof_solref: Tensor  # [nv, 2]
    dof_solimp: Tensor  # [nv, 5]
    dof_invweight0: Tensor  # [nv]

    # ---- geoms and sites
    geom_type: tuple[int, ...] = static_field()
    geom_bodyid: tuple[int, ...] = static_field()
    geom_contype: tuple[int, ...] = static_field()
    geom_conaffinity: tuple[int, ...] = static_field()
    geom_condim: tuple[int, ...] = static_field()
    geom_priority: tuple[int, ...] = static_field()
    geom_pos: Tensor  # [ngeom, 3]
    geom_quat: Tensor  # [ngeom, 4]
    geom_size: Tensor  # [ngeom, 3]
    geom_friction: Tensor  # [ngeom, 3]
    geom_surfacevel: Tensor  # [ngeom, 6] linear, angular velocity of the surface in the geom's frame
    geom_solref: Tensor  # [ngeom, 2]
    geom_solimp: Tensor  # [ngeom, 5]
    geom_solmix: Tensor  # [ngeom]
    geom_margin: Tensor  # [ngeom]
    geom_gap: Tensor  # [ngeom]
    geom_rbound: Tensor  # [ngeom]
    geom_fluid: Tensor  # [ngeom, 12] ellipsoid fluid model: interaction, blunt / slender / angular drag,
    #   Kutta and Magnus lift coefficients, virtual mass [3], virtual inertia [3] (MuJoCo's layout)
    site_bodyid: tuple[int, ...] = static_field()
    site_type: tuple[int, ...] = static_field()
    site_pos: Tensor  # [nsite, 3]
    site_quat: Tensor  # [nsite, 4]
    site_size: Tensor  # [nsite, 3]

    # ---- tendons (fixed and spatial)
    tendon_adr: tuple[int, ...] = static_field()
    tendon_num: tuple[int, ...] = static_field()
    tendon_limited: tuple[int, ...] = static_field()
    tendon_actfrclimited: tuple[int, ...] = static_field()
    wrap_type: tuple[int, ...] = static_field()
    wrap_objid: tuple[int, ...] = static_field()
    wrap_prm: Tensor  # [nwrap] joint coefficients, pulley divisors, side-site ids of wrapping geoms
    tendon_stiffness: Tensor  # [ntendon]
    tendon_damping: Tensor  # [ntendon]
    tendon_armature: Tensor  # [ntendon]
    tendon_frictionloss: Tensor  # [ntendon]
    tendon_lengthspring: Tensor  # [ntendon, 2]
    tendon_range: Tensor  # [ntendon, 2]
    tendon_margin: Tensor  # [ntendon]
    tendon_solref_lim: Tensor  # [ntendon, 2]
    tendon_solimp_lim: Tensor  # [ntendon, 5]
    tendon_solref_fri: Tensor  # [ntendon, 2]
    tendon_solimp_fri: Tensor  # [ntendon, 5]
    tendon_invweight0: Tensor  # [ntendon]
    tendon_actfrcrange: Tensor  # [ntendon, 2]
    tendon_length0: Tensor  # [ntendon]

    # ---- equality constraints
    eq_type: tuple[int, ...] = static_field()
    eq_obj1id: tuple[int, ...] = static_field()
    eq_obj2id: tuple[int, ...] = static_field()
    eq_objtype: tuple[int, ...] = static_field()
    eq_active0: tuple[int, ...] = static_field()
    eq_data: Tensor  # [neq, 12]
    eq_solref: Tensor  # [neq, 2]
    eq_solimp: Tensor  # [neq, 5]

    # ---- explicit contact pairs
    pair_dim: tuple[int, ...] = static_field()
    pair_geom1: tuple[int, ...] = static_field()
    pair_geom2: tuple[int, ...] = static_field()
    pair_friction: Tensor  # [npair, 5]
    pair_solref: Tensor  # [npair, 2]
    pair_solreffriction: Tensor  # [npair, 2]
    pair_solimp: Tensor  # [npair, 5]
    pair_margin: Tensor  # [npair]
    pair_gap: Tensor  # [npair]

    # ---- actuators
    actuator_trntype: tuple[int, ...] = static_field()
    actuator_dyntype: tuple[int, ...] = static_field()
    actuator_gaintype: tuple[int, ...] = static_field()
    actuator_biastype: tuple[int, ...] = static_field()
    actuator_trnid: tuple[tuple[int, int], ...] = static_field()
    actuator_actadr: tuple[int, ...] = static_field()
    actuator_actnum: tuple[int, ...] = static_field()
    actuator_group: tuple[int, ...] = static_field()
    actuator_ctrllimited: tuple[int, ...] = static_field()
    actuator_forcelimited: tuple[int, ...] = static_field()
    actuator_actlimited: tuple[int, ...] = static_field()
    actuator_actearly: tuple[int, ...] = static_field()
    actuator_gear: Tensor  # [nu, 6]
    actuator_cranklength: Tensor  # [nu] rod length of slider-crank transmissions
    actuator_gainprm: Tensor  # [nu, 10]
    actuator_biasprm: Tensor  # [nu, 10]
    actuator_dynprm: Tensor  # [nu, 10]
    actuator_ctrlrange: Tensor  # [nu, 2]
    actuator_forcerange: Tensor  # [nu, 2]
    actuator_actrange: Tensor  # [nu, 2]
    actuator_acc0: Tensor  # [nu] norm of M^-1 moment' at qpos0 (mj_setConst): scales muscles with force < 0
    actuator_lengthrange: Tensor  # [nu, 2] the compiler's feasible length range: muscles' normalised length

    # ---- sensors (m.sensor_plan groups them by type)
    sensor_type: tuple[int, ...] = static_field()
    sensor_datatype: tuple[int, ...] = static_field()
    sensor_needstage: tuple[int, ...] = static_field()
    sensor_objtype: tuple[int, ...] = static_field()
    sensor_objid: tuple[int, ...] = static_field()
    sensor_reftype: tuple[int, ...] = static_field()
    sensor_refid: tuple[int, ...] = static_field()
    sensor_dim: tuple[int, ...] = static_field()
    sensor_adr: tuple[int, ...] = static_field()
    sensor_cutoff: Tensor  # [nsensor] clamp of the output; 0 for none

    def replace(self, **changes) -> Model:
        """A copy with some fields replaced (parameters, or ``opt`` within what check_option_change allows).

        A raw replace: constants MuJoCo derives from parameters (``body_invweight0``, ...) keep their
        values; call ``diffmj.set_const`` after replacing masses, inertias, armature or geometry by
        hand, as after changing an mjModel in C (mj_setConst), or use ``diffmj.set_param``.
        """
        if "opt" in changes:
            check_option_change(self.opt, changes["opt"])
        return super().replace(**changes)

    @property
    def dtype(self) -> torch.dtype:
        return self.body_mass.dtype

    @property
    def device(self) -> torch.device:
        return self.body_mass.device

    @property
    def structure(self) -> tuple:
        """Hashable structure of the model; equal for two loads of the same XML."""
        return self.static()


@fields_read_directly
@tensorclass
class Contact:
    """Fixed array of contact slots (mjContact), one per possible contact of each candidate pair.

    A slot holds a contact when ``dist`` is finite (below margin + gap) and adds
    constraint rows when ``active`` (below margin). Geom ids and condim of each
    slot are structure: ``m.collision_plan.contact_geom`` / ``contact_dim``.
    """

    dist: Tensor  # [ncon] +inf for an empty slot
    pos: Tensor  # [ncon, 3]
    frame: Tensor  # [ncon, 3, 3] rows: normal (geom1 -> geom2), tangent1, tangent2
    includemargin: Tensor  # [ncon]
    friction: Tensor  # [ncon, 5]
    solref: Tensor  # [ncon, 2]
    solreffriction: Tensor  # [ncon, 2]
    solimp: Tensor  # [ncon, 5]
    active: Tensor  # [ncon] bool

    def replace(self, **changes) -> Contact:
        """A new Contact with the named fields replaced, the others shared (as ``Data.replace``)."""
        return _replaced(self, changes)


@fields_read_directly
@tensorclass
class Data:
    """Simulation state, inputs and every computed quantity (mjData), batchable.

    Unbatched shapes are listed; a batch of B states has a leading [B] on
    every field (``d.batch_size``), ``d[i]`` selects one, ``torch.stack``
    joins several.
    """

    # ---- state and inputs
    time: Tensor  # []
    qpos: Tensor  # [nq]
    qvel: Tensor  # [nv]
    act: Tensor  # [na]
    qacc_warmstart: Tensor  # [nv]
    ctrl: Tensor  # [nu]
    qfrc_applied: Tensor  # [nv]
    xfrc_applied: Tensor  # [nbody, 6]
    mocap_pos: Tensor  # [nmocap, 3]
    mocap_quat: Tensor  # [nmocap, 4]
    # ---- dynamics outputs
    qacc: Tensor  # [nv]
    act_dot: Tensor  # [na]
    # ---- position dependent
    xpos: Tensor  # [nbody, 3]
    xquat: Tensor  # [nbody, 4]
    xmat: Tensor  # [nbody, 3, 3]
    xipos: Tensor  # [nbody, 3]
    ximat: Tensor  # [nbody, 3, 3]
    xanchor: Tensor  # [njnt, 3]
    xaxis: Tensor  # [njnt, 3]
    geom_xpos: Tensor  # [ngeom, 3]
    geom_xmat: Tensor  # [ngeom, 3, 3]
    site_xpos: Tensor  # [nsite, 3]
    site_xmat: Tensor  # [nsite, 3, 3]
    subtree_com: Tensor  # [nbody, 3]
    cdof: Tensor  # [nv, 6]
    cinert: Tensor  # [nbody, 10]
    crb: Tensor  # [nbody, 10]
    ten_length: Tensor  # [ntendon]
    ten_J: Tensor  # [ntendon, nv]
    actuator_length: Tensor  # [nu]
    actuator_moment: Tensor  # [nu, nv]
    qM: Tensor  # [nv, nv] dense, symmetric
    qLD: Tensor  # [nv, nv] lower Cholesky factor L of qM = L L' (dense, not MuJoCo's layout)
    # ---- velocity dependent
    ten_velocity: Tensor  # [ntendon]
    actuator_velocity: Tensor  # [nu]
    cvel: Tensor  # [nbody, 6]
    cdof_dot: Tensor  # [nv, 6]
    qfrc_bias: Tensor  # [nv]
    qfrc_spring: Tensor  # [nv]
    qfrc_damper: Tensor  # [nv]
    qfrc_gravcomp: Tensor  # [nv]
    qfrc_fluid: Tensor  # [nv]
    qfrc_passive: Tensor  # [nv]
    # ---- acceleration dependent
    actuator_force: Tensor  # [nu]
    qfrc_actuator: Tensor  # [nv]
    qfrc_smooth: Tensor  # [nv]
    qacc_smooth: Tensor  # [nv]
    qfrc_constraint: Tensor  # [nv]
    # ---- constraints: fixed rows, ``efc_active`` marks those MuJoCo would instantiate
    eq_active: Tensor  # [neq] bool
    contact: Contact
    efc_active: Tensor  # [nefc] bool
    efc_J: Tensor  # [nefc, nv]
    efc_pos: Tensor  # [nefc]
    efc_margin: Tensor  # [nefc]
    efc_frictionloss: Tensor  # [nefc]
    efc_diagA: Tensor  # [nefc]
    efc_D: Tensor  # [nefc]
    efc_R: Tensor  # [nefc]
    efc_KBIP: Tensor  # [nefc, 4] stiffness, damping, impedance, impedance derivative
    efc_vel: Tensor  # [nefc]
    efc_aref: Tensor  # [nefc]
    efc_force: Tensor  # [nefc]
    efc_state: Tensor  # [nefc] int (mjtConstraintState)
    # ---- sensors and mj_rnePostConstraint (filled only when an acceleration sensor needs them)
    sensordata: Tensor  # [nsensordata]
    cacc: Tensor  # [nbody, 6] com-based acceleration
    cfrc_int: Tensor  # [nbody, 6] com-based interaction force with the parent body
    cfrc_ext: Tensor  # [nbody, 6] com-based external force on the body

    def replace(self, **changes) -> Data:
        """A new Data with the named fields replaced and the others shared (not copied); each value
        must have this Data's batch dims in front (``ValueError`` otherwise)."""
        return _replaced(self, changes)

    def to(self, *args, **kwargs) -> Data:
        """This Data on another device and/or float dtype (``d.to(torch.float32)``,
        ``d.to("cuda")``, ``d.to(device=..., dtype=...)``); boolean and integer fields keep
        their dtype (tensordict's own ``to`` would cast them too)."""
        dtype = kwargs.pop("dtype", None)
        moves = []
        for arg in args:
            if isinstance(arg, torch.dtype):
                dtype = arg
            else:
                moves.append(arg)
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"Data.to casts the floating-point fields only; {dtype} is not a float dtype")

        def move(x: Tensor) -> Tensor:
            x = x.to(*moves, **kwargs)
            return x.to(dtype) if dtype is not None and x.is_floating_point() else x

        return self.apply(move)


def _replaced(record: Data | Contact, changes: dict[str, Tensor | Contact]) -> Data | Contact:
    """record (a Data or Contact) with the named fields replaced and the others shared.

    A step replaces fields a dozen times or more; tensordict's generic ``replace`` copies and
    validates every entry each time (~0.3 ms eager for a Data, ~10k bytecodes for Dynamo to
    trace), so the new record is built from the old one's entries directly
    (``workarounds.record_from_entries``; ``tests/test_io.py`` compares the result with tensordict's own
    replace).
    """
    cls, storage = type(record), record._tensordict
    batch = tuple(storage.batch_size)
    for name, value in changes.items():
        if name not in cls.__dataclass_fields__:
            raise ValueError(f"{cls.__name__} has no field {name!r}")
        if tuple(value.shape[: len(batch)]) != batch:
            raise ValueError(f"{cls.__name__}.replace: {name} has shape {tuple(value.shape)}, "
                             f"its leading dims must be the batch {batch}")
    return record_from_entries(cls, {**storage._tensordict, **changes}, storage._batch_size, storage._device,
                               storage._td_dim_names)


# ---- the role of each Data field; make_data / put_data / get_data and checkpointed rollouts read these,
# and a test checks that every field has exactly one
STATE_FIELDS = ("time", "qpos", "qvel", "act", "qacc_warmstart")  # what a step advances
INPUT_FIELDS = ("ctrl", "qfrc_applied", "xfrc_applied", "mocap_pos", "mocap_quat", "eq_active")  # held by a step
COMPUTED_FIELDS = (  # recomputed from state and inputs by forward()
    "qacc", "act_dot", "xpos", "xquat", "xmat", "xipos", "ximat", "xanchor", "xaxis", "geom_xpos", "geom_xmat",
    "site_xpos", "site_xmat", "subtree_com", "cdof", "cinert", "crb", "ten_length", "ten_J", "actuator_length",
    "actuator_moment", "qM", "qLD", "ten_velocity", "actuator_velocity", "cvel", "cdof_dot", "qfrc_bias",
    "qfrc_spring", "qfrc_damper", "qfrc_gravcomp", "qfrc_fluid", "qfrc_passive", "actuator_force", "qfrc_actuator",
    "qfrc_smooth", "qacc_smooth", "qfrc_constraint", "contact", "efc_active", "efc_J", "efc_pos", "efc_margin",
    "efc_frictionloss", "efc_diagA", "efc_D", "efc_R", "efc_KBIP", "efc_vel", "efc_aref", "efc_force",
    "efc_state", "sensordata", "cacc", "cfrc_int", "cfrc_ext",
)
