"""Constraint rows (efc_*) and contacts against MuJoCo C, row by row, float64."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

import diffmj
from tests.conftest import (
    BENCHMARK_MODELS,
    assert_close,
    as_numpy,
    match_contacts,
    match_efc,
    mj_efc_J,
    mj_model,
    random_state,
    settled_state,
)

ROW_TOL = 1e-9


def compare_rows(m, out, mjm, mjd, kbip_columns=slice(None)):
    """Every efc row diffmj has active against MuJoCo's row it matches (match_efc);
    ``kbip_columns`` picks which of efc_KBIP's K, B, I, P are compared."""
    ours, theirs = match_efc(m, out, mjd)
    assert_close("efc_J", as_numpy(out.efc_J)[ours], mj_efc_J(mjm, mjd)[theirs], ROW_TOL)
    for name in ("efc_pos", "efc_margin", "efc_frictionloss", "efc_D", "efc_R", "efc_diagA", "efc_vel", "efc_aref"):
        assert_close(name, as_numpy(getattr(out, name))[ours], getattr(mjd, name)[theirs], ROW_TOL)
    kbip = as_numpy(out.efc_KBIP)[ours][:, kbip_columns]
    assert_close("efc_KBIP", kbip, mjd.efc_KBIP.reshape(-1, 4)[theirs][:, kbip_columns], ROW_TOL)


def compare_contacts(m, out, mjd):
    """Each MuJoCo contact against diffmj's contact of the same geom pair (match_contacts)."""
    for k, s in match_contacts(m, out, mjd).items():
        con = mjd.contact[k]
        assert_close("contact.dist", out.contact.dist[s], con.dist, ROW_TOL)
        assert_close("contact.pos", out.contact.pos[s], con.pos, ROW_TOL)
        assert_close("contact.frame", out.contact.frame[s].reshape(-1), con.frame, ROW_TOL)
        for field in ("friction", "solref", "solimp", "includemargin"):
            assert_close(f"contact.{field}", getattr(out.contact, field)[s], getattr(con, field), ROW_TOL)


def _forward_both(mjm, mjd):
    m = diffmj.put_model(mjm)
    out = diffmj.forward(m, diffmj.put_data(m, mjd))
    mujoco.mj_forward(mjm, mjd)
    return m, out


@pytest.mark.parametrize("seed", range(5))
def test_equality_friction_limit_rows(seed):
    mjm = mj_model("constraints")
    mjd = random_state(mjm, seed, scale=0.6)
    m, out = _forward_both(mjm, mjd)
    assert mjd.nefc > 10
    compare_rows(m, out, mjm, mjd)


@pytest.mark.parametrize("name", ["contacts", "humanoid", "ant", "walker2d", "halfcheetah", "hopper"])
@pytest.mark.parametrize("cone", ["pyramidal", "elliptic"])
def test_contact_rows(name, cone):
    """Every geom pair type, condim, mixing rule, pair / exclude (contacts.xml) and the shared models."""
    path = BENCHMARK_MODELS / f"{name}.xml"
    mjm = mujoco.MjModel.from_xml_path(str(path)) if path.exists() else mj_model(name)
    mjm.opt.cone = getattr(mujoco.mjtCone, f"mjCONE_{cone.upper()}")
    for steps in (60, 140, 300):
        mjd = settled_state(mjm, steps)
        m, out = _forward_both(mjm, mjd)
        compare_contacts(m, out, mjd)
        compare_rows(m, out, mjm, mjd)
