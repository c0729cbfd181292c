"""Where two-level averaging's bytes go (``SkipCorrectStrategy(host_interval=h)``): which replicas share a
host, the sum over a host's replicas, and the mean over hosts. The rule that uses them is
:mod:`tf_commopt.distribute.two_level_sync`.

On a cluster (every host the same number p of workers) a host sum is one all-reduce among the host's
workers (the fast link). The mean over hosts cuts the host value's flat buffer into p slices: worker r
of every host all-reduces slice r with worker r of the other hosts, so the slow link carries each host's
value once (in the wire dtype when compressed) instead of a ring over every worker; then the host's
workers join their slices with one more host all-reduce (the fast link again). Uncompressed, the sum
over hosts is float32; compressed, it adds in the wire dtype (as the flat compressed sync does); int8
slices (whole blocks of 256 values and their scales) are all-gathered across the hosts instead and added
in float32. In one process (logical devices grouped by ``hosts``) the same sums are local ``add_n``.

The collectives are raw ``CollectiveReduceV2`` ops in sub-groups (group keys from the strategy's own key
base; instance keys counted at trace time, the same sequence on every worker, as TensorFlow's own
strategies count them). Each kind (host sums, slices across hosts, host joins) is ordered on its own
lane (an ordering token), so :meth:`TwoLevelAverager.pipelined` can cut a global sync into chunks whose
host sum runs while the previous chunk crosses the slow link.

Example:
    >>> hosts_from_cluster({"worker": ["a:1", "a:2", "b:1", "b:2"]})
    ('a', 'a', 'b', 'b')
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tf_commopt._compat import (
    container_strategy,
    num_workers,
    resource_variable_ops,
    strategy_cluster_resolver,
    worker_index,
)
from tf_commopt.cluster.layout import HOSTS_ENV
from tf_commopt.core.compress import BLOCK_CODECS, INT8_BLOCK
from tf_commopt.core.hierarchical import host_groups
from tf_commopt.distribute.compressed_sync import dequantize_int8
from tf_commopt.errors import InputError

__all__ = ["hosts_from_cluster", "resolve_hosts", "TwoLevelAverager", "CHUNK_ELEMENTS"]

CHUNK_ELEMENTS = 1 << 20  # values per chunk of a pipelined global sync (4 MB of float32)
LANES = ("host", "cross", "join")


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
        spec = strategy_cluster_resolver(container_strategy(ext)).cluster_spec().as_dict()
        per_worker = hosts_from_cluster(spec, os.environ.get(HOSTS_ENV) or None)
        hosts = [h for h in per_worker for _ in range(n_local)]
        where = f"TF_CONFIG / ${HOSTS_ENV}"
    if hosts is None:
        hosts = [0] * n_local
    groups = host_groups(hosts, where=where)  # a one-line error for anything but a list of host names
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
    """The host sums and the mean over hosts of one strategy (module docstring).

    Args:
        ext: the strategy's StrategyExtended (its ``worker_devices`` and ``telemetry``).
        host_of: the host index of every global replica (:func:`resolve_hosts`).
        h: the host interval: an int, or an int64 host variable read in the step (chosen at run time,
            :mod:`tf_commopt.distribute.two_level_interval`).
        key_base: a collective key base no other collective of the process uses.
    """

    def __init__(self, ext: Any, host_of: Sequence[int], h: Any, key_base: int):
        self.ext, self.h = ext, (h if isinstance(h, tf.Variable) else int(h))
        self.groups = host_groups(list(host_of))
        self.hosts, self.replicas = len(self.groups), len(host_of)
        n_local, self.workers = len(ext.worker_devices), num_workers(ext)
        first = worker_index(ext) * n_local
        self.local_host = [host_of[first + i] for i in range(n_local)]
        self.n_host = [len(self.groups[c]) for c in self.local_host]
        self._key, self._instance = int(key_base), 0
        self.chunk_elements = CHUNK_ELEMENTS
        self._tokens: Dict[str, Any] = {}
        self.per_host = 1  # workers per host (a cluster sets it below)
        if self.workers > 1:
            c = self.local_host[0]
            mates = sorted({r // n_local for r in self.groups[c]})
            self.per_host, self.rank, self.host_id = len(mates), mates.index(first // n_local), c
            with tf.init_scope(), tf.device(ext.worker_devices[0]):  # plain variables: no strategy creator
                self._tokens = {
                    k: resource_variable_ops.ResourceVariable(0.0, trainable=False) for k in LANES
                }
            sizes = {len({r // n_local for r in g}) for g in self.groups}
            if len(sizes) > 1:
                raise InputError(
                    f"two-level averaging needs the same number of workers on every host, got hosts "
                    f"{list(host_of)!r}",
                    where="SkipCorrectStrategy(host_interval=...)",
                )

    # ---- collectives ------------------------------------------------------------------------------
    def _sum(self, x: tf.Tensor, group_key: int, size: int, lane: str) -> tf.Tensor:
        """One raw all-reduce SUM of ``x`` in a sub-group (this worker's first device), ordered after the
        earlier collectives of its ``lane`` only."""
        self._instance += 1
        return tf.raw_ops.CollectiveReduceV2(
            input=x,
            group_size=size,
            group_key=group_key,
            instance_key=self._instance,
            ordering_token=[self._tokens[lane].handle],
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
                    total = self._sum(total, self._host_key(), self.per_host, "host")
            for i in mine:
                with tf.device(devices[i]):
                    out[i] = tf.identity(total)
        return out

    def cross_host_mean(self, values: List[Any]) -> List[tf.Tensor]:
        """Per local replica: Σ_c (n_c/R)·v_c in float32, from ``values`` (each replica's host value, the
        same on a host's replicas; in the wire dtype when compressed; int8: (values, block scales) pairs,
        :func:`~tf_commopt.distribute.compressed_sync.quantize_int8`)."""
        devices = self.ext.worker_devices
        if isinstance(values[0], tuple):
            return self._gathered_mean(values)
        with tf.device(devices[0]):
            if self.workers == 1:  # every host is local: the weighted sum in float32
                self.ext.telemetry.bytes.assign_add(int(values[0].shape[0]) * values[0].dtype.size)
                first = {c: self.local_host.index(c) for c in range(self.hosts)}
                terms = [
                    tf.cast(values[first[c]], tf.float32) * (len(self.groups[c]) / self.replicas)
                    for c in first
                ]
                mean = tf.add_n(terms) if len(terms) > 1 else terms[0]
            else:
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
        self.ext.telemetry.inter_host_bytes.assign_add(size * flat.dtype.size)
        self.ext.telemetry.bytes.assign_add((size + (n if p > 1 else 0)) * flat.dtype.size)
        summed = self._sum(piece, self._key + 10_000 + self.rank, self.hosts, "cross")
        if p == 1:
            return summed
        spread = tf.pad(summed, [[self.rank * size, (p - 1 - self.rank) * size]])
        return self._sum(spread, self._host_key(), p, "join")[:n]

    def _gathered_mean(self, values: List[Tuple[tf.Tensor, tf.Tensor]]) -> List[tf.Tensor]:
        """:meth:`cross_host_mean` of int8 host values: int8 cannot be summed on the wire, so worker r of
        every host all-gathers slice r (its int8 values and their blocks' scales) across the hosts, adds
        the hosts' decoded slices in float32 (in the gather's order, the same on every host), and the host's
        workers join their slices."""
        devices = self.ext.worker_devices
        with tf.device(devices[0]):
            if self.workers == 1:  # every host is local: decode each host's value, the weighted sum
                q, scales = values[0]
                self.ext.telemetry.bytes.assign_add(int(q.shape[0]) + 4 * int(scales.shape[0]))
                first = {c: self.local_host.index(c) for c in range(self.hosts)}
                terms = [
                    dequantize_int8(*values[first[c]]) * (len(self.groups[c]) / self.replicas) for c in first
                ]
                mean = tf.add_n(terms) if len(terms) > 1 else terms[0]
            else:
                mean = self._gathered_sum(*values[0]) / float(self.hosts)
        out = []
        for d in devices:
            with tf.device(d):
                out.append(tf.identity(mean))
        return out

    def _gathered_sum(self, q: tf.Tensor, scales: tf.Tensor) -> tf.Tensor:
        """Σ_c over hosts of the decoded int8 host value (``q``, ``scales``): per-worker slices of whole
        blocks across the hosts by all-gather, then the host's slices joined (float32)."""
        n, p = int(q.shape[0]), self.per_host
        size = -(-n // (p * INT8_BLOCK)) * INT8_BLOCK  # a slice of whole blocks, a multiple of 4 bytes
        nb = size // INT8_BLOCK
        q = tf.pad(q, [[0, size * p - n]]) if size * p != n else q
        scales = tf.pad(scales, [[0, nb * p - int(scales.shape[0])]])
        piece = q[self.rank * size : (self.rank + 1) * size]
        own = scales[self.rank * nb : (self.rank + 1) * nb]
        payload = tf.concat([tf.bitcast(tf.reshape(piece, [-1, 4]), tf.int32), tf.bitcast(own, tf.int32)], 0)
        self.ext.telemetry.inter_host_bytes.assign_add(size + 4 * nb)
        self.ext.telemetry.bytes.assign_add(size + 4 * nb + (4 * n if p > 1 else 0))
        self._instance += 1
        gathered = tf.raw_ops.CollectiveGatherV2(
            input=payload,
            group_size=self.hosts,
            group_key=self._key + 10_000 + self.rank,
            instance_key=self._instance,
            ordering_token=[self._tokens["cross"].handle],
        )
        rows = tf.reshape(gathered, [self.hosts, size // 4 + nb])  # one row per host
        q_rows = tf.reshape(tf.bitcast(rows[:, : size // 4], tf.int8), [self.hosts, nb, INT8_BLOCK])
        s_rows = tf.bitcast(rows[:, size // 4 :], tf.float32)[:, :, None]
        total = tf.reshape(tf.reduce_sum(tf.cast(q_rows, tf.float32) * s_rows, axis=0), [-1])
        if p == 1:
            return total[:n]
        spread = tf.pad(total, [[self.rank * size, (p - 1 - self.rank) * size]])
        return self._sum(spread, self._host_key(), p, "join")[:n]

    def pipelined(
        self, flats: List[tf.Tensor], prep: Any, codec: Optional[str] = None
    ) -> Tuple[List[tf.Tensor], List[tf.Tensor]]:
        """Per local replica: (the host sum of ``flats``, the mean over hosts of ``prep``'s values), in
        chunks of about ``chunk_elements`` values and a multiple of the workers per host; with the int8
        ``codec`` 4x as many values (a float32 chunk's bytes on the link; each chunk's codec costs graph ops)
        in whole ``INT8_BLOCK`` blocks per worker: ``prep(sums, lo, hi)`` maps the host sums of
        ``flats[i][lo:hi]`` to what each replica sends across (:meth:`cross_host_mean`'s ``values``).
        The chunks' collectives run on three lanes, so a chunk's host sum overlaps the previous chunk's
        slow-link transfer; the results are those of one unchunked pass, element for element.

        >>> sums, means = avg.pipelined(flats, lambda s, lo, hi: [x / 2.0 for x in s])  # doctest: +SKIP
        """
        block = codec in BLOCK_CODECS
        n, q = int(flats[0].shape[0]), self.per_host * (INT8_BLOCK if block else 1)
        values = int(self.chunk_elements) * (4 if block else 1)
        step = max(q, -(-values // q) * q)  # whole slices (and blocks): a multiple of p (·INT8_BLOCK)
        devices = self.ext.worker_devices
        sums: List[List[tf.Tensor]] = [[] for _ in flats]
        means: List[List[tf.Tensor]] = [[] for _ in flats]
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            part = []
            for i, f in enumerate(flats):
                with tf.device(devices[i]):
                    part.append(f[lo:hi] if (lo, hi) != (0, n) else f)
            s = self.host_sum(part)
            for i, x in enumerate(self.cross_host_mean(prep(s, lo, hi))):
                sums[i].append(s[i])
                means[i].append(x)
        return _join(sums, devices), _join(means, devices)


def _join(chunks: List[List[tf.Tensor]], devices: Sequence[str]) -> List[tf.Tensor]:
    out = []
    for i, row in enumerate(chunks):
        with tf.device(devices[i]):
            out.append(tf.concat(row, 0) if len(row) > 1 else row[0])
    return out
