"""Run a command-line entry point inside the test process, as ``python -m MODULE ARGS`` would.

``run_module("tf_commopt.partition", ["--stages", "x"])`` executes the module as ``__main__`` (``runpy``)
with ``sys.argv`` set, captures what it writes to ``sys.stdout`` / ``sys.stderr`` and returns its exit
code (``SystemExit`` or 0), so a test checks one-line errors, exit codes and ``--help`` text without
starting an interpreter. What a run changes is put back afterwards: ``sys.argv``, ``os.environ``,
``sys.meta_path``, the absl flags (each run sees only absl's own flags plus those its modules define)
and the ``experiments`` modules (imported afresh by every run, so their flags are defined again).

``pure=True`` (the core tier) also imports ``tf_commopt`` afresh and blocks TensorFlow, tf-keras and
Keras while the command runs, even when another test already loaded them; an attempt to import them
fails the run with the names it tried (:class:`BlockedImport`). :func:`fresh_imports` does the same
for "importing X does not import Y" checks.

Example:
    >>> r = run_module("tf_commopt.cluster", ["--workers", "0", "--", "true"])
    >>> r.code, r.err.count("\\n"), "--workers" in r.err
    (2, 1, True)
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import io
import os
import runpy
import sys
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Sequence, Set, Tuple

__all__ = ["CliRun", "BlockedImport", "TENSORFLOW", "run_module", "fresh_imports", "runner_imports"]

TENSORFLOW = ("tensorflow", "tf_keras", "keras")  # what the pure tier must not import
_OURS = ("tf_commopt", "experiments")


class BlockedImport(AssertionError):
    """A command or an import tried to import a module blocked there (TensorFlow in the pure tier)."""


@dataclass
class CliRun:
    """What an in-process run returned: exit code and captured output."""

    code: int
    out: str
    err: str


def _matches(name: str, prefixes: Sequence[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


class _Blocker(importlib.abc.MetaPathFinder):
    def __init__(self, names: Sequence[str]):
        self.names, self.tried = tuple(names), []

    def find_spec(self, name, path=None, target=None):
        if _matches(name, self.names):
            self.tried.append(name)
            raise ImportError(f"{name} is blocked in this test")
        return None


_COMPILED: Dict[Tuple[str, bytes], object] = {}
_source_to_code = importlib.machinery.SourceFileLoader.source_to_code


def _cached_source_to_code(self, data, path, *args, **kwargs):
    """Compile each source once per test process (fresh imports re-run modules, not the compiler)."""
    key = (str(path), bytes(data))
    if key not in _COMPILED:
        _COMPILED[key] = _source_to_code(self, data, path, *args, **kwargs)
    return _COMPILED[key]


@contextlib.contextmanager
def _hidden(prefixes: Sequence[str]) -> Iterator[None]:
    """Modules under ``prefixes`` are imported afresh inside; the originals are put back after."""
    saved = {k: m for k, m in sys.modules.items() if _matches(k, prefixes)}
    for k in saved:
        del sys.modules[k]
    importlib.machinery.SourceFileLoader.source_to_code = _cached_source_to_code
    try:
        yield
    finally:
        importlib.machinery.SourceFileLoader.source_to_code = _source_to_code
        for k in [k for k in sys.modules if _matches(k, prefixes)]:
            del sys.modules[k]
        sys.modules.update(saved)


@contextlib.contextmanager
def fresh_imports(block: Sequence[str] = TENSORFLOW) -> Iterator[Set[str]]:
    """Import ``tf_commopt`` / ``experiments`` modules afresh with ``block`` unimportable.

    Yields the set of module names imported inside (filled on exit); raises :class:`BlockedImport` when a
    blocked module was asked for (a module under ``block`` already loaded is hidden meanwhile).

    Example:
        >>> with fresh_imports() as seen:
        ...     import tf_commopt.core.costgraph
        >>> "tf_commopt.core.costgraph" in seen and not any(m.startswith("tensorflow") for m in seen)
        True
    """
    before = set(sys.modules)
    seen: Set[str] = set()
    blocker = _Blocker(block)
    with _hidden(_OURS + tuple(block)):
        sys.meta_path.insert(0, blocker)
        try:
            yield seen
        finally:
            sys.meta_path.remove(blocker)
            seen |= {k for k in sys.modules if k not in before or _matches(k, _OURS)}
            if blocker.tried:
                raise BlockedImport(f"tried to import {sorted(set(blocker.tried))}")


def _flag_state():
    from absl import app, flags

    app.define_help_flags()  # once per process: keep them across runs
    values = flags.FLAGS.__dict__
    saved = {}
    for k, v in values.items():
        if isinstance(v, dict):
            saved[k] = {kk: (list(vv) if isinstance(vv, list) else vv) for kk, vv in v.items()}
        elif isinstance(v, (set, list)):
            saved[k] = type(v)(v)
        else:
            saved[k] = v
    flag_values = {f: (f.value, f.present, f.using_default_value) for f in flags.FLAGS._flags().values()}
    return saved, flag_values


@contextlib.contextmanager
def _isolated_flags() -> Iterator[None]:
    """Inside: only absl's own flags are defined; every flag and value is restored on exit."""
    from absl import flags

    fv = flags.FLAGS
    saved, flag_values = _flag_state()
    ours = [
        f.name
        for module, fl in fv.flags_by_module_dict().items()
        if not module.startswith("absl.")
        for f in fl
    ]
    for name in set(ours):
        if name in fv:
            delattr(fv, name)
    fv.unparse_flags()
    try:
        yield
    finally:
        fv.__dict__.update(saved)
        for f, (value, present, default) in flag_values.items():
            f.value, f.present, f.using_default_value = value, present, default


