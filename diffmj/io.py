"""Conversion between MuJoCo's C structures and diffmj's Model / Data.

``put_model`` is the single gate for model features: anything diffmj does
not implement raises ``NotImplementedError`` naming the feature and the
element, so no model runs with silently different physics.
"""

from __future__ import annotations

import os
import warnings

import mujoco
import numpy as np
import torch

from diffmj import math
from diffmj.collision.plan import build_collision_plan, convex_pair, unsupported_pair
from diffmj.names import build_names
from diffmj.plan import (
    RAY_GEOMS,
    SUPPORTED_SENSORS,
    build_actuator_plan,
    build_constraint_plan,
    build_fluid_plan,
    build_sensor_plan,
    build_tendon_plan,
    ray_geoms,
)
from diffmj.tree import build_tree_plan
from diffmj.types import (
    COMPUTED_FIELDS,
    INPUT_FIELDS,
    STATE_FIELDS,
    SUPPORTED_INTEGRATORS,
    SUPPORTED_SOLVERS,
    BackwardMode,
    BiasType,
    ConeType,
    Contact,
    Data,
    DisableBit,
    DynType,
    EnableBit,
    EqType,
    GainType,
    GeomType,
    IntegratorType,
    Model,
    ObjType,
    Option,
    SensorType,
    SolverType,
    TrnType,
    WrapType,
)

_SUPPORTED_TRN = (TrnType.JOINT, TrnType.JOINTINPARENT, TrnType.TENDON, TrnType.SITE, TrnType.SLIDERCRANK,
                  TrnType.BODY)
_SUPPORTED_DYN = (DynType.NONE, DynType.INTEGRATOR, DynType.FILTER, DynType.FILTEREXACT, DynType.MUSCLE,
                  DynType.DCMOTOR)
_SUPPORTED_GAIN = (GainType.FIXED, GainType.AFFINE, GainType.MUSCLE, GainType.DCMOTOR)
_SUPPORTED_BIAS = (BiasType.NONE, BiasType.AFFINE, BiasType.MUSCLE, BiasType.DCMOTOR)
_VOLTAGE_INPUT = 8  # mjINPUT_VOLTAGE (mjtInput in mjtype.h; the Python bindings do not expose it)
_SUPPORTED_EQ = (EqType.CONNECT, EqType.WELD, EqType.JOINT, EqType.TENDON)


def _name(mjm: mujoco.MjModel, obj: ObjType, i: int) -> str:
    name = mujoco.mj_id2name(mjm, obj, i)
    return f"'{name}'" if name else f"#{i}"


def _refuse(what: str) -> None:
    raise NotImplementedError(f"{what} is not supported by diffmj")


