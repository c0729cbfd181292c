"""What every command line of tf_commopt and experiments/ shares.

* **One flag style, the other accepted.** ``python -m tf_commopt.*`` commands document dashed flags
  (``--bandwidth-mbit``); the runners and benches in ``experiments/`` (absl) document underscores
  (``--bandwidth_mbit``). Every entry point accepts both spellings: :class:`CliParser` maps
  ``--bandwidth_mbit`` to ``--bandwidth-mbit`` and ``experiments._cli.run`` maps ``--a-b`` to ``--a_b``
  (:func:`respell`).
* **Defaults in ``--help``** (:class:`CliParser` uses :class:`DefaultsFormatter`).
* **One line on stderr and exit code 2 for a bad flag**, never a traceback.
* **Quiet TensorFlow** (:func:`quiet_tensorflow`): the one rule for TensorFlow's C++ log level, called by
  every entry point before TensorFlow is imported.

Example:
    >>> respell(["--bandwidth_mbit=5", "--quiet", "--", "cmd", "--a_b"], {"--bandwidth-mbit", "--quiet"}, "-")
    ['--bandwidth-mbit=5', '--quiet', '--', 'cmd', '--a_b']
    >>> respell(["--per-step", "--noper-step"], {"--per_step", "--noper_step"}, "_")
    ['--per_step', '--noper_step']
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile
from typing import Collection, Iterator, List, Optional, Sequence

__all__ = [
    "CliParser",
    "UsageError",
    "DefaultsFormatter",
    "respell",
    "quiet_tensorflow",
    "TF_LOG_LEVELS",
    "DEFAULT_TF_LOG_LEVEL",
]

TF_LOG_ENV = "TF_CPP_MIN_LOG_LEVEL"
TF_LOG_LEVELS = (0, 1, 2, 3)  # TensorFlow's: 0 all, 1 no INFO, 2 errors only, 3 fatal only
DEFAULT_TF_LOG_LEVEL = 2
TF_LOG_HELP = (
    "TensorFlow's C++ log level: 0 everything, 1 no INFO, 2 errors only, 3 fatal only "
    f"(default: ${TF_LOG_ENV} if set, else {DEFAULT_TF_LOG_LEVEL})"
)


# ------------------------------------------------------------------------------------------ flag style
def respell(argv: Sequence[str], known: Collection[str], sep: str) -> List[str]:
    """``argv`` with each ``--flag`` spelled with ``sep`` (``"-"`` or ``"_"``) in its name where that
    spelling is in ``known`` and the given one is not; everything after ``--`` is left alone."""
    out: List[str] = []
    other = "_" if sep == "-" else "-"
    for i, arg in enumerate(argv):
        if arg == "--":
            return out + list(argv[i:])
        if arg.startswith("--") and other in arg[2:].split("=", 1)[0]:
            name, eq, value = arg.partition("=")
            alt = "--" + name[2:].replace(other, sep)
            if name not in known and alt in known:
                arg = alt + eq + value
        out.append(arg)
    return out


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults-in-help formatter, without ``(default: None)`` / ``(default: False)`` noise."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "%(default)" in text
            or "default" in text.lower()
            or action.default is None
            or action.default is False
            or action.default is argparse.SUPPRESS
        ):
            return text
        return super()._get_help_string(action)


class UsageError(Exception):
    """A bad command line; ``str(e)`` is the one-line message (without the program name)."""


class CliParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` for ``python -m tf_commopt.*``: defaults shown in ``--help``, the
    underscore spelling of every dashed flag accepted (``--bandwidth_mbit`` = ``--bandwidth-mbit``), a bad
    flag answered with one line ``<prog>: error: <message>`` on stderr and exit code 2.

    With ``raise_usage_errors=True`` a bad flag raises :class:`UsageError` instead of exiting, so a
    ``main(argv)`` can print the line and *return* 2 (callable in process).

    Example:
        >>> p = CliParser(prog="demo", raise_usage_errors=True)
        >>> _ = p.add_argument("--n-steps", type=int)
        >>> p.parse_args(["--n_steps", "3"]).n_steps
        3
        >>> try:
        ...     p.parse_args(["--n-steps", "x"])
        ... except UsageError as e:
        ...     print(e)
        argument --n-steps: invalid int value: 'x'
    """

    def __init__(self, *args, raise_usage_errors: bool = False, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        kwargs.setdefault("epilog", "Flags may also be spelled with underscores (--a_b for --a-b).")
        super().__init__(*args, **kwargs)
        self.raise_usage_errors = raise_usage_errors

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(respell(args, self._option_string_actions, "-"), namespace)

    def error(self, message: str):
        text = " ".join(message.split())
        if self.raise_usage_errors:
            raise UsageError(text)
        sys.stderr.write(f"{self.prog}: error: {text}\n")
        sys.exit(2)


def add_tf_log_level(parser: argparse.ArgumentParser) -> None:
    """The ``--tf-log-level`` flag (see :func:`quiet_tensorflow`)."""
    parser.add_argument(
        "--tf-log-level", type=int, choices=TF_LOG_LEVELS, default=None, metavar="{0,1,2,3}", help=TF_LOG_HELP
    )


# ------------------------------------------------------------------------------------- quiet TensorFlow
_INIT_BANNER = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_LINE = re.compile(rb"^([IWEF])\d{4} ")
_SEVERITY = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}
# errors TensorFlow logs on every machine without a GPU: not errors there
_CPU_MACHINE_NOISE = (b"failed call to cuInit",)


