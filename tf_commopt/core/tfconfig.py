"""Read and validate TF_CONFIG (the cluster description TensorFlow's strategies use), pure Python.

TensorFlow itself accepts many malformed TF_CONFIGs and then hangs waiting for a peer that does not
exist; we check first and say what is wrong in one line.

Example:
    >>> from tf_commopt.core.tfconfig import parse_tf_config
    >>> c = parse_tf_config('{"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]},'
    ...                     ' "task": {"type": "worker", "index": 1}}')
    >>> c.task_type, c.task_index, c.num_workers, c.is_chief
    ('worker', 1, 2, False)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

from tf_commopt.errors import InputError

__all__ = ["TFConfig", "parse_tf_config", "tf_config_from_env", "TASK_TYPES"]

TASK_TYPES = ("chief", "worker", "ps", "evaluator")


@dataclass(frozen=True)
class TFConfig:
    """A validated TF_CONFIG."""

    cluster: Dict[str, List[str]]
    task_type: str
    task_index: int
    rpc_layer: Optional[str] = None

    @property
    def num_workers(self) -> int:
        return len(self.cluster.get("worker", []))

    @property
    def num_ps(self) -> int:
        return len(self.cluster.get("ps", []))

    @property
    def has_chief(self) -> bool:
        return bool(self.cluster.get("chief"))

    @property
    def is_chief(self) -> bool:
        """The chief, or worker 0 when the cluster has no chief (TensorFlow's convention)."""
        if self.has_chief:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    @property
    def address(self) -> str:
        return self.cluster[self.task_type][self.task_index]


def parse_tf_config(text: str, where: str = "TF_CONFIG") -> TFConfig:
    """Parse and validate a TF_CONFIG JSON string; InputError (one line, naming what) otherwise."""
    try:
        d = json.loads(text)
    except (json.JSONDecodeError, TypeError, RecursionError) as e:
        msg = getattr(e, "msg", str(e)) if not isinstance(e, RecursionError) else "nested too deeply"
        raise InputError(f"not valid JSON: {msg}", where=where) from None
    if not isinstance(d, Mapping):
        raise InputError(f"must be a JSON object, got {type(d).__name__}", where=where)
    unknown_keys = set(d) - {"cluster", "task", "rpc_layer", "environment"}
    if unknown_keys:
        raise InputError(f"unknown key(s) {sorted(unknown_keys)}", where=where)
    cluster = d.get("cluster")
    if not isinstance(cluster, Mapping) or not cluster:
        raise InputError("missing or empty 'cluster'", where=where)
    seen: Dict[str, str] = {}
    clean: Dict[str, List[str]] = {}
    for job, addrs in cluster.items():
        if job not in TASK_TYPES:
            raise InputError(
                f"unknown task type {job!r} in cluster; expected one of {', '.join(TASK_TYPES)}", where=where
            )
        if isinstance(addrs, Mapping):  # sparse form {"0": "host:port"}
            try:
                items = sorted((int(k), v) for k, v in addrs.items())
            except ValueError:
                raise InputError(f"cluster.{job}: task indices must be integers", where=where) from None
            if [k for k, _ in items] != list(range(len(items))):
                raise InputError(f"cluster.{job}: task indices must be 0..{len(items) - 1}", where=where)
            addrs = [v for _, v in items]
        if not isinstance(addrs, list) or not addrs:
            raise InputError(f"cluster.{job} must be a non-empty list of 'host:port'", where=where)
        if job in ("chief", "evaluator") and len(addrs) != 1:
            raise InputError(f"cluster.{job} must have exactly one task, got {len(addrs)}", where=where)
        for i, a in enumerate(addrs):
            if not isinstance(a, str) or ":" not in a:
                raise InputError(f"cluster.{job}[{i}] = {a!r} is not 'host:port'", where=where)
            host, _, port = a.rpartition(":")
            if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
                raise InputError(f"cluster.{job}[{i}] = {a!r} has no valid port", where=where)
            if a in seen:
                raise InputError(f"duplicate address {a!r}: cluster.{job}[{i}] and {seen[a]}", where=where)
            seen[a] = f"cluster.{job}[{i}]"
        clean[job] = list(addrs)
    if "worker" not in clean and "chief" not in clean:
        raise InputError("cluster has no 'worker' or 'chief' task", where=where)
    task = d.get("task")
    if not isinstance(task, Mapping):
        raise InputError('missing \'task\' (e.g. {"type": "worker", "index": 0})', where=where)
    ttype = task.get("type")
    if ttype not in TASK_TYPES:
        raise InputError(f"task.type {ttype!r} is not one of {', '.join(TASK_TYPES)}", where=where)
    if ttype not in clean:
        raise InputError(f"task.type {ttype!r} has no entry in cluster", where=where)
    idx = task.get("index", 0)
    if isinstance(idx, str) and idx.isascii() and idx.isdigit():
        idx = int(idx)
    if isinstance(idx, bool) or not isinstance(idx, int):
        raise InputError(f"task.index {idx!r} is not an integer", where=where)
    if not 0 <= idx < len(clean[ttype]):
        raise InputError(
            f"task.index {idx} out of range: cluster.{ttype} has {len(clean[ttype])} task(s)", where=where
        )
    rpc = d.get("rpc_layer")
    if rpc is not None and rpc not in ("grpc",):
        raise InputError(f"rpc_layer {rpc!r} is not supported (use 'grpc')", where=where)
    return TFConfig(clean, ttype, idx, rpc)


def tf_config_from_env(environ: Optional[Mapping[str, str]] = None) -> Optional[TFConfig]:
    """The validated TF_CONFIG of this process, or None when it is unset or empty."""
    env = os.environ if environ is None else environ
    text = env.get("TF_CONFIG", "")
    if not text.strip():
        return None
    return parse_tf_config(text)
