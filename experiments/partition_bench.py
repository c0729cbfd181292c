"""Benchmark every partition method on the bundled real profiles: GPipe time in the simulator, search
time, and what each part of the search adds.

Usage::

    python -m experiments.partition_bench --out_json docs/results/partition.jsonl --out_md /tmp/partition_tables.md
    python -m experiments.partition_bench --profiles=pipedream/vgg16 --stages=4 --bandwidths_gbps=10 --devices=hom

For each profile, stage count, device set (``hom``: K devices of speed 1; ``cap``: half at 0.5;
``kind`` (H200 profiles only): half bf16 / half fp32 devices using the per-kind costs) and bandwidth,
every method partitions with the planner's defaults (:func:`tf_commopt.partition.partition`: GPipe,
``M = 4 K``, plan chosen in the simulator), and the simulator gives its GPipe iteration time. Also:

* ``pipedream_dp``: PipeDream's DP as its optimizer returns it (first argmin among tied optima, the
  given device order), to show what the tie-break and device order choice add;
* ``ga_objective``: the GA scored by the additive objective (``score="objective"``);
* the ``ga`` row's ablation: the best GPipe time among the seeds alone, after the memetic local
  search, after the GA (the GPipe model is exact, so these are simulated times).
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Dict, List, Optional

from absl import flags

from tf_commopt.core.partition import baselines
from tf_commopt.core.partition.api import make_cluster
from tf_commopt.core.partition.objective import Problem
from tf_commopt.core.partition.pipemodel import PipelineModel
from tf_commopt.core.partition.synthetic import branchy_graph
from tf_commopt.core.profiles import load_profile
from tf_commopt.core.simulate import simulate_pipeline
from tf_commopt.errors import InputError
from tf_commopt.partition import partition

FLAGS = flags.FLAGS
flags.DEFINE_list(
    "profiles",
    [
        "pipedream/alexnet",
        "pipedream/vgg16",
        "pipedream/resnet50",
        "pipedream/inception_v3",
        "pipedream/gnmt",
        "h200/vgg16",
        "h200/resnet50",
        "h200/resnet101",
        "h200/inception_v3",
        "h200/densenet121",
        "h200/mobilenet_v2",
    ],
    "bundled profile names or files",
)
flags.DEFINE_list("stages", ["2", "4", "8"], "stage counts")
flags.DEFINE_list("bandwidths_gbps", ["10", "25", "100"], "link bandwidths in Gbit/s")
flags.DEFINE_alias(
    "bandwidths", "bandwidths_gbps"
)  # the other spelling (pipeline_bench and hybrid_bench say _gbps)
flags.DEFINE_list(
    "devices", ["hom", "cap", "kind"], "device sets: hom, cap (half at 0.5 speed), kind (half bf16)"
)
flags.DEFINE_integer("seed", 0, "seed for local search and the GA")
flags.DEFINE_bool("synthetic", True, "also time ga on a 2,700-node branchy graph into 8 stages")
flags.DEFINE_string("out_md", None, "write the markdown table here (default: stdout only)")
flags.DEFINE_string("out_json", None, "write every row as JSON lines here")

METHODS = ("layerwise", "balanced", "pipedream", "local", "ga")
BASELINES = ("layerwise", "balanced", "pipedream")
BRANCHY = ("inception", "densenet", "nasnet", "branchy")


def _devices(graph, K: int, which: str) -> Optional[Dict]:
    if which == "hom":
        return {}
    if which == "cap":
        return {"capacities": [1.0] * (K - K // 2) + [0.5] * (K // 2)}
    if which == "kind" and {"bf16", "fp32"} <= set(graph.kinds):
        return {"capacities": [1.0] * K, "kinds": ["bf16"] * (K - K // 2) + ["fp32"] * (K // 2)}
    return None


def run_one(name: str, graph, K: int, bw: float, which: str, dev: Dict, seed: int) -> Dict:
    M = 4 * K
    cl = make_cluster(K, dev.get("capacities"), bw, 0.0, dev.get("kinds"))
    row = {
        "profile": name,
        "nodes": len(graph),
        "stages": K,
        "devices": which,
        "bandwidth_gbps": bw,
        "microbatches": M,
        "branchy": any(b in name for b in BRANCHY),
    }

    def sim(plan) -> float:
        return simulate_pipeline(graph, plan, "gpipe", microbatches=M, cluster=cl).iteration_ms

    for m in METHODS:
        plan = partition(graph, K, method=m, bandwidth_gbps=bw, seed=seed, **dev)
        row[m] = {
            "gpipe_ms": sim(plan),
            "objective": plan.objective,
            "comm_bytes": plan.comm_bytes,
            "search_s": plan.search_s,
        }
        if m == "ga":
            row[m].update(
                {
                    k: plan.extra[k]
                    for k in (
                        "seeds_best_ms",
                        "local_best_ms",
                        "ga_best_ms",
                        "generations",
                        "improved",
                        "local_s",
                        "ga_s",
                        "candidates_simulated",
                    )
                }
            )
    plan = partition(graph, K, method="ga", bandwidth_gbps=bw, seed=seed, score="objective", **dev)
    row["ga_objective"] = {
        "gpipe_ms": sim(plan),
        "objective": plan.objective,
        "comm_bytes": plan.comm_bytes,
        "search_s": plan.search_s,
    }
    p = Problem(graph, cl, K)
    devs = p.default_devices()
    st = baselines.pipedream(p, devs, tie_break="none")
    row["pipedream_dp"] = {
        "gpipe_ms": PipelineModel(p, "gpipe", M).time(st, devs),
        "comm_bytes": p.evaluate(st, devs).comm_bytes,
    }
    best = min(row[b]["gpipe_ms"] for b in BASELINES)
    row["best_baseline_ms"] = best
    row["ga_gain_pct"] = 100.0 * (1 - row["ga"]["gpipe_ms"] / best)
    row["ga_not_slower"] = row["ga"]["gpipe_ms"] <= best * (1 + 1e-9)
    return row


COLS = METHODS + ("pipedream_dp", "ga_objective")
HEADER = (
    "| profile | K | devices | Gbit/s | "
    + " | ".join(f"{m} ms" for m in COLS)
    + " | ga s | ga vs best baseline | seeds → LS → GA ms |\n|"
    + "---|" * (4 + len(COLS) + 3)
)


def _fmt(row: Dict) -> str:
    cells = [row["profile"], str(row["stages"]), row["devices"], f"{row['bandwidth_gbps']:g}"]
    cells += [f"{row[m]['gpipe_ms']:.2f}" for m in COLS]
    ga = row["ga"]
    cells.append(f"{ga['search_s']:.2f}")
    cells.append(f"{row['ga_gain_pct']:+.1f}%")
    cells.append(f"{ga['seeds_best_ms']:.2f} → {ga['local_best_ms']:.2f} → {ga['ga_best_ms']:.2f}")
    return "| " + " | ".join(cells) + " |"


def _med(xs: List[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _summary(rows: List[Dict]) -> List[str]:
    out, n = [], len(rows)
    slower = [r for r in rows if not r["ga_not_slower"]]
    out.append(
        f"- default `ga` never slower (GPipe, simulated) than the best of layerwise/balanced/pipedream: "
        f"{n - len(slower)}/{n} configurations"
    )
    g = sorted(r["ga_gain_pct"] for r in rows)
    out.append(f"- gain over the best baseline, all: median {_med(g):.1f}%, max {g[-1]:.1f}%")
    b10 = sorted(r["ga_gain_pct"] for r in rows if r["branchy"] and r["bandwidth_gbps"] == 10)
    if b10:
        out.append(
            f"- branchy models at 10 Gbit/s ({len(b10)} configurations): median {_med(b10):.1f}%, "
            f"min {b10[0]:.1f}%, max {b10[-1]:.1f}%; >= 10% in {sum(x >= 10 for x in b10)}/{len(b10)}"
        )
    ob = sorted(100 * (1 - r["ga"]["gpipe_ms"] / r["ga_objective"]["gpipe_ms"]) for r in rows)
    out.append(
        f"- gain over ga on the additive objective (ga_objective): median {_med(ob):.1f}%, max {ob[-1]:.1f}%; "
        f"ga_objective slower than the best baseline in "
        f"{sum(r['ga_objective']['gpipe_ms'] > r['best_baseline_ms'] * (1 + 1e-9) for r in rows)}/{n}"
    )
    tb = [100 * (1 - r["pipedream"]["gpipe_ms"] / r["pipedream_dp"]["gpipe_ms"]) for r in rows]
    out.append(
        f"- `pipedream` (tie-break + device order by pipeline time) vs PipeDream's DP as returned: faster in "
        f"{sum(x > 1e-6 for x in tb)}/{n}, median {_med([x for x in tb if x > 1e-6]):.1f}% where faster, "
        f"max {max(tb):.1f}%, slower in {sum(x < -1e-6 for x in tb)}/{n}"
    )
    ls = [100 * (1 - r["ga"]["local_best_ms"] / r["ga"]["seeds_best_ms"]) for r in rows]
    ga = [100 * (1 - r["ga"]["ga_best_ms"] / r["ga"]["local_best_ms"]) for r in rows]
    for label, xs in (("memetic local search over the best seed", ls), ("GA over the local search", ga)):
        w = [x for x in xs if x > 1e-6]
        out.append(
            f"- {label}: better in {len(w)}/{n}, median {_med(w):.2f}% where better, max {max(xs):.2f}%"
        )
    bw = [r for r in rows if r["branchy"] and r["bandwidth_gbps"] == 10]
    if bw:
        w = [100 * (1 - r["ga"]["ga_best_ms"] / r["ga"]["local_best_ms"]) for r in bw]
        out.append(
            f"  - branchy at 10 Gbit/s: GA better than local search in {sum(x > 1e-6 for x in w)}/{len(w)}, "
            f"median {_med(w):.2f}%, max {max(w):.2f}%"
        )
    s = sorted(r["ga"]["search_s"] for r in rows)
    out.append(
        f"- ga search_s: median {_med(s):.2f} s, max {s[-1]:.2f} s (layerwise/balanced/pipedream: "
        f"max {max(r[b]['search_s'] for r in rows for b in BASELINES):.2f} s)"
    )
    return out


def main(argv):
    import sys

    del argv
    bad = [d for d in FLAGS.devices if d not in ("hom", "cap", "kind")]
    if bad:
        raise InputError(
            f"unknown device set(s) {', '.join(bad)}; choose from hom, cap, kind", where="--devices"
        )
    for flag, values, kind in (
        ("--stages", FLAGS.stages, int),
        ("--bandwidths_gbps", FLAGS.bandwidths_gbps, float),
    ):
        for v in values:
            try:
                if not kind(v) > 0:
                    raise ValueError
            except ValueError:
                raise InputError(
                    f"{v!r} is not a positive {'integer' if kind is int else 'number'}", where=flag
                ) from None
    graphs = [(n, load_profile(n)) for n in FLAGS.profiles]
    rows, lines = [], [HEADER]
    print(HEADER, flush=True)
    t0 = time.perf_counter()
    out = open(FLAGS.out_json, "w") if FLAGS.out_json else None
    for name, g in graphs:
        for K in (int(k) for k in FLAGS.stages):
            if K > len(g):
                print(f"note: skipped {name} K={K}: more stages than its {len(g)} nodes", file=sys.stderr)
                continue
            for which in FLAGS.devices:
                dev = _devices(g, K, which)
                if dev is None:
                    print(
                        f"note: skipped {name} K={K} devices={which}: the profile has no bf16 and fp32 kinds",
                        file=sys.stderr,
                    )
                    continue
                for bw in (float(b) for b in FLAGS.bandwidths_gbps):
                    row = run_one(name, g, K, bw, which, dev, FLAGS.seed)
                    rows.append(row)
                    lines.append(_fmt(row))
                    print(lines[-1], flush=True)
                    if out:
                        out.write(json.dumps(row) + "\n")
                        out.flush()
    summary = _summary(rows) if rows else []
    if FLAGS.synthetic:
        g = branchy_graph(2700, seed=0)
        plan = partition(g, 8, method="ga", bandwidth_gbps=10.0, seed=FLAGS.seed)
        syn = {
            "profile": "synthetic/branchy2700",
            "nodes": len(g),
            "stages": 8,
            "bandwidth_gbps": 10.0,
            "search_s": plan.search_s,
            "gpipe_ms": plan.extra["simulated_ms"],
            "seeds_best_ms": plan.extra["seeds_best_ms"],
            "local_best_ms": plan.extra["local_best_ms"],
            "ga_best_ms": plan.extra["ga_best_ms"],
        }
        if out:
            out.write(json.dumps(syn) + "\n")
        summary.append(
            f"- 2,700-node synthetic branchy graph ({len(g)} nodes) into 8 stages with ga: "
            f"search_s = {plan.search_s:.2f} s; GPipe {plan.extra['simulated_ms']:.1f} ms "
            f"(seeds {syn['seeds_best_ms']:.1f}, local search {syn['local_best_ms']:.1f}, "
            f"GA {syn['ga_best_ms']:.1f})."
        )
    if out:
        out.close()
    summary.append(f"- whole benchmark: {time.perf_counter() - t0:.0f} s wall.")
    text = "\n".join(lines) + "\n\n" + "\n".join(summary) + "\n"
    print("\n".join(summary))
    if FLAGS.out_md:
        with open(FLAGS.out_md, "w") as f:
            f.write(text)


if __name__ == "__main__":
    from experiments import _cli

    _cli.run(main)
