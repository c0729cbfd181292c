"""Thesis 000, partitioning side: ``ga`` against ``layerwise``, ``balanced`` and ``pipedream`` plans,
measured in the discrete-event simulator on real per-layer profiles.

For every profile, stage count and bandwidth: partition with each method (search time recorded), then
simulate

* the synchronous pipeline (GPipe, ``M = microbatches_per_stage * K`` micro-batches per mini-batch, each
  1/M of the profiled mini-batch): iteration time;
* the asynchronous pipeline (PipeDream 1F1B with weight stashing, every micro-batch a full profiled
  mini-batch, ``async_minibatches_per_stage * K`` streamed): steady-state throughput;
* bytes injected into the network per mini-batch (activations forward + gradients back, hop by hop).

and reports GA's percentage change against each baseline next to the thesis figures (5-19% shorter
synchronous iterations, up to 15% higher asynchronous efficiency, up to 35% less traffic than
layer-wise pipelining). Pure Python (no TensorFlow).

Example:
    python -m experiments.pipeline_bench                      # the full run of docs/results/pipeline.md
    python -m experiments.pipeline_bench --profiles=pipedream/vgg16 --stages=4 --bandwidths_gbps=10
    python -m experiments.pipeline_bench --score=simulated    # ga re-ranked by the simulator

With ``--score=simulated`` the ``ga`` plan is ``partition(..., score="simulated")`` for GPipe (sync numbers,
bytes) and again for 1F1B (async numbers); ``search_s`` is the GPipe call's.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Dict, List

from absl import app, flags

from experiments.graphs import load_graph as _load_graph
from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.core.partition.plan import PartitionPlan
from tf_commopt.core.profiles import load_profile
from tf_commopt.core.simulate import simulate_pipeline
from tf_commopt.errors import InputError, TfCommoptError

try:  # the public entry point (interfaces); the core module until it lands
    from tf_commopt.partition import partition
except ImportError:  # pragma: no cover
    from tf_commopt.core.partition.api import partition

PROFILES = ["pipedream/vgg16", "pipedream/resnet50", "pipedream/inception_v3", "pipedream/gnmt",
            "h200/vgg16.fp32", "h200/resnet50.fp32", "h200/resnet101.fp32", "h200/inception_v3.fp32",
            "h200/densenet121.fp32", "h200/mobilenet_v2.fp32",
            "keras/MobileNetV2", "keras/ResNet50", "keras/InceptionV3", "keras/DenseNet121"]
BASELINES = ["layerwise", "balanced", "pipedream"]
THESIS = {"sync_pct": "-5 to -19 (shorter)", "async_pct": "up to +15", "bytes_pct": "up to -35"}

FLAGS = flags.FLAGS
flags.DEFINE_list("profiles", PROFILES, "bundled profile names, files, or keras/<Application>")
flags.DEFINE_list("stages", ["4", "8"], "pipeline stage counts")
flags.DEFINE_list("bandwidths_gbps", ["1", "10", "100"], "link bandwidths (Gbit/s)")
flags.DEFINE_float("latency_ms", 0.0, "per-message link latency (ms)")
flags.DEFINE_integer("microbatches_per_stage", 4, "GPipe micro-batches per mini-batch = this * stages")
flags.DEFINE_integer("async_minibatches_per_stage", 8, "1F1B mini-batches streamed = this * stages")
flags.DEFINE_integer("seed", 0, "GA / local-search seed")
flags.DEFINE_enum("score", "objective", ["objective", "simulated"],
                  "how ga picks its plan: the partitioner objective, or re-ranked in the simulator (the GPipe "
                  "numbers use the plan re-ranked for GPipe, the 1F1B numbers the plan re-ranked for 1F1B)")
flags.DEFINE_string("out_json", "", "write one JSON object per (profile, stages, bandwidth, method) here")
flags.DEFINE_string("out_md", "", "write the markdown tables here")
flags.DEFINE_string("figure", "", "write the summary figure (PNG) here")
flags.DEFINE_string("from_json", "", "re-make the tables and figure from a previous --out_json (no runs)")


def speed_check() -> Dict[str, float]:
    """Seconds to simulate 1,000 micro-batches on 8 stages (GPipe and 1F1B), with communication."""
    p = 8
    g = CostGraph([Node(f"n{i}", 1.0 + 0.1 * i, 2.0, activation_bytes=1e6) for i in range(p)],
                  [(f"n{i}", f"n{i + 1}") for i in range(p - 1)])
    plan = PartitionPlan("speed", {f"n{i}": i for i in range(p)}, list(range(p)), [0.0] * p, [0.0] * p,
                         [0.0] * p, 0.0, 0.0)
    out = {}
    for sched in ("gpipe", "1f1b"):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            simulate_pipeline(g, plan, sched, microbatches=1000)
            best = min(best, time.perf_counter() - t0)
        out[sched] = best
    return out


def load_graph(name: str) -> CostGraph:
    """See :func:`experiments.graphs.load_graph`."""
    return _load_graph(name, where="--profiles")


def run_config(graph, name: str, k: int, bw: float) -> List[dict]:
    rows = []
    m = FLAGS.microbatches_per_stage * k
    m_async = FLAGS.async_minibatches_per_stage * k
    for method in BASELINES + ["ga"]:
        score = FLAGS.score if method == "ga" else "objective"
        plan = partition(graph, k, method=method, bandwidth_gbps=bw, latency_ms=FLAGS.latency_ms, seed=FLAGS.seed,
                         score=score, schedule="gpipe", microbatches=m)
        aplan = plan
        if score == "simulated":  # same search, re-ranked for the asynchronous schedule
            aplan = partition(graph, k, method=method, bandwidth_gbps=bw, latency_ms=FLAGS.latency_ms,
                              seed=FLAGS.seed, score=score, schedule="1f1b", microbatches=m_async)
        sync = simulate_pipeline(graph, plan, "gpipe", microbatches=m, bandwidth_gbps=bw, latency_ms=FLAGS.latency_ms)
        asy = simulate_pipeline(graph, aplan, "1f1b", microbatches=m_async,
                                bandwidth_gbps=bw, latency_ms=FLAGS.latency_ms)
        rows.append({
            "profile": name, "stages": k, "bandwidth_gbps": bw, "method": method,
            "search_s": plan.search_s, "objective_ms": plan.objective, "max_stage_compute_ms": max(plan.stage_compute_ms),
            "comm_compute_ratio": max(plan.stage_comm_ms) / max(plan.stage_compute_ms),
            # overlap-aware bound: a device computes while its links send, one transfer per direction
            "overlap_bound_ms": max(max(plan.stage_compute_ms), max(plan.stage_comm_ms) / 2.0),
            "busy_stages": sum(1 for c in plan.stage_compute_ms if c > 0.05 * max(plan.stage_compute_ms)),
            "sync_iteration_ms": sync.iteration_ms, "sync_bubble": sync.bubble_fraction,
            "async_throughput": asy.throughput, "async_iteration_ms": asy.iteration_ms,
            "async_bubble": asy.bubble_fraction, "bytes_injected": sync.bytes_injected,
            "microbatches": m, "score": score,
            "same_plan_sync_async": aplan.stage_of_node == plan.stage_of_node
            and aplan.device_of_stage == plan.device_of_stage,
        })
    return rows


def pct(new: float, old: float) -> float:
    return 100.0 * (new - old) / old if old else 0.0


def compare(rows: List[dict]) -> List[dict]:
    """GA's % change against each baseline, per configuration."""
    by = {}
    for r in rows:
        by.setdefault((r["profile"], r["stages"], r["bandwidth_gbps"]), {})[r["method"]] = r
    out = []
    for (prof, k, bw), ms in by.items():
        ga = ms["ga"]
        for base in BASELINES:
            b = ms[base]
            out.append({
                "profile": prof, "stages": k, "bandwidth_gbps": bw, "baseline": base,
                "sync_pct": pct(ga["sync_iteration_ms"], b["sync_iteration_ms"]),
                "async_pct": pct(ga["async_throughput"], b["async_throughput"]),
                "bytes_pct": pct(ga["bytes_injected"], b["bytes_injected"]) if b["bytes_injected"] else 0.0,
                "objective_pct": pct(ga["objective_ms"], b["objective_ms"]),
                "ga_search_s": ga["search_s"], "base_search_s": b["search_s"],
                "base_comm_compute_ratio": b["comm_compute_ratio"], "ga_busy_stages": ga["busy_stages"],
            })
    return out


