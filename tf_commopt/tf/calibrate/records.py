"""The calibration tables as records: one JSON object per printed row, merged into a .jsonl by key.

``python -m tf_commopt.tf.calibrate --jsonl PATH`` writes every row it prints as a record carrying its
inputs (profile, precision, roofline, stages, plan method, link bandwidth) and the exact command. A
record replaces the one of the same table, model, precision and roofline already in ``PATH`` and the
others stay, so the run without TensorFlow and the ``--keras`` runs fill one file; the file is kept in
one order (table, model, precision, roofline). ``python -m experiments.report calibration`` renders
docs/results/calibration.md from it.

Example:
    >>> rows = [{"table": "keras_totals", "model": "vgg16", "mode": "fp32", "roofline": "datasheet"},
    ...         {"table": "layers", "model": "vgg16", "mode": "bf16", "roofline": "fitted"},
    ...         {"table": "layers", "model": "resnet50", "mode": "bf16", "roofline": "fitted"}]
    >>> [(r["table"], r["model"]) for r in sorted(rows, key=order)]
    [('layers', 'resnet50'), ('layers', 'vgg16'), ('keras_totals', 'vgg16')]
"""

from __future__ import annotations

import json
import os
import shlex
from typing import Any, Dict, List, Sequence, Tuple

from tf_commopt.tf.calibrate.estimate import MODELS, MODES

__all__ = ["TABLES", "PROGRAM", "command_line", "profile_meta", "key", "order", "merge_jsonl"]

#: the tables of the CLI, in the order they print
TABLES = ("layers", "keras_totals", "keras_stages")
PROGRAM = "python -m tf_commopt.tf.calibrate"
Record = Dict[str, Any]


def command_line(argv: Sequence[str]) -> str:
    """The command as a user types it: ``python -m tf_commopt.tf.calibrate`` and ``argv`` (shell-quoted).

    >>> command_line(["--keras", "vgg16", "--jsonl", "a b.jsonl"])
    "python -m tf_commopt.tf.calibrate --keras vgg16 --jsonl 'a b.jsonl'"
    """
    return " ".join([PROGRAM, *map(shlex.quote, argv)])


def profile_meta(model: str, mode: str) -> Dict[str, Any]:
    """The measurement's metadata of the bundled H200 profile ``model``/``mode`` (batch, device, totals)."""
    from tf_commopt.core.profiles import bundled_profile_path

    path = bundled_profile_path(f"h200/{model}.{mode}")
    with open(path.replace(".graph.txt", ".meta.json"), encoding="utf-8") as f:
        return json.load(f)


def key(record: Record) -> Tuple[Any, ...]:
    """What a record is a row of: its table, model, precision and roofline (``datasheet`` or ``fitted``)."""
    return tuple(record.get(k) for k in ("table", "model", "mode", "roofline"))


def _index(values: Sequence[str], value: Any) -> Tuple[int, str]:
    return (values.index(value), "") if value in values else (len(values), str(value))


def order(record: Record) -> Tuple[Any, ...]:
    """Sort key of a record: table, then model and precision in the CLI's order, datasheet before fitted."""
    return (
        _index(TABLES, record.get("table")),
        _index(MODELS, record.get("model")),
        _index(MODES, record.get("mode")),
        str(record.get("roofline")),
    )


def merge_jsonl(path: str, records: List[Record]) -> None:
    """Write ``records`` into the .jsonl ``path``: each replaces the record with its :func:`key`, others stay.

    Args:
        path: the .jsonl (created when missing). records: the new rows.
    """
    old: List[Record] = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = [json.loads(line) for line in f if line.strip()]
    new_keys = {key(r) for r in records}
    merged = sorted([r for r in old if key(r) not in new_keys] + list(records), key=order)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in merged)
