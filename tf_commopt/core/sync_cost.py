"""Closed-form wall time and slow-link bytes of flat, compressed, two-level and compressed two-level syncs.

A prediction to hold measurements against, not a measurement. N workers on C hosts of n = N/C workers
each; every host has one link to the others at ``inter_mbit`` (per direction) and its workers reach each
other at ``intra_mbit``; B is the model's float32 bytes and b = B·w/4 its bytes in the wire dtype
(w = 4 fp32, 2 bf16/fp16). Bandwidth terms only, plus ``latency_s`` per ring step:

* **flat sync** (one ring over the N workers, hosts contiguous in the ring): each of the 2(N−1) steps
  moves b/N over every ring edge, two of which per host cross the slow link, so

      T_flat = 2(N−1)·(a + (b/N)·8/R_inter)        slow-link bytes per host link and direction: 2(N−1)/N·b

* **global two-level sync** (reduce-scatter within the host, an all-reduce of each of the n shards across
  the C hosts side by side on the host's link, all-gather within the host; the intra-host part at fp32):

      T_2L = 2·T_half(B, n, R_intra) + 2(C−1)·(a + (b/C)·8/R_inter)      slow-link bytes: 2(C−1)/C·b
      T_half(B, n, R) = (n−1)·(a + (B/n)·8/R)

  With int8 (two-level only) the shards are all-gathered across the hosts instead, b = B·(1 + 4/256)/4
  (a float32 scale per 256 values): (C−1)·(a + b·8/R_inter), slow-link bytes (C−1)·b.

* **intra-host sync** (an all-reduce among the host's n workers): T_intra = 2·T_half(B, n, R_intra).

A run of S steps of t_comp seconds with global interval H and intra-host interval h (two-level; h = H
for one level): S·t_comp + ⌈S/H⌉·T_global + (⌊S/h⌋ − ⌊S/H⌋)·T_intra.

Example:
    >>> row = estimate(40.08e6, 0.121, steps=240, interval=8, inter_mbit=100)
    >>> round(row["wall_s"], 1), round(row["slow_link_mb"], 0)
    (173.3, 1804.0)
    >>> row = estimate(40.08e6, 0.121, steps=240, interval=8, inter_mbit=100, compression="bf16", h=2)
    >>> round(row["wall_s"], 1), round(row["slow_link_mb"], 0)
    (81.0, 601.0)
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

from tf_commopt.core.compress import BLOCK_CODECS, INT8_BLOCK, WIRE_BYTES, validate_compression
from tf_commopt.errors import InputError

__all__ = ["flat_sync_s", "two_level_sync_s", "intra_sync_s", "estimate", "VARIANTS", "compare"]

VARIANTS = (
    ("flat", None, False),
    ("compressed", "bf16", False),
    ("two-level", None, True),
    ("both", "bf16", True),
)
"""(name, compression, two-level) of the four variants :func:`compare` prints."""


def _positive(value: object, where: str, allow_zero: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InputError(f"must be a finite number {bound}, got {value!r}", where=where)
    return float(value)


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"must be an integer >= 1, got {value!r}", where=where)
    return value


def _half(nbytes: float, ranks: int, mbit: float, latency_s: float) -> float:
    """Reduce-scatter (or all-gather) of ``nbytes`` over ``ranks`` on links of ``mbit``."""
    return (ranks - 1) * (latency_s + nbytes / ranks * 8.0 / (mbit * 1e6))


def flat_sync_s(
    model_bytes: float, workers: int, inter_mbit: float, compression=None, latency_s=0.0
) -> float:
    """T_flat: one ring over every worker, limited by the slow link (module docstring)."""
    if validate_compression(compression) in BLOCK_CODECS:
        raise InputError(f"{compression!r} needs two-level averaging (h)", where="compression")
    b = model_bytes * WIRE_BYTES[compression] / 4.0
    return 0.0 if workers == 1 else 2.0 * _half(b, workers, inter_mbit, latency_s)


def _across_bytes(model_bytes: float, hosts: int, compression: Optional[str]) -> Tuple[float, bool]:
    """(bytes of one host value on the wire, whether the hosts all-gather it): an all-reduce of the
    wire dtype; int8 an all-gather of 1 byte per value plus a float32 scale per block."""
    b = model_bytes * WIRE_BYTES[validate_compression(compression)] / 4.0
    if compression in BLOCK_CODECS:
        return b * (1.0 + 4.0 / INT8_BLOCK), True
    return b, False


def intra_sync_s(model_bytes: float, per_host: int, intra_mbit: float, latency_s: float = 0.0) -> float:
    """T_intra: an fp32 all-reduce among one host's workers."""
    return 2.0 * _half(model_bytes, per_host, intra_mbit, latency_s)


