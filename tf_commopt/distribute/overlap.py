"""Overlapped averaging for SkipCorrectStrategy (``overlap=True``): the sync's all-reduce runs in the
background while the replicas keep taking local steps (Overlap-Local-SGD, Wang, Tantia, Ballas & Rabbat,
ICASSP 2020, in its one-interval-stale form).

Example:
    >>> strategy = SkipCorrectStrategy(interval=16, overlap=True)     # doctest: +SKIP
    >>> with strategy.scope():                                        # doctest: +SKIP
    ...     model = make_model(); model.compile("sgd", "mse")
    >>> model.fit(x, y)            # each sync's averaging is hidden behind the next H local steps  # doctest: +SKIP
    >>> strategy.sync()            # drain the in-flight averaging, then average (evaluate/save do it)  # doctest: +SKIP

The exact rule (docs/skip_correct.md, "Overlap"). Local steps are those of the blocking rule. At a
scheduled sync (k = H) replica i, instead of x_i ← x̄:

1. if an averaging is in flight (launched at the previous sync from snapshots y_j, with local-step
   count k_y and lr_y): wait for ȳ = mean_j y_j, then
   x_i ← x_i + (ȳ − y_i)  (for every averaged variable: trainable, BatchNorm statistics, averaged slots;
   a slot the optimizer's step multiplies by a, s ← a·s + f(g), gets a^k (ȳ − y_i) instead, k the local
   steps since the snapshot: what remains of the snapshot's difference after k steps);
   ``vrl``: Δ_i ← Δ_i + (ȳ − y_i)/(k_y·lr_y);  ``gradient``: Δ_i ← (S_i − S̄)/k_y  (S_i = G_i at the snapshot);
2. snapshot y_i ← x_i (after step 1), S_i ← G_i, G_i ← 0, remember k_y = k, lr_y = lr; launch the fused
   all-reduce of the y_i (and S_i) in the background;
3. k ← 0.

So the average lands one interval late, the local progress made meanwhile (x_i − y_i) is kept, mean_i x_i is
unchanged by step 1, and Δ sees the same deviations as in the blocking rule, one period later
(y_i − ȳ is exactly replica i's deviation over the period that ended at the snapshot), so Σ_i Δ_i stays 0.
The averaging is always applied at the next sync (never earlier), so runs are deterministic. With
``compression`` the trainables' snapshot travels as the blocking compressed sync's deltas
(``compressed_sync.py``: v_i = y_i − x₀ + e_i in the wire dtype, and for ``gradient`` S_i + r_i beside
them) and step 1 applies that sync's x̄, x₀, e_i, r_i and Δ_i terms with y_i in place of x_i.
``strategy.sync()`` (and Keras evaluate/predict/save/save_weights, which call it) first *drains*: step 1 now,
with k unchanged; the end of ``fit`` drains too (no communication: the in-flight result is applied locally).

Mechanism: the snapshot goes into a TensorFlow FIFO queue (by value, one flat buffer per dtype and replica),
a host callback wakes this averager's background thread, which runs a traced function (dequeue, the
strategy's fused all-reduce ``averaging.fused_reduce``, enqueue the mean into a second queue); the next sync
dequeues it in the graph (an asynchronous kernel: no thread is blocked while waiting). The background
function is traced once, in the thread that traces the training step; its all-reduces draw their instance
keys when it is called, in a collective group of their own (``own_collective_reducer``), so the eager
reductions of the main thread (tf-keras reads every metric at an epoch's end) cannot take them first.
"""

from __future__ import annotations

import logging
import queue as _pyqueue
import threading
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tf_commopt._compat import host_variable, own_collective_reducer, slot_decays
from tf_commopt.distribute import correction as _corr
from tf_commopt.distribute.averaging import fused_reduce
from tf_commopt.distribute.compressed_sync import WIRE_DTYPES, _reduce
from tf_commopt.distribute.state import _pass_through
from tf_commopt.errors import InputError

