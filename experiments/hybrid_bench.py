"""Thesis 000, hybrid side: the grouped hybrid vs data parallel vs the capacity-proportional ideal on
heterogeneous clusters, simulated; and a small model run for real on emulated devices.

For every profile, cluster (capacities, optionally device kinds with their own per-layer costs from the
H200 profiles) and link bandwidth: the best hybrid of the joint search
(:func:`tf_commopt.core.planner.search_grouped_hybrid`: every group count G with the ``snake``
and ``contiguous`` groupings, the ``--microbatches`` counts, the ``--methods`` plans per group, and
one-group pipelines of replicated stages for the ``--replicated`` shapes; bucketed all-reduce with
``--overlap``), synchronous data parallel with an equal batch split (the thesis's SSGD), with a
capacity-proportional split, and with that split plus the same bucketed overlap (the strongest
baseline: G = N of the search), and the ideal ``1 / sum(speed)``. One JSON row per configuration.
Pure Python unless ``--keras_apps`` or ``--real`` is given.

Example:
    python -m experiments.hybrid_bench                          # the run of docs/results/hybrid.md
    python -m experiments.hybrid_bench --json --profiles=h200/resnet50 --clusters="1,1,0.5,0.5" --microbatches=4
    python -m experiments.hybrid_bench --keras_apps=MobileNetV2 --real
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from typing import Dict, List, Optional, Sequence

from absl import flags

from experiments.graphs import load_graph as _load_graph
from tf_commopt.core.costgraph import CostGraph
from tf_commopt.core.devices import Cluster, parse_capacities
from tf_commopt.core.planner import REPLICA_SHAPES, search_grouped_hybrid
from tf_commopt.core.simulate.hybrid import ideal_iteration_ms, simulate_dp
from tf_commopt.errors import InputError, TfCommoptError

PROFILES = [
    "pipedream/vgg16",
    "pipedream/resnet50",
    "pipedream/inception_v3",
    "pipedream/alexnet",
    "pipedream/gnmt",
    "h200/vgg16",
    "h200/resnet50",
    "h200/resnet101",
    "h200/inception_v3",
    "h200/densenet121",
    "h200/mobilenet_v2",
]
CLUSTERS = [
    "1,1,1,1,0.5,0.5,0.25,0.25",
    "1,1,0.7,0.7,0.4,0.4,0.4,0.2",
    "1,1,0.5,0.5",
    "1,1,1,1,1,1,0.5,0.5",
    "1,0.5,0.5,0.25",
    "bf16,bf16,tf32,tf32,fp32,fp32,fp32,fp32",
    "bf16,bf16,bf16,bf16,0.5:fp32,0.5:fp32,0.5:fp32,0.5:fp32",
]
THESIS_PCT = 21.0  # ~21% lower iteration time than synchronous data parallel on mixed clusters

FLAGS = flags.FLAGS
flags.DEFINE_list(
    "profiles", PROFILES, "bundled profile names or files (h200/<model> loads the fp32/tf32/bf16 kinds)"
)
flags.DEFINE_list(
    "keras_apps", [], "tf-keras applications to import with from_keras_model (roofline costs, batch 32)"
)
flags.DEFINE_multi_string(
    "clusters",
    CLUSTERS,
    "a cluster: comma-separated devices, each CAP, KIND or CAP:KIND "
    "(KIND = per-layer costs of the profile; clusters with kinds run on profiles that have them)",
)
flags.DEFINE_list("bandwidths_gbps", ["10", "100", "400"], "link bandwidths (Gbit/s), every pair of devices")
flags.DEFINE_float("latency_ms", 0.0, "per-message link latency (ms)")
flags.DEFINE_list("group_counts", [], "group counts G to try (default 1..N)")
flags.DEFINE_list("microbatches", ["4", "8"], "GPipe micro-batch counts tried per group per mini-batch")
flags.DEFINE_list(
    "replicated",
    list(REPLICA_SHAPES),
    "replica shapes of one-group pipelines with replicated "
    "stages to try (empty: groups of unreplicated pipelines only)",
)
flags.DEFINE_bool(
    "overlap",
    True,
    "bucketed gradient all-reduce overlapping the backward (hybrid and the proportional-DP baseline alike)",
)
flags.DEFINE_float("bucket_mb", 25.0, "gradient bucket cap (MB), as PyTorch DDP's bucket_cap_mb")
flags.DEFINE_list(
    "methods",
    ["balanced", "pipedream", "local"],
    "partition methods; each group keeps the plan whose pipeline simulates fastest",
)
flags.DEFINE_integer("seed", 0, "partitioner seed")
flags.DEFINE_bool("json", False, "print one JSON object per configuration (profile, cluster, bandwidth, G)")
flags.DEFINE_string("out_md", "", "write the markdown summary here")
flags.DEFINE_string("from_json", "", "re-make the summary from a previous --json output (no runs)")
flags.DEFINE_bool("real", False, "also run a small model for real on emulated devices (TensorFlow)")
flags.DEFINE_bool("real_only", False, "only the real run")
flags.DEFINE_list("real_capacities", ["1", "0.25"], "capacities of the emulated devices (logical CPUs)")
flags.DEFINE_float(
    "real_base_slowdown",
    1.0,
    "slow-down factor of a capacity-1 device (a device of capacity c runs base/c times slower than the CPU)",
)
flags.DEFINE_integer("real_width", 1024, "width of the MLP's Dense layers")
flags.DEFINE_integer("real_depth", 6, "Dense layers")
flags.DEFINE_integer("real_batch", 512, "global batch")
flags.DEFINE_integer("real_microbatches", 4, "micro-batches of the real pipelines")
flags.DEFINE_integer("real_groups", 1, "groups of the real grouped hybrid (snake rule)")
flags.DEFINE_bool(
    "real_exclusive",
    True,
    "GroupedHybridTrainer(exclusive_devices=...): one instruction at a time "
    "per device, as on a GPU (off: a logical CPU overlaps micro-batches and their slow-down sleeps)",
)
flags.DEFINE_enum(
    "real_sim_costs",
    "roofline",
    ["roofline", "measured"],
    "per-layer costs of the simulation: "
    "from_keras_model (FLOP roofline, exact proportions for an MLP) or profile_keras_model on /CPU:0",
)
flags.DEFINE_integer("real_repeats", 15, "timed steps per configuration (interleaved; medians)")
flags.DEFINE_integer(
    "real_intra_op_threads",
    1,
    "TensorFlow intra-op threads: 1 makes a logical CPU one core "
    "whether or not the others compute (with N devices <= cores they do not contend)",
)
flags.DEFINE_integer(
    "real_inter_op_threads",
    16,
    "TensorFlow inter-op threads (the emulated slow-down sleeps "
    "block one each; with the default 2 on this machine sleeping devices serialise)",
)


# ----------------------------------------------------------------------------- inputs
def parse_cluster(spec: str, bandwidth_gbps: float, latency_ms: float) -> Cluster:
    """``"1,1,0.5"`` or ``"bf16,0.5:fp32"`` -> Cluster (one-line InputError naming the bad item)."""
    caps: List[float] = []
    kinds: List[Optional[str]] = []
    for i, item in enumerate(t.strip() for t in spec.split(",")):
        cap, kind = 1.0, None
        parts = item.split(":")
        if len(parts) > 2 or not item:
            raise InputError(f"item {i} {item!r} must be CAP, KIND or CAP:KIND", where=f"--clusters {spec!r}")
        try:
            cap = float(parts[0])
            if len(parts) == 2:
                kind = parts[1]
        except ValueError:
            if len(parts) == 2:
                raise InputError(
                    f"item {i} {item!r}: capacity {parts[0]!r} is not a number", where=f"--clusters {spec!r}"
                ) from None
            kind = parts[0]
        if not cap > 0:
            raise InputError(f"item {i} {item!r}: capacity must be positive", where=f"--clusters {spec!r}")
        caps.append(cap)
        kinds.append(kind)
    return Cluster.from_capacities(caps, bandwidth_gbps, latency_ms, kinds=kinds if any(kinds) else None)


def load_graph(name: str) -> CostGraph:
    """See :func:`experiments.graphs.load_graph`."""
    return _load_graph(name, where="--keras_apps")


# ----------------------------------------------------------------------------- simulated
def run_config(
    graph: CostGraph, profile: str, spec: str, bw: float, counts: Sequence[int], cache: Dict
) -> List[dict]:
    """One row for ``graph`` on cluster ``spec`` at ``bw`` Gbit/s: the best hybrid of the joint search
    (:func:`search_grouped_hybrid`: every G, grouping, micro-batch count, plan; replicated one-group
    pipelines), the best G < N unreplicated groups, the best replicated pipeline, and the baselines."""
    cl = parse_cluster(spec, bw, FLAGS.latency_ms)
    for d in cl.devices:
        if d.kind is not None and d.kind not in graph.kinds:
            return []
    bucket = FLAGS.bucket_mb * 1e6
    ms = [int(m) for m in FLAGS.microbatches]
    dp = simulate_dp(graph, cl)
    dpp = simulate_dp(graph, cl, "proportional")
    dppo = simulate_dp(graph, cl, "proportional", overlap=FLAGS.overlap, bucket_bytes=bucket)
    ideal = ideal_iteration_ms(graph, cl)
    choice = search_grouped_hybrid(
        graph,
        cl,
        counts or None,
        microbatches=ms,
        method=FLAGS.methods,
        seed=FLAGS.seed,
        cache=cache,
        overlap=FLAGS.overlap,
        bucket_bytes=bucket,
        replicated=FLAGS.replicated,
    )
    best, cands = choice.result, choice.candidates
    n = len(cl)
    groups_only = [c for c in cands if c["num_groups"] < n and not c["grouping"].startswith("replicated")]
    repl = [c for c in cands if c["grouping"].startswith("replicated")]
    return [
        {
            "profile": profile,
            "cluster": spec,
            "capacities": cl.capacities,
            "kinds": [d.kind for d in cl.devices],
            "bandwidth_gbps": bw,
            "overlap": FLAGS.overlap,
            "bucket_mb": FLAGS.bucket_mb,
            "microbatches_tried": ms,
            "replica_shapes": list(FLAGS.replicated),
            "grouping": choice.plan.grouping,
            "groups": best.extra["groups"],
            "stage_devices": best.extra.get("stage_devices"),
            "num_groups": len(best.extra["groups"]),
            "microbatches": best.extra["microbatches"],
            "stage_layers": best.extra["stage_layers"],
            "batch_fractions": [round(f, 4) for f in best.extra["batch_fractions"]],
            "hybrid_iteration_ms": best.iteration_ms,
            "hybrid_bubble_fraction": best.bubble_fraction,
            "hybrid_bytes_injected": best.bytes_injected,
            "groups_only_iteration_ms": min((c["iteration_ms"] for c in groups_only), default=None),
            "replicated_iteration_ms": min((c["iteration_ms"] for c in repl), default=None),
            "data_parallel_iteration_ms": dp.iteration_ms,
            "data_parallel_proportional_iteration_ms": dpp.iteration_ms,
            "data_parallel_proportional_overlap_iteration_ms": dppo.iteration_ms,
            "data_parallel_bytes_injected": dp.bytes_injected,
            "ideal_iteration_ms": ideal,
            "candidates": len(cands),
        }
    ]


def _mean_of(rows: List[dict], f) -> float:
    return statistics.mean(f(r) for r in rows)


def pct(a: float, b: float) -> float:
    return 100.0 * (a - b) / b


def summary(rows: List[dict]) -> str:
    """Markdown: every configuration, then means per bandwidth (all figures from the rows)."""
    out = [
        "| profile | cluster | Gbit/s | best (M) | hybrid ms | DP prop.+overlap ms | DP prop. ms | DP equal ms "
        "| ideal ms | hybrid vs DP prop.+overlap | hybrid / ideal |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        what = (
            r["grouping"]
            if r["grouping"].startswith("replicated")
            else f"G={r['num_groups']} {r['grouping']}"
        )
        if r["stage_devices"]:
            what += " " + "|".join(",".join(map(str, d)) for d in r["stage_devices"][0])
        out.append(
            f"| {r['profile']} | {r['cluster']} | {r['bandwidth_gbps']:g} | {what} ({r['microbatches']}) "
            f"| {r['hybrid_iteration_ms']:.1f} | {r['data_parallel_proportional_overlap_iteration_ms']:.1f} "
            f"| {r['data_parallel_proportional_iteration_ms']:.1f} | {r['data_parallel_iteration_ms']:.1f} "
            f"| {r['ideal_iteration_ms']:.1f} "
            f"| {pct(r['hybrid_iteration_ms'], r['data_parallel_proportional_overlap_iteration_ms']):+.1f}% "
            f"| {r['hybrid_iteration_ms'] / r['ideal_iteration_ms']:.2f} |"
        )
    out += [
        "",
        "| bandwidth | configs | mean hybrid vs DP prop.+overlap | configs >1% faster | best gain "
        "| mean hybrid / ideal | within 1.6x ideal | DP prop.+overlap within 1.6x | mean hybrid vs DP equal "
        "| mean groups-only vs DP prop.+overlap | mean replicated vs DP prop.+overlap |",
        "|" + "---|" * 11,
    ]
    for bw in sorted({r["bandwidth_gbps"] for r in rows}) + [None]:
        sel = [r for r in rows if bw is None or r["bandwidth_gbps"] == bw]
        if not sel:
            continue
        m = functools.partial(_mean_of, sel)
        base = "data_parallel_proportional_overlap_iteration_ms"
        gains = [pct(r["hybrid_iteration_ms"], r[base]) for r in sel]
        go = [pct(r["groups_only_iteration_ms"], r[base]) for r in sel if r["groups_only_iteration_ms"]]
        rp = [pct(r["replicated_iteration_ms"], r[base]) for r in sel if r["replicated_iteration_ms"]]
        out.append(
            f"| {'all' if bw is None else f'{bw:g} Gbit/s'} | {len(sel)} | {statistics.mean(gains):+.1f}% "
            f"| {sum(x < -1 for x in gains)} | {min(gains):+.1f}% "
            f"| {m(lambda r: r['hybrid_iteration_ms'] / r['ideal_iteration_ms']):.2f} "
            f"| {sum(r['hybrid_iteration_ms'] <= 1.6 * r['ideal_iteration_ms'] for r in sel)} "
            f"| {sum(r[base] <= 1.6 * r['ideal_iteration_ms'] for r in sel)} "
            f"| {m(lambda r: pct(r['hybrid_iteration_ms'], r['data_parallel_iteration_ms'])):+.1f}% "
            f"| {statistics.mean(go) if go else float('nan'):+.1f}% "
            f"| {statistics.mean(rp) if rp else float('nan'):+.1f}% |"
        )
    return "\n".join(out)


# ----------------------------------------------------------------------------- main
def _check_kinds(graphs: Dict[str, CostGraph]) -> None:
    """A cluster whose device kinds no profile has would be skipped silently: a one-line error instead."""
    for spec in FLAGS.clusters:
        wanted = {d.kind for d in parse_cluster(spec, 10.0, 0.0).devices if d.kind is not None}
        if graphs and wanted and not any(wanted <= set(g.kinds) for g in graphs.values()):
            have = sorted({k for g in graphs.values() for k in g.kinds}) or ["none"]
            raise InputError(
                f"kind(s) {', '.join(sorted(wanted))} in none of the profiles (their kinds: "
                f"{', '.join(have)}); a device is CAP, KIND or CAP:KIND",
                where=f"--clusters {spec!r}",
            )


def _simulated_rows(names: List[str], bws: List[float], counts: List[int]) -> List[dict]:
    """Every profile x cluster x bandwidth, printed as it comes (JSON lines with ``--json``)."""
    rows: List[dict] = []
    cache: Dict = {}
    graphs = {name: load_graph(name) for name in names}
    _check_kinds(graphs)
    for name in names:
        for spec in FLAGS.clusters:
            for bw in bws:
                rs = run_config(graphs[name], name, spec, bw, counts, cache)
                rows += rs
                for r in rs if FLAGS.json else rs[:1]:
                    print(
                        json.dumps(r)
                        if FLAGS.json
                        else f"{name} [{spec}] {bw:g} Gbit/s: best {r['grouping']} G={r['num_groups']} hybrid "
                        f"{r['hybrid_iteration_ms']:.1f} ms, DP prop.+overlap "
                        f"{r['data_parallel_proportional_overlap_iteration_ms']:.1f}, DP equal "
                        f"{r['data_parallel_iteration_ms']:.1f}, ideal {r['ideal_iteration_ms']:.1f}",
                        flush=True,
                    )
    return rows


def _real_row() -> None:
    """``--real``: the emulated-device run next to its simulation (:mod:`experiments.hybrid_real`)."""
    from experiments.hybrid_real import real_vs_sim

    caps = parse_capacities(",".join(FLAGS.real_capacities), where="--real_capacities")
    real = real_vs_sim(
        caps,
        FLAGS.real_base_slowdown,
        FLAGS.real_width,
        FLAGS.real_depth,
        FLAGS.real_batch,
        FLAGS.real_microbatches,
        FLAGS.real_repeats,
        FLAGS.real_groups,
        inter_op_threads=FLAGS.real_inter_op_threads,
        intra_op_threads=FLAGS.real_intra_op_threads,
        exclusive=FLAGS.real_exclusive,
        sim_costs=FLAGS.real_sim_costs,
    )
    real["kind"] = "real"
    print(
        json.dumps(real)
        if FLAGS.json
        else f"real (emulated {caps}): hybrid/DP measured {real['real_ratio_hybrid']:.3f} simulated "
        f"{real['sim_ratio_hybrid']:.3f}; DP prop./DP measured "
        f"{real['real_ratio_data_parallel_proportional']:.3f} simulated "
        f"{real['sim_ratio_data_parallel_proportional']:.3f}; medians {real['real_ms']}",
        flush=True,
    )


def main(argv):
    del argv
    try:
        bws = [float(b) for b in FLAGS.bandwidths_gbps]
        counts = [int(g) for g in FLAGS.group_counts]
        if any(int(m) < 1 for m in FLAGS.microbatches):
            raise ValueError("micro-batch counts must be positive")
    except ValueError as e:
        print(f"error: --bandwidths_gbps / --group_counts / --microbatches: {e}", file=sys.stderr)
        return 2
    rows: List[dict] = []
    t0 = time.time()
    try:
        for spec in FLAGS.clusters:
            parse_cluster(spec, 10.0, 0.0)  # bad specs fail before any work
        if FLAGS.from_json:
            with open(FLAGS.from_json) as f:
                rows = [json.loads(line) for line in f if line.startswith("{") and '"kind"' not in line]
        if not (FLAGS.real_only or FLAGS.from_json):
            names = list(FLAGS.profiles) + [f"keras/{a}" for a in FLAGS.keras_apps]
            rows += _simulated_rows(names, bws, counts)
        if FLAGS.real or FLAGS.real_only:
            _real_row()
    except TfCommoptError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if rows and not FLAGS.json:
        print(summary(rows))
        print(f"({time.time() - t0:.0f} s)")
    if FLAGS.out_md and rows:
        with open(FLAGS.out_md, "w") as f:
            f.write(summary(rows) + "\n")
    return 0


if __name__ == "__main__":
    from experiments import _cli

    _cli.run(main)
