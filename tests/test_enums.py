"""diffmj's enums are MuJoCo's: same members, same values (so they cannot drift apart)."""

from __future__ import annotations

import mujoco
import pytest

import diffmj
from diffmj import enums

# diffmj enum -> (MuJoCo enum, member prefix, MuJoCo members diffmj leaves out)
MIRRORS = {
    enums.JointType: (mujoco.mjtJoint, "mjJNT_", set()),
    enums.GeomType: (mujoco.mjtGeom, "mjGEOM_", {  # visual-only types and the count
        "mjNGEOMTYPES", "mjGEOM_ARROW", "mjGEOM_ARROW1", "mjGEOM_ARROW2", "mjGEOM_LINE", "mjGEOM_LINEBOX",
        "mjGEOM_FLEX", "mjGEOM_SKIN", "mjGEOM_LABEL", "mjGEOM_TRIANGLE", "mjGEOM_NONE"}),
    enums.IntegratorType: (mujoco.mjtIntegrator, "mjINT_", set()),
    enums.ConeType: (mujoco.mjtCone, "mjCONE_", set()),
    enums.SolverType: (mujoco.mjtSolver, "mjSOL_", set()),
    enums.TrnType: (mujoco.mjtTrn, "mjTRN_", set()),
    enums.DynType: (mujoco.mjtDyn, "mjDYN_", set()),
    enums.GainType: (mujoco.mjtGain, "mjGAIN_", set()),
    enums.BiasType: (mujoco.mjtBias, "mjBIAS_", set()),
    enums.EqType: (mujoco.mjtEq, "mjEQ_", set()),
    enums.WrapType: (mujoco.mjtWrap, "mjWRAP_", set()),
    enums.ObjType: (mujoco.mjtObj, "mjOBJ_", {"mjNOBJECT"}),
    enums.SensorType: (mujoco.mjtSensor, "mjSENS_", set()),
    enums.Stage: (mujoco.mjtStage, "mjSTAGE_", set()),
    enums.DataType: (mujoco.mjtDataType, "mjDATATYPE_", set()),
    enums.ConstraintType: (mujoco.mjtConstraint, "mjCNSTR_", set()),
    enums.ConstraintState: (mujoco.mjtConstraintState, "mjCNSTRSTATE_", set()),
    enums.DisableBit: (mujoco.mjtDisableBit, "mjDSBL_", {"mjNDISABLE"}),
    enums.EnableBit: (mujoco.mjtEnableBit, "mjENBL_", {"mjNENABLE"}),
    enums.State: (mujoco.mjtState, "mjSTATE_", {"mjNSTATE"}),
}


@pytest.mark.parametrize("ours", MIRRORS, ids=lambda e: e.__name__)
def test_enum_matches_mujoco(ours):
    theirs, prefix, left_out = MIRRORS[ours]
    expected = {name.removeprefix(prefix): int(value) for name, value in theirs.__members__.items()
                if name not in left_out}
    assert {name: int(member) for name, member in ours.__members__.items()} == expected  # composites too


def test_every_enum_is_mirrored_and_public():
    """Each enum of diffmj.enums is checked above and reachable as diffmj.X and diffmj.types.X."""
    defined = {v for v in vars(enums).values()
               if isinstance(v, type) and issubclass(v, int) and v.__module__ == enums.__name__}
    assert defined == set(MIRRORS)
    for enum in defined:
        assert getattr(diffmj, enum.__name__) is enum
        assert getattr(diffmj.types, enum.__name__) is enum
