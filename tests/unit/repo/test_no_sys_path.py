"""No module in the tree edits ``sys.path``: everything runs from the root as a package
(``python -m bench.replay``, ``python -m app.cli``), so an import means the same module wherever it
is run from, and a benchmark cannot silently measure another tree than the one it sits in.

Read with ``ast``: a mutating call on ``sys.path`` (insert, append, extend, remove, clear, pop,
``+=``, item or whole assignment) or ``site.addsitedir`` is an edit; reading ``sys.path`` is not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TREES = ("app", "testkit", "kubeharness", "bench", "scripts", "tests")
MUTATORS = frozenset({"insert", "append", "extend", "remove", "clear", "pop", "__setitem__", "__iadd__"})


def _is_sys_path(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "path"
            and isinstance(node.value, ast.Name) and node.value.id == "sys")


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    return []


def sys_path_edits(source: str) -> list[int]:
    """Line numbers of every edit of ``sys.path`` in ``source``."""
    lines: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner, method = node.func.value, node.func.attr
            if (_is_sys_path(owner) and method in MUTATORS) or (
                    method == "addsitedir" and isinstance(owner, ast.Name) and owner.id == "site"):
                lines.append(node.lineno)
        for target in _targets(node):
            inner = target.value if isinstance(target, ast.Subscript) else target
            if _is_sys_path(inner):
                lines.append(node.lineno)
        if isinstance(node, ast.ImportFrom) and node.module == "sys" and any(
                alias.name == "path" for alias in node.names):
            lines.append(node.lineno)  # a bare `path` name would hide the edits from this check
    return sorted(lines)


@pytest.mark.parametrize(("source", "edits"), [
    ("import sys\nsys.path.insert(0, '.')\n", [2]),
    ("import sys\nsys.path.append('/x')\n", [2]),
    ("import sys\nsys.path.extend(['/x'])\n", [2]),
    ("import sys\nsys.path[0:0] = ['/x']\n", [2]),
    ("import sys\nsys.path = ['/x']\n", [2]),
    ("import sys\nsys.path += ['/x']\n", [2]),
    ("import site\nsite.addsitedir('/x')\n", [2]),
    ("from sys import path\n", [1]),
    ("import sys\nprint(sys.path)\n", []),
    ("import sys\nfirst = sys.path[0]\n", []),
    ("import os\nos.path.join('a', 'b')\n", []),
    ("import sys\nimport os\nsys.path.insert(0, os.getcwd())\nsys.path.remove('x')\n", [3, 4]),
])
def test_the_check_finds_every_edit_and_nothing_else(source: str, edits: list[int]) -> None:
    assert sys_path_edits(source) == edits


def test_no_python_file_in_the_tree_edits_sys_path() -> None:
    files = [f for tree in TREES for f in sorted((ROOT / tree).rglob("*.py"))]
    assert len(files) > 100  # the walk found the tree, not an empty folder
    offenders = [f"{f.relative_to(ROOT)}:{line}" for f in files
                 for line in sys_path_edits(f.read_text(encoding="utf-8"))]
    assert offenders == [], "run it as a package (python -m bench.x) instead: " + ", ".join(offenders)
