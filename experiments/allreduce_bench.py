"""All-reduce efficiency of MultiWorkerMirroredStrategy vs the ring bound, per CommunicationOptions setting.
Page: docs/results/allreduce.md.

Launches the runner's all-reduce mode (:mod:`experiments.allreduce`) on ``--workers`` processes of a shaped
network (``--topology``, ``--bandwidth_mbit``): every worker all-reduces B = ``--megabytes`` MB of float32
per ``impl:bytes_per_pack:chunks`` setting, ``--repeats`` times, settings interleaved in a shuffled order,
each after a barrier and ``--idle_s`` idle (``--nobarrier``: back to back). A repeat's time is the slowest
worker's; the record has per setting the median, min, max and the ratio to the ring bound
(``tf_commopt.core.scaling.ring_allreduce_s``: shared = one segment carries every rank's 2(N-1)/N x B;
switch = each rank's own link carries it), plus the TCP retransmissions and the shaper's drops.

Example:
    python -m experiments.allreduce_bench --workers=2 --topology=switch --bandwidth_mbit=10 \
        --megabytes=0.4 --settings=auto:0:1 --repeats=2 --out=/tmp/allreduce.md
    python -m experiments.allreduce_bench --workers=4 --topology=shared --bandwidth_mbit=1000 \
        --megabytes=40 --out=docs/results/allreduce.md
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from typing import Any, Dict, List, Optional, Sequence

from experiments import _cli
from experiments.allreduce import check, measure, parse_setting, parse_size
from experiments.harness import Launch, append_jsonl, cluster_lines, json_lines
from experiments.page import Page, Table, write_page
from tf_commopt.errors import InputError

__all__ = ["parse_size", "parse_setting", "ring_bound_s", "summarize", "main", "PAGE"]

DEFAULT_SETTINGS = ["auto:0:1", "ring:0:1", "auto:0:8", "auto:4M:8", "auto:16M:8", "auto:1M:32"]
TOPOLOGIES = ("switch", "shared")


def define(fv: Any) -> None:
    from absl import flags

    from experiments import allreduce

    allreduce.define(fv, DEFAULT_SETTINGS)
    d = dict(flag_values=fv)
    flags.DEFINE_bool("worker", False, "run one worker of the cluster (python -m experiments.allreduce)", **d)
    flags.DEFINE_integer("workers", 4, "worker processes (>= 2)", **d)
    flags.DEFINE_string(
        "topology", "shared", "switch (a shaped link per worker) or shared (one segment)", **d
    )
    flags.DEFINE_float("bandwidth_mbit", 1000.0, "cap in Mbit/s (tc tbf, see tf_commopt.cluster)", **d)
    flags.DEFINE_float("timeout", 1200.0, "kill the cluster after this many seconds", **d)
    flags.DEFINE_integer("tbf_burst", 0, "comparison only: tbf burst in bytes instead of the launcher's", **d)
    flags.DEFINE_integer("tbf_limit", 0, "comparison only: tbf limit in bytes instead of the launcher's", **d)
    flags.DEFINE_bool(
        "slow_start_after_idle",
        True,
        "TCP restarts slow start after idle (--noslow_start_after_idle sets net.ipv4.tcp_slow_start_after_idle=0)",
        **d,
    )
    flags.DEFINE_string("out", "", "append the record to OUT's .jsonl and rewrite the OUT page", **d)


def ring_bound_s(nbytes: float, workers: int, bandwidth_mbit: float, topology: str) -> float:
    """Seconds a ring all-reduce of ``nbytes`` needs at least (payload bytes only).

    >>> round(ring_bound_s(40e6, 4, 1000, "shared"), 3), round(ring_bound_s(4e6, 2, 50, "switch"), 3)
    (1.92, 0.64)
    """
    from tf_commopt.core.scaling import ring_allreduce_s

    return ring_allreduce_s(nbytes, workers, bandwidth_mbit, topology=topology)


def validate(fv: Any) -> List[Dict[str, Any]]:
    """The parsed settings; InputError naming the flag for any bad value."""
    if fv.workers < 2:
        raise InputError(f"must be an integer >= 2, got {fv.workers}", where="--workers")
    if fv.topology not in TOPOLOGIES:
        raise InputError(f"unknown topology {fv.topology!r}; choose switch or shared", where="--topology")
    for name in ("bandwidth_mbit", "timeout"):
        v = getattr(fv, name)
        if not (math.isfinite(v) and v > 0):
            raise InputError(f"must be a number > 0, got {v!r}", where=f"--{name}")
    settings = check(fv)
    for name in ("tbf_burst", "tbf_limit"):
        if getattr(fv, name) < 0:
            raise InputError(f"must be bytes >= 0, got {getattr(fv, name)}", where=f"--{name}")
    if fv.out and os.path.isdir(fv.out):
        raise InputError(
            f"{fv.out!r} is a directory; give a page path like docs/results/allreduce.md", where="--out"
        )
    return settings


def summarize(
    per_rank: Sequence[Dict[str, Any]],
    settings: Sequence[Dict[str, Any]],
    bound_s: float,
    shared_ns: bool = False,
) -> List[Dict[str, Any]]:
    """Per setting: the slowest rank's time per repeat -> median, min, max, ratio to the bound.

    >>> rows = summarize([{"times": {"a": [1.0, 3.0, 2.0]}}, {"times": {"a": [1.5, 2.0, 2.0]}}],
    ...                  [{"name": "a"}], bound_s=1.0)
    >>> rows[0]["median_s"], rows[0]["ratio"], rows[0]["times_s"]
    (2.0, 2.0, [1.5, 3.0, 2.0])
    """
    rows = []
    for s in settings:
        reps = [
            max(r["times"][s["name"]][k] for r in per_rank)
            for k in range(len(per_rank[0]["times"][s["name"]]))
        ]
        med = statistics.median(reps)
        row = {
            "setting": s["name"],
            "median_s": round(med, 4),
            "min_s": round(min(reps), 4),
            "max_s": round(max(reps), 4),
            "ratio": round(med / bound_s, 3) if bound_s else None,
            "times_s": [round(x, 4) for x in reps],
        }
        ranks_tcp = [r["tcp"][s["name"]] for r in per_rank if r.get("tcp", {}).get(s["name"])]
        if ranks_tcp:  # per repeat, summed over the ranks' namespaces (shared topology: one namespace)
            src = ranks_tcp[:1] if shared_ns else ranks_tcp
            row["retrans_segs"] = [sum(t[k].get("RetransSegs", 0) for t in src) for k in range(len(reps))]
            row["rto_timeouts"] = [sum(t[k].get("TCPTimeouts", 0) for t in src) for k in range(len(reps))]
        rows.append(row)
    return rows


def _shaping(fv: Any) -> None:
    """The launcher's token bucket and sysctls for this run (comparison flags)."""
    import tf_commopt.cluster as cluster

    if fv.tbf_burst:  # the launcher sizes its token bucket from these (comparison runs only)
        cluster.TBF_BURST_S, cluster.TBF_MIN_BURST = 0.0, fv.tbf_burst
    if fv.tbf_limit:
        cluster.TBF_LIMIT_S, cluster.TBF_MIN_LIMIT = 0.0, fv.tbf_limit
    if not fv.slow_start_after_idle:
        cluster.SYSCTLS = tuple(cluster.SYSCTLS) + ("net.ipv4.tcp_slow_start_after_idle=0",)


