"""What every generated results page shares: read the .jsonl, write the page, the two-argument CLI.

A report module defines ``render(records, source) -> str`` and ends with
``if __name__ == "__main__": _report.main(render)``; ``tests/core/test_results_pages.py`` compares
``render(load_jsonl(jsonl), name)`` with the committed page.

Example:
    >>> from experiments._report import load_jsonl            # doctest: +SKIP
    >>> records = load_jsonl("docs/results/sc_speed.jsonl")    # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Dict, List

__all__ = ["load_jsonl", "write_page", "main"]

Render = Callable[[List[Dict[str, Any]], str], str]


def load_jsonl(path: str) -> List[Dict[str, Any]]:
    """One record per non-blank line."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_page(render: Render, jsonl: str, page: str) -> None:
    """Render the page from ``jsonl`` (named by its basename in the page) and write it to ``page``."""
    text = render(load_jsonl(jsonl), os.path.basename(jsonl))
    with open(page, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {page}")


def main(render: Render) -> None:
    """``python -m experiments.<name>_report RECORDS.jsonl PAGE.md``."""
    prog = getattr(sys.modules["__main__"].__spec__, "name", "experiments.<report>")
    usage = f"usage: python -m {prog} RECORDS.jsonl PAGE.md  (render PAGE.md from RECORDS.jsonl)"
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(usage)
        sys.exit(0)
    if len(sys.argv) != 3:
        sys.stderr.write(f"{usage}\n")
        sys.exit(2)
    if not os.path.exists(sys.argv[1]):
        sys.stderr.write(f"{prog}: error: RECORDS.jsonl: no such file {sys.argv[1]!r}\n")
        sys.exit(2)
    write_page(render, sys.argv[1], sys.argv[2])