__all__ = ["OverlapAverager"]

_log = logging.getLogger("tf_commopt.distribute")
_KEY_OFFSET = 90_000  # the background all-reduces' group: key base + this (two-level uses 50,000 to 70,000)
_no_autograph = tf.autograph.experimental.do_not_convert


def _background_loop(
    jobs: "_pyqueue.Queue[Optional[int]]", fn_ref: List[Any], result_queue: Any, errors: List[BaseException]
) -> None:
    """The averager's thread: one traced background averaging per job; None ends it."""
    while True:
        job = jobs.get()
        if job is None:
            return
        try:
            fn_ref[0]()
        except BaseException as e:
            errors.append(e)
            _log.error("SkipCorrectStrategy overlap: the background averaging failed: %s", e)
            try:
                result_queue.close(cancel_pending_enqueues=True)  # the waiting sync fails instead of hanging
            except Exception:
                pass
            return


def _check_compression(compression: Optional[str], trainable: Sequence[Any]) -> None:
    """Overlapped compressed syncs carry float32 trainable variables (a one-line error otherwise)."""
    if compression is not None and any(v.dtype != tf.float32 for v in trainable):
        raise _pass_through(
            InputError(
                "compression with overlap=True needs float32 trainable variables",
                where="SkipCorrectStrategy(compression=...)",
            )
        )