def _dropped(line: bytes, level: int) -> bool:
    if level >= 1 and line.startswith(_INIT_BANNER):
        return True
    m = _LINE.match(line)
    if m is None:
        return False
    sev = _SEVERITY[m.group(1)]
    return sev < level or (level >= 2 and sev == 2 and any(n in line for n in _CPU_MACHINE_NOISE))


@contextlib.contextmanager
def _filtered_stderr(level: int) -> Iterator[None]:
    """Send fd 2 to a file meanwhile, then write back the lines ``level`` keeps."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no usable fd 2
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = b"".join(x for x in tmp.read().splitlines(keepends=True) if not _dropped(x, level))
            if kept:
                os.write(2, kept)


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, level: int):
        self.inner, self.level = inner, level

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def __getattr__(self, name):  # get_source, is_package, resource readers ...: the real loader's
        return getattr(self.inner, name)

    def exec_module(self, module) -> None:
        with _filtered_stderr(self.level):
            self.inner.exec_module(module)
            try:  # the device scan is where cuInit is logged; listing is allowed before any configuration
                module.config.list_physical_devices()
            except Exception:  # pragma: no cover - never fail an import over quieting
                pass


class _QuietFinder(importlib.abc.MetaPathFinder):
    def __init__(self, level: int):
        self.level = level

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader, self.level)
        return spec


def quiet_tensorflow(level: Optional[int] = None) -> int:
    """The one rule for TensorFlow's logging in every runner, bench and CLI; returns the level used.

    ``level`` (a ``--tf_log_level`` flag) wins, then ``$TF_CPP_MIN_LOG_LEVEL`` if the user set it, then 2
    (errors only). The level is put in ``$TF_CPP_MIN_LOG_LEVEL`` (child processes inherit it) and, when
    TensorFlow is not imported yet, also applied to what its C++ libraries log while loading and scanning
    devices, which ignores that variable (absl logs everything before ``absl::InitializeLog()``); at level
    >= 2 the ``failed call to cuInit`` error of a machine without a GPU is dropped too. Call it before
    TensorFlow is imported; calling it again only changes the level.
    """
    if level is None:
        env = os.environ.get(TF_LOG_ENV, "")
        level = int(env) if env.strip().isdigit() else DEFAULT_TF_LOG_LEVEL
    level = max(0, min(3, int(level)))
    os.environ[TF_LOG_ENV] = str(level)
    for f in [f for f in sys.meta_path if isinstance(f, _QuietFinder)]:
        sys.meta_path.remove(f)
    if level >= 1 and "tensorflow" not in sys.modules:
        sys.meta_path.insert(0, _QuietFinder(level))
    return level
