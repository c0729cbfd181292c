"""Compressed syncs in SkipCorrectStrategy (``compression="bf16"`` or ``"fp16"``): the period's model
delta travels in the wire dtype inside the one fused all-reduce, with error feedback.

The rule is :mod:`tf_commopt.core.compress` (docs/skip_correct.md, "Compressed syncs"), here on tensors:
at a sync after k local steps, for every trainable variable of the correction state and replica i,
with x₀ the anchor (the model every replica held after the last averaging) and e_i the residual::

    v_i = (x_i − x₀) + e_i      q_i = round(v_i)      e_i ← v_i − q_i
    S   = Σ_i q_i               (the fused all-reduce, SUM, in the wire dtype)
    x̄   = x₀ + S / R            x_i ← x̄,  x₀ ← x̄
    vrl:       Δ_i ← Δ_i + (S/R − q_i) / (k·clr)
    gradient:  Ĝ_i = round(G_i + r_i), r_i ← G_i + r_i − Ĝ_i, Δ_i ← (Ĝ_i − ΣĜ/R) / k, G_i ← 0

``round`` is ``tf.cast`` into the wire dtype and back (round to nearest even; the same bits as
``core.compress.round_bf16`` / ``round_fp16``). The all-reduce adds in the wire dtype (the rule's
``reduce="wire"``), identically on every worker. If a reduced sum has a non-finite element (fp16
overflow), every worker sees it and the sync is redone uncompressed in the same graph (a float32
all-reduce of the v_i, residuals ← 0). The averaged non-trainable state (BatchNorm statistics, slots
with ``average_optimizer_state``) travels in float32 in the same call.

x₀ is taken from the model at the first local step, and again after any averaging outside this rule
(``strategy.sync()``, a restore without it): :func:`anchor_op`. With ``overlap=True`` the snapshot
y_i is compressed against x₀ the same way and x₀ advances when the mean is applied (``overlap.py``).

Example:
    >>> strategy = SkipCorrectStrategy(interval=8, compression="bf16")   # doctest: +SKIP
    >>> strategy.stats()["sync_payload_bytes"]                           # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from tf_commopt._compat import container_strategy
from tf_commopt.core.compress import BLOCK_CODECS, INT8_BLOCK, sync_bytes, validate_compression
from tf_commopt.distribute import correction as _corr
from tf_commopt.distribute.averaging import fused_reduce
from tf_commopt.distribute.state import SkipCorrectState, _pass_through
from tf_commopt.errors import InputError

__all__ = [
    "WIRE_DTYPES",
    "wire_dtype",
    "quantize_int8",
    "dequantize_int8",
    "encode",
    "check_rule",
    "anchor_op",
    "mark_stale",
    "average",
    "payload_bytes",
]

WIRE_DTYPES = {"bf16": tf.bfloat16, "fp16": tf.float16, "int8": tf.int8}
_no_autograph = tf.autograph.experimental.do_not_convert


def wire_dtype(codec: Optional[str]) -> Optional[tf.DType]:
    """The TensorFlow dtype of a codec (None for no compression).

    >>> wire_dtype("bf16").name, wire_dtype(None)    # doctest: +SKIP
    ('bfloat16', None)
    """
    codec = validate_compression(codec)
    return None if codec is None else WIRE_DTYPES[codec]


def quantize_int8(v: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """A float32 vector in blocks of ``INT8_BLOCK`` values: (int8 values, one float32 scale per block,
    the values they stand for in float32), as :func:`tf_commopt.core.compress.round_int8` rounds.

    >>> q, scales, sent = quantize_int8(tf.constant([1.0, 0.5, 0.3, -0.01]))    # doctest: +SKIP
    >>> q.numpy().tolist(), sent.numpy()[1]                                      # doctest: +SKIP
    ([127, 64, 38, -1], 0.503937)
    """
    n = int(v.shape[0])
    pad = -n % INT8_BLOCK
    blocks = tf.reshape(tf.pad(v, [[0, pad]]) if pad else v, [-1, INT8_BLOCK])
    scales = tf.reduce_max(tf.abs(blocks), axis=1) / 127.0
    safe = tf.where(scales > 0, scales, tf.ones_like(scales))[:, None]
    q = tf.cast(tf.reshape(tf.clip_by_value(tf.round(blocks / safe), -127.0, 127.0), [-1]), tf.int8)[:n]
    return q, scales, dequantize_int8(q, scales)


def dequantize_int8(q: tf.Tensor, scales: tf.Tensor) -> tf.Tensor:
    """int8 values and their blocks' scales -> the float32 values they stand for (q·s per block)."""
    n = int(q.shape[0])
    blocks = tf.reshape(tf.pad(tf.cast(q, tf.float32), [[0, -n % INT8_BLOCK]]), [-1, INT8_BLOCK])
    return tf.reshape(blocks * scales[:, None], [-1])[:n]