def parent(fv: Any, settings: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Launch the cluster, print the table, append to ``--out``'s .jsonl and rewrite the page."""
    import tf_commopt.cluster as cluster
    from tf_commopt.cluster import tbf_params

    _shaping(fv)
    argv = [f"--megabytes={fv.megabytes!r}", f"--settings={','.join(s['name'] for s in settings)}"]
    argv += [f"--repeats={fv.repeats}", f"--idle_s={fv.idle_s!r}", f"--seed={fv.seed}"]
    argv += [f"--{'' if fv.barrier else 'no'}barrier"]
    load = os.getloadavg()[0]
    launch = Launch(
        argv, workers=fv.workers, mbit=fv.bandwidth_mbit, topology=fv.topology, timeout=fv.timeout
    )
    launch.module = "experiments.allreduce"
    r, _ = cluster_lines(launch)
    per_rank = [x for lines in r.outputs.values() for x in json_lines(lines) if "rank" in x]
    if r.returncode != 0 or len(per_rank) != fv.workers:
        show = r.failed_task or "worker:0"
        tail = "\n".join(f"[{show}] {x}" for x in r.last_lines(show, 8))
        raise RuntimeError(f"cluster failed: {r.message}\n{tail}")
    nbytes = per_rank[0]["nbytes"]
    bound = ring_bound_s(nbytes, fv.workers, fv.bandwidth_mbit, fv.topology)
    rows = summarize(per_rank, settings, bound, shared_ns=fv.topology == "shared")
    qd = [x.get("qdisc", {}) for x in per_rank]
    drops = (
        qd[0].get("dropped")
        if fv.topology == "shared"
        else (sum(q.get("dropped", 0) for q in qd) if qd[0] else None)
    )
    _, burst, limit = tbf_params(fv.bandwidth_mbit)
    rec = {"command": _cli.command(fv), "workers": fv.workers, "topology": fv.topology}
    rec.update(bandwidth_mbit=fv.bandwidth_mbit, nbytes=nbytes, bound_s=round(bound, 4), repeats=fv.repeats)
    rec.update(
        idle_s=fv.idle_s, barrier=fv.barrier, tbf_burst=burst, tbf_limit=limit, sysctls=list(cluster.SYSCTLS)
    )
    rec.update(
        tbf_dropped_packets=drops,
        loadavg_1m_before=round(load, 2),
        loadavg_1m_after=round(os.getloadavg()[0], 2),
    )
    rec.update(wall_s=round(r.wall_s, 1), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rows=rows)
    print(json.dumps({k: v for k, v in rec.items() if k != "rows"}))
    for row in rows:
        print(f"{row['setting']:<14} median {row['median_s']:.3f} s, {row['ratio']:.3f} x the bound")
    if fv.out:
        jsonl = os.path.splitext(fv.out)[0] + ".jsonl"
        append_jsonl(jsonl, rec)
        write_page(PAGE, jsonl, fv.out)
        print(f"wrote {fv.out} and {jsonl}")
    return rec


def _body(fv: Any) -> int:
    if fv.worker:  # one worker of the cluster, as the runner's all-reduce mode
        print(
            json.dumps(measure(check(fv), fv.megabytes, fv.repeats, fv.idle_s, fv.barrier, fv.seed)),
            flush=True,
        )
        return 0
    settings = validate(fv)
    try:
        parent(fv, settings)
    except RuntimeError as e:
        print(f"experiments.allreduce_bench: {e}", flush=True)
        return 1
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.allreduce_bench`` in process; returns the exit code."""
    return _cli.main("experiments.allreduce_bench", argv, define, _body)


# ------------------------------------------------------------------------------------------------ page
def _run(r: Dict[str, Any]) -> Dict[str, Any]:
    how = f"barrier, idle {r['idle_s']:g} s" if r.get("barrier", True) else "back to back"
    row = {
        k: r.get(k) for k in ("workers", "topology", "bandwidth_mbit", "bound_s", "tbf_burst", "tbf_limit")
    }
    row.update(date=r["date"], mb=r["nbytes"] / 1e6, repeats=r["repeats"], how=how)
    row.update(sysctls=", ".join(r.get("sysctls", [])) or "none", drops=r.get("tbf_dropped_packets"))
    return dict(row, load_before=r.get("loadavg_1m_before"), load_after=r.get("loadavg_1m_after"))


def rows_runs(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [_run(r) for r in records]


def rows_settings(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    for r in records:
        run = {
            k: v for k, v in _run(r).items() if k in ("date", "workers", "topology", "bandwidth_mbit", "mb")
        }
        for x in r["rows"]:
            retrans = sum(x["retrans_segs"]) if "retrans_segs" in x else None
            out.append(
                dict(
                    run,
                    **{k: x[k] for k in ("setting", "median_s", "min_s", "max_s", "ratio")},
                    retrans=retrans,
                )
            )
    return out


_RUN = [
    ("run (UTC)", "date", ""),
    ("workers", "workers", "d"),
    ("topology", "topology", ""),
    ("Mbit/s", "bandwidth_mbit", "g"),
    ("MB", "mb", "g"),
]
PAGE = Page(
    "allreduce",
    "All-reduce efficiency vs the ring bound (MultiWorkerMirroredStrategy, CPU, gRPC)",
    "The time of one all-reduce of B bytes of single-precision floats per worker against the ring bound on payload bytes "
    "(shared segment: every rank's traffic on one shaped link; switch: each rank's own link), per setting "
    "`impl:bytes_per_pack:chunks` (the buffer passed as `chunks` equal tensors to `ReplicaContext.all_reduce` "
    "with `CommunicationOptions(implementation=impl, bytes_per_pack=...)`; TF runs one collective per pack, "
    "in order). Settings run interleaved in a shuffled order per repeat; a repeat's time is the slowest "
    "rank's; the table gives the median, min and max over the repeats and the median over the bound. The "
    "wire carries more than the payload (Ethernet, IP and TCP headers and the reverse flow's ACKs), so no "
    "TCP transport reaches the bound. Retransmitted segments are summed over the repeats and the ranks' "
    "namespaces; drops are the shaper's over the whole run. Records made while the launcher turned TCP's "
    "slow start after idle off by default name that sysctl among those set; their commands are in today's "
    "flags.",
    [
        Table(
            "Runs",
            rows_runs,
            [
                *_RUN,
                ("bound s", "bound_s", ".3f"),
                ("tbf burst B", "tbf_burst", "d"),
                ("tbf limit B", "tbf_limit", "d"),
                ("sysctls set", "sysctls", ""),
                ("packets dropped", "drops", "d"),
                ("repeats", "repeats", "d"),
                ("timing", "how", ""),
                ("load before", "load_before", "g"),
                ("load after", "load_after", "g"),
            ],
        ),
        Table(
            "Settings",
            rows_settings,
            [
                *_RUN,
                ("setting", "setting", ""),
                ("median s", "median_s", ".3f"),
                ("min s", "min_s", ".3f"),
                ("max s", "max_s", ".3f"),
                ("/bound", "ratio", ".3f"),
                ("TCP retransmitted segments", "retrans", "d"),
            ],
        ),
    ],
)

if __name__ == "__main__":
    raise SystemExit(main())
