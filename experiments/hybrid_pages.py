"""The pages of ``experiments.hybrid_bench`` (docs/results/hybrid.md, hybrid_m8_32.md, hybrid_keras.md,
hybrid_real.md), rendered from their records alone.

Example:
    python -m experiments.report hybrid hybrid_real
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List

from experiments.page import Page, Table
from experiments.sim_pages import pct

Records = List[Dict[str, Any]]


def _best(r: Dict[str, Any]) -> str:
    return f"{r.get('grouping', '')} ({r.get('microbatches')})"


def rows_hybrid(records: Records) -> Records:
    out = []
    for r in records:
        row = {
            k: r.get(k)
            for k in ("profile", "cluster", "bandwidth_gbps", "hybrid_iteration_ms", "ideal_iteration_ms")
        }
        base = r["data_parallel_proportional_overlap_iteration_ms"]
        row.update(
            best=_best(r),
            dppo=base,
            dpp=r["data_parallel_proportional_iteration_ms"],
            dp=r["data_parallel_iteration_ms"],
        )
        out.append(
            dict(
                row,
                vs=pct(r["hybrid_iteration_ms"], base),
                ideal=r["hybrid_iteration_ms"] / r["ideal_iteration_ms"],
            )
        )
    return out


def rows_hybrid_summary(records: Records) -> Records:
    out = []
    for bw in sorted({r["bandwidth_gbps"] for r in records}):
        for src in ("", "pipedream/", "h200/", "keras/"):
            rs = [r for r in records if r["bandwidth_gbps"] == bw and r["profile"].startswith(src)]
            if not rs or (src and len(rs) == len([r for r in records if r["bandwidth_gbps"] == bw])):
                continue
            g = [
                pct(r["hybrid_iteration_ms"], r["data_parallel_proportional_overlap_iteration_ms"])
                for r in rs
            ]
            eq = [pct(r["hybrid_iteration_ms"], r["data_parallel_iteration_ms"]) for r in rs]
            n = len(rs)
            row = dict(bw=bw, profiles=src or "all", n=n, gain=statistics.mean(g), eq=statistics.mean(eq))
            row.update(faster=f"{sum(x < -1 for x in g)}/{n}")
            row["within"] = (
                f"{sum(r['hybrid_iteration_ms'] <= 1.6 * r['ideal_iteration_ms'] for r in rs)}/{n}"
            )
            row["dp_within"] = (
                f"{sum(r['data_parallel_proportional_overlap_iteration_ms'] <= 1.6 * r['ideal_iteration_ms'] for r in rs)}/{n}"
            )
            out.append(row)
    return out


def rows_real(records: Records) -> Records:
    out = []
    for r in records:
        row = dict(
            kind=r.get("kind"), profile=r["profile"], capacities=r["capacities"], groups=len(r["groups"])
        )
        row.update(microbatches=r.get("microbatches"), repeats=r.get("repeats"), costs=r.get("sim_costs"))
        row.update({f"real_{k}": v for k, v in r["real_ms"].items()})
        row.update(real_ratio=r["real_ratio_hybrid"], sim_ratio=r["sim_ratio_hybrid"])
        out.append(dict(row, agree=r["real_ratio_hybrid"] / r["sim_ratio_hybrid"]))
    return out


_HYBRID_COMPARED = (
    "The device-aware grouped hybrid (pipelines inside device groups, partitioned by device capacity; "
    "synchronous data parallelism between groups), found by the joint search over groups, replicated-stage "
    "pipelines, micro-batch counts and plans, against data parallel with an equal split (SSGD), with a "
    "capacity-proportional split, and with that split plus the same bucketed all-reduce overlap as the "
    "hybrid, and against the compute-only ideal, all simulated on heterogeneous clusters; per link rate the "
    "mean change against proportional data parallel with overlap and against SSGD, how often the hybrid is "
    "faster by more than a percent, and how often each is within the goal's factor of the ideal."
)
_SUMMARY = [
    ("Gbit/s", "bw", "g"),
    ("profiles", "profiles", ""),
    ("configurations", "n", "d"),
    ("hybrid vs DP prop.+overlap, mean %", "gain", "+.1f"),
    ("hybrid vs SSGD, mean %", "eq", "+.1f"),
    ("hybrid faster by > 1%", "faster", ""),
    ("hybrid ≤ 1.6 × ideal", "within", ""),
    ("DP prop.+overlap ≤ 1.6 × ideal", "dp_within", ""),
]
_ALL = [
    ("profile", "profile", ""),
    ("cluster", "cluster", ""),
    ("Gbit/s", "bandwidth_gbps", "g"),
    ("best (M)", "best", ""),
    ("hybrid ms", "hybrid_iteration_ms", ".1f"),
    ("DP prop.+overlap ms", "dppo", ".1f"),
    ("DP prop. ms", "dpp", ".1f"),
    ("DP equal ms", "dp", ".1f"),
    ("ideal ms", "ideal_iteration_ms", ".1f"),
    ("hybrid vs DP prop.+overlap %", "vs", "+.1f"),
    ("hybrid / ideal", "ideal", ".2f"),
]


def _hybrid_page(name: str, title: str, command: str) -> Page:
    tables = [
        Table("Per link rate", rows_hybrid_summary, _SUMMARY),
        Table("Every configuration", rows_hybrid, _ALL),
    ]
    return Page(name, title, _HYBRID_COMPARED, tables, commands=lambda rs: [command])


HYBRID = [
    _hybrid_page(
        "hybrid",
        "Grouped hybrid vs data parallel on heterogeneous devices (simulated)",
        "python -m experiments.hybrid_bench --json > docs/results/hybrid.jsonl",
    ),
    _hybrid_page(
        "hybrid_m8_32",
        "Grouped hybrid vs data parallel, more micro-batch counts (simulated)",
        "python -m experiments.hybrid_bench --json --microbatches=8,32 > docs/results/hybrid_m8_32.jsonl",
    ),
    _hybrid_page(
        "hybrid_keras",
        "Grouped hybrid vs data parallel on Keras applications (simulated)",
        "python -m experiments.hybrid_bench --json --profiles= --keras_apps=MobileNetV2,ResNet50 > docs/results/hybrid_keras.jsonl",
    ),
    Page(
        "hybrid_real",
        "Grouped hybrid: the simulator against real runs on emulated devices",
        "Real runs on emulated devices of different speed (one process, threads slowed to each device's "
        "capacity) of equal-split data parallel, capacity-proportional data parallel and the hybrid, each "
        "repeated, against the simulator's prediction for the same plans: the measured milliseconds per "
        "iteration, the hybrid-to-SSGD ratio measured and simulated, and how far they agree.",
        [
            Table(
                "",
                rows_real,
                [
                    ("kind", "kind", ""),
                    ("profile", "profile", ""),
                    ("capacities", "capacities", "g"),
                    ("groups", "groups", "d"),
                    ("M", "microbatches", "d"),
                    ("repeats", "repeats", "d"),
                    ("simulated costs", "costs", ""),
                    ("SSGD ms", "real_data_parallel", ".1f"),
                    ("DP prop. ms", "real_data_parallel_proportional", ".1f"),
                    ("hybrid ms", "real_hybrid", ".1f"),
                    ("hybrid / SSGD measured", "real_ratio", ".3f"),
                    ("hybrid / SSGD simulated", "sim_ratio", ".3f"),
                    ("measured / simulated", "agree", ".2f"),
                ],
            )
        ],
        commands=lambda rs: [
            "python -m experiments.hybrid_bench --real_only --json --real_repeats=10 "
            f"--real_capacities={caps} --real_groups={g} --real_microbatches={m} --real_width=512 "
            "--real_batch=256 --real_base_slowdown=4 --real_sim_costs=measured >> docs/results/hybrid_real.jsonl"
            for caps, g, m in (("1,0.25", 1, 2), ("1,0.5,0.5", 1, 3), ("1,1,0.5,0.5", 2, 2))
        ],
    ),
]