def encode(v: tf.Tensor, codec: str) -> Tuple[Any, tf.Tensor]:
    """(what crosses the link, the float32 values it stands for) of a float32 vector: the vector in
    the wire dtype (bf16, fp16), or int8 values and their scales (int8).

    >>> wire, sent = encode(tf.constant([1.0 / 3]), "bf16")    # doctest: +SKIP
    >>> float(sent[0])                                           # doctest: +SKIP
    0.333984375
    """
    if codec in BLOCK_CODECS:
        q, scales, sent = quantize_int8(v)
        return (q, scales), sent
    wire = tf.cast(v, WIRE_DTYPES[codec])
    return wire, tf.cast(wire, tf.float32)


def check_rule(codec: Optional[str], rule: str, optimizer: str) -> None:
    """A one-line error (through tracing) when ``codec`` cannot carry the resolved correction ``rule``:
    int8 carries vrl and none (the gradient rule's G_i would share the blocks of the model's deltas)."""
    if rule == "gradient" and codec in BLOCK_CODECS:
        raise _pass_through(
            InputError(
                f"{codec!r} compresses the vrl and none corrections; the gradient correction (chosen for "
                f"{optimizer}) needs 'bf16', 'fp16' or None, or pass correction='vrl' to keep {codec!r}",
                where="SkipCorrectStrategy(compression=...)",
            )
        )


def payload_bytes(variables: Sequence[Any], n_trainable: int, rule: str, codec: Optional[str]) -> int:
    """Bytes one replica puts into one scheduled sync: the trainable deltas (and G_i for ``gradient``) in
    the wire dtype (int8: with a float32 scale per block of the flat buffer), the other averaged state in
    its own dtype."""
    codec = validate_compression(codec)
    trainable = [int(v.shape.num_elements()) for v in variables[:n_trainable]]
    if codec is None:
        total = sum(n * v.dtype.size for n, v in zip(trainable, variables))
        total *= 2 if rule == "gradient" else 1
    else:
        total = sync_bytes(sum(trainable), codec, rule)
    return total + sum(int(v.shape.num_elements()) * v.dtype.size for v in variables[n_trainable:])


def _round(v: tf.Tensor, wire: tf.DType) -> Tuple[tf.Tensor, tf.Tensor]:
    """(the wire value, the wire value back in v's dtype)."""
    w = tf.cast(v, wire)
    return w, tf.cast(w, v.dtype)


@_no_autograph
def anchor_op(state: SkipCorrectState, optimizer: Any, warmup_steps: int) -> tf.Tensor:
    """In the step, before the local update: x₀ ← x_i at the first local step or when x₀ is stale."""
    t = tf.cast(optimizer.iterations, tf.int64) + 1
    need = tf.logical_and(
        t > warmup_steps,
        tf.logical_or(t == warmup_steps + 1, state.anchor_stale.read_value() > 0),
    )

    def snap() -> tf.Tensor:
        ops = []
        for v, a in zip(state.variables, state.anchors):
            for c, ac in zip(v.values, a.values):
                with tf.device(ac.device):
                    ops.append(ac.assign(c.read_value()))
        with tf.control_dependencies(ops):
            return state.anchor_stale.assign(0)

    return tf.cond(need, snap, lambda: tf.constant(0, tf.int64))


def mark_stale(states: Sequence[SkipCorrectState]) -> None:
    """After an averaging outside the rule (eager): take x₀ from the model at the next local step."""
    for s in states:
        if s.anchors is not None:
            s.anchor_stale.assign(1)


def _all_finite(sums: List[List[tf.Tensor]]) -> tf.Tensor:
    checks = [tf.reduce_all(tf.math.is_finite(tf.cast(row[0], tf.float32))) for row in sums]
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


