"""The one report module: every page of docs/results/ rendered from its .jsonl.

Each bench declares its page(s) as data (``PAGE`` / ``PAGES``, an :class:`experiments.page.Page`);
this module lists them all, renders each from ``docs/results/<jsonl>`` and writes
``docs/results/<name>.md``. ``tests/core/test_results_pages.py`` renders every page and compares it with
the committed file byte for byte.

Example:
    python -m experiments.report                 # rewrite every page from its .jsonl
    python -m experiments.report overlap         # one page
    python -m experiments.report --check         # exit 1 if a committed page differs from its data
"""

from __future__ import annotations

import os
import sys
from typing import Dict, Optional, Sequence

from experiments.page import Page, load_jsonl, render_page

__all__ = ["RESULTS", "pages", "render", "write", "main"]

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "results")


def pages() -> Dict[str, Page]:
    """Every results page, by name (each bench module declares its own ``PAGE``)."""
    from experiments import (
        allreduce_bench,
        calibration_page,
        chaos_page,
        cheapsync_bench,
        comm_page,
        correction_bench,
        hybrid_pages,
        overlap_bench,
        ps_bench,
        sc_speed_page,
        sim_pages,
        skip_correct_bench,
        unequal_bench,
    )

    found = [overlap_bench.PAGE, sc_speed_page.PAGE, *skip_correct_bench.PAGES]
    found += [ps_bench.PAGE, ps_bench.TRACE_PAGE, correction_bench.PAGE, comm_page.PAGE, allreduce_bench.PAGE]
    found += sim_pages.all_pages() + hybrid_pages.HYBRID + [calibration_page.PAGE, chaos_page.PAGE]
    found += [unequal_bench.PAGE, unequal_bench.TTA_PAGE, cheapsync_bench.PAGE]
    return {p.name: p for p in found}


def render(name: str, results: str = RESULTS) -> str:
    """Page ``name`` rendered from its .jsonl in ``results``."""
    page = pages()[name]
    return render_page(page, load_jsonl(os.path.join(results, page.source)))


def write(name: str, results: str = RESULTS) -> str:
    """Render page ``name`` and write it to ``results/<name>.md``; returns the path."""
    path = os.path.join(results, f"{name}.md")
    text = render(name, results)
    page = pages()[name]
    if page.draw is not None:
        page.draw(load_jsonl(os.path.join(results, page.source)), results)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m experiments.report [--check] [NAME ...]``: rewrite (or check) pages; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv[1:])
    check = "--check" in args
    names = [a for a in args if a != "--check"]
    known = pages()
    if any(a in ("-h", "--help") for a in names):
        print(f"usage: python -m experiments.report [--check] [{'|'.join(known)} ...]")
        return 0
    bad = [n for n in names if n not in known]
    if bad:
        sys.stderr.write(
            f"experiments.report: error: unknown page(s) {', '.join(bad)}; choose from {', '.join(known)}\n"
        )
        return 2
    stale = []
    for name in names or list(known):
        if check:
            with open(os.path.join(RESULTS, f"{name}.md"), encoding="utf-8") as f:
                if f.read() != render(name):
                    stale.append(name)
        else:
            print(f"wrote {write(name)}")
    if stale:
        sys.stderr.write(f"experiments.report: pages differ from their data: {', '.join(stale)}\n")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