def check_supported(mjm: mujoco.MjModel) -> None:
    """Raise NotImplementedError naming the first unsupported feature of ``mjm``."""
    opt = mjm.opt
    if opt.integrator not in SUPPORTED_INTEGRATORS:
        _refuse(f"option integrator '{IntegratorType(opt.integrator).name.lower()}'")
    if opt.enableflags & EnableBit.SLEEP:
        _refuse("option flag 'sleep'")
    for count, feature in (
        (mjm.nflex, "flex"),
        (mjm.nplugin, "plugin"),
        (mjm.nplastic, "plasticity (springyield)"),
        (mjm.nhistory, "actuator / sensor history buffers"),
        (mjm.flg_adhesion, "contact adhesion (geom / pair adhesion)"),
    ):
        if count:
            _refuse(feature)
    _check_sensors(mjm)
    for flag, name in ((EnableBit.DIAGEXACT, "diagexact"), (EnableBit.SPECULATIVE, "speculative")):
        if opt.enableflags & flag:
            _refuse(f"option flag '{name}'")

    for j in range(mjm.njnt):
        if np.any(mjm.jnt_stiffnesspoly[j]):
            _refuse(f"joint {_name(mjm, ObjType.JOINT, j)}: polynomial stiffness")
        if mjm.jnt_actuatorid[j] >= 0:
            _refuse(f"joint {_name(mjm, ObjType.JOINT, j)}: actuator damping / armature")
    for i in range(mjm.nv):
        if np.any(mjm.dof_dampingpoly[i]):
            _refuse(f"joint {_name(mjm, ObjType.JOINT, mjm.dof_jntid[i])}: polynomial damping")

    for e in range(mjm.neq):
        ename = f"equality {_name(mjm, ObjType.EQUALITY, e)}"
        if mjm.eq_type[e] not in _SUPPORTED_EQ:
            _refuse(f"{ename}: type '{EqType(mjm.eq_type[e]).name.lower()}'")
        if mjm.eq_type[e] in (EqType.CONNECT, EqType.WELD) and mjm.eq_objtype[e] != ObjType.BODY:
            _refuse(f"{ename}: site semantics")
    pair = unsupported_pair(mjm)
    if pair:
        _refuse(pair)
    # diffmj's general convex pairs are MuJoCo's native CCD with multi-CCD (the defaults)
    pair = convex_pair(mjm)
    if pair and opt.disableflags & DisableBit.NATIVECCD:
        _refuse(f"option flag 'nativeccd' disabled (libccd) for {pair}")
    pair = convex_pair(mjm, multi=True)
    if pair and opt.disableflags & DisableBit.MULTICCD:
        _refuse(f"option flag 'multiccd' disabled for {pair}")

    for t in range(mjm.ntendon):
        tname = _name(mjm, ObjType.TENDON, t)
        adr = mjm.tendon_adr[t]
        if mjm.wrap_type[adr] != WrapType.JOINT and mjm.tendon_armature[t] != 0:
            # its bias force needs the time derivative of ten_J (mj_tendonBias)
            _refuse(f"tendon {tname}: armature on a spatial tendon")
        if np.any(mjm.tendon_stiffnesspoly[t]) or np.any(mjm.tendon_dampingpoly[t]):
            _refuse(f"tendon {tname}: polynomial stiffness / damping")
        if mjm.tendon_actuatorid[t] >= 0:
            _refuse(f"tendon {tname}: actuator damping / armature")

    for i in range(mjm.nu):
        aname = f"actuator {_name(mjm, ObjType.ACTUATOR, i)}"
        trn = mjm.actuator_trntype[i]
        if trn not in _SUPPORTED_TRN:
            _refuse(f"{aname}: transmission '{TrnType(trn).name.lower()}'")
        _check_dcmotor(mjm, i, aname)
        if mjm.actuator_dyntype[i] not in _SUPPORTED_DYN:
            _refuse(f"{aname}: dynamics '{DynType(mjm.actuator_dyntype[i]).name.lower()}'")
        if mjm.actuator_gaintype[i] not in _SUPPORTED_GAIN:
            _refuse(f"{aname}: gain '{GainType(mjm.actuator_gaintype[i]).name.lower()}'")
        if mjm.actuator_biastype[i] not in _SUPPORTED_BIAS:
            _refuse(f"{aname}: bias '{BiasType(mjm.actuator_biastype[i]).name.lower()}'")
        if mjm.actuator_delay[i] > 0:
            _refuse(f"{aname}: delay")
        if mjm.actuator_ctrlnum[i] != 1 or mjm.actuator_outnum[i] != 1:
            _refuse(f"{aname}: multi-input / multi-output actuators")
        if mjm.actuator_actnum[i] > 1:
            _refuse(f"{aname}: more than one activation state")
        if mjm.actuator_plugin[i] >= 0:
            _refuse(f"{aname}: actuator plugin")


def _check_dcmotor(mjm: mujoco.MjModel, i: int, aname: str) -> None:
    """Refuse DC motors other than those driven by voltage, with or without a current state and cogging."""
    dcmotor = (mjm.actuator_dyntype[i] == DynType.DCMOTOR, mjm.actuator_gaintype[i] == GainType.DCMOTOR,
               mjm.actuator_biastype[i] == BiasType.DCMOTOR)
    if not any(dcmotor):
        return
    if not all(dcmotor):
        _refuse(f"{aname}: DC motor dynamics, gain or bias mixed with other types")
    dynprm, gainprm = mjm.actuator_dynprm[i], mjm.actuator_gainprm[i]
    if mjm.actuator_ctrlspec[i] != _VOLTAGE_INPUT or mjm.actuator_ctrlnum[i] != 1:
        _refuse(f"{aname}: DC motor inputs other than one voltage (controller setpoints, passive)")
    for value, feature in ((dynprm[7], "slew-rate limit"), (gainprm[5], "integral gain"),
                           (dynprm[2], "thermal model"), (dynprm[5], "LuGre friction")):
        if value > 0:
            _refuse(f"{aname}: DC motor {feature}")