@_no_autograph
def _reduce(
    ext: Any, vs: List[List[Any]], wire: tf.DType, extras: List[List[Any]], reduce_to: Any = None
) -> Tuple[List[List[Any]], List[List[Any]], List[List[Any]], List[List[Any]]]:
    """The fused SUM of round(v) (wire dtype) and the extras (own dtype); if a wire sum is non-finite,
    the fused SUM of the exact v instead. Returns (sums of v rows, sent q rows, new residuals, extra sums).
    ``reduce_to``: as :func:`fused_reduce`'s."""
    rounded = [[_round(x, wire) for x in row] for row in vs]
    summed = [[w for w, _ in row] for row in rounded] + extras
    sums = fused_reduce(ext, tf.distribute.ReduceOp.SUM, summed, reduce_to)
    wire_sums, extra_sums = sums[: len(vs)], sums[len(vs) :]
    n_local = len(vs[0])
    ok = _all_finite(wire_sums) if wire == tf.float16 else None

    def compressed() -> List[Any]:
        out = [tf.cast(s, v.dtype) for srow, vrow in zip(wire_sums, vs) for s, v in zip(srow, vrow)]
        out += [q for row in rounded for _, q in row]
        out += [v - q for row, vrow in zip(rounded, vs) for (_, q), v in zip(row, vrow)]
        return out

    def fallback() -> List[Any]:  # every worker sees the same non-finite sum: redo it exactly
        exact = fused_reduce(ext, tf.distribute.ReduceOp.SUM, vs, reduce_to)
        out = [s for row in exact for s in row]
        out += [tf.identity(v) for row in vs for v in row]
        out += [tf.zeros_like(v) for row in vs for v in row]
        return out

    # bf16 has float32's range: a non-finite sum means a non-finite model, which an exact sum keeps, so
    # only fp16 carries the fallback (the branch costs graph-building time)
    flat = tf.cond(ok, compressed, fallback) if wire == tf.float16 else compressed()
    m = len(vs) * n_local
    rows = [[flat[p * m + j * n_local + i] for i in range(n_local)] for p in range(3) for j in range(len(vs))]
    n = len(vs)
    return rows[:n], rows[n : 2 * n], rows[2 * n :], extra_sums


def _inputs(state: SkipCorrectState, variables: Sequence[Any], n: int, t0: tf.Tensor) -> List[List[Any]]:
    """v_i = x_i − x₀ + e_i of every trainable variable, then (gradient) G_i + r_i."""
    anchors = state.components(state.anchors)
    res = state.components(state.residuals)
    with tf.control_dependencies([t0]):
        vs = []
        for j in range(n):
            row = []
            for i, c in enumerate(variables[j].values):
                with tf.device(c.device):
                    row.append(c.read_value() - anchors[j][i].read_value() + res[j][i].read_value())
            vs.append(row)
        if state.rule == "gradient":
            sums, gres = state.components(state.grad_sums), state.components(state.grad_residuals)
            for j in range(n):
                vs.append([g.read_value() + r.read_value() for g, r in zip(sums[j], gres[j])])
    return vs


@_no_autograph
def average(
    ext: Any,
    variables: Sequence[Any],
    state: SkipCorrectState,
    n_trainable: int,
    local_steps: Any,
    lr: Any = None,
) -> tf.Tensor:
    """The scheduled sync with compressed deltas (module docstring); ``variables`` are the state's
    trainable variables, then the averaged extras. Returns the seconds it took (also in telemetry)."""
    t0 = tf.timestamp()
    n, rule = n_trainable, state.rule
    wire = WIRE_DTYPES[state.compression]
    r = float(container_strategy(ext).num_replicas_in_sync)
    vs = _inputs(state, variables, n, t0)
    with tf.control_dependencies([t0]):
        extras = [[c.read_value() for c in v.values] for v in variables[n:]]
    sums, sent, new_res, extra_sums = _reduce(ext, vs, wire, extras)
    anchors, res = state.components(state.anchors), state.components(state.residuals)
    deltas = state.components(state.deltas)
    ops = []
    for j in range(n):
        for i, c in enumerate(variables[j].values):
            with tf.device(c.device):
                q_bar = sums[j][i] / r
                x_bar = anchors[j][i].read_value() + q_bar
                ops += [c.assign(x_bar), anchors[j][i].assign(x_bar), res[j][i].assign(new_res[j][i])]
                if rule == "vrl":
                    scale = tf.cast(local_steps, c.dtype) * tf.cast(lr, c.dtype)
                    d = deltas[j][i]
                    ops.append(
                        d.assign(_corr.vrl_delta_update(d.read_value(), q_bar, sent[j][i], 1.0, scale))
                    )
                elif rule == "gradient":
                    g_bar = sums[n + j][i] / r
                    k = tf.cast(local_steps, c.dtype)
                    ops.append(deltas[j][i].assign(_corr.gradient_delta(sent[n + j][i], g_bar, k)))
                    ops.append(state.components(state.grad_sums)[j][i].assign(tf.zeros_like(c)))
                    ops.append(state.components(state.grad_residuals)[j][i].assign(new_res[n + j][i]))
    for e, v in enumerate(variables[n:]):
        for i, c in enumerate(v.values):
            with tf.device(c.device):
                ops.append(c.assign(extra_sums[e][i] / tf.cast(r, c.dtype)))
    with tf.control_dependencies(ops):
        t1 = tf.timestamp()
    ext.telemetry.add_sync(t1 - t0)
    return t1 - t0
