"""The README's snippets run as written from the repository root, and the files its
commands name exist."""

from __future__ import annotations

import itertools
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parents[1]
READMES = (ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "models" / "README.md")


def _blocks(path: pathlib.Path, language: str | None = None) -> list[str]:
    """The fenced code blocks of a Markdown file (of one language when given)."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", path.read_text(), flags=re.M | re.S)
    return [code for lang, code in blocks if language is None or lang == language]


def _expand_braces(word: str) -> list[str]:
    """Shell brace expansion of one word: models/{a,b}.xml -> models/a.xml, models/b.xml."""
    parts = re.split(r"\{([^{}]*)\}", word)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def test_files_named_in_the_readmes_exist():
    pattern = re.compile(r"[\w.{},/-]+\.(?:xml|py|sh|json|png)\b")
    named = {
        path
        for readme in READMES
        for block in _blocks(readme)
        for word in pattern.findall(re.sub(r"#.*", "", block))  # a comment may name an output
        if "/" in word and not word.startswith(("/", "../")) and "*" not in word
        for path in _expand_braces(word)
    }
    assert "models/humanoid.xml" in named and "scripts/run_tests.sh" in named
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"named in a README but not in the repository: {missing}"


def test_no_path_leaves_the_repository():
    for readme in READMES:
        assert "../" not in readme.read_text(), f"{readme.name} names a path outside the repository"


PYTHON_BLOCKS = _blocks(ROOT / "README.md", "python")


@pytest.mark.parametrize(
    "code",
    # a block that compiles takes minutes (issue #7): those run with the slow tests
    [pytest.param(code, marks=pytest.mark.slow) if "torch.compile" in code else code for code in PYTHON_BLOCKS],
    ids=[f"block{i}" for i in range(len(PYTHON_BLOCKS))],
)
def test_readme_python_runs(code, monkeypatch):
    """Each ```python block of README.md runs on its own from the repository root."""
    monkeypatch.chdir(ROOT)
    exec(compile(code, "README.md", "exec"), {})