def _fmt(x: float) -> str:
    return f"{x:+.1f}"


def tables(rows: List[dict], comps: List[dict], speed: Dict[str, float]) -> str:
    lines = [f"Simulator speed: 1,000 micro-batches on 8 stages in {speed['gpipe']:.3f} s (GPipe), "
             f"{speed['1f1b']:.3f} s (1F1B).", ""]
    lines += _model_fit(rows)
    lines += _summary(comps, "all configurations")
    lines += _summary([c for c in comps if c["base_comm_compute_ratio"] <= 1.0],
                      "configurations where the baseline's slowest transfer is at most its slowest stage's "
                      "compute (comm/compute <= 1)")
    lines += ["### GA against layer-wise, per configuration", "",
              "comm/compute: the layer-wise plan's largest per-stage communication (activations out + "
              "gradients back) over its largest stage compute. busy: GA stages with > 5% of the largest "
              "stage's compute.", "",
              "| profile | K | Gbit/s | comm/compute | sync iter % | async thr % | bytes % | objective % | "
              "GA busy stages | GA search s |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for c in comps:
        if c["baseline"] != "layerwise":
            continue
        lines.append(f"| {c['profile']} | {c['stages']} | {c['bandwidth_gbps']:g} | "
                     f"{c['base_comm_compute_ratio']:.2f} | {_fmt(c['sync_pct'])} | "
                     f"{_fmt(c['async_pct'])} | {_fmt(c['bytes_pct'])} | {_fmt(c['objective_pct'])} | "
                     f"{c['ga_busy_stages']}/{c['stages']} | {c['ga_search_s']:.2f} |")
    return "\n".join(lines + _absolute(rows)) + "\n"


def _model_fit(rows: List[dict]) -> List[str]:
    """How well the partitioner's objective (and an overlap-aware bound) predict the simulated
    asynchronous time per mini-batch."""
    rs = [r for r in rows if "overlap_bound_ms" in r]
    if not rs:
        return []

    def err(key: str) -> float:
        return statistics.median(abs(r[key] - r["async_iteration_ms"]) / r["async_iteration_ms"] for r in rs)

    def rank_agree(key: str) -> str:
        by: Dict[tuple, List[dict]] = {}
        for r in rs:
            by.setdefault((r["profile"], r["stages"], r["bandwidth_gbps"]), []).append(r)
        same = sum(1 for group in by.values()
                   if min(group, key=lambda r: r[key])["method"] == min(group, key=lambda r: r["async_iteration_ms"])["method"])
        return f"{same}/{len(by)}"

    return ["### How well each cost model predicts the simulated 1F1B time per mini-batch", "",
            "| model | median relative error | picks the simulated-best method in |", "|---|---|---|",
            f"| partitioner objective: max_s compute + 2 transfer | {100 * err('objective_ms'):.1f}% | "
            f"{rank_agree('objective_ms')} |",
            f"| overlap-aware: max(max_s compute, max_h transfer) | {100 * err('overlap_bound_ms'):.1f}% | "
            f"{rank_agree('overlap_bound_ms')} |", ""]


def _summary(comps: List[dict], title: str) -> List[str]:
    lines = [f"### GA's change against each baseline: {title}", "",
             "| baseline | metric | thesis | median | best | worst | GA better in |",
             "|---|---|---|---|---|---|---|"]
    for base in BASELINES:
        cs = [c for c in comps if c["baseline"] == base]
        if not cs:
            continue
        for key, label, better in (("sync_pct", "sync iteration time %", -1), ("async_pct", "async throughput %", 1),
                                   ("bytes_pct", "bytes injected %", -1), ("objective_pct", "partitioner objective %", -1)):
            vals = [c[key] for c in cs]
            best = min(vals) if better < 0 else max(vals)
            worst = max(vals) if better < 0 else min(vals)
            wins = sum(1 for v in vals if v * better > 1e-9)
            thesis = THESIS.get(key, "") if base == "layerwise" else ""
            lines.append(f"| {base} | {label} | {thesis} | {_fmt(statistics.median(vals))} | {_fmt(best)} | "
                         f"{_fmt(worst)} | {wins}/{len(vals)} |")
    return lines + [""]


def _absolute(rows: List[dict]) -> List[str]:
    lines = ["", "### Absolute numbers (sync ms / async mini-batches per s / MB injected), per method", "",
              "| profile | K | Gbit/s | " + " | ".join(BASELINES + ["ga"]) + " |",
              "|---|---|---|" + "---|" * (len(BASELINES) + 1)]
    by = {}
    for r in rows:
        by.setdefault((r["profile"], r["stages"], r["bandwidth_gbps"]), {})[r["method"]] = r
    for (prof, k, bw), ms in by.items():
        cells = [f"{ms[m]['sync_iteration_ms']:.1f} / {ms[m]['async_throughput']:.2f} / "
                 f"{ms[m]['bytes_injected'] / 1e6:.0f}" for m in BASELINES + ["ga"]]
        lines.append(f"| {prof} | {k} | {bw:g} | " + " | ".join(cells) + " |")
    return lines


def figure(comps: List[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cs = [c for c in comps if c["baseline"] == "layerwise"]
    bws = sorted({c["bandwidth_gbps"] for c in cs})
    ks = sorted({c["stages"] for c in cs})
    profs = list(dict.fromkeys(c["profile"] for c in cs))
    fig, axes = plt.subplots(1, 3, figsize=(15, 0.32 * len(profs) * len(ks) + 2.5), sharey=True)
    metrics = [("sync_pct", "sync (GPipe) iteration time, % change", (-19, -5)),
               ("async_pct", "async (1F1B) throughput, % change", (0, 15)),
               ("bytes_pct", "bytes injected, % change", (-35, 0))]
    labels = [f"{p} K={k}" for p in profs for k in ks]
    ys = list(range(len(labels)))
    markers = ["o", "s", "^", "D", "v"]
    for ax, (key, title, band) in zip(axes, metrics):
        ax.axvspan(*band, color="#ddd", zorder=0, label="thesis range")
        ax.axvline(0, color="black", linewidth=0.8)
        for j, bw in enumerate(bws):
            xs = []
            for p in profs:
                for k in ks:
                    c = next(c for c in cs if c["profile"] == p and c["stages"] == k and c["bandwidth_gbps"] == bw)
                    xs.append(max(-100, min(100, c[key])))
            ax.scatter(xs, ys, marker=markers[j % len(markers)], s=22, label=f"{bw:g} Gbit/s", zorder=3)
        ax.set_title(title, fontsize=10)
        ax.set_xlim(-106, 106)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(ys)
    axes[0].set_yticklabels(labels, fontsize=7)
    axes[0].invert_yaxis()
    axes[2].legend(fontsize=7, loc="lower right")
    fig.suptitle("GA partitions against layer-wise pipelining (simulated; values clipped to +-100%)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv):
    del argv
    try:
        ks = [int(k) for k in FLAGS.stages]
        bws = [float(b) for b in FLAGS.bandwidths_gbps]
    except ValueError as e:
        print(f"error: --stages / --bandwidths_gbps: {e}", file=sys.stderr)
        return 2
    speed = speed_check()
    print(f"simulator speed: 1000 micro-batches x 8 stages: gpipe {speed['gpipe']:.3f} s, "
          f"1f1b {speed['1f1b']:.3f} s", flush=True)
    rows: List[dict] = []
    t0 = time.time()
    if FLAGS.from_json:
        with open(FLAGS.from_json) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    try:
        for name in ([] if FLAGS.from_json else FLAGS.profiles):
            graph = load_graph(name)
            for k in ks:
                for bw in bws:
                    rs = run_config(graph, name, k, bw)
                    rows += rs
                    ga = rs[-1]
                    lw = rs[0]
                    print(f"{name} K={k} {bw:g} Gbit/s: ga vs layerwise sync "
                          f"{pct(ga['sync_iteration_ms'], lw['sync_iteration_ms']):+.1f}% async "
                          f"{pct(ga['async_throughput'], lw['async_throughput']):+.1f}% bytes "
                          f"{pct(ga['bytes_injected'], lw['bytes_injected']) if lw['bytes_injected'] else 0:+.1f}% "
                          f"(ga search {ga['search_s']:.2f} s)", flush=True)
    except TfCommoptError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    comps = compare(rows)
    md = tables(rows, comps, speed)
    print(md)
    print(f"total {time.time() - t0:.1f} s")
    if FLAGS.out_json and not FLAGS.from_json:
        with open(FLAGS.out_json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    if FLAGS.out_md:
        with open(FLAGS.out_md, "w") as f:
            f.write(md)
    if FLAGS.figure:
        figure(comps, FLAGS.figure)
    return 0


if __name__ == "__main__":
    app.run(main)
