"""Build the API reference: HTML pages from the docstrings of tf_commopt's public modules and names.

Usage (from the repository root; pdoc is in the ``test`` extra)::

    python docs/build_api.py build/api        # then open build/api/index.html

Every public module of ``tf_commopt`` (no leading underscore) is documented, with the names its
``__all__`` lists (the lazily loaded ones included). A module that fails to import, or a name in an
``__all__`` that does not resolve, is an error: the build prints one line per problem and exits 1.
``tests/tf/test_api_reference.py`` runs this build, so a broken reference fails CI.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from typing import List

PACKAGE = "tf_commopt"
# packages whose __all__ names load on first use (PEP 562 __getattr__): resolved before pdoc reads them
LAZY_PACKAGES = ["tf_commopt", "tf_commopt.distribute", "tf_commopt.keras", "tf_commopt.tf"]


def resolve_lazy_names() -> List[str]:
    """Load every name of the lazy packages' ``__all__`` into the module (pdoc reads ``__dict__``).

    Returns one line per name that does not resolve.
    """
    problems = []
    for modname in LAZY_PACKAGES:
        module = importlib.import_module(modname)
        for name in getattr(module, "__all__", []):
            try:
                setattr(module, name, getattr(module, name))
            except Exception as e:
                problems.append(f"{modname}.{name}: {type(e).__name__}: {e}".splitlines()[0])
    return problems


def public_modules() -> List[str]:
    """Every module of the package whose dotted name has no part starting with ``_``."""
    import pkgutil

    root = importlib.import_module(PACKAGE)
    names = [PACKAGE]
    for info in pkgutil.walk_packages(root.__path__, prefix=PACKAGE + "."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


def build(out: str) -> List[str]:
    """Write the reference into ``out``; returns the problems (empty: a clean build).

    Example:
        >>> problems = build("/tmp/api")   # doctest: +SKIP
        >>> problems                       # doctest: +SKIP
        []
    """
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import pdoc
    import pdoc.render

    problems = resolve_lazy_names()
    pdoc.render.configure(docformat="google", show_source=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*public_modules(), output_directory=_path(out))
    for w in caught:
        text = str(w.message)
        # a package's spec already walks its submodules: naming them again only repeats a page
        if "/pdoc/" in w.filename.replace(os.sep, "/") and "has already been added" not in text:
            problems.append(text.splitlines()[0])
    return problems


def _path(out: str):
    import pathlib

    return pathlib.Path(out)


def main(argv: List[str]) -> int:
    """``build_api.py OUT``: build into OUT; exit 1 with one line per problem."""
    if len(argv) != 1:
        print("usage: python docs/build_api.py OUT_DIR", file=sys.stderr)
        return 2
    problems = build(argv[0])
    for p in problems:
        print(f"build_api: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main(sys.argv[1:]))
