"""One way for every absl runner in experiments/ to start and to fail: ``run(main)``.

A bad flag (absl's own parsing, or a value ``main`` rejects with a ``TfCommoptError`` or ``ValueError``)
ends the program with exit code 2 and one line on stderr naming the program and the flag — never a
traceback, never a silent exit 0. ``--help`` shows every flag with its default (absl does).

Flags are documented with underscores (``--bandwidth_mbit``); the dashed spelling of the library CLIs
(``--bandwidth-mbit``, ``--no-per-step`` for ``--noper_step``) is accepted as an alias everywhere.
TensorFlow is quiet by default: ``--tf_log_level`` (default ``$TF_CPP_MIN_LOG_LEVEL``, else 2 = errors
only) is applied by ``tf_commopt._cli.quiet_tensorflow`` before ``main`` runs (see there).

Example:
    from experiments._cli import run
    if __name__ == "__main__":
        run(main)
"""

from __future__ import annotations

import os
import sys
from typing import Callable, List, NoReturn, Optional

__all__ = ["run", "fail"]


def _prog() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return spec.name
    return os.path.basename(sys.argv[0] or "experiments")


def fail(message: str) -> NoReturn:
    """Exit 2 with ``<program>: error: <message>`` (one line) on stderr."""
    sys.stderr.write(f"{_prog()}: error: {' '.join(str(message).split())}\n")
    sys.stderr.flush()
    sys.exit(2)


def run(main: Callable[[List[str]], Optional[int]]) -> None:
    """``absl.app.run(main)`` with one-line errors for bad flags and rejected values."""
    from absl import app, flags

    from tf_commopt._cli import TF_LOG_HELP, quiet_tensorflow, respell
    from tf_commopt.errors import TfCommoptError

    if "tf_log_level" not in flags.FLAGS:
        flags.DEFINE_integer("tf_log_level", None, TF_LOG_HELP, lower_bound=0, upper_bound=3)
    # listed in --help with the main module's flags (absl names the main module by sys.argv[0])
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS["tf_log_level"])

    def parse(argv: List[str]) -> List[str]:
        known = {f"--{n}" for n in flags.FLAGS}
        known |= {f"--no{n}" for n, f in flags.FLAGS._flags().items() if f.boolean}
        argv = argv[:1] + respell(argv[1:], known, "_")
        try:
            rest = flags.FLAGS(argv)
        except flags.Error as e:
            fail(str(e))
        except SystemExit as e:  # absl's --help exits 1; asking for help is not a failure
            if e.code == 1 and any(
                a.split("=")[0] in ("--help", "-h", "-?", "--helpshort", "--helpfull") for a in argv[1:]
            ):
                sys.exit(0)
            raise
        quiet_tensorflow(flags.FLAGS.tf_log_level)
        return rest

    def guarded(argv: List[str]) -> Optional[int]:
        if len(argv) > 1:
            fail(f"unexpected argument(s): {' '.join(argv[1:])}")
        try:
            return main(argv)  # app.run exits with it
        except (TfCommoptError, ValueError) as e:  # TF_COMMOPT_TRACEBACK=1 shows the traceback instead
            if os.environ.get("TF_COMMOPT_TRACEBACK") == "1":
                raise
            fail(str(e))

    app.run(guarded, flags_parser=parse)
