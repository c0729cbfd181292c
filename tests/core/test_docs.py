"""The docs hang together: the index lists every page, and every relative link resolves."""

from __future__ import annotations

import pathlib
import re

import pytest

pytestmark = pytest.mark.core

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def _links(page: pathlib.Path):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return [m.group(1) for m in LINK.finditer(text) if "://" not in m.group(1)]


def test_the_index_lists_every_page():
    linked = {(DOCS / link).resolve() for link in _links(DOCS / "index.md")}
    pages = set(DOCS.glob("*.md")) | set((DOCS / "results").glob("*.md"))
    missing = sorted(
        p.relative_to(DOCS).as_posix() for p in pages - {DOCS / "index.md"} if p.resolve() not in linked
    )
    assert not missing, f"docs/index.md does not link: {missing}"


@pytest.mark.parametrize(
    "page",
    [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted((DOCS / "results").glob("*.md"))],
    ids=lambda p: p.relative_to(ROOT).as_posix(),
)
def test_relative_links_resolve(page):
    broken = [link for link in _links(page) if not (page.parent / link).exists()]
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {broken}"


def _architecture_tree():
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Packages", 1)[1]
    block = section.split("```", 2)[1]
    return {line.split()[0].rstrip("/") for line in block.splitlines() if line.strip()}


def test_the_architecture_tree_names_every_package_and_only_packages():
    named = {n for n in _architecture_tree() if n.startswith("tf_commopt")}
    packages = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "tf_commopt").rglob("__init__.py")}
    assert named == packages, f"missing: {sorted(packages - named)}; not packages: {sorted(named - packages)}"
