"""Say when a pipeline plan leaves stages idle, why, and from which bandwidth pipelining pays.

Pure Python (no TensorFlow, despite living beside the TF glue): the partition CLI uses it on
any plan. A stage is *busy* when its compute is more than ``busy_fraction`` (10%) of the busiest
stage's. When fewer stages than asked are busy, the links are too slow for this model: moving
activations (and their gradients back) across any cut costs more than the compute it takes off
the first stage.

**Break-even bandwidth.** With the objective of :mod:`tf_commopt.core.partition.objective`
(a stage's time = compute + ``2 * (latency + bytes / bandwidth)`` for what it sends), splitting
the graph into two stages at a cut with ``C`` ms of compute before it (of ``T`` in total) and
``B`` bytes crossing it beats one stage iff ``C + 2 * (lat + B / bw) < T`` and ``C > 0``, i.e.::

    bw > 2 * B / (T - C - 2 * lat)          (bytes per ms; * 8e-6 for Gbit/s)

:func:`idle_stage_report` takes the smallest such ``bw`` over the cuts along the graph's
topological order (every prefix of that order is a convex 2-stage split; for branchy graphs
other convex cuts exist, so the value is an upper bound of the true break-even bandwidth) and
names the cut. Devices are taken as equally fast (``capacity`` scales compute).

Example:
    >>> from tf_commopt.core.costgraph import CostGraph, Node
    >>> g = CostGraph([Node("a", 1, 2, activation_bytes=12.5e6), Node("b", 1, 2)], [("a", "b")])
    >>> r = break_even(g)
    >>> round(r["bandwidth_gbps"], 3), r["cut_after"]      # 2 * 12.5 MB in the 3 ms stage b saves
    (66.667, 'a')
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

__all__ = ["break_even", "idle_stage_report"]

_GBPS_TO_BYTES_PER_MS = 1e9 / 8 / 1e3


def break_even(
    graph: Any, latency_ms: float = 0.0, capacity: float = 1.0, kind: Optional[str] = None
) -> Dict[str, Any]:
    """Smallest link bandwidth at which a 2-stage split beats one stage (see the module docstring).

    Returns:
        ``{"bandwidth_gbps", "cut_after", "cut_bytes", "compute_before_ms", "total_compute_ms"}``;
        ``bandwidth_gbps`` is ``None`` when no cut can pay at any bandwidth (latency too high or a
        single node holds all the compute).
    """
    order: List[str] = graph.topological_order()
    pos = {v: i for i, v in enumerate(order)}
    comp = [graph.compute_ms(v, kind) / capacity for v in order]
    T = sum(comp)
    last_use = [max((pos[s] for s in graph.successors(v)), default=-1) for v in order]
    best: Dict[str, Any] = {
        "bandwidth_gbps": None,
        "cut_after": None,
        "cut_bytes": None,
        "compute_before_ms": None,
        "total_compute_ms": T,
    }
    C, crossing = 0.0, 0.0
    ending: Dict[int, float] = {}
    for i, v in enumerate(order[:-1]):
        C += comp[i]
        b = graph[v].activation_bytes
        if last_use[i] > i and b > 0:  # v's output crosses every cut until its last consumer
            crossing += b
            ending[last_use[i]] = ending.get(last_use[i], 0.0) + b
        crossing -= ending.pop(i, 0.0)
        crossing = max(crossing, 0.0)
        slack = T - C - 2.0 * latency_ms
        if C <= 0 or slack <= 0:
            continue
        bw = 2.0 * crossing / slack / _GBPS_TO_BYTES_PER_MS
        if best["bandwidth_gbps"] is None or bw < best["bandwidth_gbps"]:
            best.update(bandwidth_gbps=bw, cut_after=v, cut_bytes=crossing, compute_before_ms=C)
    return best


def idle_stage_report(
    graph: Any,
    plan: Any,
    bandwidth_gbps: float,
    latency_ms: float = 0.0,
    capacity: float = 1.0,
    busy_fraction: float = 0.1,
) -> Optional[Dict[str, Any]]:
    """``None`` when every stage of ``plan`` is busy; else what to tell the user.

    Example:
        >>> rep = idle_stage_report(graph, plan, bandwidth_gbps=10.0)        # doctest: +SKIP
        >>> print(rep["message"])                                            # doctest: +SKIP

    Returns:
        ``{"busy_stages", "idle_stages", "message", "break_even_gbps", ...}`` where ``message`` is
        one line: how many stages are busy, why, and the bandwidth at which pipelining pays.
    """
    comp = list(plan.stage_compute_ms)
    top = max(comp) if comp else 0.0
    busy = [s for s, c in enumerate(comp) if c > busy_fraction * top]
    if len(busy) == len(comp):
        return None
    idle = [s for s in range(len(comp)) if s not in busy]
    be = break_even(graph, latency_ms, capacity)
    K = len(comp)
    head = (
        f"only {len(busy)} of {K} stages {'is' if len(busy) == 1 else 'are'} busy (stage(s) {idle} hold under {busy_fraction:.0%} of the "
        f"busiest stage's compute)"
    )
    if be["bandwidth_gbps"] is None:
        why = "no cut of this graph can pay: one node holds nearly all the compute, or the latency exceeds it"
    else:
        bpm = bandwidth_gbps * _GBPS_TO_BYTES_PER_MS
        saved = be["total_compute_ms"] - be["compute_before_ms"]
        comm = 2.0 * (latency_ms + be["cut_bytes"] / bpm) if be["cut_bytes"] else 0.0
        why = (
            f"links too slow to pipeline this model: at {bandwidth_gbps:g} Gbit/s the cut that pays first "
            f"(after {be['cut_after']!r}, {be['cut_bytes'] / 1e6:.3g} MB each way) costs {comm:.3g} ms of "
            f"transfer against {saved:.3g} ms of compute it would move off the first stage; pipelining starts "
            f"to pay above {be['bandwidth_gbps']:.3g} Gbit/s"
        )
        if len(busy) > 1:
            why = (
                f"the links limit the pipeline to {len(busy)} busy stages at {bandwidth_gbps:g} Gbit/s: a further cut "
                f"costs more transfer than the compute it moves (two stages already pay above "
                f"{be['bandwidth_gbps']:.3g} Gbit/s; faster links let more stages work)"
            )
    return {
        "busy_stages": len(busy),
        "idle_stages": idle,
        "break_even_gbps": be["bandwidth_gbps"],
        "break_even_cut_after": be["cut_after"],
        "break_even_cut_bytes": be["cut_bytes"],
        "message": f"{head}: {why}",
    }
