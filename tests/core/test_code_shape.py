"""The library's shape: small modules, short functions, no issue numbers in code.

A module of ``tf_commopt/`` or ``experiments/`` has at most ``MAX_MODULE_LINES`` lines and a function at most
``MAX_FUNCTION_LINES`` lines of code (its docstring not counted). ``TOO_LONG`` lists what is still over
and shrinks to nothing; a file that meets the limits must leave it.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

pytestmark = pytest.mark.core

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = (ROOT / "tf_commopt", ROOT / "experiments")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80

# path relative to the repository -> names over the limits ("<module>" for the file's own length)
TOO_LONG: dict = {}


def _function_lines(node: ast.AST) -> int:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        if isinstance(body[0].value.value, str):
            body = body[1:] or body
    return node.end_lineno - body[0].lineno + 1


def _over_limits(path: pathlib.Path) -> set:
    src = path.read_text(encoding="utf-8")
    over = set()
    if len(src.splitlines()) > MAX_MODULE_LINES:
        over.add("<module>")
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if _function_lines(node) > MAX_FUNCTION_LINES:
                over.add(node.name)
    return over


def _modules():
    return sorted(p for pkg in PACKAGES for p in pkg.rglob("*.py"))


def test_modules_and_functions_are_small():
    found = {}
    for path in _modules():
        over = _over_limits(path)
        if over:
            found[path.relative_to(ROOT).as_posix()] = over
    new = {k: v - TOO_LONG.get(k, set()) for k, v in found.items()}
    new = {k: sorted(v) for k, v in new.items() if v}
    assert not new, f"over {MAX_MODULE_LINES} lines per module or {MAX_FUNCTION_LINES} per function: {new}"
    fixed = {k: sorted(v - found.get(k, set())) for k, v in TOO_LONG.items()}
    fixed = {k: v for k, v in fixed.items() if v}
    assert not fixed, f"within the limits now, remove from TOO_LONG: {fixed}"


def test_no_issue_numbers_in_code():
    pattern = re.compile(r"\b[Ii]ssue\s*#?\d+|\(#\d+\)")
    hits = []
    for folder in ("tf_commopt", "experiments"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{i}")
    assert not hits, f"issue numbers belong in commit messages: {hits}"
