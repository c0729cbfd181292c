"""No import cycles inside tf_commopt and experiments/: module-level and function-level (lazy) imports both
count.

Reads every module's source with ``ast`` (nothing is imported), resolves ``import a.b`` and
``from a.b import c`` (c a submodule or a name) to tf_commopt modules, and asserts the graph is acyclic.
"""

import ast
import os

import networkx as nx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("tf_commopt", "experiments")


def _modules():
    out = {}
    for dirpath, _, files in (w for pkg in PACKAGES for w in os.walk(os.path.join(ROOT, pkg))):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(dirpath, f)
    return out


def import_graph() -> nx.DiGraph:
    mods = _modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rsplit(".", 1)[0] if "." in t else ""
                if (
                    t and t != name and not name.startswith(t + ".")
                ):  # a module importing its own package is fine
                    g.add_edge(name, t)
    return g


def test_no_import_cycles():
    cycles = list(nx.simple_cycles(import_graph()))
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c + [c[0]]) for c in cycles)


def _package_of(module: str, modules) -> str:
    path = modules[module]
    return module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]


def test_no_package_cycles():
    """Packages (modules collapsed into the package that holds them) import each other without cycles."""
    modules = _modules()
    packages = nx.DiGraph()
    for a, b in import_graph().edges:
        pa, pb = _package_of(a, modules), _package_of(b, modules)
        if pa != pb:
            packages.add_edge(pa, pb)
    cycles = list(nx.simple_cycles(packages))
    assert cycles == [], "package cycles: " + "; ".join(" -> ".join(c + [c[0]]) for c in cycles)


def test_the_graph_sees_lazy_imports():
    g = import_graph()
    assert g.has_edge("tf_commopt.distribute.skip_correct", "tf_commopt.distribute._keras_hooks")
    assert g.has_edge("tf_commopt.distribute.skip_correct", "tf_commopt._compat")
    # experiments/: the runner dispatches to its trainers lazily
    assert g.has_edge("experiments.train", "experiments.ps_train")
    assert g.has_edge("experiments.ps_train", "experiments.config")
