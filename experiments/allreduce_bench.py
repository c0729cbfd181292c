"""All-reduce efficiency of MultiWorkerMirroredStrategy vs the ring bound, per CommunicationOptions setting.

Launches ``--workers`` processes on a shaped network (``tf_commopt.cluster.run_cluster``, ``--topology``,
``--bandwidth_mbit``) that all run this file with ``--worker``. Every worker holds B = ``--megabytes`` MB of
float32 and all-reduces it (SUM, replica context, ``ReplicaContext.all_reduce(..., options=...)`` — the
same ``CollectiveAllReduce._all_reduce`` / ``batch_all_reduce`` path SkipCorrectStrategy's fused sync
takes) once per setting per repeat. Settings are ``impl:pack:chunks``:

* ``impl``: ``auto`` or ``ring`` (``tf.distribute.experimental.CommunicationImplementation``);
* ``pack``: ``bytes_per_pack`` (``0``, or bytes with a ``K``/``M`` suffix, 1 M = 2**20 bytes);
* ``chunks``: the buffer is passed as this many equal tensors (1 = one buffer). TF groups them into packs
  of at least ``bytes_per_pack`` (0 = one pack) and runs one collective per pack, in order.

The settings run interleaved: before every timed all-reduce the workers meet in a one-float all-reduce,
then idle ``--idle_s`` (the idle local steps before a sync; the token bucket refills), then time it. The
order of the settings is shuffled per repeat with the same seed on every worker. A repeat's time is the
slowest worker's (the all-reduce is done when every rank holds the sum); the table reports the median
over repeats, the spread, and the ratio to the ring bound (``tf_commopt.core.scaling.ring_allreduce_s``):

* shared: one segment carries every rank's 2(N-1)/N x B:  T >= 2(N-1) x B x 8 / rate
* switch: each rank's own link carries 2(N-1)/N x B:       T >= 2(N-1)/N x B x 8 / rate

Example:
    python -m experiments.allreduce_bench --workers=4 --topology=shared --bandwidth_mbit=1000 \\
        --megabytes=40 --out=docs/results/allreduce.md
    python -m experiments.allreduce_bench --workers=2 --topology=switch --bandwidth_mbit=10 \\
        --megabytes=0.40708 --repeats=9 --out=docs/results/allreduce.md
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import sys
import time
from typing import Any, Dict, List, Sequence

from absl import flags  # noqa: E402

from tf_commopt.errors import InputError  # noqa: E402

DEFAULT_SETTINGS = ["auto:0:1", "ring:0:1", "auto:0:8", "auto:4M:8", "auto:16M:8", "auto:1M:32"]
IMPLEMENTATIONS = ("auto", "ring")
TOPOLOGIES = ("switch", "shared")
PROG = "allreduce_bench"

FLAGS = flags.FLAGS
flags.DEFINE_bool("worker", False, "internal: run one worker (under TF_CONFIG)")
flags.DEFINE_integer("workers", 4, "worker processes (>= 2)")
flags.DEFINE_string("topology", "shared", "switch (a shaped link per worker) or shared (one shaped segment)")
flags.DEFINE_float("bandwidth_mbit", 1000.0, "cap in Mbit/s (tc tbf, see tf_commopt.cluster)")
flags.DEFINE_float("megabytes", 40.0, "all-reduce payload per worker in MB (1e6 bytes) of float32")
flags.DEFINE_list("settings", DEFAULT_SETTINGS, "impl:bytes_per_pack:chunks entries, e.g. auto:4M:8")
flags.DEFINE_integer("repeats", 5, "timed all-reduces per setting")
flags.DEFINE_float("idle_s", 0.2, "idle seconds between the barrier and each timed all-reduce")
flags.DEFINE_bool(
    "barrier",
    True,
    "meet in a one-float all-reduce and idle --idle_s before each timed all-reduce "
    "(--nobarrier: back to back, like experiments.train's time_allreduce; ranks may start skewed)",
)
flags.DEFINE_integer("seed", 0, "seed of the per-repeat order of the settings")
flags.DEFINE_float("timeout", 1200.0, "kill the cluster after this many seconds")
flags.DEFINE_integer(
    "tbf_burst", 0, "comparison only: tbf burst in bytes instead of the launcher's (0 = its own)"
)
flags.DEFINE_integer(
    "tbf_limit", 0, "comparison only: tbf limit in bytes instead of the launcher's (0 = its own)"
)
flags.DEFINE_bool(
    "slow_start_after_idle",
    True,
    "TCP restarts slow start after idle (the kernel's and the launcher's "
    "default); --noslow_start_after_idle sets net.ipv4.tcp_slow_start_after_idle=0 in every namespace",
)
flags.DEFINE_string("out", "", "append the result to OUT's .jsonl and rewrite the OUT page (markdown)")


# --------------------------------------------------------------------------------------------- settings
def parse_size(text: str) -> int:
    """``'0'`` -> 0, ``'64K'`` -> 65536, ``'4M'`` -> 4194304, ``'1000'`` -> 1000 (bytes).

    >>> parse_size("4M"), parse_size("64k"), parse_size("0")
    (4194304, 65536, 0)
    """
    t = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    num = t[:-1] if mult > 1 else t
    try:
        v = float(num)
    except ValueError:
        raise InputError(f"bad size {text!r} (bytes, or a number with K/M/G)") from None
    if not (math.isfinite(v) and v >= 0):
        raise InputError(f"bad size {text!r}: must be >= 0")
    return int(v * mult)


def parse_setting(text: str) -> Dict[str, Any]:
    """``'auto:4M:8'`` -> ``{"name": "auto:4M:8", "impl": "auto", "bytes_per_pack": 4194304, "chunks": 8}``.

    >>> parse_setting("ring:0:1")["impl"], parse_setting("auto:16M:8")["bytes_per_pack"]
    ('ring', 16777216)
    """
    parts = text.strip().split(":")
    if len(parts) != 3:
        raise InputError(
            f"expected impl:bytes_per_pack:chunks (e.g. auto:4M:8), got {text!r}", where="--settings"
        )
    impl, pack, chunks = parts
    if impl.lower() not in IMPLEMENTATIONS:
        raise InputError(
            f"unknown implementation {impl!r} in {text!r}; choose {' or '.join(IMPLEMENTATIONS)}"
            " (NCCL needs GPUs)",
            where="--settings",
        )
    try:
        nbytes = parse_size(pack)
    except InputError as e:
        raise InputError(f"{e} in {text!r}", where="--settings") from None
    if not chunks.isdigit() or int(chunks) < 1:
        raise InputError(f"chunks must be an integer >= 1, got {chunks!r} in {text!r}", where="--settings")
    return {"name": text.strip(), "impl": impl.lower(), "bytes_per_pack": nbytes, "chunks": int(chunks)}


def ring_bound_s(nbytes: float, workers: int, bandwidth_mbit: float, topology: str) -> float:
    """Seconds a ring all-reduce of ``nbytes`` needs at least (payload bytes only; see module docstring).

    >>> round(ring_bound_s(40e6, 4, 1000, "shared"), 3), round(ring_bound_s(4e6, 2, 50, "switch"), 3)
    (1.92, 0.64)
    """
    from tf_commopt.core.scaling import ring_allreduce_s

    return ring_allreduce_s(nbytes, workers, bandwidth_mbit, topology=topology)


def validate_flags() -> List[Dict[str, Any]]:
    """The parsed settings; InputError naming the flag for any bad value."""
    if FLAGS.workers < 2:
        raise InputError(f"must be an integer >= 2, got {FLAGS.workers}", where="--workers")
    if FLAGS.topology not in TOPOLOGIES:
        raise InputError(f"unknown topology {FLAGS.topology!r}; choose switch or shared", where="--topology")
    for name in ("bandwidth_mbit", "megabytes", "timeout"):
        v = getattr(FLAGS, name)
        if not (math.isfinite(v) and v > 0):
            raise InputError(f"must be a number > 0, got {v!r}", where=f"--{name}")
    if FLAGS.repeats < 1:
        raise InputError(f"must be an integer >= 1, got {FLAGS.repeats}", where="--repeats")
    if not (math.isfinite(FLAGS.idle_s) and FLAGS.idle_s >= 0):
        raise InputError(f"must be a number >= 0, got {FLAGS.idle_s!r}", where="--idle_s")
    if not FLAGS.settings:
        raise InputError("give at least one setting", where="--settings")
    settings = [parse_setting(s) for s in FLAGS.settings]
    names = [s["name"] for s in settings]
    if len(set(names)) != len(names):
        raise InputError(f"duplicate setting in {names}", where="--settings")
    n = int(FLAGS.megabytes * 1e6 / 4)
    if n < max(s["chunks"] for s in settings):
        raise InputError(f"{FLAGS.megabytes:g} MB is fewer float32 values than chunks", where="--megabytes")
    for name in ("tbf_burst", "tbf_limit"):
        if getattr(FLAGS, name) < 0:
            raise InputError(f"must be bytes >= 0, got {getattr(FLAGS, name)}", where=f"--{name}")
    if FLAGS.out and os.path.isdir(FLAGS.out):
        raise InputError(
            f"{FLAGS.out!r} is a directory; give a page path like docs/results/allreduce.md", where="--out"
        )
    return settings


# ----------------------------------------------------------------------------------------------- worker
def worker(settings: Sequence[Dict[str, Any]]) -> None:
    """One worker: time every setting ``--repeats`` times, print one JSON line of its times."""
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ranks = strategy.num_replicas_in_sync
    rank = strategy.cluster_resolver.task_id
    n = int(FLAGS.megabytes * 1e6 / 4)
    expect = ranks * (ranks + 1) / 2  # each rank contributes rank + 1
    impls = {
        "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
        "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    }
    with tf.device("/cpu:0"):
        full = tf.fill([n], tf.constant(rank + 1, tf.float32))
        one = tf.ones([1])

    def make(s: Dict[str, Any]):
        opts = tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=s["bytes_per_pack"], implementation=impls[s["impl"]]
        )
        with tf.device("/cpu:0"):
            sizes = [len(a) for a in np.array_split(np.arange(n), s["chunks"])]
            parts = tf.split(full, sizes) if s["chunks"] > 1 else [full]

        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            out = ctx.all_reduce(tf.distribute.ReduceOp.SUM, list(parts), options=opts)
            return tf.stack([out[0][0], out[-1][-1]])

        @tf.function
        def step():
            return strategy.run(replica_fn)

        return step

    @tf.function
    def barrier():
        return strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, one)
        )

    steps = {s["name"]: make(s) for s in settings}

    tcp: Dict[str, List[Dict[str, int]]] = {name: [] for name in steps}

    def timed(name: str, record: bool = True) -> float:
        if FLAGS.barrier:
            barrier()
            time.sleep(FLAGS.idle_s)
        before = tcp_counters()
        t = time.perf_counter()
        got = strategy.experimental_local_results(steps[name]())[0].numpy()
        dt = time.perf_counter() - t
        after = tcp_counters()
        if record:
            tcp[name].append({k: after[k] - before.get(k, 0) for k in after})
        if not np.all(got == expect):  # the reduce really happened, over every rank
            raise RuntimeError(f"{name}: all-reduce returned {got.tolist()}, expected {expect}")
        return dt

    warm = {name: timed(name, record=False) for name in steps}  # trace, set up the collective groups
    rng = random.Random(FLAGS.seed)
    times: Dict[str, List[float]] = {name: [] for name in steps}
    order_log = []
    for _ in range(FLAGS.repeats):
        order = list(steps)
        rng.shuffle(order)  # same seed on every worker: same collective order
        order_log.append(order)
        for name in order:
            times[name].append(timed(name))
    print(
        json.dumps(
            {
                "rank": rank,
                "ranks": ranks,
                "nbytes": n * 4,
                "times": times,
                "warmup": warm,
                "order": order_log,
                "qdisc": qdisc_stats(),
                "tcp": tcp,
            }
        ),
        flush=True,
    )


TCP_COUNTERS = {"Tcp": ("RetransSegs",), "TcpExt": ("TCPTimeouts", "TCPLossProbes")}


def tcp_counters() -> Dict[str, int]:
    """This network namespace's TCP retransmitted segments, retransmission time-outs and tail-loss probes
    (``/proc/net/snmp``, ``/proc/net/netstat``); {} where unreadable."""
    out: Dict[str, int] = {}
    for path in ("/proc/net/snmp", "/proc/net/netstat"):
        try:
            lines = open(path, encoding="ascii").read().splitlines()
        except OSError:
            continue
        for head, vals in zip(lines[::2], lines[1::2]):
            names, numbers = head.split(), vals.split()
            for key in TCP_COUNTERS.get(names[0].rstrip(":"), ()):
                if key in names:
                    out[key] = int(numbers[names.index(key)])
    return out


def qdisc_stats() -> Dict[str, int]:
    """Sent bytes and dropped packets of this namespace's shaped device (``eth0``, else ``lo``); {} if none.

    In the switch topology this is the task's egress; the shared loopback's counters are the segment's.
    """
    import re
    import subprocess

    for dev in ("eth0", "lo"):
        try:
            p = subprocess.run(
                ["tc", "-s", "qdisc", "show", "dev", dev],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.TimeoutExpired):
            return {}
        m = re.search(
            r"qdisc tbf.*?Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)", p.stdout, re.S
        )
        if m:
            return {
                "dev_" + dev: 1,
                "sent_bytes": int(m.group(1)),
                "packets": int(m.group(2)),
                "dropped": int(m.group(3)),
                "overlimits": int(m.group(4)),
            }
    return {}


# ----------------------------------------------------------------------------------------------- parent
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


def parent(settings: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Launch the cluster, print the table, append to ``--out``'s .jsonl and rewrite the page."""
    import tf_commopt.cluster as cluster
    from tf_commopt.cluster import run_cluster, tbf_params

    if FLAGS.tbf_burst:  # the launcher sizes its token bucket from these (comparison runs only)
        cluster.TBF_BURST_S, cluster.TBF_MIN_BURST = 0.0, FLAGS.tbf_burst
    if FLAGS.tbf_limit:
        cluster.TBF_LIMIT_S, cluster.TBF_MIN_LIMIT = 0.0, FLAGS.tbf_limit
    if not FLAGS.slow_start_after_idle:
        cluster.SYSCTLS = tuple(cluster.SYSCTLS) + ("net.ipv4.tcp_slow_start_after_idle=0",)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [
        sys.executable,
        "-m",
        "experiments.allreduce_bench",
        "--worker",
        f"--megabytes={FLAGS.megabytes!r}",
        f"--settings={','.join(s['name'] for s in settings)}",
        f"--repeats={FLAGS.repeats}",
        f"--idle_s={FLAGS.idle_s!r}",
        f"--seed={FLAGS.seed}",
        f"--{'' if FLAGS.barrier else 'no'}barrier",
    ]
    load = os.getloadavg()[0]
    r = run_cluster(
        cmd,
        workers=FLAGS.workers,
        bandwidth_mbit=FLAGS.bandwidth_mbit,
        topology=FLAGS.topology,
        timeout=FLAGS.timeout,
        cwd=root,
        echo=False,
    )  # tasks inherit --tf_log_level
    per_rank = [
        json.loads(line) for lines in r.outputs.values() for line in lines if line.startswith('{"rank"')
    ]
    if r.returncode != 0 or len(per_rank) != FLAGS.workers:
        show = r.failed_task or "worker:0"
        tail = "\n".join(f"[{show}] {x}" for x in r.last_lines(show, 8))
        raise RuntimeError(f"cluster failed: {r.message}\n{tail}")
    nbytes = per_rank[0]["nbytes"]
    bound = ring_bound_s(nbytes, FLAGS.workers, FLAGS.bandwidth_mbit, FLAGS.topology)
    rows = summarize(per_rank, settings, bound, shared_ns=FLAGS.topology == "shared")
    if FLAGS.topology == "shared":  # one qdisc: every rank reads the same counters
        drops = per_rank[0].get("qdisc", {}).get("dropped")
    else:
        drops = (
            sum(r.get("qdisc", {}).get("dropped", 0) for r in per_rank) if per_rank[0].get("qdisc") else None
        )
    _, burst, limit = tbf_params(FLAGS.bandwidth_mbit)
    rec = {
        "command": "python -m experiments.allreduce_bench " + " ".join(sys.argv[1:]),
        "workers": FLAGS.workers,
        "topology": FLAGS.topology,
        "bandwidth_mbit": FLAGS.bandwidth_mbit,
        "nbytes": nbytes,
        "bound_s": round(bound, 4),
        "repeats": FLAGS.repeats,
        "idle_s": FLAGS.idle_s,
        "barrier": FLAGS.barrier,
        "tbf_burst": burst,
        "tbf_limit": limit,
        "sysctls": list(cluster.SYSCTLS),
        "tbf_dropped_packets": drops,
        "loadavg_1m_before": round(load, 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
        "wall_s": round(r.wall_s, 1),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rows": rows,
    }
    print(
        f"{FLAGS.workers} workers, {FLAGS.topology}, {FLAGS.bandwidth_mbit:g} Mbit/s, all-reduce of "
        f"{nbytes / 1e6:g} MB: ring bound {bound:.3f} s (tbf burst {burst} B, limit {limit} B; "
        f"packets the shaper dropped in the whole run: {drops})"
    )
    print(
        f"{'setting':<14} {'median s':>9} {'min s':>8} {'max s':>8} {'/bound':>7} {'retrans':>8} {'RTOs':>5}"
    )
    for row in rows:
        print(
            f"{row['setting']:<14} {row['median_s']:>9.3f} {row['min_s']:>8.3f} {row['max_s']:>8.3f} "
            f"{row['ratio']:>7.3f} {sum(row.get('retrans_segs', [])):>8} {sum(row.get('rto_timeouts', [])):>5}"
        )
    if FLAGS.out:
        jsonl = os.path.splitext(FLAGS.out)[0] + ".jsonl"
        with open(jsonl, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        write_page(FLAGS.out, jsonl)
        print(f"wrote {FLAGS.out} and {jsonl}")
    return rec


FINDINGS = "## Findings"


def write_page(path: str, jsonl: str) -> None:
    """Rewrite ``path`` from every record in ``jsonl``, keeping an existing ``## Findings`` section."""
    keep = ""
    if os.path.exists(path):
        text = open(path, encoding="utf-8").read()
        k = text.find(FINDINGS)
        keep = text[k:] if k >= 0 else ""
    recs = [json.loads(x) for x in open(jsonl, encoding="utf-8") if x.strip()]
    out = [
        "# All-reduce efficiency vs the ring bound (MultiWorkerMirroredStrategy, CPU, gRPC)",
        "",
        "Written by `experiments/allreduce_bench.py` (one section per run, newest last; the Findings at the end",
        "are written by hand). A setting `impl:bytes_per_pack:chunks` all-reduces B bytes of float32 per worker,",
        "passed as `chunks` equal tensors to `ReplicaContext.all_reduce(SUM, ..., options=CommunicationOptions(",
        "implementation=impl, bytes_per_pack=...))`; TF concatenates the tensors of a pack and runs one",
        "collective per pack, in order. The settings run interleaved in a shuffled order per repeat, each after",
        "a barrier and an idle gap. Times are the slowest rank's per repeat, median over the repeats.",
        "`/bound` = median / ring bound on payload bytes, R = the cap in bytes/s:",
        "",
        "* shared segment (one shaped loopback carries every rank's traffic): 2(N-1) x B / R;",
        "* switch (each rank's own link shaped, each direction): 2(N-1)/N x B / R per link.",
        "",
        "The wire carries more than the payload: 1514 bytes per 1448-byte TCP segment (Ethernet, IP and TCP",
        "headers with timestamps; tbf counts from the Ethernet header) plus the reverse flow's ACKs (66 bytes",
        "per two segments), so ~1.068 x the bound is the floor for any TCP transport. TCP retransmitted",
        "segments: summed over the timed repeats and the ranks' namespaces (one namespace when shared).",
        "",
        "Runs before 02:58 UTC on 2026-12-01 were made while the launcher set net.ipv4.tcp_slow_start_after_idle=0",
        "by default (and `--slow_start_after_idle` meant keeping 1); their commands are given in today's flags",
        "(`--noslow_start_after_idle` where 0 was set); each run's `sysctls set` says what was set.",
        "",
    ]
    for rec in recs:
        how = (
            f"barrier and idle {rec['idle_s']:g} s before each"
            if rec.get("barrier", True)
            else "back to back (no barrier: ranks may start skewed)"
        )
        out += [
            f"## {rec['workers']} workers, {rec['topology']}, {rec['bandwidth_mbit']:g} Mbit/s, "
            f"{rec['nbytes'] / 1e6:g} MB ({rec['date']})",
            "",
            f"`{rec['command']}`",
            "",
            f"Ring bound {rec['bound_s']:.3f} s; tbf burst {rec['tbf_burst']} B, limit {rec['tbf_limit']} B, "
            f"sysctls set: {', '.join(rec.get('sysctls', [])) or 'none'}; packets dropped by the shaper"
            f"{' (task egress)' if rec['topology'] == 'switch' else ''} over the run: "
            f"{rec.get('tbf_dropped_packets', 'not recorded')}; {rec['repeats']} repeats, {how}; load "
            f"average {rec['loadavg_1m_before']} before, {rec['loadavg_1m_after']} after (2 cores, shared).",
            "",
            "| setting (impl:bytes_per_pack:chunks) | median s | min s | max s | /bound | TCP retransmitted segments |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for row in rec["rows"]:
            rt = sum(row["retrans_segs"]) if "retrans_segs" in row else "not recorded"
            out.append(
                f"| {row['setting']} | {row['median_s']:.3f} | {row['min_s']:.3f} | {row['max_s']:.3f} | "
                f"{row['ratio']:.3f} | {rt} |"
            )
        out.append("")
    if keep:
        out.append(keep.rstrip("\n"))
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


def _error(msg: str) -> None:
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    sys.exit(2)


def main(argv: List[str]) -> None:
    if len(argv) > 1:
        _error(f"unexpected argument(s): {' '.join(argv[1:])}")
    try:
        settings = validate_flags()
    except InputError as e:
        _error(str(e))
        return
    if FLAGS.worker:
        worker(settings)
        return
    from tf_commopt.errors import ClusterError

    try:
        parent(settings)
    except ClusterError as e:
        _error(str(e))
    except RuntimeError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    from experiments import _cli

    _cli.run(main)  # bad flags: one line, exit 2; dashed aliases; quiet TensorFlow
