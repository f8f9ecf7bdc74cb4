"""MuJoCo's enums (mjtJoint, mjtGeom, mjtSensor, ...) as Python enums, one source for each.

Members keep MuJoCo's names without the prefix (``mjJNT_FREE`` is
``JointType.FREE``) and MuJoCo's values (a test checks them against the
``mujoco`` package). ``IntEnum`` members compare equal to the integers
MuJoCo stores, so they index tensors and key tuples directly.

This module imports nothing from diffmj, so that every other module (the
index plans that ``types.py`` itself imports included) can use it; users
reach the enums through ``diffmj.types`` or ``diffmj``.
"""

from __future__ import annotations

import enum


class JointType(enum.IntEnum):
    """mjtJoint: joint types (jnt_type)."""

    FREE = 0
    BALL = 1
    SLIDE = 2
    HINGE = 3

    @property
    def nq(self) -> int:
        """qpos entries of a joint of this type (position + quaternion, quaternion, scalar)."""
        return {JointType.FREE: 7, JointType.BALL: 4}.get(self, 1)

    @property
    def nv(self) -> int:
        """Degrees of freedom of a joint of this type."""
        return {JointType.FREE: 6, JointType.BALL: 3}.get(self, 1)


class GeomType(enum.IntEnum):
    """mjtGeom: geom types (geom_type); MuJoCo's visual-only types are left out."""

    PLANE = 0
    HFIELD = 1
    SPHERE = 2
    CAPSULE = 3
    ELLIPSOID = 4
    CYLINDER = 5
    BOX = 6
    MESH = 7
    SDF = 8


class IntegratorType(enum.IntEnum):
    """mjtIntegrator: integrators (opt.integrator)."""

    EULER = 0
    RK4 = 1
    IMPLICIT = 2
    IMPLICITFAST = 3
    DISCRETE = 4


class ConeType(enum.IntEnum):
    """mjtCone: friction cones (opt.cone)."""

    PYRAMIDAL = 0
    ELLIPTIC = 1


class SolverType(enum.IntEnum):
    """mjtSolver: constraint solvers (opt.solver)."""

    PGS = 0
    CG = 1
    NEWTON = 2


class TrnType(enum.IntEnum):
    """mjtTrn: actuator transmissions (actuator_trntype)."""

    JOINT = 0
    JOINTINPARENT = 1
    SLIDERCRANK = 2
    TENDON = 3
    SITE = 4
    BODY = 5
    SO3 = 6
    UNDEFINED = 1000


class DynType(enum.IntEnum):
    """mjtDyn: actuator dynamics (actuator_dyntype)."""

    NONE = 0
    INTEGRATOR = 1
    FILTER = 2
    FILTEREXACT = 3
    MUSCLE = 4
    DCMOTOR = 5
    PID = 6
    USER = 7


class GainType(enum.IntEnum):
    """mjtGain: actuator gains (actuator_gaintype)."""

    FIXED = 0
    AFFINE = 1
    MUSCLE = 2
    DCMOTOR = 3
    SO3 = 4
    PID = 5
    USER = 6


class BiasType(enum.IntEnum):
    """mjtBias: actuator biases (actuator_biastype)."""

    NONE = 0
    AFFINE = 1
    MUSCLE = 2
    DCMOTOR = 3
    SO3 = 4
    USER = 5


class EqType(enum.IntEnum):
    """mjtEq: equality constraints (eq_type)."""

    CONNECT = 0
    WELD = 1
    JOINT = 2
    TENDON = 3
    FLEX = 4
    FLEXVERT = 5
    FLEXSTRAIN = 6
    DISTANCE = 7


class WrapType(enum.IntEnum):
    """mjtWrap: tendon wrap objects (wrap_type)."""

    NONE = 0
    JOINT = 1
    PULLEY = 2
    SITE = 3
    SPHERE = 4
    CYLINDER = 5


class ObjType(enum.IntEnum):
    """mjtObj: object types (eq_objtype, sensor_objtype, sensor_reftype, ...)."""

    UNKNOWN = 0
    BODY = 1
    XBODY = 2
    JOINT = 3
    DOF = 4
    GEOM = 5
    SITE = 6
    CAMERA = 7
    LIGHT = 8
    FLEX = 9
    MESH = 10
    SKIN = 11
    HFIELD = 12
    TEXTURE = 13
    MATERIAL = 14
    PAIR = 15
    EXCLUDE = 16
    EQUALITY = 17
    TENDON = 18
    ACTUATOR = 19
    SENSOR = 20
    NUMERIC = 21
    TEXT = 22
    TUPLE = 23
    KEY = 24
    PLUGIN = 25
    FRAME = 100
    DEFAULT = 101
    MODEL = 102


