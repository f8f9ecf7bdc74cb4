"""The examples in optim_examples/ parse their options, run, and report without the optional extras.

The examples themselves take minutes; here each answers --help, the shared report module skips what it
cannot do (no tqdm, matplotlib, imageio or OpenGL context) with one printed line, and two examples run a
few steps end to end in a subprocess with those packages hidden.
"""

from __future__ import annotations

import importlib
import os
import pathlib
import subprocess
import sys

import mujoco
import numpy as np
import pytest
import torch

from diffmj import optim
from optim_examples import report, tasks

ROOT = pathlib.Path(__file__).parents[1]
EXAMPLES = sorted(p.stem for p in (ROOT / "optim_examples").glob("*.py") if "def main(" in p.read_text())
# importing None from sys.modules raises ImportError: the extras look absent even where they are installed
HIDE_EXTRAS = "import sys; sys.modules.update(tqdm=None, matplotlib=None, imageio=None); "


def _python(code: str, tmp_path: pathlib.Path, gl: str = "disable") -> subprocess.CompletedProcess:
    env = dict(os.environ, MUJOCO_GL=gl, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", HIDE_EXTRAS + code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)


def test_every_example_is_listed():
    assert EXAMPLES == ["acrobot_mpc", "apg", "cartpole_ilqr", "cartpole_mpc", "hopper_mpc", "push_box",
                        "sysid_mass_damping"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_help(name, capsys):
    example = importlib.import_module(f"optim_examples.{name}")
    with pytest.raises(SystemExit) as exit_:
        example.main(["--help"])
    assert exit_.value.code == 0
    assert "--out" in capsys.readouterr().out


def test_report_skips_what_is_missing(tmp_path):
    code = """
import numpy as np, mujoco, pathlib
from diffmj import optim
from optim_examples import report, tasks
with report.Progress(3, "count") as bar:
    for i in range(3):
        bar.update(cost=float(i))
out = pathlib.Path("out")
assert report.save_plot(out / "p.png", "t", {"cost": [3.0, 2.0]}, "iteration", np.arange(2), {"x": [0, 1]}) is None
assert report.save_curves(out / "c.png", "t", [("a", "x", "y", {"one": ([0, 1], [2, 3])})]) is None
model = mujoco.MjModel.from_xml_string(tasks.CARTPOLE_XML)
assert report.save_video(out / "v.gif", model, np.zeros((3, model.nq)), camera="fixed") is None
assert not out.exists()
"""
    result = _python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "count: 3 steps (install tqdm for a progress bar)"
    assert lines[1].startswith("count 1/3  cost 0  ") and lines[3].startswith("count 3/3  cost 2  ")
    assert lines[4] == 'plot skipped: matplotlib is not installed (pip install -e ".[examples]")'
    assert lines[5] == lines[4]
    assert lines[6].startswith("video skipped: mujoco.Renderer has no OpenGL context (MUJOCO_GL=disable;")
    assert len(lines) == 7


def test_save_curves_writes_a_png(tmp_path):
    panels = [(f"panel {i}", "x", "y", {"a": (np.arange(3), np.arange(3.0) * i), "b": ([0, 2], [1, 0])})
              for i in range(3)]
    path = report.save_curves(tmp_path / "c.png", "three panels", panels)
    assert path == tmp_path / "c.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # two subprocesses importing torch and diffmj: ~35 s each on a loaded 2-core machine
@pytest.mark.parametrize("name, args, expected", [
    ("cartpole_mpc", ["--duration", "0.03", "--samples", "4"], "3 steps in "),
    ("sysid_mass_damping", ["--horizon", "5", "--iterations", "2"], "diffmj LM: 2 iterations (max_iterations)"),
])
def test_example_runs_without_extras(name, args, expected, tmp_path):
    result = _python(f"from optim_examples import {name}; {name}.main({args + ['--out', 'out']!r})", tmp_path)
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout
    assert "plot skipped: matplotlib is not installed" in result.stdout
    assert not (tmp_path / "out").exists()


def test_task_costs_are_zero_at_the_goal():
    """Each task's cost vanishes at its goal (upright, standing) at rest with zero control (its residuals
    measure the goal), and the start is not within the goal's tolerance."""
    for task, goal in ((tasks.cartpole(), (0.0, 0.0)), (tasks.cartpole(open_loop=True), (0.0, 2 * np.pi)),
                       (tasks.acrobot(), (0.0, 0.0)), (tasks.acrobot(), (2 * np.pi, 0.0)),
                       (tasks.hopper(), (0.3, tasks.HOPPER_STAND_HEIGHT - tasks.HOPPER_TORSO_Z, 0, 0, 0, 0))):
        _, m, d = tasks.load(task)
        states = d.replace(qpos=d.qpos.new_tensor(goal)).expand(3)
        cost = optim.trajectory_cost(m, task.cost, states, d.ctrl.expand(2, m.nu))
        assert cost.abs().max() < 1e-12, (task.name, cost)
        assert task.error(np.array(goal)) < 1e-12
        hanging = optim.trajectory_cost(m, task.cost, d.expand(3), d.ctrl.expand(2, m.nu))
        assert (hanging > 1).all()
        assert task.error(np.array(task.qpos0)) > task.tolerance


@pytest.mark.parametrize("xml, points, names", [
    (tasks.ACROBOT_XML, lambda qpos: (tasks.acrobot_tip(qpos),), ("site tip",)),
    (tasks.HOPPER_XML, tasks.hopper_points, ("body torso", "body foot")),
])
def test_task_points_are_mujocos(xml, points, names):
    """The acrobot's and the hopper's costs compute their points (x, z) from qpos; MuJoCo C's site_xpos or
    body xpos agree."""
    mj_model = mujoco.MjModel.from_xml_string(xml)
    mj_data = mujoco.MjData(mj_model)
    for qpos in np.random.default_rng(0).uniform(-4, 4, (10, mj_model.nq)):
        mj_data.qpos[:] = qpos
        mujoco.mj_kinematics(mj_model, mj_data)
        for point, name in zip(points(torch.tensor(qpos)), names, strict=True):
            kind, name = name.split()
            np.testing.assert_allclose(point.numpy(), getattr(mj_data, kind)(name).xpos[[0, 2]], atol=1e-12)


def test_acrobot_target_is_mujocos_site():
    mj_model = mujoco.MjModel.from_xml_string(tasks.ACROBOT_XML)
    mj_data = mujoco.MjData(mj_model)
    mujoco.mj_kinematics(mj_model, mj_data)
    np.testing.assert_allclose(tasks.TARGET, mj_data.site("target").xpos[[0, 2]], atol=1e-12)
