"""Compressed syncs with error feedback (pure, exact): the period's model delta travels in bf16 or fp16.

At a sync every worker i sends, instead of its model x_i, the rounded delta since the last global model
x₀ plus the residual e_i it kept from earlier rounding (docs/skip_correct.md, "Compressed syncs")::

    v_i = (x_i − x₀) + e_i          q_i = round(v_i)          e_i ← v_i − q_i
    x̄   = x₀ + Σ_i q_i / R
    vrl:       Δ_i ← Δ_i + (q̄ − q_i) / (k·clr)          q̄ = Σ_j q_j / R
    gradient:  Ĝ_i = round(G_i + r_i),  r_i ← G_i + r_i − Ĝ_i,   Δ_i ← (Ĝ_i − mean_j Ĝ_j) / k,   G_i ← 0
    none:      Δ_i unchanged

``round`` is round-to-nearest-even into the wire dtype and back (:func:`round_bf16`, :func:`round_fp16`; in
TensorFlow ``tf.cast`` there and back). ``"int8"`` (two-level averaging only: int8 cannot be summed, so the
hosts exchange their values by all-gather and add them in float32) rounds blocks of ``INT8_BLOCK``
consecutive values of the flat buffer to multiples of their scale s = max|v|/127 (:func:`round_int8`). The corrections use what each worker *sent* (q_i, Ĝ_i), so
Σ_i Δ_i stays 0 exactly; error feedback keeps the running sum of applied averages within one rounding of
the sum of the exact averages (Σ_n mean_i q_i = Σ_n mean_i d_i − mean_i e_i). If the reduced sum has a
non-finite element (fp16 overflows at |v| ≥ 65520), every worker sees it and the sync is done uncompressed:
q_i = v_i exactly, e_i ← 0 (:func:`compressed_sync` reports ``fallback=True``).

``compression=None`` is today's rule: x̄ = Σ_i x_i / R, vrl Δ_i + (x̄ − x_i)/(k·clr), gradient (G_i − Ḡ)/k.

Every sync function uses only ``+ − * /`` and the rounding function it is given, so the same code runs on
numpy arrays and on tensors.

Example:
    >>> import numpy as np
    >>> x0 = np.zeros(1)
    >>> out = compressed_sync(x0, [np.array([1.0 / 3]), np.array([0.0])], "vrl", 1, 1.0, codec="bf16")
    >>> float(out.x[0]), float(out.residuals[0][0])       # 1/3 in bf16 is 0.333984375
    (0.1669921875, -0.0006510416666666852)
    >>> sync_bytes(10_000_000, "bf16"), sync_bytes(10_000_000, None)
    (20000000, 40000000)
"""

from typing import Any, Callable, List, NamedTuple, Optional, Sequence

import numpy as np

from tf_commopt.errors import InputError

__all__ = [
    "CODECS",
    "BLOCK_CODECS",
    "INT8_BLOCK",
    "WIRE_BYTES",
    "UNIT_ROUNDOFF",
    "FP16_MAX",
    "validate_compression",
    "bf16_bits",
    "round_bf16",
    "round_fp16",
    "round_int8",
    "rounder",
    "encode",
    "reduce_sum",
    "SyncResult",
    "compressed_sync",
    "sync_bytes",
]

CODECS = ("bf16", "fp16")  # float codecs: summed in the wire dtype, flat or two-level
BLOCK_CODECS = ("int8",)  # blockwise codecs: two-level averaging only (exchanged by all-gather)
INT8_BLOCK = 256  # values per int8 block (one float32 scale each)
WIRE_BYTES = {None: 4, "bf16": 2, "fp16": 2, "int8": 1}  # per value (int8: plus 4 bytes per block)
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11}
"""u: |round(v) − v| ≤ u·|v| for v in the codec's normal range (half a unit in the last place)."""
FP16_MAX = 65504.0
REDUCTIONS = ("exact", "wire")
RULES = ("vrl", "gradient", "none")