def _check_sensors(mjm: mujoco.MjModel) -> None:
    """Refuse sensor types diffmj does not compute, camera frames and delayed / sampled outputs."""
    for i in range(mjm.nsensor):
        sname = f"sensor {_name(mjm, ObjType.SENSOR, i)}"
        typ = int(mjm.sensor_type[i])
        if typ not in SUPPORTED_SENSORS:
            _refuse(f"{sname}: type '{SensorType(typ).name.lower()}'")
        if ObjType.CAMERA in (mjm.sensor_objtype[i], mjm.sensor_reftype[i]):
            _refuse(f"{sname}: camera frames")
        if mjm.sensor_history[i, 0] > 0 or mjm.sensor_delay[i] > 0 or mjm.sensor_interval[i, 0] > 0:
            _refuse(f"{sname}: delay / history / interval")
        if typ == SensorType.RANGEFINDER:
            for g in ray_geoms(mjm):
                if mjm.geom_type[g] not in RAY_GEOMS:
                    gname = _name(mjm, ObjType.GEOM, g)
                    _refuse(f"{sname}: rangefinder ray against {GeomType(mjm.geom_type[g]).name.lower()} geom {gname}")


def _solver(solver: SolverType) -> SolverType:
    """The model's solver; PGS models are solved by Newton, with a warning (the same optimum)."""
    if solver in SUPPORTED_SOLVERS:
        return solver
    warnings.warn(
        f"the model asks for the {solver.name} solver, which diffmj does not implement: it is solved by "
        "Newton instead. MuJoCo's solvers minimise the same convex problem, whose optimum is unique: "
        "qacc and efc_force agree with a PGS solve to within about the square root of its tolerance.",
        stacklevel=3,
    )
    return SolverType.NEWTON


def _tuple(x) -> tuple[int, ...]:
    return tuple(int(v) for v in np.asarray(x).reshape(-1))


