"""One way for every runner and bench in experiments/ to read its flags and to fail.

An entry point is ``main(argv) -> int``: :func:`main` parses ``argv`` on a fresh absl ``FlagValues``
(so it can be called in process any number of times), runs the body and returns its exit code. A bad
flag (absl's own parsing, a value the body rejects with :func:`fail`, a ``TfCommoptError`` or a
``ValueError``) prints one line ``<program>: error: <what>`` on stderr and returns 2 — never a
traceback (``TF_COMMOPT_TRACEBACK=1`` shows it), never a silent 0. ``--help`` prints every flag with its
default and returns 0.

Flags are documented with underscores (``--bandwidth_mbit``); the dashed spelling (``--bandwidth-mbit``,
``--no-per-step`` for ``--noper_step``) is accepted as an alias. ``--tf_log_level`` (default
``$TF_CPP_MIN_LOG_LEVEL``, else 2 = errors only) is applied by ``tf_commopt._cli.quiet_tensorflow``
before the body runs.

Example:
    >>> from absl import flags
    >>> def define(fv): flags.DEFINE_integer("steps", 1, "steps", flag_values=fv)
    >>> main("demo", ["demo", "--steps=3"], define, lambda fv: 0 if fv.steps == 3 else 1)
    0
    >>> main("demo", ["demo", "--steps=x"], define, lambda fv: 0)     # prints the error line on stderr
    2
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence

__all__ = ["main", "fail", "UsageError", "run", "command"]

_COMMANDS: Dict[int, str] = {}


class UsageError(Exception):
    """A bad command line: :func:`main` prints it as one line and returns 2."""


def fail(message: str) -> NoReturn:
    """Reject the command line with ``message`` (raises :class:`UsageError`)."""
    raise UsageError(message)


def command(fv: Any) -> str:
    """``python -m <program> <flags>`` exactly as :func:`main` was called with ``fv``'s flags."""
    return _COMMANDS[id(fv)]


def _error(prog: str, message: str) -> int:
    sys.stderr.write(f"{prog}: error: {' '.join(str(message).split())}\n")
    sys.stderr.flush()
    return 2


def _is_help(arg: str) -> bool:
    return arg.split("=")[0] in ("--help", "-h", "-?", "--helpshort", "--helpfull")


def main(
    prog: str,
    argv: Optional[Sequence[str]],
    define: Callable[[Any], None],
    body: Callable[[Any], Optional[int]],
) -> int:
    """Parse ``argv`` (``argv[0]`` is the program; None = ``sys.argv``) with the flags ``define(fv)`` puts
    on a fresh FlagValues, then return ``body(fv)`` (None counts as 0) or 2 with one error line."""
    from absl import flags

    from tf_commopt._cli import TF_LOG_HELP, quiet_tensorflow, respell
    from tf_commopt.errors import TfCommoptError

    argv = list(sys.argv if argv is None else argv)
    fv = flags.FlagValues()
    define(fv)
    flags.DEFINE_integer("tf_log_level", None, TF_LOG_HELP, lower_bound=0, upper_bound=3, flag_values=fv)
    if any(_is_help(a) for a in argv[1:]):
        print(f"usage: python -m {prog} [flags]\n\n{fv.get_help()}")
        return 0
    known = {f"--{n}" for n in fv} | {f"--no{n}" for n, f in fv._flags().items() if f.boolean}
    try:
        rest = fv(argv[:1] + respell(argv[1:], known, "_"))
    except flags.Error as e:
        return _error(prog, str(e))
    if len(rest) > 1:
        return _error(prog, f"unexpected argument(s): {' '.join(rest[1:])}")
    quiet_tensorflow(fv.tf_log_level)
    _COMMANDS[id(fv)] = " ".join(["python", "-m", prog, *argv[1:]])
    try:
        return int(body(fv) or 0)
    except UsageError as e:
        return _error(prog, str(e))
    except (TfCommoptError, ValueError) as e:
        if os.environ.get("TF_COMMOPT_TRACEBACK") == "1":
            raise
        return _error(prog, str(e))
    finally:
        _COMMANDS.pop(id(fv), None)


def run(main_fn: Callable[[List[str]], Optional[int]]) -> None:
    """``absl.app.run(main_fn)`` with one-line errors, for benches whose flags are still module-level
    (defined on absl's global FLAGS at import)."""
    from absl import app, flags

    from tf_commopt._cli import TF_LOG_HELP, quiet_tensorflow, respell
    from tf_commopt.errors import TfCommoptError

    prog = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None) or "experiments"
    if "tf_log_level" not in flags.FLAGS:
        flags.DEFINE_integer("tf_log_level", None, TF_LOG_HELP, lower_bound=0, upper_bound=3)
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS["tf_log_level"])

    def parse(argv: List[str]) -> List[str]:
        known = {f"--{n}" for n in flags.FLAGS}
        known |= {f"--no{n}" for n, f in flags.FLAGS._flags().items() if f.boolean}
        try:
            rest = flags.FLAGS(argv[:1] + respell(argv[1:], known, "_"))
        except flags.Error as e:
            sys.exit(_error(prog, str(e)))
        except SystemExit as e:  # absl's --help exits 1; asking for help is not a failure
            if e.code == 1 and any(_is_help(a) for a in argv[1:]):
                sys.exit(0)
            raise
        quiet_tensorflow(flags.FLAGS.tf_log_level)
        return rest

    def guarded(argv: List[str]) -> Optional[int]:
        if len(argv) > 1:
            sys.exit(_error(prog, f"unexpected argument(s): {' '.join(argv[1:])}"))
        try:
            return main_fn(argv)
        except (UsageError, TfCommoptError, ValueError) as e:
            if os.environ.get("TF_COMMOPT_TRACEBACK") == "1" and not isinstance(e, UsageError):
                raise
            sys.exit(_error(prog, str(e)))

    app.run(guarded, flags_parser=parse)
