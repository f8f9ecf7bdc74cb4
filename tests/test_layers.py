"""The package's layers import downward only, and no module reaches into another's privates.

Layers, lowest first: the engine (every module of ``diffmj/`` and ``diffmj/collision/``
but rollout), ``diffmj.grad``, ``diffmj.rollout``, ``diffmj.optim``, ``diffmj.envs``.
``diffmj/__init__.py`` re-exports them all and is not checked.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).parents[1] / "diffmj"
LAYERS = ("engine", "diffmj.grad", "diffmj.rollout", "diffmj.optim", "diffmj.envs")


def _layer(module: str) -> int:
    for rank, name in reversed(list(enumerate(LAYERS))):
        if module == name or module.startswith(name + "."):
            return rank
    return 0


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py" and path.parent == PACKAGE:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        yield ".".join(p for p in parts if p != "__init__"), ast.parse(path.read_text())


def _diffmj_imports(tree: ast.Module):
    """(line, imported module, names, at module level) of every import of diffmj (an ``if TYPE_CHECKING:``
    block at module level counts as module level: annotations only, nothing imported at run time)."""
    top = set(tree.body)
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            top.update(node.body)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("diffmj"):
            names = [a.name for a in node.names]
            # `from diffmj import math` imports a module, not a name
            modules = [f"{node.module}.{n}" for n in names] if node.module == "diffmj" else [node.module]
            for module in modules:
                yield node.lineno, module, names, node in top
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("diffmj"):
                    yield node.lineno, alias.name, [], node in top


def test_imports_go_downward_only():
    upward = [
        f"{module}:{line} imports {imported}"
        for module, tree in _modules()
        for line, imported, _, _ in _diffmj_imports(tree)
        if _layer(imported) > _layer(module)
    ]
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_no_private_or_lazy_imports_across_modules():
    bad = []
    for module, tree in _modules():
        for line, imported, names, at_top in _diffmj_imports(tree):
            private = [n for n in names if n.startswith("_")]
            if private:
                bad.append(f"{module}:{line} imports private {private} from {imported}")
            if not at_top:
                bad.append(f"{module}:{line} imports {imported} inside a function")
    assert not bad, "\n".join(bad)


def test_the_check_sees_the_package():
    modules = dict(_modules())
    assert {"diffmj.forward", "diffmj.grad.transition", "diffmj.collision.driver"} <= set(modules)
    assert _layer("diffmj.grad.transition") > _layer("diffmj.forward")
    imported = {m for _, m, _, _ in _diffmj_imports(modules["diffmj.grad.transition"])}
    assert "diffmj.forward" in imported
