"""The runner's all-reduce measurements: ``--bench_allreduce_mb`` after training (:func:`time_allreduce`)
and the all-reduce mode ``python -m experiments.allreduce`` (:func:`measure`), which every worker of a
``TF_CONFIG`` cluster runs: it times a MultiWorkerMirroredStrategy all-reduce of ``--megabytes`` MB of
float32 per worker (SUM, ``ReplicaContext.all_reduce(..., options=...)``, the path SkipCorrectStrategy's
fused sync takes) for every ``impl:bytes_per_pack:chunks`` setting, ``--repeats`` times in a shuffled
order (the same on every worker), each after a one-float all-reduce barrier and ``--idle_s`` idle, and
prints one JSON line ``{"rank", "ranks", "nbytes", "times", "warmup", "order", "qdisc", "tcp"}``.

* ``impl``: ``auto`` or ``ring`` (``tf.distribute.experimental.CommunicationImplementation``);
* ``bytes_per_pack``: ``0``, or bytes with a ``K``/``M`` suffix (1 M = 2**20 bytes);
* ``chunks``: the buffer is passed as this many equal tensors (TF packs them into packs of at least
  ``bytes_per_pack`` and runs one collective per pack, in order).

Example:
    python -m tf_commopt.cluster --workers 2 --bandwidth-mbit 10 -- \
        python -m experiments.allreduce --megabytes=0.4 --settings=auto:0:1 --repeats=3
"""

from __future__ import annotations

import json
import math
import random
import time
from typing import Any, Dict, List, Optional, Sequence

from tf_commopt.errors import InputError

__all__ = ["time_allreduce", "parse_size", "parse_setting", "measure", "tcp_counters", "qdisc_stats", "main"]

IMPLEMENTATIONS = ("auto", "ring")


def time_allreduce(strategy, megabytes: float, repeats: int = 3) -> Dict[str, float]:
    """Median seconds of an all-reduce (sum) of ``megabytes`` MB of float32 per replica.

    Every worker of a multi-worker strategy must call it together. Returns ``allreduce_mb``,
    ``allreduce_s`` and ``allreduce_busbw_mbit`` = 2(N-1)/N x bytes x 8 / s / 1e6 (what each rank of
    a ring all-reduce sends per second; a link cap bounds it).
    """
    import tensorflow as tf

    n = max(1, int(megabytes * 1e6 / 4))

    def replica_fn():
        ctx = tf.distribute.get_replica_context()
        x = tf.fill([n], tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32))
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, x)[:1]

    @tf.function
    def step():
        return strategy.run(replica_fn)

    def once() -> float:
        t = time.perf_counter()
        out = strategy.experimental_local_results(step())
        got = float(out[0].numpy()[0])
        dt = time.perf_counter() - t
        r = strategy.num_replicas_in_sync
        if got != r * (r + 1) / 2:  # the sum 1 + 2 + ... + R: the reduce really happened
            raise RuntimeError(f"all-reduce returned {got}, expected {r * (r + 1) / 2}")
        return dt

    once()  # trace, set up the collective groups
    times = sorted(once() for _ in range(repeats))
    med = times[len(times) // 2]
    r = strategy.num_replicas_in_sync
    busbw = 2.0 * (r - 1) / r * n * 4 * 8 / med / 1e6
    return {"allreduce_mb": n * 4 / 1e6, "allreduce_s": med, "allreduce_busbw_mbit": busbw}


def end_barrier(strategy: Any, rounds: int = 2) -> None:
    """Return only when every worker has got here, ``rounds`` times (one tiny all-reduce each).

    A worker's collective completes when its own receives are done, while a peer may still be pulling
    the worker's last chunk of the same ring; a worker that exits then closes that socket and fails the
    peer ("Socket closed"). Every worker of a multi-worker strategy calls this before it exits: after the
    first round no peer still needs an earlier collective, the second covers the first.
    """
    import tensorflow as tf

    def one() -> Any:
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.ones([1]))

    @tf.function
    def step() -> Any:
        return strategy.run(one)

    for _ in range(rounds):
        strategy.experimental_local_results(step())[0].numpy()


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


