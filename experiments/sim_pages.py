"""The pages of the simulation benches (docs/results/partition.md, pipeline.md; hybrid*.md in
:mod:`experiments.hybrid_pages`), rendered from their records alone (the benches' public .jsonl fields:
this module imports none of them).

Example:
    python -m experiments.report partition pipeline hybrid
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Dict, List, Sequence

from experiments.page import Page, Table

Records = List[Dict[str, Any]]
BASELINES = ("layerwise", "balanced", "pipedream")
PARTITION_COLS = ("layerwise", "balanced", "pipedream", "local", "ga", "pipedream_dp", "ga_objective")


def pct(new: float, old: float) -> float:
    """Percent change of ``new`` against ``old`` (0 when ``old`` is 0).

    >>> pct(90.0, 100.0)
    -10.0
    """
    return 100.0 * (new - old) / old if old else 0.0


def spread(values: Sequence[float], better: int) -> Dict[str, Any]:
    """Median, best, worst and how often better / worse (``better`` = +1 higher is better, -1 lower)."""
    vals = list(values)
    n = len(vals)
    wins = sum(1 for v in vals if v * better > 1e-6)
    losses = sum(1 for v in vals if v * better < -1e-6)
    best, worst = (min(vals), max(vals)) if better < 0 else (max(vals), min(vals))
    return dict(
        median=statistics.median(vals), best=best, worst=worst, wins=f"{wins}/{n}", losses=f"{losses}/{n}"
    )


# ------------------------------------------------------------------------------------------ partition
def _partition_rows(records: Records) -> Records:
    return [r for r in records if "ga" in r]


def rows_partition(records: Records) -> Records:
    out = []
    for r in _partition_rows(records):
        row = {
            k: r.get(k) for k in ("profile", "stages", "devices", "bandwidth_gbps", "nodes", "ga_gain_pct")
        }
        row.update({m: r[m]["gpipe_ms"] for m in PARTITION_COLS if m in r})
        ga = r["ga"]
        row.update(search_s=ga.get("search_s"), not_slower=r.get("ga_not_slower"))
        keys = ("seeds_best_ms", "local_best_ms", "ga_best_ms")
        if all(k in ga for k in keys):
            row["ablation"] = " → ".join(f"{ga[k]:.2f}" for k in keys)
        out.append(row)
    return out


def rows_partition_summary(records: Records) -> Records:
    rows = _partition_rows(records)
    subsets = {
        "all": rows,
        "chain models": [r for r in rows if not r["branchy"]],
        "branchy models": [r for r in rows if r["branchy"]],
        "branchy models, 10 Gbit/s": [r for r in rows if r["branchy"] and r["bandwidth_gbps"] == 10],
    }
    out = []
    for name, rs in subsets.items():
        if not rs:
            continue
        g = [r["ga_gain_pct"] for r in rs]
        old = [pct(r["ga"]["gpipe_ms"], r["ga_objective"]["gpipe_ms"]) for r in rs if "ga_objective" in r]
        old_slower = sum(
            r["ga_objective"]["gpipe_ms"] > r["best_baseline_ms"] * (1 + 1e-9)
            for r in rs
            if "ga_objective" in r
        )
        row = dict(
            subset=name, n=len(rs), not_slower=f"{sum(bool(r['ga_not_slower']) for r in rs)}/{len(rs)}"
        )
        row.update(
            median=statistics.median(g), lo=min(g), hi=max(g), ten=f"{sum(x >= 10 for x in g)}/{len(rs)}"
        )
        row.update(old_slower=f"{old_slower}/{len(rs)}", vs_old=statistics.median(old) if old else None)
        out.append(row)
    return out


def rows_partition_large(records: Records) -> Records:
    return [r for r in records if "ga" not in r]


PARTITION = Page(
    "partition",
    "Partitioner benchmark",
    "Every partition method of `tf_commopt.partition` on the bundled per-layer profiles, each plan simulated "
    "(GPipe) on the devices and links it was made for: the GPipe iteration of each method's plan, the "
    "default's gain over the best baseline (the fastest of layer-wise, balanced and PipeDream per "
    "configuration), its search seconds and its ablation (best seed, then the memetic local search, then "
    "the genetic algorithm). `pipedream_dp` is PipeDream's dynamic program as its optimizer returns it; "
    "`ga_objective` is the earlier default (the genetic algorithm on the additive objective). The search "
    "on a synthetic graph of thousands of nodes is timed last. Devices: `hom` all alike, `cap` half at "
    "half speed, `kind` half in each numeric mode of the profile.",
    [
        Table(
            "Summary",
            rows_partition_summary,
            [
                ("configurations", "subset", ""),
                ("n", "n", "d"),
                ("default not slower than the best baseline", "not_slower", ""),
                ("median gain %", "median", ".1f"),
                ("min gain %", "lo", ".1f"),
                ("max gain %", "hi", ".1f"),
                ("gain ≥ 10%", "ten", ""),
                ("earlier default slower than the best baseline", "old_slower", ""),
                ("default vs earlier default (median %)", "vs_old", "+.1f"),
            ],
        ),
        Table(
            "A large synthetic graph",
            rows_partition_large,
            [
                ("profile", "profile", ""),
                ("nodes", "nodes", ","),
                ("K", "stages", "d"),
                ("Gbit/s", "bandwidth_gbps", "g"),
                ("search s", "search_s", ".2f"),
                ("GPipe ms", "gpipe_ms", ".2f"),
                ("seeds / LS / GA best ms", "seeds_best_ms", ".2f"),
            ],
        ),
        Table(
            "Every configuration (GPipe iteration ms)",
            rows_partition,
            [
                ("profile", "profile", ""),
                ("K", "stages", "d"),
                ("devices", "devices", ""),
                ("Gbit/s", "bandwidth_gbps", "g"),
                *[(m, m, ".2f") for m in PARTITION_COLS],
                ("ga s", "search_s", ".2f"),
                ("ga vs best baseline %", "ga_gain_pct", "+.1f"),
                ("seeds → LS → GA ms", "ablation", ""),
            ],
        ),
    ],
    commands=lambda rs: [
        "python -m experiments.partition_bench --out_json docs/results/partition.jsonl --out_md /tmp/partition_table.md"
    ],
)


# ------------------------------------------------------------------------------------------- pipeline
def _configs(records: Records) -> Dict[tuple, Dict[str, Dict[str, Any]]]:
    by: Dict[tuple, Dict[str, Dict[str, Any]]] = {}
    for r in records:
        key = (r["profile"], r["stages"], r["bandwidth_gbps"], r.get("devices", "hom"))
        by.setdefault(key, {})[r["method"]] = r
    return {k: v for k, v in by.items() if "ga" in v}


def compare(records: Records) -> Records:
    """The default (``ga``) against each baseline, the best baseline (per metric) and the earlier default."""
    out = []
    for (prof, k, bw, dev), ms in _configs(records).items():
        ga = ms["ga"]
        refs: Dict[str, Dict[str, float]] = {b: ms[b] for b in (*BASELINES, "ga_objective") if b in ms}
        refs["best_baseline"] = {
            "sync_iteration_ms": min(ms[b]["sync_iteration_ms"] for b in BASELINES),
            "async_throughput": max(ms[b]["async_throughput"] for b in BASELINES),
            "bytes_injected": min(ms[b]["bytes_injected"] for b in BASELINES),
        }
        for base, b in refs.items():
            row = dict(
                profile=prof, stages=k, bandwidth_gbps=bw, devices=dev, baseline=base, branchy=ga["branchy"]
            )
            row.update(sync_pct=pct(ga["sync_iteration_ms"], b["sync_iteration_ms"]))
            row.update(async_pct=pct(ga["async_throughput"], b["async_throughput"]))
            row.update(
                bytes_pct=pct(ga["bytes_injected"], b["bytes_injected"]) if b["bytes_injected"] else 0.0
            )
            out.append(dict(row, fast=ms["layerwise"]["comm_compute_ratio"] <= 1.0))
    return out


def _rows_against(select: Callable[[Dict[str, Any]], bool]) -> Callable[[Records], Records]:
    def rows(records: Records) -> Records:
        comps = [c for c in compare(records) if select(c)]
        out = []
        for base in ("best_baseline", *BASELINES, "ga_objective"):
            cs = [c for c in comps if c["baseline"] == base]
            for key, label, better in (
                ("sync_pct", "GPipe iteration time %", -1),
                ("async_pct", "1F1B throughput %", 1),
                ("bytes_pct", "bytes injected %", -1),
            ):
                if cs:
                    out.append(dict(against=base, metric=label, **spread([c[key] for c in cs], better)))
        return out

    return rows


def rows_ablation(records: Records) -> Records:
    ga = [r for r in records if r["method"] == "ga" and "sync_seeds_best_ms" in r]
    out = []
    for tag, sched in (("sync", "GPipe (exact)"), ("async", "1F1B (model)")):
        for subset, rs in (
            ("all", ga),
            ("branchy", [r for r in ga if r["branchy"]]),
            ("branchy, 10 Gbit/s", [r for r in ga if r["branchy"] and r["bandwidth_gbps"] == 10]),
        ):
            if not rs:
                continue
            ls = [100 * (1 - r[f"{tag}_local_best_ms"] / r[f"{tag}_seeds_best_ms"]) for r in rs]
            gg = [100 * (1 - r[f"{tag}_ga_best_ms"] / r[f"{tag}_local_best_ms"]) for r in rs]
            lsw, ggw = [x for x in ls if x > 1e-6], [x for x in gg if x > 1e-6]
            ss = sorted(r["search_s" if tag == "sync" else "async_search_s"] for r in rs)
            row = dict(
                schedule=sched,
                subset=subset,
                n=len(rs),
                ls=f"{len(lsw)}/{len(rs)}",
                gg=f"{len(ggw)}/{len(rs)}",
            )
            row.update(ls_med=statistics.median(lsw) if lsw else 0.0, ls_max=max(lsw, default=0.0))
            row.update(gg_med=statistics.median(ggw) if ggw else 0.0, gg_max=max(ggw, default=0.0))
            out.append(dict(row, s_med=statistics.median(ss), s_max=ss[-1]))
    return out


PIPELINE_METHODS = ("layerwise", "balanced", "pipedream", "ga_objective", "ga")


def rows_pipeline(records: Records) -> Records:
    """One row per configuration: per method GPipe ms / 1F1B mini-batches per s / MB injected."""
    out = []
    for (prof, k, bw, dev), ms in _configs(records).items():
        row: Dict[str, Any] = dict(profile=prof, stages=k, bandwidth_gbps=bw, devices=dev)
        for m, r in ms.items():
            row[m] = (
                f"{r['sync_iteration_ms']:.1f} / {r['async_throughput']:.2f} / {r['bytes_injected'] / 1e6:.0f}"
            )
        out.append(row)
    return out


_AGAINST = [
    ("against", "against", ""),
    ("metric", "metric", ""),
    ("median", "median", "+.1f"),
    ("best", "best", "+.1f"),
    ("worst", "worst", "+.1f"),
    ("ga better in", "wins", ""),
    ("ga worse in", "losses", ""),
]
PIPELINE = Page(
    "pipeline",
    "Pipeline partitioning results",
    "The default partition (the plan fastest in the simulator for the schedule that will run, found by a "
    "search on the pipeline time with a memetic local search and a graph-aware genetic algorithm) against "
    "layer-wise, balanced and PipeDream partitioning, the best of them per configuration and metric, and "
    "the earlier default (`ga_objective`), each plan simulated in `tf_commopt.core.simulate` on the bundled "
    "per-layer profiles: GPipe iteration time, 1F1B throughput and bytes injected, as percent change of the "
    "default against each reference. Links are fast enough to pipeline where layer-wise partitioning's "
    "largest stage communication is at most its largest stage compute.",
    [
        Table("Against each reference, every configuration", _rows_against(lambda c: True), _AGAINST),
        Table(
            "Branchy models at ten Gbit/s",
            _rows_against(lambda c: c["branchy"] and c["bandwidth_gbps"] == 10),
            _AGAINST,
        ),
        Table("Where links are fast enough to pipeline", _rows_against(lambda c: c["fast"]), _AGAINST),
        Table(
            "Ablation: seeds only, then the memetic local search, then the genetic algorithm",
            rows_ablation,
            [
                ("schedule", "schedule", ""),
                ("subset", "subset", ""),
                ("configurations", "n", "d"),
                ("LS better than seeds", "ls", ""),
                ("median gain %", "ls_med", ".2f"),
                ("max gain %", "ls_max", ".2f"),
                ("GA better than LS", "gg", ""),
                ("median gain % ", "gg_med", ".2f"),
                ("max gain % ", "gg_max", ".2f"),
                ("search s median", "s_med", ".2f"),
                ("search s max", "s_max", ".2f"),
            ],
        ),
        Table(
            "Every configuration: GPipe ms / 1F1B mini-batches per s / MB injected, per method",
            rows_pipeline,
            [
                ("profile", "profile", ""),
                ("K", "stages", "d"),
                ("Gbit/s", "bandwidth_gbps", "g"),
                ("devices", "devices", ""),
                *[(m, m, "") for m in PIPELINE_METHODS],
            ],
        ),
    ],
    commands=lambda rs: [
        "python -m experiments.pipeline_bench --out_json=docs/results/pipeline.jsonl --figure=docs/results/pipeline.png"
    ],
    figures=["pipeline.png", "pipeline_gantt.png"],
)


def all_pages() -> List[Page]:
    """The partitioning pages (the hybrid ones are :data:`experiments.hybrid_pages.HYBRID`)."""
    return [PARTITION, PIPELINE]
