"""How a results page is laid out: :class:`Page` and :class:`Table` (pages as data) and :func:`render_page`.

A page has a title, what is compared (words only: every number on a page comes from the records), and
tables whose rows a bench computes from its records (``rows(records)`` -> list of dicts) and whose
columns say which key to show and how. Every page states its commands (the ``command`` each record
carries, or the page's own for records made before records carried one), the machine load the records
carry, and what is compared. The registry of every page is :mod:`experiments.report`.

Example:
    >>> p = Page("demo", "Demo", "two variants", [Table("", lambda rs: rs, [("variant", "v", ""), ("s", "s", ".1f")])])
    >>> print(render_page(p, [{"v": "a", "s": 1.5, "command": "python -m x"}]).splitlines()[-1])
    | a | 1.5 |
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

__all__ = [
    "Table",
    "Page",
    "load_jsonl",
    "render_page",
    "write_page",
    "cell",
    "table",
    "verdict",
    "median",
    "when",
]

Records = List[Dict[str, Any]]
Column = Tuple[str, str, str]  # header, key in the row, format ("" = as is, ".2f", "%", "+.1f", ...)


@dataclass
class Table:
    """One table: ``rows(records)`` -> one dict per row; ``columns`` pick and format its keys."""

    heading: str
    rows: Callable[[Records], Records]
    columns: Sequence[Column]
    note: str = ""
    optional: Sequence[str] = ()  # keys whose columns are shown only when some row has them


@dataclass
class Page:
    """One results page: ``docs/results/<name>.md`` from ``docs/results/<jsonl or name.jsonl>``."""

    name: str
    title: str
    compared: str
    tables: Sequence[Table]
    commands: Optional[Callable[[Records], List[str]]] = None  # default: the records' own commands
    jsonl: str = ""
    figures: Sequence[str] = field(default_factory=list)  # images beside the page, shown at its end
    draw: Optional[Callable[[Records, str], None]] = None  # writes the figures into a directory

    @property
    def source(self) -> str:
        return self.jsonl or f"{self.name}.jsonl"


def load_jsonl(path: str) -> Records:
    """One record per non-blank line."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ------------------------------------------------------------------------------------------- formatting
def cell(value: Any, fmt: str) -> str:
    """One table cell: missing -> ``—``; ``%`` -> a fraction as percent; else ``format(value, fmt)``.

    >>> cell(0.9034, "%"), cell(None, ".2f"), cell(3.14159, ".2f"), cell(7734520, ","), cell(True, "")
    ('90.3%', '—', '3.14', '7,734,520', 'yes')
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if fmt == "%":
        return f"{100 * value:.1f}%"
    if isinstance(value, (list, tuple)):
        return ", ".join(cell(v, fmt) for v in value)
    if fmt and isinstance(value, (int, float)):
        return format(value, fmt)
    return str(value)


def table(columns: Sequence[Column], rows: Records) -> List[str]:
    """A markdown table; numeric columns (a format given) right-aligned."""
    head = "| " + " | ".join(c[0] for c in columns) + " |"
    align = "|" + "|".join("---:" if c[2] else "---" for c in columns) + "|"
    body = ["| " + " | ".join(cell(r.get(c[1]), c[2]) for c in columns) + " |" for r in rows]
    return [head, align, *body]


def when(record: Dict[str, Any]) -> str:
    """A record's UTC time as a page shows it (``"12-02 11:07"``), from the harness's ``when`` field.

    >>> when({"when": "2026-12-02T11:07:49Z"}), when({})
    ('12-02 11:07', '')
    """
    return record.get("when", "")[5:16].replace("T", " ")


def verdict(ok: Optional[bool]) -> str:
    """``met`` / ``**missed**`` for a goal (``—`` when it cannot be judged)."""
    return "—" if ok is None else ("met" if ok else "**missed**")


def median(values: Sequence[float]) -> float:
    """The median (mean of the two middle values for an even count); NaN for none."""
    vals = sorted(v for v in values if v is not None)
    n = len(vals)
    return (vals[(n - 1) // 2] + vals[n // 2]) / 2 if n else float("nan")


def _load_line(records: Records) -> str:
    loads = [r.get("load_average_1m", r.get("loadavg_1m_after")) for r in records]
    nums = [x for x in loads if isinstance(x, (int, float))]
    words = sorted({x for x in loads if isinstance(x, str)})
    cores = sorted({r["cores"] for r in records if r.get("cores")})
    if not nums and not words:
        return "**Machine load:** not recorded in these records."
    parts = []
    if nums:
        lo, hi = min(nums), max(nums)
        parts.append(
            f"1-minute load average {lo:g}" + ("" if lo == hi else f"–{hi:g}") + " at the records' ends"
        )
    parts += [f"recorded as {w!r}" for w in words]
    where = f" on {', '.join(map(str, cores))} cores" if cores else ""
    missing = loads.count(None)
    rest = f"; {missing} of {len(records)} records carry none" if missing else ""
    return f"**Machine load:** {'; '.join(parts)}{where}{rest}."


def render_page(page: Page, records: Records) -> str:
    """The page's markdown from its records."""
    cmds = (
        page.commands(records) if page.commands else sorted({r["command"] for r in records if "command" in r})
    )
    out = [
        f"# {page.title}",
        "",
        f"Generated by `python -m experiments.report {page.name}` from [{page.source}]({page.source}); "
        "do not edit by hand.",
        "",
        f"**What is compared.** {page.compared}",
        "",
        "**Command" + ("s" if len(cmds) != 1 else "") + "** (each record names its own):",
        "",
        *[f"    {c}" for c in cmds],
        "",
        _load_line(records),
        "",
    ]
    for t in page.tables:
        rows = t.rows(records)
        if not rows:
            continue
        if t.heading:
            out += [f"## {t.heading}", ""]
        if t.note:
            out += [t.note, ""]
        shown = [c for c in t.columns if c[1] not in t.optional or any(c[1] in r for r in rows)]
        out += table(shown, rows) + [""]
    for fig in page.figures:
        out += [f"![{fig}]({fig})", ""]
    return "\n".join(out).rstrip() + "\n"


def write_page(page: Page, jsonl: str, path: str) -> None:
    """Render ``page`` from the records in ``jsonl`` and write it to ``path``."""
    text = render_page(page, load_jsonl(jsonl))
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