def validate_compression(value: object, where: str = "compression") -> Optional[str]:
    """``None``, ``"bf16"``, ``"fp16"`` or ``"int8"`` (one-line InputError naming ``where`` otherwise).

    >>> validate_compression("bf16"), validate_compression(None)
    ('bf16', None)
    """
    if value is None or value in CODECS + BLOCK_CODECS:
        return value
    raise InputError(f"must be 'bf16', 'fp16', 'int8' or None, got {value!r}", where=where)


def bf16_bits(x: Any) -> np.ndarray:
    """The bfloat16 bit patterns (uint16) of ``x`` rounded to nearest, ties to even, from float32.

    The upper 16 bits of the float32 after adding 0x7FFF plus the lowest kept bit (TensorFlow's
    ``tf.cast(x, tf.bfloat16)`` rounds the same way: Eigen's ``float_to_bfloat16_rtne``). NaN stays a
    quiet NaN; values beyond the largest bfloat16 round to ±inf.

    >>> [hex(b) for b in bf16_bits(np.array([1.0, 1.00390625, 1.01171875, -2.0], np.float32))]
    ['0x3f80', '0x3f80', '0x3f82', '0xc000']
    """
    f = np.array(x, dtype=np.float32)
    u = f.reshape(-1).view(np.uint32).astype(np.uint64).reshape(f.shape)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f), ((u >> 16) | 0x40).astype(np.uint16), rounded)


def round_bf16(x: Any) -> Any:
    """``x`` rounded to bfloat16 (via float32, :func:`bf16_bits`) and back, in ``x``'s float dtype.

    >>> float(round_bf16(np.float32(1.0 / 3)))
    0.333984375
    """
    arr = np.asarray(x)
    dtype = arr.dtype if arr.dtype in (np.float32, np.float64) else np.float64
    bits = bf16_bits(arr).astype(np.uint32) << 16
    return bits.reshape(-1).view(np.float32).reshape(bits.shape).astype(dtype)


def round_fp16(x: Any) -> Any:
    """``x`` rounded to IEEE half precision (numpy's float16, round to nearest even) and back.

    |x| ≥ 65520 becomes ±inf (the sync then falls back to uncompressed, see the module docstring).

    >>> float(round_fp16(np.float64(1.0 / 3)))
    0.333251953125
    """
    arr = np.asarray(x)
    dtype = arr.dtype if arr.dtype in (np.float32, np.float64) else np.float64
    with np.errstate(over="ignore"):
        return arr.astype(np.float16).astype(dtype)


def round_int8(x: Any, block: int = INT8_BLOCK) -> Any:
    """``x`` (flattened) in blocks of ``block`` values, each rounded to a multiple of its scale
    s = max|v|/127 (float32; round to nearest even, |q| ≤ 127; a block of zeros stays zeros), back in
    ``x``'s shape and float dtype. |round_int8(v) − v| ≤ s/2 = max|block|/254 elementwise. The arithmetic is
    float32's, as on the wire (TensorFlow: :func:`tf_commopt.distribute.compressed_sync.quantize_int8`).

    >>> [float(v) for v in round_int8(np.array([1.0, 0.5, 0.3, -0.01]))]   # s = 1/127; 63.5 -> 64
    [1.0, 0.5039370059967041, 0.29921260476112366, -0.007874015718698502]
    """
    arr = np.asarray(x)
    dtype = arr.dtype if arr.dtype in (np.float32, np.float64) else np.float64
    flat = arr.astype(np.float32).reshape(-1)
    pad = -len(flat) % block
    blocks = np.concatenate([flat, np.zeros(pad, np.float32)]).reshape(-1, block)
    scale = np.max(np.abs(blocks), axis=1) / np.float32(127.0)
    safe = np.where(scale > 0, scale, np.float32(1.0))[:, None]
    q = np.clip(np.round(blocks / safe), -127, 127)
    out = (q * scale[:, None]).reshape(-1)[: len(flat)]
    return out.reshape(arr.shape).astype(dtype)


def rounder(codec: Optional[str]) -> Optional[Callable[[Any], Any]]:
    """The numpy rounding function of a codec (None for no compression)."""
    codec = validate_compression(codec)
    return None if codec is None else {"bf16": round_bf16, "fp16": round_fp16, "int8": round_int8}[codec]


