"""The API reference builds from the docstrings with no problem, and documents every public name."""

from __future__ import annotations

import importlib
import pathlib
import runpy
import types

import pytest

pytestmark = pytest.mark.tf

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    builder = runpy.run_path(str(ROOT / "docs" / "build_api.py"))
    out = tmp_path_factory.mktemp("api")
    return builder, out, builder["build"](str(out))


def test_the_reference_builds_without_problems(built):
    _, _, problems = built
    assert problems == []


def test_every_public_module_has_a_page_with_its_exported_names(built):
    builder, out, _ = built
    modules = builder["public_modules"]()
    assert "tf_commopt.distribute.skip_correct" in modules and "tf_commopt._compat" not in modules
    for name in modules:
        page = out.joinpath(*name.split(".")).with_suffix(".html")
        assert page.exists(), name
        html = page.read_text(encoding="utf-8")
        module = importlib.import_module(name)
        for exported in getattr(module, "__all__", []):
            if isinstance(getattr(module, exported), types.ModuleType):
                assert f"{name}.{exported}" in modules  # a submodule: its own page
                continue
            assert f'id="{exported}"' in html, f"{name}.{exported} is not documented"