def two_level_sync_s(
    model_bytes: float,
    hosts: int,
    per_host: int,
    inter_mbit: float,
    intra_mbit: float,
    compression=None,
    latency_s: float = 0.0,
) -> float:
    """T_2L: intra-host reduce-scatter and all-gather around an inter-host all-reduce of the shards
    (int8: an all-gather of every host's shard)."""
    b, gather = _across_bytes(model_bytes, hosts, compression)
    across = (
        _half(b * hosts, hosts, inter_mbit, latency_s)
        if gather
        else 2.0 * _half(b, hosts, inter_mbit, latency_s)
    )
    return intra_sync_s(model_bytes, per_host, intra_mbit, latency_s) + across


def estimate(
    model_bytes: float,
    t_comp_s: float,
    steps: int,
    interval: int,
    inter_mbit: float,
    intra_mbit: float = 10_000.0,
    workers: int = 4,
    hosts: int = 2,
    compression: Optional[str] = None,
    h: Optional[int] = None,
    latency_s: float = 0.0,
) -> Dict[str, float]:
    """Wall seconds and slow-link bytes of a run (module docstring); ``h`` given = two-level averaging.

    Returns a dict: ``wall_s``, ``comm_s``, ``global_sync_s``, ``intra_sync_s``, ``global_syncs``,
    ``intra_syncs``, ``slow_link_mb`` (MB per host link and direction over the run).
    """
    model_bytes = _positive(model_bytes, "model_bytes")
    t_comp = _positive(t_comp_s, "t_comp_s", allow_zero=True)
    steps, interval = _count(steps, "steps"), _count(interval, "interval")
    workers, hosts = _count(workers, "workers"), _count(hosts, "hosts")
    inter, intra = _positive(inter_mbit, "inter_mbit"), _positive(intra_mbit, "intra_mbit")
    latency_s = _positive(latency_s, "latency_s", allow_zero=True)
    if workers % hosts:
        raise InputError(f"{workers} workers do not split evenly over {hosts} hosts", where="hosts")
    n = workers // hosts
    b = model_bytes * WIRE_BYTES[validate_compression(compression)] / 4.0
    n_global = math.ceil(steps / interval)
    if h is None:
        t_global, t_intra, n_intra = flat_sync_s(model_bytes, workers, inter, compression, latency_s), 0.0, 0
        slow = 2.0 * (workers - 1) / workers * b if hosts > 1 else 0.0
    else:
        h = _count(h, "h")
        if interval % h:
            raise InputError(f"the global interval {interval} is not a multiple of h = {h}", where="h")
        t_global = two_level_sync_s(model_bytes, hosts, n, inter, intra, compression, latency_s)
        t_intra = intra_sync_s(model_bytes, n, intra, latency_s)
        n_intra = steps // h - steps // interval
        b, gather = _across_bytes(model_bytes, hosts, compression)
        slow = (hosts - 1) * b if gather else 2.0 * (hosts - 1) / hosts * b
    comm = n_global * t_global + n_intra * t_intra
    return {
        "wall_s": steps * t_comp + comm,
        "comm_s": comm,
        "global_sync_s": t_global,
        "intra_sync_s": t_intra,
        "global_syncs": n_global,
        "intra_syncs": n_intra,
        "slow_link_mb": n_global * slow / 1e6,
    }


def compare(
    model_bytes: float, t_comp_s: float, steps: int, interval: int, h: int, inter_mbit: float, **kw
) -> List[Dict[str, object]]:
    """The four :data:`VARIANTS` at one global interval, each with its ratios to the flat fp32 run."""
    rows = []
    for name, codec, two_level in VARIANTS:
        row = estimate(
            model_bytes,
            t_comp_s,
            steps,
            interval,
            inter_mbit,
            compression=codec,
            h=h if two_level else None,
            **kw,
        )
        rows.append(
            {
                "variant": name,
                "compression": codec or "—",
                "H": interval,
                "h": h if two_level else interval,
                **row,
            }
        )
    base = rows[0]
    for row in rows:
        row["wall_ratio"] = row["wall_s"] / base["wall_s"]
        row["bytes_ratio"] = row["slow_link_mb"] / base["slow_link_mb"] if base["slow_link_mb"] else 1.0
    return rows