def encode(delta: Any, residual: Any, round_fn: Callable[[Any], Any]) -> tuple:
    """(q, e') = (round(delta + residual), delta + residual − q): what is sent and what is kept.

    >>> q, e = encode(np.array([1.0 / 3]), np.zeros(1), round_bf16)
    >>> float(q[0] + e[0]) == 1.0 / 3
    True
    """
    v = delta + residual
    q = round_fn(v)
    return q, v - q


def reduce_sum(parts: Sequence[Any], round_fn: Optional[Callable[[Any], Any]] = None) -> Any:
    """Σ parts in order; with ``round_fn`` every partial sum is rounded (a reduction in the wire dtype).

    |reduce_sum(q, round) − Σ q| ≤ γ_{R−1}·Σ|q_i|, γ_n = n·u/(1 − n·u) (docs/skip_correct.md).

    >>> float(reduce_sum([np.float64(1.0), np.float64(2.0**-9)], round_bf16))    # 1 + 2^-9 -> 1 in bf16
    1.0
    """
    total = parts[0]
    for p in parts[1:]:
        total = total + p if round_fn is None else round_fn(total + p)
    return total


class SyncResult(NamedTuple):
    """One variable's compressed sync: the new global model, each worker's Δ_i and residuals."""

    x: Any
    deltas: List[Any]
    residuals: List[Any]
    grad_residuals: Optional[List[Any]]
    sent: List[Any]
    fallback: bool


def _zeros(like: Any, n: int) -> List[Any]:
    return [like * 0.0 for _ in range(n)]


def _all_finite(values: Sequence[Any]) -> bool:
    return all(bool(np.all(np.isfinite(v))) for v in values)


def _check(rule: str, interval: int, clr: float, codec: Optional[str], reduce: str) -> None:
    if rule not in RULES:
        raise InputError(f"unknown rule {rule!r}; expected one of {', '.join(RULES)}", where="rule")
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise InputError(f"must be an integer >= 1, got {interval!r}", where="interval")
    if rule == "vrl" and not (isinstance(clr, (int, float)) and np.isfinite(clr) and clr > 0):
        raise InputError(f"must be a finite number > 0, got {clr!r}", where="clr")
    validate_compression(codec, where="codec")
    if reduce not in REDUCTIONS:
        raise InputError(f"must be 'exact' or 'wire', got {reduce!r}", where="reduce")


def _uncompressed(x0, xs, rule, interval, clr, deltas, grad_sums) -> SyncResult:
    """Today's rule: x̄ = Σ x_i / R; vrl Δ_i + (x̄ − x_i)/(k·clr); gradient (G_i − Ḡ)/k."""
    r = len(xs)
    x_bar = reduce_sum(xs) / r
    if rule == "vrl":
        deltas = [d + (x_bar - x) / (interval * clr) for d, x in zip(deltas, xs)]
    elif rule == "gradient":
        g_bar = reduce_sum(grad_sums) / r
        deltas = [(g - g_bar) / interval for g in grad_sums]
    return SyncResult(x_bar, deltas, _zeros(x0, r), None, list(xs), False)


