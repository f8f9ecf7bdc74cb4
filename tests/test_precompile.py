"""diffmj.precompiled: a compiled function saved to disk and loaded by a later process."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import diffmj
from diffmj import precompile
from tests.conftest import MODELS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _count_compiles(monkeypatch) -> list:
    """Record every compile precompiled starts (a load does not start one)."""
    compiles = []
    aot_compile = precompile._aot_compile

    def counted(fn, example_args):
        compiles.append(fn)
        return aot_compile(fn, example_args)

    monkeypatch.setattr(precompile, "_aot_compile", counted)
    return compiles


@pytest.mark.slow
def test_saved_step_loads_in_a_new_process_and_equals_eager(tmp_path):
    """The pendulum's step compiled here is loaded, not compiled, by another process, and equals eager."""
    m = diffmj.load(MODELS / "pendulum.xml")
    d = diffmj.make_data(m)
    d = d.replace(qvel=torch.full_like(d.qvel, 0.3))
    step = diffmj.precompiled(diffmj.step, (m, d), tmp_path)
    assert [p.suffix for p in tmp_path.iterdir()] == [".pt2"]
    torch.testing.assert_close(step(m, d).qvel, diffmj.step(m, d).qvel, rtol=0, atol=1e-12)
    child = textwrap.dedent(f"""
        import torch, diffmj
        from diffmj import precompile
        torch.set_num_threads({torch.get_num_threads()})  # part of the key: the guards check it
        def refuse(*args):
            raise AssertionError("compiled again instead of loading")
        precompile._aot_compile = refuse
        m = diffmj.load({str(MODELS / "pendulum.xml")!r})
        d = diffmj.make_data(m)
        d = d.replace(qvel=torch.full_like(d.qvel, -0.7))
        step = diffmj.precompiled(diffmj.step, (m, d), {str(tmp_path)!r})
        d2 = step(m, step(m, d))  # values differ from the example's: no guard on values
        expected = diffmj.step(m, diffmj.step(m, d))
        print(float((d2.qpos - expected.qpos).abs().max()), float((d2.qvel - expected.qvel).abs().max()))
    """)
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": REPO})
    assert result.returncode == 0, result.stderr[-3000:]
    assert max(map(float, result.stdout.split())) <= 1e-12


def test_new_structure_or_source_compiles_again(tmp_path, monkeypatch):
    compiles = _count_compiles(monkeypatch)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # a reload reads the edited source, not a .pyc
    module = tmp_path / "user_code.py"
    module.write_text("def scaled(x, y):\n    return x * 2 + y\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import user_code

    x, y = torch.ones(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    cache = tmp_path / "cache"
    assert torch.equal(diffmj.precompiled(user_code.scaled, (x, y), cache)(x, y), x * 2 + y)
    diffmj.precompiled(user_code.scaled, (2 * x, y), cache)  # other values: loaded
    assert len(compiles) == 1
    diffmj.precompiled(user_code.scaled, (torch.ones(4, dtype=torch.float64), torch.ones(4)), cache)
    assert len(compiles) == 2  # other shapes and dtypes: another file
    module.write_text("def scaled(x, y):\n    return x * 3 + y\n")
    importlib.reload(user_code)
    changed = diffmj.precompiled(user_code.scaled, (x, y), cache)
    assert len(compiles) == 3 and len(list(cache.iterdir())) == 2  # the traced source changed: rewritten
    assert torch.equal(changed(x, y), x * 3 + y)


def test_other_shapes_are_refused_by_name(tmp_path):
    x = torch.ones(3)
    doubled = diffmj.precompiled(_double, (x,), tmp_path)
    with pytest.raises(RuntimeError, match="[Gg]uard"):
        doubled(torch.ones(4))


def _double(x):
    return 2 * x


def test_non_functions_are_refused(tmp_path):
    with pytest.raises(ValueError, match="needs a Python function"):
        diffmj.precompiled(torch.nn.Linear(2, 2), (torch.ones(2),), tmp_path)