@contextlib.contextmanager
def runner_imports() -> Iterator[None]:
    """Import ``experiments`` runners afresh with their own absl flags (no clash with runners imported
    elsewhere in this process, which define flags of the same names); all is put back on exit.

    Example:
        >>> with runner_imports():
        ...     from experiments.allreduce_bench import parse_setting
        >>> parse_setting("ring:0:1")["impl"]
        'ring'
    """
    with _isolated_flags(), _hidden(("experiments",)):
        yield


@contextlib.contextmanager
def _process_state(env: Optional[Dict[str, Optional[str]]]) -> Iterator[Tuple[io.StringIO, io.StringIO]]:
    old_env, old_argv, old_path = dict(os.environ), list(sys.argv), list(sys.meta_path)
    for k, v in (env or {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield out, err
    finally:
        os.environ.clear()
        os.environ.update(old_env)
        sys.argv[:] = old_argv
        sys.meta_path[:] = old_path


def run_module(
    module: str,
    argv: Sequence[str],
    env: Optional[Dict[str, Optional[str]]] = None,
    pure: bool = True,
) -> CliRun:
    """Run ``python -m module *argv`` in this process; returns its exit code and output.

    Args:
        module: the module run as ``__main__`` (e.g. ``"experiments.train"``).
        argv: its arguments (without the program name).
        env: environment variables set meanwhile (``None`` as a value unsets one).
        pure: import ``tf_commopt`` afresh and block TensorFlow (:class:`BlockedImport` if tried).

    Example:
        >>> run_module("tf_commopt.partition", ["--help"]).code
        0
    """
    code: object = 0
    with contextlib.ExitStack() as stack:
        out, err = stack.enter_context(_process_state(env))
        stack.enter_context(_isolated_flags())
        stack.enter_context(fresh_imports() if pure else _hidden(("experiments",)))
        sys.argv[:] = [module] + list(argv)
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed, status 1
        err.write(f"{code}\n")
        code = 1
    return CliRun(code, out.getvalue(), err.getvalue())