class SensorType(enum.IntEnum):
    """mjtSensor: sensor types (sensor_type)."""

    TOUCH = 0
    ACCELEROMETER = 1
    VELOCIMETER = 2
    GYRO = 3
    FORCE = 4
    TORQUE = 5
    MAGNETOMETER = 6
    RANGEFINDER = 7
    CAMPROJECTION = 8
    JOINTPOS = 9
    JOINTVEL = 10
    TENDONPOS = 11
    TENDONVEL = 12
    ACTUATORPOS = 13
    ACTUATORVEL = 14
    ACTUATORFRC = 15
    JOINTACTFRC = 16
    TENDONACTFRC = 17
    BALLQUAT = 18
    BALLANGVEL = 19
    JOINTLIMITPOS = 20
    JOINTLIMITVEL = 21
    JOINTLIMITFRC = 22
    TENDONLIMITPOS = 23
    TENDONLIMITVEL = 24
    TENDONLIMITFRC = 25
    FRAMEPOS = 26
    FRAMEQUAT = 27
    FRAMEXAXIS = 28
    FRAMEYAXIS = 29
    FRAMEZAXIS = 30
    FRAMELINVEL = 31
    FRAMEANGVEL = 32
    FRAMELINACC = 33
    FRAMEANGACC = 34
    SUBTREECOM = 35
    SUBTREELINVEL = 36
    SUBTREEANGMOM = 37
    INSIDESITE = 38
    GEOMDIST = 39
    GEOMNORMAL = 40
    GEOMFROMTO = 41
    CONTACT = 42
    E_POTENTIAL = 43
    E_KINETIC = 44
    CLOCK = 45
    TACTILE = 46
    PLUGIN = 47
    USER = 48


class Stage(enum.IntEnum):
    """mjtStage: computation stages (sensor_needstage)."""

    NONE = 0
    POS = 1
    VEL = 2
    ACC = 3


class DataType(enum.IntEnum):
    """mjtDataType: sensor output kinds (sensor_datatype): how cutoff applies."""

    REAL = 0
    POSITIVE = 1
    AXIS = 2
    QUATERNION = 3


class ConstraintType(enum.IntEnum):
    """mjtConstraint: constraint row kinds (efc_type)."""

    EQUALITY = 0
    FRICTION_DOF = 1
    FRICTION_TENDON = 2
    LIMIT_JOINT = 3
    LIMIT_TENDON = 4
    CONTACT_FRICTIONLESS = 5
    CONTACT_PYRAMIDAL = 6
    CONTACT_ELLIPTIC = 7


class ConstraintState(enum.IntEnum):
    """mjtConstraintState: constraint row states (efc_state)."""

    SATISFIED = 0
    QUADRATIC = 1
    LINEARNEG = 2
    LINEARPOS = 3
    CONE = 4


class DisableBit(enum.IntFlag):
    """mjtDisableBit: flags of opt.disableflags."""

    CONSTRAINT = 1 << 0
    EQUALITY = 1 << 1
    FRICTIONLOSS = 1 << 2
    LIMIT = 1 << 3
    CONTACT = 1 << 4
    SPRING = 1 << 5
    DAMPER = 1 << 6
    GRAVITY = 1 << 7
    CLAMPCTRL = 1 << 8
    WARMSTART = 1 << 9
    FILTERPARENT = 1 << 10
    ACTUATION = 1 << 11
    REFSAFE = 1 << 12
    SENSOR = 1 << 13
    MIDPHASE = 1 << 14
    EULERDAMP = 1 << 15
    AUTORESET = 1 << 16
    NATIVECCD = 1 << 17
    ISLAND = 1 << 18
    MULTICCD = 1 << 19


class EnableBit(enum.IntFlag):
    """mjtEnableBit: flags of opt.enableflags."""

    OVERRIDE = 1 << 0
    ENERGY = 1 << 1
    FWDINV = 1 << 2
    INVDISCRETE = 1 << 3
    SLEEP = 1 << 4
    DIAGEXACT = 1 << 5
    IPC = 1 << 6
    SPECULATIVE = 1 << 7


class State(enum.IntFlag):
    """Components of the state vector and MuJoCo's composites (mjtState)."""

    TIME = 1 << 0
    QPOS = 1 << 1
    QVEL = 1 << 2
    ACT = 1 << 3
    HISTORY = 1 << 4
    WARMSTART = 1 << 5
    CTRL = 1 << 6
    QFRC_APPLIED = 1 << 7
    XFRC_APPLIED = 1 << 8
    EQ_ACTIVE = 1 << 9
    MOCAP_POS = 1 << 10
    MOCAP_QUAT = 1 << 11
    USERDATA = 1 << 12
    PLUGIN = 1 << 13
    PLASTIC = 1 << 14
    PHYSICS = QPOS | QVEL | ACT | HISTORY | PLASTIC
    FULLPHYSICS = TIME | PHYSICS | PLUGIN
    USER = CTRL | QFRC_APPLIED | XFRC_APPLIED | EQ_ACTIVE | MOCAP_POS | MOCAP_QUAT | USERDATA
    INTEGRATION = FULLPHYSICS | USER | WARMSTART
