"""The two-argument CLI of the older per-page report modules (``python -m experiments.<name>_report
RECORDS.jsonl PAGE.md``): renders page ``<name>`` of :mod:`experiments.report` from the given records.

Example:
    python -m experiments.sc_speed_report docs/results/sc_speed.jsonl docs/results/sc_speed.md
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional


def main(name: str, argv: Optional[List[str]] = None) -> int:
    """Render page ``name`` from ``argv[1]`` (RECORDS.jsonl) into ``argv[2]`` (PAGE.md); the exit code."""
    from experiments.page import write_page
    from experiments.report import pages

    args = list(sys.argv if argv is None else argv)[1:]
    prog = f"experiments.{name}_report"
    usage = f"usage: python -m {prog} RECORDS.jsonl PAGE.md  (render PAGE.md from RECORDS.jsonl; see experiments.report)"
    if any(a in ("-h", "--help") for a in args):
        print(usage)
        return 0
    if len(args) != 2:
        sys.stderr.write(f"{usage}\n")
        return 2
    if not os.path.exists(args[0]):
        sys.stderr.write(f"{prog}: error: RECORDS.jsonl: no such file {args[0]!r}\n")
        return 2
    write_page(pages()[name], args[0], args[1])
    print(f"wrote {args[1]}")
    return 0
