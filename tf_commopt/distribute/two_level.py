"""Two-level averaging in SkipCorrectStrategy (``host_interval=h``): replicas on one host average every h
local steps, all replicas every H steps, with the VRL correction at both levels.

The rule is :mod:`tf_commopt.core.hierarchical` (docs/skip_correct.md, "Two-level averaging"), here on
tensors. Replica i is on host c with n_c replicas; k is the local steps since the last global sync;
clr the correction's learning rate::

    host sync (k a multiple of h, k < H):   x̄_c = Σ_{j∈c} x_j / n_c
        Δ_i ← Δ_i + (x̄_c − x_i)/(h·clr),   x_i ← x̄_c
    global sync (k = H): the host sync, then across hosts, with x₀ the last global model and e_c the
    host's rounding residual (compression; uncompressed: Q_c = x̄_c − x₀ exactly)
        v_c = x̄_c − x₀ + e_c,   Q_c = round(v_c),   e_c ← v_c − Q_c,   Q̄ = Σ_c (n_c/R)·Q_c
        x̄ = x₀ + Q̄,   Δ_i ← Δ_i + (x̄_c − x_i)/(h·clr) + (Q̄ − Q_c)/(k·clr),   x_i ← x̄,   x₀ ← x̄

How the bytes move on a cluster (every host the same number p of workers): a host sync is one
all-reduce among the host's workers (the fast link). A global sync is that all-reduce, then the host
value's flat buffer cut into p slices: worker r of every host all-reduces slice r with worker r of the
other hosts (the slow link carries each host's value once, in the wire dtype, instead of a ring over
every worker), then the host's workers exchange their slices (the fast link again). Uncompressed, the
cross-host sum is exact float32; compressed, it adds in the wire dtype (as the flat compressed sync
does). In one process (logical devices grouped by ``hosts``) the same rule runs on local tensors.

Non-trainable averaged state (BatchNorm statistics) follows the model: the host mean at host syncs, the
global mean at global syncs, float32. Supported: corrections ``vrl`` and ``none``; ``gradient`` (every
optimizer but plain SGD under ``correction="auto"``) is a one-line error.

Example:
    >>> strategy = SkipCorrectStrategy(interval=8, host_interval=2, compression="bf16")   # doctest: +SKIP
    >>> strategy.stats()["host_syncs"], strategy.stats()["inter_host_bytes"]            # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tf_commopt._compat import host_variable, num_workers, worker_index
from tf_commopt.cluster.layout import HOSTS_ENV
from tf_commopt.core.hierarchical import host_groups
from tf_commopt.distribute.compressed_sync import WIRE_DTYPES
from tf_commopt.errors import InputError

__all__ = [
    "hosts_from_cluster",
    "resolve_hosts",
    "TwoLevelAverager",
    "host_sync",
    "global_sync",
    "check_rule",
]

_no_autograph = tf.autograph.experimental.do_not_convert


def hosts_from_cluster(cluster: Dict[str, Sequence[str]], env: Optional[str] = None) -> Tuple[Any, ...]:
    """The host of every collective task (``chief:0`` first, then the workers): ``env`` (the launcher's
    ``$TF_COMMOPT_HOSTS``, comma-separated) if given, else the host part of each TF_CONFIG address.

    >>> hosts_from_cluster({"worker": ["a:1", "a:2", "b:1", "b:2"]})
    ('a', 'a', 'b', 'b')
    >>> hosts_from_cluster({"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, env="0,1")
    ('0', '1')
    """
    tasks = list(cluster.get("chief", []))[:1] + list(cluster.get("worker", []))
    if env:
        parts = tuple(p.strip() for p in env.split(","))
        if len(parts) != len(tasks) or not all(parts):
            raise InputError(
                f"names {len(parts)} hosts ({env!r}) for {len(tasks)} chief/worker tasks",
                where=f"${HOSTS_ENV}",
            )
        return parts
    return tuple(a.rpartition(":")[0] for a in tasks)


def resolve_hosts(ext: Any, hosts: Optional[Sequence[Any]]) -> Tuple[int, ...]:
    """The host index of every global replica: ``hosts`` (one entry per replica), else one per worker
    from the cluster (:func:`hosts_from_cluster`), else (one process) a single host."""
    n_local = len(ext.worker_devices)
    nw = num_workers(ext)
    where = "SkipCorrectStrategy(hosts=...)"
    if hosts is None and nw > 1:
        spec = ext._cluster_resolver.cluster_spec().as_dict()
        per_worker = hosts_from_cluster(spec, os.environ.get(HOSTS_ENV) or None)
        hosts = [h for h in per_worker for _ in range(n_local)]
        where = f"TF_CONFIG / ${HOSTS_ENV}"
    if hosts is None:
        hosts = [0] * n_local
    groups = host_groups(list(hosts), where=where)
    if sum(len(g) for g in groups) != n_local * nw:
        raise InputError(
            f"must name the host of each of the {n_local * nw} replicas, got {len(hosts)}", where=where
        )
    host_of = [0] * (n_local * nw)
    for c, g in enumerate(groups):
        for i in g:
            host_of[i] = c
    for w in range(nw if nw > 1 else 0):  # one process: its devices may stand for several hosts
        if len({host_of[w * n_local + i] for i in range(n_local)}) > 1:
            raise InputError(f"worker {w}'s replicas are on different hosts: {list(hosts)!r}", where=where)
    return tuple(host_of)


class TwoLevelAverager:
    """The host and global syncs of one strategy (module docstring); built at the first traced sync.

    Args:
        ext: the strategy's StrategyExtended (its ``worker_devices``, ``telemetry``, ``reduce_to``).
        host_of: the host index of every global replica (:func:`resolve_hosts`).
        h: the host interval.
        key_base: a collective key base no other collective of the process uses.
    """

    def __init__(self, ext: Any, host_of: Sequence[int], h: int, key_base: int):
        self.ext, self.h, self.host_of = ext, int(h), tuple(host_of)
        self.groups = host_groups(list(host_of))
        self.hosts, self.replicas = len(self.groups), len(host_of)
        n_local, self.workers = len(ext.worker_devices), num_workers(ext)
        first = worker_index(ext) * n_local
        self.local_host = [host_of[first + i] for i in range(n_local)]
        self.n_host = [len(self.groups[c]) for c in self.local_host]
        self._key, self._instance = int(key_base), 0
        self.host_syncs = host_variable(0, tf.int64, "skip_correct/host_syncs")
        self.host_comm_s = host_variable(0.0, tf.float64, "skip_correct/host_comm_s")
        self.inter_host_bytes = host_variable(0, tf.int64, "skip_correct/inter_host_bytes")
        if self.workers > 1:
            c = self.local_host[0]
            mates = sorted({r // n_local for r in self.groups[c]})
            self.per_host, self.rank, self.host_id = len(mates), mates.index(first // n_local), c
            sizes = {len({r // n_local for r in g}) for g in self.groups}
            if len(sizes) > 1:
                raise InputError(
                    f"two-level averaging needs the same number of workers on every host, got hosts "
                    f"{list(host_of)!r}",
                    where="SkipCorrectStrategy(host_interval=...)",
                )

    # ---- collectives ------------------------------------------------------------------------------
    def _sum(self, x: tf.Tensor, group_key: int, size: int) -> tf.Tensor:
        """One raw all-reduce SUM of ``x`` in a sub-group (this worker's first device)."""
        self._instance += 1
        return tf.raw_ops.CollectiveReduceV2(
            input=x,
            group_size=size,
            group_key=group_key,
            instance_key=self._instance,
            ordering_token=[],
            merge_op="Add",
            final_op="Id",
        )

    def _host_key(self) -> int:
        return self._key + 1 + self.host_id

    def host_sum(self, flats: List[tf.Tensor]) -> List[tf.Tensor]:
        """Per local replica: the sum of ``flats`` over the replicas of its host."""
        devices = self.ext.worker_devices
        out: List[Any] = [None] * len(flats)
        for c in sorted(set(self.local_host)):
            mine = [i for i, hc in enumerate(self.local_host) if hc == c]
            with tf.device(devices[mine[0]]):
                self.ext.telemetry.bytes.assign_add(int(flats[mine[0]].shape[0]) * flats[mine[0]].dtype.size)
                total = tf.add_n([flats[i] for i in mine]) if len(mine) > 1 else tf.identity(flats[mine[0]])
                if self.workers > 1 and self.per_host > 1:
                    total = self._sum(total, self._host_key(), self.per_host)
            for i in mine:
                with tf.device(devices[i]):
                    out[i] = tf.identity(total)
        return out

    def cross_host_mean(self, values: List[tf.Tensor]) -> List[tf.Tensor]:
        """Per local replica: Σ_c (n_c/R)·v_c in float32, from ``values`` (each replica's host value, the
        same on a host's replicas; in the wire dtype when compressed)."""
        devices = self.ext.worker_devices
        if self.workers == 1:  # every host is local: the weighted sum in float32
            self.ext.telemetry.bytes.assign_add(int(values[0].shape[0]) * values[0].dtype.size)
            first = {c: self.local_host.index(c) for c in range(self.hosts)}
            with tf.device(devices[0]):
                terms = [
                    tf.cast(values[first[c]], tf.float32) * (len(self.groups[c]) / self.replicas)
                    for c in first
                ]
                mean = tf.add_n(terms) if len(terms) > 1 else terms[0]
            return [tf.identity(mean) for _ in devices]
        with tf.device(devices[0]):
            mean = tf.cast(self._sliced_sum(values[0]), tf.float32) / float(self.hosts)
        out = []
        for d in devices:
            with tf.device(d):
                out.append(tf.identity(mean))
        return out

    def _sliced_sum(self, flat: tf.Tensor) -> tf.Tensor:
        """Σ_c over hosts of ``flat``: slice r across hosts (the slow link), then the host's slices joined."""
        if self.hosts == 1:
            return flat
        n = int(flat.shape[0])
        p = self.per_host
        size = -(-n // p)
        padded = tf.pad(flat, [[0, size * p - n]]) if size * p != n else flat
        piece = padded[self.rank * size : (self.rank + 1) * size]
        self.inter_host_bytes.assign_add(size * flat.dtype.size)
        self.ext.telemetry.bytes.assign_add((size + (n if p > 1 else 0)) * flat.dtype.size)
        summed = self._sum(piece, self._key + 10_000 + self.rank, self.hosts)
        if p == 1:
            return summed
        spread = tf.pad(summed, [[self.rank * size, (p - 1 - self.rank) * size]])
        return self._sum(spread, self._host_key(), p)[:n]


def _pack(rows: List[List[Any]]) -> Tuple[List[tf.Tensor], List[int]]:
    """rows[j][i] (variable j, local replica i) -> one flat float32 buffer per replica, and the sizes."""
    sizes = [int(r[0].shape.num_elements()) for r in rows]
    flats = []
    for i in range(len(rows[0])):
        with tf.device(rows[0][i].device):
            flats.append(tf.concat([tf.reshape(tf.cast(r[i], tf.float32), [-1]) for r in rows], 0))
    return flats, sizes


def _unpack(flat: tf.Tensor, sizes: List[int], like: List[Any]) -> List[tf.Tensor]:
    pieces = tf.split(flat, sizes) if len(sizes) > 1 else [flat]
    return [tf.cast(tf.reshape(p, v.shape), v.dtype) for p, v in zip(pieces, like)]


def check_rule(rule: str) -> None:
    """The corrections two-level averaging supports (one-line error for ``gradient``)."""
    if rule not in ("vrl", "none"):
        raise InputError(
            f"two-level averaging supports correction='vrl' or 'none', not {rule!r} (correction='auto' "
            f"picks 'gradient' for optimizers other than plain SGD): pass correction='vrl'",
            where="SkipCorrectStrategy(host_interval=...)",
        )


@_no_autograph
def host_sync(
    avg: TwoLevelAverager, variables: Sequence[Any], state: Any, n_trainable: int, lr: Any
) -> tf.Tensor:
    """The host sync (module docstring). Returns its seconds (also in ``avg.host_comm_s``)."""
    t0 = tf.timestamp()
    with tf.control_dependencies([t0]):
        rows = [[c.read_value() for c in v.values] for v in variables]
    flats, sizes = _pack(rows)
    sums = avg.host_sum(flats)
    ops = _apply_host_mean(avg, variables, state, n_trainable, lr, rows, sums, sizes)
    with tf.control_dependencies(ops):
        t1 = tf.timestamp()
    avg.host_syncs.assign_add(1)
    avg.host_comm_s.assign_add(t1 - t0)
    return t1 - t0


def _apply_host_mean(avg, variables, state, n_trainable, lr, rows, sums, sizes, assign=True) -> List[Any]:
    """Δ_i += (x̄_c − x_i)/(h·clr) and (``assign``) x_i ← x̄_c; returns the ops, or with ``assign=False``
    the per-variable host means ``means[j][i]`` as the last element."""
    deltas = state.delta_components() if state is not None and state.rule == "vrl" else None
    ops: List[Any] = []
    means: List[List[Any]] = [[None] * len(avg.local_host) for _ in variables]
    for i, c0 in enumerate(variables[0].values):
        with tf.device(c0.device):
            xbar = _unpack(sums[i] / float(avg.n_host[i]), sizes, [v.values[i] for v in variables])
            for j, v in enumerate(variables):
                means[j][i] = xbar[j]
                c = v.values[i]
                if deltas is not None and j < n_trainable:
                    scale = tf.cast(avg.h, c.dtype) * tf.cast(lr, c.dtype)
                    ops.append(deltas[j][i].assign_add((xbar[j] - rows[j][i]) / scale))
                if assign:
                    ops.append(c.assign(xbar[j]))
    return ops if assign else ops + [means]


@_no_autograph
def global_sync(
    avg: TwoLevelAverager, variables: Sequence[Any], state: Any, n_trainable: int, local_steps: Any, lr: Any
) -> tf.Tensor:
    """The global sync (module docstring). Returns its seconds (also in the strategy's telemetry)."""
    t0 = tf.timestamp()
    with tf.control_dependencies([t0]):
        rows = [[c.read_value() for c in v.values] for v in variables]
    flats, sizes = _pack(rows)
    sums = avg.host_sum(flats)
    *ops, means = _apply_host_mean(avg, variables, state, n_trainable, lr, rows, sums, sizes, assign=False)
    n = n_trainable
    codec = state.compression if state is not None else None
    tr_rows, ex_rows = means[:n], means[n:]
    new: List[List[Any]] = [[None] * len(avg.local_host) for _ in variables]
    if codec is None:
        packed, tr_sizes = _pack(means)
        glob = avg.cross_host_mean(packed)
        for i in range(len(avg.local_host)):
            with tf.device(variables[0].values[i].device):
                new_i = _unpack(glob[i], tr_sizes, [r[i] for r in means])
                for j in range(len(variables)):
                    new[j][i] = new_i[j]
                    if j < n:
                        ops += _vrl_global(state, j, i, new_i[j] - means[j][i], local_steps, lr)
    else:
        ops += _compressed_global(avg, variables, state, n, tr_rows, local_steps, lr, new)
        if ex_rows:
            packed, ex_sizes = _pack(ex_rows)
            glob = avg.cross_host_mean(packed)
            for i in range(len(avg.local_host)):
                ex_new = _unpack(glob[i], ex_sizes, [r[i] for r in ex_rows])
                for e, val in enumerate(ex_new):
                    new[n + e][i] = val
    for j, v in enumerate(variables):
        for i, c in enumerate(v.values):
            with tf.device(c.device):
                ops.append(c.assign(new[j][i]))
    with tf.control_dependencies(ops):
        t1 = tf.timestamp()
    avg.ext.telemetry.add_sync(t1 - t0)
    return t1 - t0


def _vrl_global(state: Any, j: int, i: int, diff: Any, local_steps: Any, lr: Any) -> List[Any]:
    """Δ_i += diff/(k·clr) for ``vrl`` (diff = Q̄ − Q_c); nothing for ``none``."""
    if state is None or state.rule != "vrl":
        return []
    d = state.delta_components()[j][i]
    scale = tf.cast(local_steps, d.dtype) * tf.cast(lr, d.dtype)
    return [d.assign_add(diff / scale)]


def _compressed_global(avg, variables, state, n, host_means, local_steps, lr, new) -> List[Any]:
    """v_c = x̄_c − x₀ + e_c in the wire dtype across hosts; x̄ = x₀ + Q̄ (module docstring)."""
    wire = WIRE_DTYPES[state.compression]
    anchors, res = state.components(state.anchors), state.components(state.residuals)
    ops: List[Any] = []
    vs = [
        [
            host_means[j][i] - anchors[j][i].read_value() + res[j][i].read_value()
            for i in range(len(avg.local_host))
        ]
        for j in range(n)
    ]
    flats, sizes = _pack(vs)
    wires = [tf.cast(f, wire) for f in flats]
    sent = [tf.cast(w, tf.float32) for w in wires]
    glob = avg.cross_host_mean(wires)
    for i in range(len(avg.local_host)):
        with tf.device(variables[0].values[i].device):
            q = _unpack(sent[i], sizes, [r[i] for r in vs])
            qbar = _unpack(glob[i], sizes, [r[i] for r in vs])
            for j in range(n):
                x_new = anchors[j][i].read_value() + qbar[j]
                new[j][i] = x_new
                ops += [anchors[j][i].assign(x_new), res[j][i].assign(vs[j][i] - q[j])]
                ops += _vrl_global(state, j, i, qbar[j] - q[j], local_steps, lr)
    return ops
