"""Thesis 000, partitioning side: the default partition (``ga``, chosen in the simulator for the schedule
that runs) against ``layerwise``, ``balanced`` and ``pipedream`` plans and against ``ga``
scored by the additive objective, measured in the discrete-event simulator on real per-layer profiles.

For every profile x stage count K x bandwidth x device mix (``hom``: K equal devices; ``mixed``: half at
speed 1, half at 0.5), each method partitions with the planner (:func:`tf_commopt.partition.partition`)
*for* each schedule, and the simulator runs the plan:

* synchronous: GPipe, ``M = microbatches_per_stage * K`` micro-batches per mini-batch (each 1/M of the
  profiled mini-batch): iteration time; plans made with ``schedule="gpipe", microbatches=M``;
* asynchronous: PipeDream 1F1B with weight stashing, every micro-batch a full profiled mini-batch,
  ``async_minibatches_per_stage * K`` streamed: steady-state throughput; plans made with
  ``schedule="1f1b"``;
* bytes injected per mini-batch (the GPipe plan): activations forward and gradients back, hop by hop.

Baselines at full strength: each baseline's device order (and PipeDream's tied optima) is chosen by
the pipeline time of the schedule (``score="simulated"`` for every method). ``ga_objective`` is the
GA on the additive objective (``score="objective"``, one plan for both schedules). The ``ga`` rows also carry the
ablation: the best pipeline-model time of the seeds alone, after the memetic local search and after
the GA (exact simulated times for GPipe; for 1F1B the closed-form model's).

Example:
    python -m experiments.pipeline_bench --out_json=docs/results/pipeline.jsonl --out_md=/tmp/pipeline_tables.md
    python -m experiments.pipeline_bench --profiles=pipedream/vgg16 --stages=4 --bandwidths_gbps=10 --devices=hom
    python -m experiments.pipeline_bench --from_json=docs/results/pipeline.jsonl     # tables only
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Dict, List, Optional

from absl import flags

from experiments.graphs import load_graph
from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.core.partition.api import make_cluster
from tf_commopt.core.plan import PartitionPlan
from tf_commopt.core.simulate import simulate_pipeline
from tf_commopt.errors import TfCommoptError
from tf_commopt.partition import partition

PROFILES = [
    "pipedream/vgg16",
    "pipedream/resnet50",
    "pipedream/inception_v3",
    "pipedream/gnmt",
    "h200/vgg16.fp32",
    "h200/resnet50.fp32",
    "h200/resnet101.fp32",
    "h200/inception_v3.fp32",
    "h200/densenet121.fp32",
    "h200/mobilenet_v2.fp32",
]
BASELINES = ["layerwise", "balanced", "pipedream"]
METHODS = BASELINES + ["ga_objective", "ga"]
BRANCHY = ("inception", "densenet", "nasnet", "branchy")
THESIS = {"sync_pct": "-5 to -19 (shorter)", "async_pct": "up to +15", "bytes_pct": "up to -35"}

FLAGS = flags.FLAGS
flags.DEFINE_list("profiles", PROFILES, "bundled profile names, files, or keras/<Application>")
flags.DEFINE_list("stages", ["4", "8"], "pipeline stage counts")
flags.DEFINE_list("bandwidths_gbps", ["1", "10", "100"], "link bandwidths (Gbit/s)")
flags.DEFINE_list("devices", ["hom", "mixed"], "device mixes: hom (equal), mixed (half at 0.5 speed)")
flags.DEFINE_float("latency_ms", 0.0, "per-message link latency (ms)")
flags.DEFINE_integer("microbatches_per_stage", 4, "GPipe micro-batches per mini-batch = this * stages")
flags.DEFINE_integer("async_minibatches_per_stage", 8, "1F1B mini-batches streamed = this * stages")
flags.DEFINE_integer("seed", 0, "GA / local-search seed")
flags.DEFINE_string(
    "out_json", "", "write one JSON object per (profile, stages, bandwidth, devices, method) here"
)
flags.DEFINE_string("out_md", "", "write the markdown tables here")
flags.DEFINE_string("figure", "", "write the summary figure (PNG) here")
flags.DEFINE_string("from_json", "", "re-make the tables and figure from a previous --out_json (no runs)")


def speed_check() -> Dict[str, float]:
    """Seconds to simulate 1,000 micro-batches on 8 stages (GPipe and 1F1B), with communication."""
    p = 8
    g = CostGraph(
        [Node(f"n{i}", 1.0 + 0.1 * i, 2.0, activation_bytes=1e6) for i in range(p)],
        [(f"n{i}", f"n{i + 1}") for i in range(p - 1)],
    )
    plan = PartitionPlan(
        "speed", {f"n{i}": i for i in range(p)}, list(range(p)), [0.0] * p, [0.0] * p, [0.0] * p, 0.0, 0.0
    )
    out = {}
    for sched in ("gpipe", "1f1b"):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            simulate_pipeline(g, plan, sched, microbatches=1000)
            best = min(best, time.perf_counter() - t0)
        out[sched] = best
    return out


def capacities(k: int, devices: str) -> Optional[List[float]]:
    """The device mix: None (K equal devices) or half at speed 1 and half at 0.5."""
    return None if devices == "hom" else [1.0] * (k - k // 2) + [0.5] * (k // 2)


def run_config(graph, name: str, k: int, bw: float, devices: str) -> List[dict]:
    """One row per method for one (profile, K, bandwidth, device mix)."""
    m, m_async = FLAGS.microbatches_per_stage * k, FLAGS.async_minibatches_per_stage * k
    caps = capacities(k, devices)
    cl = make_cluster(k, caps, bw, FLAGS.latency_ms)
    kw = dict(capacities=caps, bandwidth_gbps=bw, latency_ms=FLAGS.latency_ms, seed=FLAGS.seed)
    rows = []
    for method in METHODS:
        if method == "ga_objective":
            plan = partition(graph, k, method="ga", score="objective", microbatches=m, **kw)
            aplan = plan
        else:
            plan = partition(graph, k, method=method, schedule="gpipe", microbatches=m, **kw)
            aplan = partition(graph, k, method=method, schedule="1f1b", microbatches=m_async, **kw)
        sync = simulate_pipeline(graph, plan, "gpipe", microbatches=m, cluster=cl)
        asy = simulate_pipeline(graph, aplan, "1f1b", microbatches=m_async, cluster=cl)
        row = {
            "profile": name,
            "stages": k,
            "bandwidth_gbps": bw,
            "devices": devices,
            "method": method,
            "branchy": any(b in name for b in BRANCHY),
            "search_s": plan.search_s,
            "async_search_s": aplan.search_s,
            "objective_ms": plan.objective,
            "max_stage_compute_ms": max(plan.stage_compute_ms),
            "comm_compute_ratio": max(plan.stage_comm_ms) / max(max(plan.stage_compute_ms), 1e-12),
            "sync_iteration_ms": sync.iteration_ms,
            "sync_bubble": sync.bubble_fraction,
            "async_throughput": asy.throughput,
            "async_iteration_ms": asy.iteration_ms,
            "async_bubble": asy.bubble_fraction,
            "bytes_injected": sync.bytes_injected,
            "microbatches": m,
            "async_minibatches": m_async,
            "same_plan_sync_async": aplan.stage_of_node == plan.stage_of_node
            and aplan.device_of_stage == plan.device_of_stage,
        }
        if method == "ga":
            for tag, pl in (("sync", plan), ("async", aplan)):
                for key in (
                    "seeds_best_ms",
                    "local_best_ms",
                    "ga_best_ms",
                    "model_ms",
                    "simulated_ms",
                    "generations",
                    "improved",
                    "candidates_simulated",
                    "local_s",
                    "ga_s",
                ):
                    if key in pl.extra:
                        row[f"{tag}_{key}"] = pl.extra[key]
        rows.append(row)
    return rows


def pct(new: float, old: float) -> float:
    return 100.0 * (new - old) / old if old else 0.0


def _fmt(x: float) -> str:
    return f"{x:+.1f}"


def configs(rows: List[dict]) -> Dict[tuple, Dict[str, dict]]:
    by: Dict[tuple, Dict[str, dict]] = {}
    for r in rows:
        by.setdefault((r["profile"], r["stages"], r["bandwidth_gbps"], r.get("devices", "hom")), {})[
            r["method"]
        ] = r
    return by


def compare(rows: List[dict]) -> List[dict]:
    """The default (``ga``) against each baseline, the best baseline (per metric) and ``ga_objective``."""
    out = []
    for (prof, k, bw, dev), ms in configs(rows).items():
        ga = ms["ga"]
        best = {
            "sync_iteration_ms": min(ms[b]["sync_iteration_ms"] for b in BASELINES),
            "async_throughput": max(ms[b]["async_throughput"] for b in BASELINES),
            "bytes_injected": min(ms[b]["bytes_injected"] for b in BASELINES),
        }
        refs = {b: ms[b] for b in BASELINES + ["ga_objective"]}
        refs["best_baseline"] = best
        for base, b in refs.items():
            out.append(
                {
                    "profile": prof,
                    "stages": k,
                    "bandwidth_gbps": bw,
                    "devices": dev,
                    "baseline": base,
                    "branchy": ga["branchy"],
                    "sync_pct": pct(ga["sync_iteration_ms"], b["sync_iteration_ms"]),
                    "async_pct": pct(ga["async_throughput"], b["async_throughput"]),
                    "bytes_pct": pct(ga["bytes_injected"], b["bytes_injected"])
                    if b["bytes_injected"]
                    else 0.0,
                    "base_comm_compute_ratio": ms["layerwise"]["comm_compute_ratio"],
                }
            )
    return out


def _summary(comps: List[dict], title: str) -> List[str]:
    lines = [
        f"### The default `ga` against each reference: {title}",
        "",
        "| against | metric | thesis | median | best | worst | ga better in | ga worse in |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for base in ["best_baseline"] + BASELINES + ["ga_objective"]:
        cs = [c for c in comps if c["baseline"] == base]
        if not cs:
            continue
        for key, label, better in (
            ("sync_pct", "GPipe iteration time %", -1),
            ("async_pct", "1F1B throughput %", 1),
            ("bytes_pct", "bytes injected %", -1),
        ):
            vals = [c[key] for c in cs]
            best = min(vals) if better < 0 else max(vals)
            worst = max(vals) if better < 0 else min(vals)
            wins = sum(1 for v in vals if v * better > 1e-6)
            losses = sum(1 for v in vals if v * better < -1e-6)
            thesis = THESIS.get(key, "") if base == "layerwise" else ""
            lines.append(
                f"| {base} | {label} | {thesis} | {_fmt(statistics.median(vals))} | {_fmt(best)} | "
                f"{_fmt(worst)} | {wins}/{len(vals)} | {losses}/{len(vals)} |"
            )
    return lines + [""]


def _ablation(rows: List[dict]) -> List[str]:
    """Seeds only vs + memetic local search vs + GA, on the pipeline time (GPipe: exact simulated ms)."""
    ga = [r for r in rows if r["method"] == "ga" and "sync_seeds_best_ms" in r]
    if not ga:
        return []
    lines = [
        "### Ablation: seeds only / + memetic local search / + GA (pipeline time of the best plan)",
        "",
        "| schedule | subset | configs | LS better than seeds (median gain, max) | GA better than LS "
        "(median gain over those, max) | GA search s (median, max) |",
        "|---|---|---|---|---|---|",
    ]
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
            lines.append(
                f"| {sched} | {subset} | {len(rs)} | {len(lsw)}/{len(rs)} "
                f"({statistics.median(lsw) if lsw else 0:.2f}%, {max(lsw, default=0):.2f}%) | "
                f"{len(ggw)}/{len(rs)} ({statistics.median(ggw) if ggw else 0:.2f}%, {max(ggw, default=0):.2f}%) | "
                f"{statistics.median(ss):.2f}, {ss[-1]:.2f} |"
            )
    return lines + [""]


def _absolute(rows: List[dict]) -> List[str]:
    lines = [
        "### Absolute numbers (GPipe ms / 1F1B mini-batches per s / MB injected), per method",
        "",
        "| profile | K | Gbit/s | devices | " + " | ".join(METHODS) + " |",
        "|---|---|---|---|" + "---|" * len(METHODS),
    ]
    for (prof, k, bw, dev), ms in configs(rows).items():
        cells = [
            f"{ms[m]['sync_iteration_ms']:.1f} / {ms[m]['async_throughput']:.2f} / "
            f"{ms[m]['bytes_injected'] / 1e6:.0f}"
            for m in METHODS
        ]
        lines.append(f"| {prof} | {k} | {bw:g} | {dev} | " + " | ".join(cells) + " |")
    return lines


def tables(rows: List[dict], speed: Dict[str, float]) -> str:
    comps = compare(rows)
    lines = [
        f"Simulator speed: 1,000 micro-batches on 8 stages in {speed['gpipe']:.3f} s (GPipe), "
        f"{speed['1f1b']:.3f} s (1F1B).",
        "",
    ]
    lines += _summary(comps, "all configurations")
    lines += _summary(
        [c for c in comps if c["branchy"] and c["bandwidth_gbps"] == 10.0],
        "branchy models (Inception-v3, DenseNet-121) at 10 Gbit/s",
    )
    lines += _summary(
        [c for c in comps if c["base_comm_compute_ratio"] <= 1.0],
        "configurations where the layer-wise plan's slowest transfer is at most its slowest "
        "stage's compute (comm/compute <= 1)",
    )
    lines += _ablation(rows)
    return "\n".join(lines + _absolute(rows)) + "\n"


def figure(comps: List[dict], path: str) -> None:
    """One message: the default partition against the best baseline, per configuration (equal devices).

    Every panel is a % change where lower is better (1F1B as time per mini-batch = 1 / throughput), at
    page width (1000 px, 11 pt); no point is clipped: the axes span the data.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cs = [c for c in comps if c["baseline"] == "best_baseline" and c["devices"] == "hom"]
    bws = sorted({c["bandwidth_gbps"] for c in cs})
    ks = sorted({c["stages"] for c in cs})
    profs = list(dict.fromkeys(c["profile"] for c in cs))
    plt.rcParams.update({"font.size": 11})
    fig, axes = plt.subplots(1, 3, figsize=(10, 0.3 * len(profs) * len(ks) + 2.2), sharey=True)
    metrics = [
        ("GPipe iteration time", lambda c: c["sync_pct"]),
        ("1F1B time per mini-batch", lambda c: 100.0 * (1.0 / (1.0 + c["async_pct"] / 100.0) - 1.0)),
        ("bytes injected (not a goal)", lambda c: c["bytes_pct"]),
    ]
    labels = [f"{p.split('/')[1].replace('.fp32', '')} ({p.split('/')[0]}) K={k}" for p in profs for k in ks]
    ys = list(range(len(labels)))
    markers, colors = ["o", "s", "^", "D", "v"], ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9"]
    for ax, (title, value) in zip(axes, metrics):
        ax.axvline(0, color="black", linewidth=0.8)
        lo = hi = 0.0
        for j, bw in enumerate(bws):
            xs = []
            for p in profs:
                for k in ks:
                    c = next(
                        c for c in cs if c["profile"] == p and c["stages"] == k and c["bandwidth_gbps"] == bw
                    )
                    xs.append(value(c))
            lo, hi = min(lo, *xs), max(hi, *xs)
            ax.scatter(
                xs, ys, marker=markers[j % 5], color=colors[j % 5], s=30, label=f"{bw:g} Gbit/s", zorder=3
            )
        pad = 0.06 * (hi - lo or 1.0)
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_title(title, fontsize=11)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(ys)
    axes[0].set_yticklabels(labels, fontsize=10)
    axes[0].invert_yaxis()
    fig.supxlabel("% change of the default (ga) vs the best baseline — lower is better", fontsize=11)
    fig.suptitle(
        "The default partition is never slower than the best baseline (simulated, equal devices)", fontsize=12
    )
    fig.legend(
        *axes[0].get_legend_handles_labels(),
        loc="upper center",
        ncol=len(bws),
        fontsize=10,
        bbox_to_anchor=(0.5, 0.955),
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    plt.rcdefaults()


def main(argv):
    del argv
    try:
        ks = [int(k) for k in FLAGS.stages]
        bws = [float(b) for b in FLAGS.bandwidths_gbps]
    except ValueError as e:
        print(f"error: --stages / --bandwidths_gbps: {e}", file=sys.stderr)
        return 2
    if any(k < 1 for k in ks) or any(not b > 0 for b in bws):
        print("error: --stages must be integers >= 1 and --bandwidths_gbps numbers > 0", file=sys.stderr)
        return 2
    bad = [d for d in FLAGS.devices if d not in ("hom", "mixed")]
    if bad:
        print(f"error: --devices: unknown device mix {bad[0]!r} (hom, mixed)", file=sys.stderr)
        return 2
    speed = speed_check()
    print(
        f"simulator speed: 1000 micro-batches x 8 stages: gpipe {speed['gpipe']:.3f} s, "
        f"1f1b {speed['1f1b']:.3f} s",
        flush=True,
    )
    rows: List[dict] = []
    t0 = time.time()
    if FLAGS.from_json:
        with open(FLAGS.from_json) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    out = open(FLAGS.out_json, "w") if FLAGS.out_json and not FLAGS.from_json else None
    try:
        for name in [] if FLAGS.from_json else FLAGS.profiles:
            graph = load_graph(name)
            for k in ks:
                for dev in FLAGS.devices:
                    for bw in bws:
                        rs = run_config(graph, name, k, bw, dev)
                        rows += rs
                        if out:
                            for r in rs:
                                out.write(json.dumps(r) + "\n")
                            out.flush()
                        ms = {r["method"]: r for r in rs}
                        ga = ms["ga"]
                        best = min(ms[b]["sync_iteration_ms"] for b in BASELINES)
                        print(
                            f"{name} K={k} {dev} {bw:g} Gbit/s: ga vs best baseline sync "
                            f"{pct(ga['sync_iteration_ms'], best):+.1f}%, vs ga_objective "
                            f"{pct(ga['sync_iteration_ms'], ms['ga_objective']['sync_iteration_ms']):+.1f}% "
                            f"(ga search {ga['search_s']:.2f} s)",
                            flush=True,
                        )
    except TfCommoptError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if out:
            out.close()
    md = tables(rows, speed)
    print(md)
    print(f"total {time.time() - t0:.1f} s")
    if FLAGS.out_md:
        with open(FLAGS.out_md, "w") as f:
            f.write(md)
    if FLAGS.figure:
        figure(compare(rows), FLAGS.figure)
    return 0


if __name__ == "__main__":
    from experiments import _cli

    _cli.run(main)