def _collectives(strategy: Any, n: int, settings: Sequence[Dict[str, Any]]) -> tuple:
    """(traced all-reduce per setting, traced one-float barrier): each all-reduces this rank's rank + 1."""
    import numpy as np
    import tensorflow as tf

    rank = strategy.cluster_resolver.task_id
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

        return tf.function(lambda: strategy.run(replica_fn))

    def meet():
        return strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, one)
        )

    return {s["name"]: make(s) for s in settings}, tf.function(meet)


def measure(
    settings: Sequence[Dict[str, Any]],
    megabytes: float,
    repeats: int,
    idle_s: float,
    barrier: bool,
    seed: int,
) -> Dict[str, Any]:
    """This worker's record: every setting timed ``repeats`` times (see the module docstring)."""
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ranks = strategy.num_replicas_in_sync
    n = int(megabytes * 1e6 / 4)
    expect = ranks * (ranks + 1) / 2
    steps, meet = _collectives(strategy, n, settings)
    tcp: Dict[str, List[Dict[str, int]]] = {name: [] for name in steps}

    def timed(name: str, record: bool = True) -> float:
        if barrier:
            meet()
            time.sleep(idle_s)
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
    rng = random.Random(seed)
    times: Dict[str, List[float]] = {name: [] for name in steps}
    order_log = []
    for _ in range(repeats):
        order = list(steps)
        rng.shuffle(order)  # same seed on every worker: same collective order
        order_log.append(order)
        for name in order:
            times[name].append(timed(name))
    rec = {"rank": strategy.cluster_resolver.task_id, "ranks": ranks, "nbytes": n * 4, "times": times}
    return dict(rec, warmup=warm, order=order_log, qdisc=qdisc_stats(), tcp=tcp)


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


# ------------------------------------------------------------------------------------------------- CLI
def define(fv: Any, settings: Sequence[str] = ("auto:0:1",)) -> None:
    """The mode's flags on ``fv`` (``settings``: the default of ``--settings``)."""
    from absl import flags

    d = dict(flag_values=fv)
    flags.DEFINE_float("megabytes", 40.0, "all-reduce payload per worker in MB (1e6 bytes) of float32", **d)
    flags.DEFINE_list("settings", list(settings), "impl:bytes_per_pack:chunks entries, e.g. auto:4M:8", **d)
    flags.DEFINE_integer("repeats", 5, "timed all-reduces per setting", **d)
    flags.DEFINE_float("idle_s", 0.2, "idle seconds between the barrier and each timed all-reduce", **d)
    flags.DEFINE_bool("barrier", True, "meet in a one-float all-reduce and idle before each timed one", **d)
    flags.DEFINE_integer("seed", 0, "seed of the per-repeat order of the settings", **d)


def check(fv: Any) -> List[Dict[str, Any]]:
    """The parsed settings of the mode's flags; InputError naming the flag for a bad value."""
    for name in ("megabytes",):
        v = getattr(fv, name)
        if not (math.isfinite(v) and v > 0):
            raise InputError(f"must be a number > 0, got {v!r}", where=f"--{name}")
    if fv.repeats < 1:
        raise InputError(f"must be an integer >= 1, got {fv.repeats}", where="--repeats")
    if not (math.isfinite(fv.idle_s) and fv.idle_s >= 0):
        raise InputError(f"must be a number >= 0, got {fv.idle_s!r}", where="--idle_s")
    if not fv.settings:
        raise InputError("give at least one setting", where="--settings")
    settings = [parse_setting(s) for s in fv.settings]
    names = [s["name"] for s in settings]
    if len(set(names)) != len(names):
        raise InputError(f"duplicate setting in {names}", where="--settings")
    if int(fv.megabytes * 1e6 / 4) < max(s["chunks"] for s in settings):
        raise InputError(f"{fv.megabytes:g} MB is fewer float32 values than chunks", where="--megabytes")
    return settings


def _body(fv: Any) -> int:
    rec = measure(check(fv), fv.megabytes, fv.repeats, fv.idle_s, fv.barrier, fv.seed)
    print(json.dumps(rec), flush=True)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.allreduce`` in process (every worker of the cluster); the exit code."""
    from experiments import _cli

    return _cli.main("experiments.allreduce", argv, define, _body)


if __name__ == "__main__":
    raise SystemExit(main())