class OverlapAverager:
    """One optimizer's overlapped averaging: the snapshot layout, the two queues, the background thread.

    Built by the strategy at the first trace of a sync (``variables`` = the trainable variables of the
    correction state, then the averaged extras; ``state`` = that ``SkipCorrectState``: its rule, Δ_i, the
    G_i rows for ``correction="gradient"``, and with ``compression`` its x₀ and residuals: the trainables
    then travel as wire-dtype deltas, docs/skip_correct.md "Overlapped syncs").
    """

    def __init__(
        self, ext: Any, strategy: Any, variables: Sequence[Any], n_trainable: int, state: Any
    ) -> None:
        self._ext = weakref.proxy(ext)
        self._strategy = weakref.proxy(strategy)
        # the background thread's all-reduces draw their instance keys in a collective group of their own
        self._reduce_to = own_collective_reducer(ext, _KEY_OFFSET)
        self.variables = list(variables)
        self.n_trainable = int(n_trainable)
        self.rule = state.rule
        self.compression = state.compression  # None, "bf16" or "fp16": the trainables travel as deltas
        _check_compression(self.compression, variables[:n_trainable])
        self._deltas = state.delta_components()
        self._grad_sums = state.grad_sum_components() if self.rule == "gradient" else None
        self._anchors = state.components(state.anchors)  # x₀ per variable and replica (compressed)
        self._residuals = state.components(state.residuals)  # e_i (compressed)
        self._grad_res = state.components(state.grad_residuals)  # r_i (compressed gradient)
        self._local_steps = state.local_steps  # k: the local steps since the last sync
        decays = slot_decays(state.optimizer) if state.optimizer is not None else {}
        self._decays = [decays.get(id(v), 1.0) if e >= n_trainable else 1.0 for e, v in enumerate(variables)]
        # compressed: wire rows of one flat buffer per replica, v_i (and for gradient S_i + r_i)
        self._wire_rows = 0 if self.compression is None else (2 if self.rule == "gradient" else 1)
        self.n_local = len(self.variables[0].values)
        self._devices = [c.device for c in self.variables[0].values]
        # entries: the averaged variables, then (gradient) the G_i rows of the trainable ones
        # compressed: the trainables (and G_i) travel in the wire rows instead, the rest as before
        first = self.n_trainable if self.compression is not None else 0
        self._entries: List[Tuple[str, int]] = [("var", e) for e in range(first, len(self.variables))]
        if self._grad_sums is not None and self.compression is None:
            self._entries += [("sum", j) for j in range(self.n_trainable)]
        groups: Dict[tf.DType, List[int]] = {}
        for n, entry in enumerate(self._entries):
            groups.setdefault(self._entry_dtype(entry), []).append(n)
        self._groups = [
            (dtype, idx, [int(self._entry_shape(self._entries[n]).num_elements()) for n in idx])
            for dtype, idx in groups.items()
        ]
        self._train_sizes = [int(v.shape.num_elements()) for v in self.variables[: self.n_trainable]]
        self.payload_bytes = sum(sum(sizes) * dtype.size for dtype, _, sizes in self._groups)
        n_train = sum(self._train_sizes) if self.compression is not None else 0
        if n_train:
            self.payload_bytes += n_train * WIRE_DTYPES[self.compression].size * self._wire_rows
        n_groups = len(self._groups)
        with tf.init_scope(), tf.device("/CPU:0"):
            self.pending = host_variable(0, tf.int64, "skip_correct/overlap_pending")
            dts = [d for d, _, _ in self._groups]
            lens = [[sum(sizes)] for _, _, sizes in self._groups]
            f32, n_loc = [tf.float32] * self.n_local, [[n_train]] * self.n_local
            # compressed: each replica's y_i, then the wire rows (v_i = y_i − x₀ + e_i; S_i + r_i), flat
            w = self._wire_rows if n_train else 0
            train_types, train_shapes = (f32 * (1 + w), n_loc * (1 + w)) if w else ([], [])
            snap_types = [d for d in dts for _ in range(self.n_local)] + train_types + [tf.float64]
            snap_shapes = [n for n in lens for _ in range(self.n_local)] + train_shapes + [[]]
            # per wire row: the SUM of the q_i and each replica's q_i (e_i = v_i − q_i is taken at apply)
            sum_types, sum_shapes = ([tf.float32] + f32) * w, ([[n_train]] + n_loc) * w
            # (snapshot bufs, scale) -> (means, [sums], snapshot bufs, scale, background seconds)
            self._snapshots = tf.queue.FIFOQueue(
                2, snap_types, shapes=snap_shapes, name="skip_correct_overlap_snapshots"
            )
            self._results = tf.queue.FIFOQueue(
                2,
                dts + sum_types + snap_types + [tf.float64],
                shapes=lens + sum_shapes + snap_shapes + [[]],
                name="skip_correct_overlap_results",
            )
        self._n_groups = n_groups
        self._errors: List[BaseException] = []
        self._jobs: "_pyqueue.Queue[Optional[int]]" = _pyqueue.Queue()
        self._fn_ref: List[Any] = [None]
        with tf.init_scope():
            self._fn_ref[0] = tf.function(self._background, autograph=False).get_concrete_function()
        self._thread = threading.Thread(
            target=_background_loop,
            name="skip_correct_overlap",
            daemon=True,
            args=(self._jobs, self._fn_ref, self._results, self._errors),
        )
        self._thread.start()
        weakref.finalize(self, self._jobs.put, None)

    # ---- layout ------------------------------------------------------------------------------------
    def _entry_dtype(self, entry: Tuple[str, int]) -> tf.DType:
        kind, j = entry
        return (self.variables[j] if kind == "var" else self._grad_sums[j][0]).dtype.base_dtype

    def _entry_shape(self, entry: Tuple[str, int]) -> tf.TensorShape:
        kind, j = entry
        return (self.variables[j] if kind == "var" else self._grad_sums[j][0]).shape

    def _entry_component(self, entry: Tuple[str, int], i: int) -> Any:
        kind, j = entry
        return self.variables[j].values[i] if kind == "var" else self._grad_sums[j][i]

    def same_layout(self, variables: Sequence[Any]) -> bool:
        return len(variables) == len(self.variables) and all(
            a is b for a, b in zip(variables, self.variables)
        )

    # ---- background ----------------------------------------------------------------------------------
    def _background(self) -> None:
        """Traced once: dequeue a snapshot, the fused all-reduce (MEAN), enqueue the means."""
        ext = self._ext
        with self._strategy.scope():
            vals = self._snapshots.dequeue()
            with tf.control_dependencies(vals):
                t0 = tf.timestamp()
            per_group = []
            for g in range(self._n_groups):
                row = []
                for i in range(self.n_local):
                    with tf.device(ext.worker_devices[i]):
                        with tf.control_dependencies([t0]):
                            row.append(tf.identity(vals[g * self.n_local + i]))
                per_group.append(row)
            if self.compression is None:
                means = fused_reduce(ext, tf.distribute.ReduceOp.MEAN, per_group, self._reduce_to)
                firsts = [means[g][0] for g in range(self._n_groups)]
            else:
                firsts = self._compressed_reduce(vals, per_group, t0)
            with tf.control_dependencies(firsts):
                t1 = tf.timestamp()
            with tf.device("/CPU:0"):
                self._results.enqueue(firsts + list(vals) + [t1 - t0])

    def _compressed_reduce(
        self, vals: List[tf.Tensor], per_group: List[List[tf.Tensor]], t0: Any
    ) -> List[Any]:
        """The means of the other groups, then per wire row Σ_i q_i and each q_i (``compressed_sync``'s
        fused reduce in the wire dtype; fp16's fallback sends q_i = v_i, so v_i − q_i is 0 there too)."""
        n, at = self.n_local, self._n_groups * self.n_local + self.n_local  # the wire rows follow the y_i
        rows = []
        for w in range(self._wire_rows):
            row = []
            for i in range(n):
                with tf.device(self._ext.worker_devices[i]), tf.control_dependencies([t0]):
                    row.append(tf.identity(vals[at + w * n + i]))
            rows.append(row)
        wire = WIRE_DTYPES[self.compression]
        sums, sent, _, extra_sums = _reduce(self._ext, rows, wire, per_group, self._reduce_to)
        r = float(self._strategy.num_replicas_in_sync)
        means = [extra_sums[g][0] / tf.cast(r, extra_sums[g][0].dtype) for g in range(self._n_groups)]
        return means + [t for w in range(self._wire_rows) for t in [sums[w][0]] + list(sent[w])]

    def _launch(self) -> np.int64:
        if self._errors:
            raise RuntimeError(f"the background averaging failed: {self._errors[0]}")
        self._jobs.put(1)
        return np.int64(1)

    # ---- at a sync (graph or eager) -----------------------------------------------------------------
    @_no_autograph
    def apply_pending(self, k_now: Any) -> tf.Tensor:
        """Wait for the in-flight mean ȳ and apply step 1 of the rule (``k_now``: the local steps since the
        snapshot, for the slots' decay); returns the background seconds."""
        with tf.device("/CPU:0"):
            vals = self._results.dequeue()
        g_n, n, w = self._n_groups, self.n_local, self._wire_rows
        z = w * (1 + n)  # per wire row: Σ q_i, the q_i
        means, sums = vals[:g_n], vals[g_n : g_n + z]
        snaps = vals[g_n + z : g_n + z + g_n * n]
        at = g_n + z + g_n * n
        ys = vals[at : at + n] if w else []
        wires = [vals[at + (1 + k) * n : at + (2 + k) * n] for k in range(w)]  # the v_i (, the S_i + r_i)
        scale, bg_s = vals[-2], vals[-1]
        ops = self._apply_compressed(sums, ys, wires, scale) if w else []
        for g, (dtype, idx, sizes) in enumerate(self._groups):
            for i in range(n):
                with tf.device(self._devices[i]):
                    diff = means[g] - snaps[g * n + i]  # ȳ − y_i, one flat buffer
                    pieces = tf.split(diff, sizes) if len(sizes) > 1 else [diff]
                    for m, piece in zip(idx, pieces):
                        kind, j = self._entries[m]
                        if kind == "var":
                            c = self.variables[j].values[i]
                            if self._decays[j] != 1.0:  # a decaying slot: a^k (ȳ − y_i)
                                piece = piece * tf.pow(
                                    tf.constant(self._decays[j], dtype), tf.cast(k_now, dtype)
                                )
                            ops.append(c.assign_add(tf.reshape(piece, c.shape)))
                            if self.rule == "vrl" and j < self.n_trainable:
                                d = self._deltas[j][i]  # Δ_i += (ȳ − y_i)/(k_y·lr_y)
                                ops.append(d.assign_add(tf.reshape(piece / tf.cast(scale, dtype), d.shape)))
                        else:  # piece = S̄ − S_i: Δ_i = (S_i − S̄)/k_y
                            d = self._deltas[j][i]
                            ops.append(d.assign(tf.reshape(-piece / tf.cast(scale, dtype), d.shape)))
        with tf.control_dependencies(ops):
            done = self.pending.assign(0)
        with tf.control_dependencies([done]):
            return tf.identity(bg_s)

    def _apply_compressed(
        self, sums: List[tf.Tensor], ys: List[tf.Tensor], wires: List[List[tf.Tensor]], scale: tf.Tensor
    ) -> List[Any]:
        """The compressed mean's step 1 for the trainables: x̄ = x₀ + Σq/R, x_i += x̄ − y_i, x₀ ← x̄,
        e_i ← v_i − q_i; vrl: Δ_i ← Δ_i + (Σq/R − q_i)/(k_y·lr_y); gradient: Δ_i ← (Ĝ_i − ΣĜ/R)/k_y,
        r_i ← S_i + r_i − Ĝ_i (``compressed_sync.average``'s terms, with the snapshot in place of x_i, G_i)."""
        n, sizes, ops = self.n_local, self._train_sizes, []
        r = float(self._strategy.num_replicas_in_sync)
        if self.rule == "gradient":
            ops += self._apply_gradient(sums[1 + n :], wires[1], scale)
        for i in range(n):
            with tf.device(self._devices[i]):
                q_bar = sums[0] / r
                anchors = [self._anchors[j][i] for j in range(self.n_trainable)]
                x_bar = tf.concat([tf.reshape(a.read_value(), [-1]) for a in anchors], 0) + q_bar
                parts = [x_bar - ys[i], x_bar, q_bar, sums[1 + i], wires[0][i] - sums[1 + i]]
                for j, (diff, xb, qb, q_i, e_i) in enumerate(zip(*[tf.split(p, sizes) for p in parts])):
                    c, shape = self.variables[j].values[i], self.variables[j].shape
                    ops += [c.assign_add(tf.reshape(diff, shape)), anchors[j].assign(tf.reshape(xb, shape))]
                    ops.append(self._residuals[j][i].assign(tf.reshape(e_i, shape)))
                    if self.rule == "vrl":  # Δ_i + (Σq/R − q_i)/(1·k_y·lr_y), as compressed_sync.average
                        d = self._deltas[j][i]
                        qb, q_i = tf.reshape(qb, shape), tf.reshape(q_i, shape)
                        k_lr = tf.cast(scale, tf.float32)
                        ops.append(d.assign(_corr.vrl_delta_update(d.read_value(), qb, q_i, 1.0, k_lr)))
        return ops

    def _apply_gradient(self, sums: List[tf.Tensor], gs: List[tf.Tensor], scale: tf.Tensor) -> List[Any]:
        """``gradient``'s wire row: Δ_i ← (Ĝ_i − ΣĜ/R)/k_y and r_i ← (S_i + r_i) − Ĝ_i per variable."""
        ops, r = [], float(self._strategy.num_replicas_in_sync)
        for i in range(self.n_local):
            with tf.device(self._devices[i]):
                g_bar, k = sums[0] / r, tf.cast(scale, tf.float32)
                parts = [tf.split(p, self._train_sizes) for p in (g_bar, sums[1 + i], gs[i] - sums[1 + i])]
                for j, (gb, g_i, r_i) in enumerate(zip(*parts)):
                    shape = self.variables[j].shape
                    ops.append(self._deltas[j][i].assign(tf.reshape(_corr.gradient_delta(g_i, gb, k), shape)))
                    ops.append(self._grad_res[j][i].assign(tf.reshape(r_i, shape)))
        return ops

    @_no_autograph
    def sync(self, scale: tf.Tensor, k: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """In the traced step, at a scheduled sync after ``k`` local steps: steps 1 and 2 of the rule.
        ``scale`` = k·lr (vrl) or k (gradient). Returns (exposed seconds, background seconds of the applied
        mean or 0)."""
        t0 = tf.timestamp()
        with tf.control_dependencies([t0]):
            bg_s = tf.cond(
                self.pending.read_value() > 0,
                lambda: self.apply_pending(k),
                lambda: tf.constant(0.0, tf.float64),
            )
        with tf.control_dependencies([bg_s]):
            bufs = self._pack()
        with tf.device("/CPU:0"):
            enq = self._snapshots.enqueue(bufs + [tf.cast(scale, tf.float64)])
        resets = []
        with tf.control_dependencies([enq]):
            if (
                self._grad_sums is not None
            ):  # S_i travelled with the snapshot: G_i starts the next period at 0
                for row in self._grad_sums:
                    for c in row:
                        with tf.device(c.device):
                            resets.append(c.assign(tf.zeros_like(c)))
            with tf.device("/CPU:0"):
                launched = tf.numpy_function(self._launch, [], tf.int64, stateful=True)
        with tf.control_dependencies([launched] + resets):
            flag = self.pending.assign(1)
        with tf.control_dependencies([flag]):
            t1 = tf.timestamp()
        return t1 - t0, bg_s

    def _pack(self) -> List[tf.Tensor]:
        out = []
        for _dtype, idx, _ in self._groups:
            for i in range(self.n_local):
                with tf.device(self._devices[i]):
                    parts = [
                        tf.reshape(self._entry_component(self._entries[m], i).read_value(), [-1]) for m in idx
                    ]
                    out.append(tf.concat(parts, 0) if len(parts) > 1 else tf.identity(parts[0]))
        if self.compression is None:
            return out
        ys, vs, gs = [], [], []
        for i in range(self.n_local):
            with tf.device(self._devices[i]):
                rows = [
                    (v.values[i], self._anchors[j][i], self._residuals[j][i])
                    for j, v in enumerate(self.variables[: self.n_trainable])
                ]
                flat = [[tf.reshape(t.read_value(), [-1]) for t in row] for row in rows]
                ys.append(tf.concat([y for y, _, _ in flat], 0))
                vs.append(tf.concat([y - a + e for y, a, e in flat], 0))  # v_i = (y_i − x₀) + e_i
                if self._wire_rows == 2:  # S_i + r_i
                    pairs = [(self._grad_sums[j][i], self._grad_res[j][i]) for j in range(self.n_trainable)]
                    gs.append(
                        tf.concat([tf.reshape(g.read_value() + e.read_value(), [-1]) for g, e in pairs], 0)
                    )
        return out + ys + vs + gs

    def drain(self) -> Optional[float]:
        """Eager: apply the in-flight mean now (step 1 of the rule, k unchanged). Returns the background
        all-reduce's seconds, or None if nothing was in flight."""
        if int(self.pending.numpy()) == 0:
            return None
        if self._errors:
            raise InputError(
                f"the background averaging failed: {self._errors[0]}",
                where="SkipCorrectStrategy(overlap=True)",
            )
        return float(self.apply_pending(self._local_steps.read_value()).numpy())


def validate_overlap(overlap: object, where: str = "overlap") -> bool:
    """``overlap`` must be True or False (one-line InputError otherwise).

    >>> validate_overlap(True)
    True
    """
    if not isinstance(overlap, bool):
        raise InputError(f"must be True or False, got {overlap!r}", where=where)
    return overlap