def put_model(
    mjm: mujoco.MjModel,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float64,
    backward_mode: BackwardMode = BackwardMode.IMPLICIT,
    early_exit: bool = True,
) -> Model:
    """Convert a ``mujoco.MjModel`` to a diffmj Model on ``device`` with float ``dtype``.

    ``backward_mode`` chooses how gradients pass through the constraint solver. ``early_exit``:
    the solver stops iterating once converged (every batch element, in eager mode), as MuJoCo C
    does; False runs ``opt.iterations`` (and ``opt.ls_iterations``) always, eager with no host
    synchronisation inside a step (for CUDA-graph capture; compiled, torch 2.13's inductor reads
    each ``scan`` iteration's counter on the host: see README.md). Results are the same either way.
    """
    if not isinstance(mjm, mujoco.MjModel):
        raise TypeError(f"put_model expects a mujoco.MjModel, got {type(mjm).__name__}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
    check_supported(mjm)
    device = torch.device(device) if device is not None else torch.device("cpu")

    def t(x) -> torch.Tensor:
        return torch.as_tensor(np.array(x, dtype=np.float64), device=device).to(dtype)

    o = mjm.opt
    opt = Option(
        timestep=t(o.timestep),
        gravity=t(o.gravity),
        impratio=t(o.impratio),
        tolerance=t(o.tolerance),
        ls_tolerance=t(o.ls_tolerance),
        noslip_tolerance=t(o.noslip_tolerance),
        o_margin=t(o.o_margin),
        o_solref=t(o.o_solref),
        o_solimp=t(o.o_solimp),
        o_friction=t(o.o_friction),
        magnetic=t(o.magnetic),
        density=t(o.density),
        viscosity=t(o.viscosity),
        wind=t(o.wind),
        integrator=IntegratorType(o.integrator),
        cone=ConeType(o.cone),
        solver=_solver(SolverType(o.solver)),
        iterations=int(o.iterations),
        ls_iterations=int(o.ls_iterations),
        noslip_iterations=int(o.noslip_iterations),
        disableflags=int(o.disableflags),
        enableflags=int(o.enableflags),
        disableactuator=int(o.disableactuator),
    )

    fields = {"backward_mode": BackwardMode(backward_mode), "early_exit": bool(early_exit), "names": build_names(mjm)}
    for f in Model._static_names:
        if f in ("backward_mode", "early_exit", "names"):
            continue
        fields[f] = _tuple(getattr(mjm, f)) if not f.startswith("n") or "_" in f else int(getattr(mjm, f))
    fields["actuator_trnid"] = tuple((int(a), int(b)) for a, b in mjm.actuator_trnid)
    for f in Model._data_names:
        if f in ("stat_meaninertia",):
            fields[f] = t(mjm.stat.meaninertia)
        elif f not in ("opt", "tree", "tendon_plan", "actuator_plan", "collision_plan", "constraint_plan",
                       "sensor_plan", "fluid_plan"):
            fields[f] = t(getattr(mjm, f))
    # MuJoCo stores these per-element scalars as [n, 1]
    for f in ("body_mass", "body_gravcomp", "jnt_stiffness", "jnt_margin", "geom_solmix",
              "geom_margin", "geom_gap", "geom_rbound", "wrap_prm", "tendon_stiffness",
              "tendon_damping", "tendon_armature", "tendon_frictionloss", "tendon_margin",
              "tendon_invweight0", "dof_armature", "dof_damping", "dof_frictionloss",
              "dof_invweight0", "tendon_length0", "pair_margin", "pair_gap"):
        fields[f] = fields[f].reshape(-1)
    collision_plan = build_collision_plan(mjm, dtype, device)
    constraint_plan = build_constraint_plan(mjm, collision_plan, dtype, device)
    contact_geom = collision_plan.contact_geom.cpu().numpy()
    return Model(
        opt=opt,
        tree=build_tree_plan(mjm, dtype, device),
        tendon_plan=build_tendon_plan(mjm, dtype, device),
        actuator_plan=build_actuator_plan(mjm, contact_geom, dtype, device),
        collision_plan=collision_plan,
        constraint_plan=constraint_plan,
        sensor_plan=build_sensor_plan(mjm, constraint_plan, contact_geom, dtype, device),
        fluid_plan=build_fluid_plan(mjm, dtype, device),
        **fields,
    )


def load(path_or_xml: str | os.PathLike, **kwargs) -> Model:
    """Load an MJCF file (path) or XML string and convert it with ``put_model``."""
    text = os.fspath(path_or_xml)
    if text.lstrip().startswith("<"):
        mjm = mujoco.MjModel.from_xml_string(text)
    else:
        mjm = mujoco.MjModel.from_xml_path(text)
    return put_model(mjm, **kwargs)


def _zeros_data(m: Model, batch_shape: tuple[int, ...]) -> dict:
    nb, nv, nu, na, nq = m.nbody, m.nv, m.nu, m.na, m.nq
    nefc = m.constraint_plan.nefc
    shapes = {
        "time": (),
        "qpos": (nq,),
        "qvel": (nv,),
        "act": (na,),
        "qacc_warmstart": (nv,),
        "ctrl": (nu,),
        "qfrc_applied": (nv,),
        "xfrc_applied": (nb, 6),
        "mocap_pos": (m.nmocap, 3),
        "mocap_quat": (m.nmocap, 4),
        "qacc": (nv,),
        "act_dot": (na,),
        "xpos": (nb, 3),
        "xquat": (nb, 4),
        "xmat": (nb, 3, 3),
        "xipos": (nb, 3),
        "ximat": (nb, 3, 3),
        "xanchor": (m.njnt, 3),
        "xaxis": (m.njnt, 3),
        "geom_xpos": (m.ngeom, 3),
        "geom_xmat": (m.ngeom, 3, 3),
        "site_xpos": (m.nsite, 3),
        "site_xmat": (m.nsite, 3, 3),
        "subtree_com": (nb, 3),
        "cdof": (nv, 6),
        "cinert": (nb, 10),
        "crb": (nb, 10),
        "ten_length": (m.ntendon,),
        "ten_J": (m.ntendon, nv),
        "actuator_length": (nu,),
        "actuator_moment": (nu, nv),
        "qM": (nv, nv),
        "qLD": (nv, nv),
        "ten_velocity": (m.ntendon,),
        "actuator_velocity": (nu,),
        "cvel": (nb, 6),
        "cdof_dot": (nv, 6),
        "qfrc_bias": (nv,),
        "qfrc_spring": (nv,),
        "qfrc_damper": (nv,),
        "qfrc_gravcomp": (nv,),
        "qfrc_fluid": (nv,),
        "qfrc_passive": (nv,),
        "actuator_force": (nu,),
        "qfrc_actuator": (nv,),
        "qfrc_smooth": (nv,),
        "qacc_smooth": (nv,),
        "qfrc_constraint": (nv,),
        "efc_J": (nefc, nv),
        "efc_pos": (nefc,),
        "efc_margin": (nefc,),
        "efc_frictionloss": (nefc,),
        "efc_diagA": (nefc,),
        "efc_D": (nefc,),
        "efc_R": (nefc,),
        "efc_KBIP": (nefc, 4),
        "efc_vel": (nefc,),
        "efc_aref": (nefc,),
        "efc_force": (nefc,),
        "sensordata": (m.nsensordata,),
        "cacc": (nb, 6),
        "cfrc_int": (nb, 6),
        "cfrc_ext": (nb, 6),
    }
    fields = {k: torch.zeros((*batch_shape, *s), dtype=m.dtype, device=m.device) for k, s in shapes.items()}
    fields["efc_state"] = torch.zeros((*batch_shape, nefc), dtype=torch.long, device=m.device)
    fields["efc_active"] = torch.zeros((*batch_shape, nefc), dtype=torch.bool, device=m.device)
    fields["eq_active"] = _per_example(torch.tensor(m.eq_active0, dtype=torch.bool, device=m.device), batch_shape)
    fields["contact"] = _empty_contacts(m, batch_shape)
    return fields


def _empty_contacts(m: Model, batch_shape: tuple[int, ...]) -> Contact:
    """Contact slots with no contact in them (dist = +inf, inactive)."""
    n = m.collision_plan.ncon

    def zeros(*shape):
        return torch.zeros((*batch_shape, n, *shape), dtype=m.dtype, device=m.device)

    return Contact(
        dist=torch.full((*batch_shape, n), torch.inf, dtype=m.dtype, device=m.device),
        pos=zeros(3),
        frame=zeros(3, 3),
        includemargin=zeros(),
        friction=zeros(5),
        solref=zeros(2),
        solreffriction=zeros(2),
        solimp=zeros(5),
        active=torch.zeros((*batch_shape, n), dtype=torch.bool, device=m.device),
        batch_size=batch_shape,
    )


def _per_example(value: torch.Tensor, batch_shape: tuple[int, ...]) -> torch.Tensor:
    """value copied for every example, [*batch_shape, *value.shape], freshly laid out.

    Contiguous strides even when empty, as a step's outputs have (a compiled step guards on them).
    """
    return value.expand(*batch_shape, *value.shape).clone(memory_format=torch.contiguous_format)


def make_data(m: Model, batch_shape: tuple[int, ...] | int = ()) -> Data:
    """Data at the model's default state (qpos0, zero velocity), like ``mujoco.MjData``."""
    if isinstance(batch_shape, int):
        batch_shape = (batch_shape,)
    batch_shape = tuple(batch_shape)
    fields = _zeros_data(m, batch_shape)
    fields["qpos"] = _per_example(m.qpos0, batch_shape)
    mocap_bodies = [b for b in range(m.nbody) if m.body_mocapid[b] >= 0]
    mocap_bodies.sort(key=lambda b: m.body_mocapid[b])
    if mocap_bodies:
        fields["mocap_pos"] = _per_example(m.body_pos[mocap_bodies], batch_shape)
        fields["mocap_quat"] = _per_example(m.body_quat[mocap_bodies], batch_shape)
    return Data(**fields, batch_size=batch_shape)


def _dense(values, rownnz, rowadr, colind, ncol) -> np.ndarray:
    out = np.zeros((len(rownnz), ncol))
    if len(rownnz) and ncol:
        mujoco.mju_sparse2dense(out, np.asarray(values, dtype=np.float64), rownnz, rowadr, colind)
    return out


def put_data(m: Model, mjd: mujoco.MjData) -> Data:
    """Convert a ``mujoco.MjData`` (state, inputs and computed fields) to Data."""
    if mjd.qpos.shape[0] != m.nq or mjd.qvel.shape[0] != m.nv or mjd.ctrl.shape[0] != m.nu:
        raise ValueError("mujoco.MjData does not match the model's sizes (nq, nv, nu)")
    mjm = mjd.model
    fields = _zeros_data(m, ())
    for name in _MJDATA_FIELDS:
        zero = fields[name]
        value = np.asarray(getattr(mjd, name), dtype=np.float64)
        fields[name] = torch.as_tensor(value.reshape(zero.shape).copy(), device=m.device).to(zero.dtype)
    qm = np.zeros((m.nv, m.nv))
    if m.nv:
        mujoco.mj_fullM(mjm, mjd, qm)
    fields["qM"] = torch.as_tensor(qm, device=m.device).to(m.dtype)
    # qLD is diffmj's dense Cholesky factor; derive it when MuJoCo has computed M (no error where M is not
    # positive definite, as MuJoCo's is after its simulation blew up: the state is still copied)
    fields["qLD"] = math.cholesky(fields["qM"]).contiguous() if np.any(qm) else torch.zeros_like(fields["qM"])
    ten_j = _dense(mjd.ten_J, mjm.ten_J_rownnz, mjm.ten_J_rowadr, mjm.ten_J_colind, m.nv)
    moment = _dense(mjd.actuator_moment, mjd.moment_rownnz, mjd.moment_rowadr, mjd.moment_colind, m.nv)
    fields["ten_J"] = torch.as_tensor(ten_j, device=m.device).to(m.dtype)
    fields["actuator_moment"] = torch.as_tensor(moment, device=m.device).to(m.dtype)
    return Data(**fields, batch_size=())


# Data fields diffmj stores differently from mjData (dense, or in its fixed slots and rows):
# put_data converts them, get_data leaves them for mj_forward to recompute
_OWN_LAYOUT = {"qM", "qLD", "ten_J", "actuator_moment", "contact"}
_OWN_LAYOUT |= {f for f in COMPUTED_FIELDS if f.startswith("efc_")}
# the others: put_data and get_data copy them as they are
_MJDATA_FIELDS = tuple(f for f in STATE_FIELDS + INPUT_FIELDS + COMPUTED_FIELDS if f not in _OWN_LAYOUT)


def get_data_into(mjd: mujoco.MjData, mjm: mujoco.MjModel, d: Data) -> None:
    """Copy an unbatched Data into ``mjd`` (MJX's ``get_data_into``).

    State, inputs and every computed field with MuJoCo's own layout are
    copied; MuJoCo's sparse fields (M, qLD, ten_J, actuator_moment), contacts
    and constraint rows are left for ``mujoco.mj_forward`` to recompute.
    """
    if d.batch_dims:
        raise ValueError(f"get_data takes one unbatched Data, got batch_size {tuple(d.batch_size)}")
    if mjd.qpos.shape[0] != d.qpos.shape[-1] or mjd.qvel.shape[0] != d.qvel.shape[-1]:
        raise ValueError("mujoco.MjData does not match the Data's sizes (nq, nv)")
    for name in _MJDATA_FIELDS:
        value = getattr(d, name).detach().to("cpu", torch.float64).numpy()
        if name == "time":
            mjd.time = float(value)
        else:
            target = getattr(mjd, name)
            target[...] = value.reshape(target.shape)


def get_data(mjm: mujoco.MjModel, d: Data) -> mujoco.MjData | list[mujoco.MjData]:
    """A new ``mujoco.MjData`` holding ``d`` (a list for a batch), as MJX's ``get_data``.

    ``mjm`` is the ``mujoco.MjModel`` the diffmj Model was made from.
    """
    if not isinstance(mjm, mujoco.MjModel):
        raise TypeError("get_data takes the mujoco.MjModel (as mjx.get_data does), "
                        f"got {type(mjm).__name__}")
    if d.batch_dims:
        return [get_data(mjm, d[i]) for i in range(d.batch_size[0])]
    mjd = mujoco.MjData(mjm)
    get_data_into(mjd, mjm, d)
    return mjd
