"""One way for every absl runner in experiments/ to start and to fail: ``run(main)``.

A bad flag (absl's own parsing, or a value ``main`` rejects with a ``TfCommoptError`` or ``ValueError``)
ends the program with exit code 2 and one line on stderr naming the program and the flag — never a
traceback, never a silent exit 0. ``--help`` shows every flag with its default (absl does).

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

    from tf_commopt.errors import TfCommoptError

    def parse(argv: List[str]) -> List[str]:
        try:
            return flags.FLAGS(argv)
        except flags.Error as e:
            fail(str(e))

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