def compressed_sync(
    x0: Any,
    xs: Sequence[Any],
    rule: str,
    interval: int,
    clr: float = 1.0,
    deltas: Optional[Sequence[Any]] = None,
    residuals: Optional[Sequence[Any]] = None,
    grad_sums: Optional[Sequence[Any]] = None,
    grad_residuals: Optional[Sequence[Any]] = None,
    codec: Optional[str] = None,
    round_fn: Optional[Callable[[Any], Any]] = None,
    reduce: str = "exact",
) -> SyncResult:
    """One variable's sync with compressed deltas and error feedback (module docstring).

    Args:
        x0: the global model at the last sync (every worker's copy was x₀ then).
        xs: each worker's model now, after k = ``interval`` local steps.
        rule: the correction, ``"vrl"``, ``"gradient"`` or ``"none"``.
        interval: k, the local steps since the last sync.
        clr: the lr of the vrl update.
        deltas: each worker's Δ_i (zeros when None).
        residuals: each worker's e_i (zeros when None).
        grad_sums: ``gradient``: each worker's G_i (the period's raw gradient sum).
        grad_residuals: ``gradient``: each worker's r_i (zeros when None).
        codec: ``None`` (today's rule), ``"bf16"`` or ``"fp16"``.
        round_fn: the rounding into the wire dtype and back (default: the codec's numpy function; in
            TensorFlow ``lambda v: tf.cast(tf.cast(v, tf.bfloat16), v.dtype)``).
        reduce: ``"exact"``: the q_i are summed in the working precision (what error feedback covers);
            ``"wire"``: every partial sum is rounded too, as a reduction in the wire dtype does.

    Returns:
        :class:`SyncResult` (``sent`` = the q_i; ``fallback`` True if the sync went uncompressed).
    """
    _check(rule, interval, clr, codec, reduce)
    r = len(xs)
    if r == 0:
        raise InputError("no worker models", where="xs")
    deltas = list(deltas) if deltas is not None else _zeros(x0, r)
    if rule == "gradient" and (grad_sums is None or len(grad_sums) != r):
        raise InputError("the gradient rule needs one gradient sum per worker", where="grad_sums")
    if codec is None:
        return _uncompressed(x0, xs, rule, interval, clr, deltas, grad_sums)
    round_fn = round_fn or rounder(codec)
    residuals = list(residuals) if residuals is not None else _zeros(x0, r)
    g_res = list(grad_residuals) if grad_residuals is not None else _zeros(x0, r)
    wire = round_fn if reduce == "wire" else None
    moves = [x - x0 for x in xs]
    sent = [encode(d, e, round_fn) for d, e in zip(moves, residuals)]
    sums = [reduce_sum([q for q, _ in sent], wire)]
    g_sent = []
    if rule == "gradient":
        g_sent = [encode(g, e, round_fn) for g, e in zip(grad_sums, g_res)]
        sums.append(reduce_sum([q for q, _ in g_sent], wire))
    fallback = not _all_finite(sums)
    if fallback:  # every worker sees the same non-finite sum: send v_i exactly, residuals to 0
        sent = [(d + e, e * 0.0) for d, e in zip(moves, residuals)]
        g_sent = [(g + e, e * 0.0) for g, e in zip(grad_sums, g_res)] if g_sent else []
        sums = [reduce_sum([q for q, _ in sent])] + ([reduce_sum([q for q, _ in g_sent])] if g_sent else [])
    qs = [q for q, _ in sent]
    q_bar = sums[0] / r
    new_x = x0 + q_bar
    if rule == "vrl":
        deltas = [d + (q_bar - q) / (interval * clr) for d, q in zip(deltas, qs)]
    elif rule == "gradient":
        g_bar = sums[1] / r
        deltas = [(q - g_bar) / interval for q, _ in g_sent]
    new_g_res = [e for _, e in g_sent] if g_sent else None
    return SyncResult(new_x, deltas, [e for _, e in sent], new_g_res, qs, fallback)


def sync_bytes(
    param_count: int, compression: Optional[str] = None, correction: str = "vrl", state_count: int = 0
) -> int:
    """Payload bytes one replica puts into one sync's all-reduce (as ``stats()['bytes_communicated']``).

    The trainable variables' deltas travel in the wire dtype (4 bytes fp32, 2 bf16/fp16), and with the
    ``gradient`` rule the G_i too; ``state_count`` other averaged floats (BatchNorm statistics, slots
    with ``average_optimizer_state``) stay float32.

    >>> sync_bytes(1000, "fp16", "gradient", state_count=10)
    4040
    """
    if isinstance(param_count, bool) or not isinstance(param_count, int) or param_count < 0:
        raise InputError(f"must be an integer >= 0, got {param_count!r}", where="param_count")
    if isinstance(state_count, bool) or not isinstance(state_count, int) or state_count < 0:
        raise InputError(f"must be an integer >= 0, got {state_count!r}", where="state_count")
    if correction not in RULES:
        raise InputError(
            f"unknown rule {correction!r}; expected one of {', '.join(RULES)}", where="correction"
        )
    compression = validate_compression(compression)
    per = param_count * WIRE_BYTES[compression]
    if compression in BLOCK_CODECS:
        per += 4 * -(-param_count // INT8_BLOCK)
    buffers = 2 if correction == "gradient" else 1
    return per * buffers + state_count * 4
