"""Checkpoints of the ps state between rounds: ``DIR/round-R``, written atomically, the newest kept.

A checkpoint is a ``tf.train.Checkpoint`` (``ckpt``: the global model, every D_i, the per-shard optimizer
slots, read on the chief from the ps) plus ``round.json`` (round and step counters, interval, correction,
optimizer). It is written to ``DIR/.tmp-round-R`` and renamed, so a crash mid-write never leaves a half
checkpoint under a ``round-R`` name. Workers hold no state between rounds, so a checkpoint holds
everything the next round reads. When to save is the caller's choice (``trainer.save``; the runner's
``--backup_dir`` saves every tenth of the run).

Example:
    >>> saved_rounds("/nonexistent")
    []
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Callable, Dict, List, Optional

import tensorflow as tf

from tf_commopt.errors import InputError

__all__ = ["saved_rounds", "write", "read_latest", "check_same_run"]


def saved_rounds(directory: str) -> List[int]:
    """Rounds with a complete checkpoint in ``directory``, oldest first (a ``round-R`` appears by rename).

    Example:
        >>> saved_rounds("/nonexistent/dir")
        []
    """
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(n[6:]) for n in names if n.startswith("round-") and n[6:].isdigit())


def write(directory: str, checkpoint: tf.train.Checkpoint, meta: Dict[str, Any], keep: int = 2) -> str:
    """Write ``checkpoint`` and ``meta`` (with ``meta["rounds"]`` = R) to ``directory/round-R``; keep the
    newest ``keep``. Returns the path.

    Example:
        >>> write("/tmp/ps_backup", ckpt, {"rounds": 12, "steps": 48}) # doctest: +SKIP
        '/tmp/ps_backup/round-12'
    """
    rounds = int(meta["rounds"])
    os.makedirs(directory, exist_ok=True)
    tmp, final = os.path.join(directory, f".tmp-round-{rounds}"), os.path.join(directory, f"round-{rounds}")
    shutil.rmtree(tmp, ignore_errors=True)
    checkpoint.write(os.path.join(tmp, "ckpt"))
    with open(os.path.join(tmp, "round.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in saved_rounds(directory)[:-keep]:
        shutil.rmtree(os.path.join(directory, f"round-{old}"), ignore_errors=True)
    return final


def check_same_run(meta: Dict[str, Any], optimizer: str, auto: bool, correction: str, interval: int) -> None:
    """ValueError unless a checkpoint's ``round.json`` was written by a run with this optimizer, correction
    and interval (any H when both runs use ``interval="auto"``).

    Example:
        >>> check_same_run({"optimizer": "SGD", "auto": False, "correction": "vrl", "interval": 4},
        ...                "SGD", False, "vrl", 8)
        Traceback (most recent call last):
        ValueError: saved with interval 4, correction vrl; this run has 8, vrl
    """
    if meta.get("optimizer", "SGD") != optimizer:
        raise ValueError(f"saved with optimizer {meta.get('optimizer', 'SGD')}; this run has {optimizer}")
    if (bool(meta.get("auto")), meta["correction"]) != (auto, correction) or (
        not auto and meta["interval"] != interval
    ):
        raise ValueError(
            f"saved with interval {'auto' if meta.get('auto') else meta['interval']}, correction "
            f"{meta['correction']}; this run has {'auto' if auto else interval}, {correction}"
        )


def read_latest(
    directory: str, checkpoint: tf.train.Checkpoint, check: Callable[[Dict[str, Any]], None]
) -> Optional[Dict[str, Any]]:
    """Load the newest ``round-R`` of ``directory`` into ``checkpoint``; returns its ``round.json`` (None
    when there is none).

    ``check(meta)`` raises ValueError when the checkpoint belongs to another configuration. Anything that
    goes wrong (truncated, corrupt, another model or configuration) is a one-line InputError naming the
    checkpoint.

    Example:
        >>> read_latest("/nonexistent", None, lambda meta: None) is None
        True
    """
    rounds = saved_rounds(directory)
    if not rounds:
        return None
    path = os.path.join(directory, f"round-{rounds[-1]}", "ckpt")
    try:
        with open(os.path.join(os.path.dirname(path), "round.json"), encoding="utf-8") as f:
            meta = json.load(f)
        check(meta)
        checkpoint.read(path).assert_existing_objects_matched()
        int(meta["rounds"])
    except (tf.errors.OpError, ValueError, AssertionError, OSError, KeyError, TypeError) as e:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise InputError(
            f"cannot restore this parameter-server checkpoint (truncated, corrupt or another "
            f"model/interval/correction?): {type(e).__name__}: {first}",
            where=path,
        ) from None
    return meta
