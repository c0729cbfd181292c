"""Two-level averaging's rule on tensors (``SkipCorrectStrategy(host_interval=h)``): replicas on one host
average every h local steps, all replicas every H steps, with the correction at both levels.

The rule is :mod:`tf_commopt.core.hierarchical`'s (docs/skip_correct.md, "Two-level averaging"). Replica
i is on host c with n_c of the R replicas (w_c = n_c/R); k is the local steps since the last global sync;
clr the vrl update's learning rate; G_i the raw gradients summed since the last host sync, S_c the host's
sum of its means Ḡ_c since the last global sync and β_c its correction term (``gradient``)::

    host sync (every h-th local step before H):   x̄_c = Σ_{j∈c} x_j / n_c,   x_i ← x̄_c
        vrl:       Δ_i ← Δ_i + (x̄_c − x_i)/(h·clr)
        gradient:  Ḡ_c = Σ_{j∈c} G_j / n_c,   Δ_i ← (G_i − Ḡ_c)/h + β_c,   S_c ← S_c + Ḡ_c,   G_i ← 0
    global sync (k = H): the host sync's means, then across the hosts (x₀ the last global model; e_c,
    r_c the host's rounding residuals with compression, else round is exact and they stay 0):
        v_c = x̄_c − x₀ + e_c,   Q_c = round(v_c),   e_c ← v_c − Q_c,   Q̄ = Σ_c w_c Q_c,   x_i ← x₀ + Q̄
        vrl:       Δ_i ← Δ_i + (x̄_c − x_i)/(h·clr) + (Q̄ − Q_c)/(k·clr)
        gradient:  u_c = S_c + Ḡ_c + r_c,   Ŝ_c = round(u_c),   r_c ← u_c − Ŝ_c,
                   β_c ← (Ŝ_c − Σ_d w_d Ŝ_d)/k,   Δ_i ← (G_i − Ḡ_c)/h + β_c,   S_c ← 0,   G_i ← 0

Σ_i Δ_i stays 0 at both levels. Uncompressed, x̄ is computed as Σ_c w_c x̄_c (the same in exact
arithmetic). Non-trainable averaged state (BatchNorm statistics) follows the model in float32: the host
mean at host syncs, the mean over hosts at global syncs. Where the bytes go: :mod:`.two_level`.

Example:
    >>> strategy = SkipCorrectStrategy(interval=8, host_interval=2, compression="bf16")   # doctest: +SKIP
    >>> strategy.stats()["host_syncs"], strategy.stats()["inter_host_bytes"]            # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from tf_commopt.distribute.compressed_sync import WIRE_DTYPES, encode
from tf_commopt.distribute.two_level import TwoLevelAverager

__all__ = ["host_sync", "global_sync"]

_no_autograph = tf.autograph.experimental.do_not_convert
Rows = List[List[Any]]  # rows[j][i]: variable j on local replica i


def _pack(rows: Rows) -> Tuple[List[tf.Tensor], List[int]]:
    """rows[j][i] -> one flat float32 buffer per local replica, and the variables' sizes."""
    sizes = [int(r[0].shape.num_elements()) for r in rows]
    flats = []
    for i in range(len(rows[0])):
        with tf.device(rows[0][i].device):
            flats.append(tf.concat([tf.reshape(tf.cast(r[i], tf.float32), [-1]) for r in rows], 0))
    return flats, sizes


def _unpack(flats: List[tf.Tensor], sizes: List[int], like: Rows) -> Rows:
    """The inverse of :func:`_pack`: flats[i] -> out[j][i], shaped and typed like ``like[j][i]``."""
    out: Rows = [[None] * len(flats) for _ in like]
    for i, flat in enumerate(flats):
        with tf.device(like[0][i].device):
            pieces = tf.split(flat, sizes) if len(sizes) > 1 else [flat]
            for j, p in enumerate(pieces):
                out[j][i] = tf.cast(tf.reshape(p, like[j][i].shape), like[j][i].dtype)
    return out


def _map(fn, *rows: Rows) -> Rows:
    """fn(a[j][i], b[j][i], ...) for every j, i."""
    return [[fn(*vals) for vals in zip(*cols)] for cols in zip(*rows)]


class _HostLevel(NamedTuple):
    xs: Rows  # x_i as read
    means: Rows  # x̄_c
    g_part: Optional[Rows]  # (G_i − Ḡ_c)/h  (gradient)
    s_new: Optional[Rows]  # S_c + Ḡ_c  (gradient)


def _host_level(avg: TwoLevelAverager, variables: Sequence[Any], state: Any, t0: Any) -> _HostLevel:
    """Read x_i (and G_i), one host sum of both; the host means and the gradient rule's host terms."""
    grad = state is not None and state.rule == "gradient"
    with tf.control_dependencies([t0]):
        xs = [[c.read_value() for c in v.values] for v in variables]
        gs = [[g.read_value() for g in row] for row in state.grad_sum_components()] if grad else []
    flats, sizes = _pack(xs + gs)
    sums = avg.host_sum(flats)
    means_all = _unpack([s / float(m) for s, m in zip(sums, avg.n_host)], sizes, xs + gs)
    means, gbar = means_all[: len(xs)], means_all[len(xs) :]
    if not grad:
        return _HostLevel(xs, means, None, None)
    host_sums = state.components(state.host_sums)
    g_part = _map(lambda g, gb: (g - gb) / tf.cast(avg.h, g.dtype), gs, gbar)
    s_new = _map(lambda s, gb: s.read_value() + gb, host_sums, gbar)
    return _HostLevel(xs, means, g_part, s_new)


def _scale(steps: Any, lr: Any, like: Any) -> Any:
    return tf.cast(steps, like.dtype) * tf.cast(lr, like.dtype)


def _corrections(
    avg: TwoLevelAverager, state: Any, n: int, hl: _HostLevel, lr: Any, across: Optional[tuple] = None
) -> List[Any]:
    """The Δ_i (and gradient's S_c, β_c, G_i) updates of a host sync, or of a global sync when ``across``
    = (Q̄ − Q_c, Ŝ_c − Σ_d w_d Ŝ_d, k) is given (module docstring)."""
    rule = state.rule if state is not None else "none"
    if rule == "none":
        return []
    deltas, ops = state.delta_components(), []
    if rule == "gradient":
        betas, sums = state.components(state.host_deltas), state.components(state.host_sums)
        grads = state.grad_sum_components()
    for j in range(n):
        for i, d in enumerate(deltas[j]):
            with tf.device(d.device):
                if rule == "vrl":
                    step = (hl.means[j][i] - hl.xs[j][i]) / _scale(avg.h, lr, d)
                    if across is not None:
                        step += across[0][j][i] / _scale(across[2], lr, d)
                    ops.append(d.assign_add(step))
                    continue
                if across is None:  # host sync: β_c kept, S_c grows by Ḡ_c
                    beta = betas[j][i].read_value()
                    ops.append(sums[j][i].assign(hl.s_new[j][i]))
                else:  # global sync: β_c from the hosts' sums, S_c restarts
                    beta = across[1][j][i] / tf.cast(across[2], d.dtype)
                    ops += [betas[j][i].assign(beta), sums[j][i].assign(tf.zeros_like(d))]
                ops += [d.assign(hl.g_part[j][i] + beta), grads[j][i].assign(tf.zeros_like(d))]
    return ops


def _assign(variables: Sequence[Any], values: Rows) -> List[Any]:
    """x_i ← values[j][i] for every variable j and local replica i."""
    ops = []
    for j, v in enumerate(variables):
        for i, c in enumerate(v.values):
            with tf.device(c.device):
                ops.append(c.assign(values[j][i]))
    return ops


@_no_autograph
def host_sync(
    avg: TwoLevelAverager, variables: Sequence[Any], state: Any, n_trainable: int, lr: Any
) -> tf.Tensor:
    """The host sync (module docstring) of ``variables`` (the state's trainable ones first, then the
    averaged extras). Returns its seconds (also in the strategy's telemetry, ``host_comm_s``)."""
    t0 = tf.timestamp()
    hl = _host_level(avg, variables, state, t0)
    ops = _corrections(avg, state, n_trainable, hl, lr) + _assign(variables, hl.means)
    with tf.control_dependencies(ops):
        t1 = tf.timestamp()
    avg.ext.telemetry.add_host_sync(t1 - t0)
    return t1 - t0


def _across_exact(avg: TwoLevelAverager, hl: _HostLevel) -> Tuple[Rows, Rows, Optional[Rows]]:
    """Uncompressed: (x̄ of every variable, Q̄ − Q_c = x̄ − x̄_c, Σ_d w_d S_d) in one mean over hosts."""
    send = hl.means + (hl.s_new or [])
    flats, sizes = _pack(send)
    glob = _unpack(avg.cross_host_mean(flats), sizes, send)
    xbar = glob[: len(hl.means)]
    sbar = glob[len(hl.means) :] if hl.s_new is not None else None
    return xbar, _map(lambda a, b: a - b, xbar, hl.means), sbar


def _across_compressed(
    avg: TwoLevelAverager, hl: _HostLevel, state: Any, n: int
) -> Tuple[Rows, Rows, Optional[Rows], List[Any]]:
    """Compressed (module docstring): (x̄ of every variable, Q̄ − Q_c of the trainable ones, the sent
    Ŝ_c − Σ_d w_d Ŝ_d, the residual and anchor assignments)."""
    wire = WIRE_DTYPES[state.compression]
    anchors, res = state.components(state.anchors), state.components(state.residuals)
    vs = _map(lambda m, a, e: m - a.read_value() + e.read_value(), hl.means[:n], anchors, res)
    us = (
        _map(lambda s, r: s + r.read_value(), hl.s_new, state.components(state.grad_residuals))
        if hl.s_new
        else []
    )
    flats, sizes = _pack(vs + us)
    wires = []
    for f in flats:
        with tf.device(f.device):
            wires.append(tf.cast(f, wire))
    sent = _unpack([tf.cast(w, tf.float32) for w in wires], sizes, vs + us)
    mean = _unpack(avg.cross_host_mean(wires), sizes, vs + us)
    xbar = _map(lambda a, q: a.read_value() + q, anchors, mean[:n])
    ops = [a.assign(x) for ra, rx in zip(anchors, xbar) for a, x in zip(ra, rx)]
    ops += [e.assign(v - q) for re, rv, rq in zip(res, vs, sent[:n]) for e, v, q in zip(re, rv, rq)]
    s_diff = None
    if us:
        gres = state.components(state.grad_residuals)
        ops += [r.assign(u - q) for rr, ru, rq in zip(gres, us, sent[n:]) for r, u, q in zip(rr, ru, rq)]
        s_diff = _map(lambda q, m: q - m, sent[n:], mean[n:])
    extras = hl.means[n:]
    if extras:
        ex_flats, ex_sizes = _pack(extras)
        xbar += _unpack(avg.cross_host_mean(ex_flats), ex_sizes, extras)
    return xbar, _map(lambda m, q: m - q, mean[:n], sent[:n]), s_diff, ops


def _pipelined(
    avg: TwoLevelAverager, variables: Sequence[Any], state: Any, n: int, t0: Any, codec: Optional[str]
) -> Tuple[_HostLevel, Rows, Rows, List[Any]]:
    """vrl / none: the host sums and the mean over hosts of the trainable variables as one pipeline
    (:meth:`TwoLevelAverager.pipelined`), the same values as :func:`_host_level` then
    :func:`_across_exact` / :func:`_across_compressed` (``codec``: what crosses the hosts, None exact).
    Returns (host level, x̄, Q̄ − Q_c, ops)."""
    with tf.control_dependencies([t0]):
        xs = [[c.read_value() for c in v.values] for v in variables]
    flats, sizes = _pack(xs[:n])
    if codec is not None:
        anchors, res = state.components(state.anchors), state.components(state.residuals)
        a_flat = _pack([[a.read_value() for a in row] for row in anchors])[0]
        e_flat = _pack([[e.read_value() for e in row] for row in res])[0]
    kept: List[Any] = []  # per chunk: each replica's v_c and the float32 values its wire values stand for

    def prep(sums: List[tf.Tensor], lo: int, hi: int) -> List[Any]:
        out, vs, sent = [], [], []
        for i, x in enumerate(sums):
            with tf.device(x.device):
                m = x / float(avg.n_host[i])
                if codec is None:
                    out.append(m)
                    continue
                vs.append(m - a_flat[i][lo:hi] + e_flat[i][lo:hi])
                wire, q = encode(vs[-1], codec)
                out.append(wire)
                sent.append(q)
        if codec is not None:
            kept.append((vs, sent))
        return out

    sums, across = avg.pipelined(flats, prep, codec)
    means = _unpack([s / float(m) for s, m in zip(sums, avg.n_host)], sizes, xs[:n])
    if n < len(xs):  # averaged non-trainable state: float32, one small unchunked pass
        ex_flats, ex_sizes = _pack(xs[n:])
        ex_sums = avg.host_sum(ex_flats)
        ex_means = [s / float(m) for s, m in zip(ex_sums, avg.n_host)]
        means += _unpack(ex_means, ex_sizes, xs[n:])
        ex_bar = _unpack(avg.cross_host_mean(ex_means), ex_sizes, xs[n:])
    else:
        ex_bar = []
    hl = _HostLevel(xs, means, None, None)
    if codec is None:
        xbar = _unpack(across, sizes, xs[:n])
        return hl, xbar + ex_bar, _map(lambda a, b: a - b, xbar, means[:n]), []
    v_rows = _unpack([tf.concat([k[0][i] for k in kept], 0) for i in range(len(flats))], sizes, xs[:n])
    sent = _unpack([tf.concat([k[1][i] for k in kept], 0) for i in range(len(flats))], sizes, xs[:n])
    mean = _unpack(across, sizes, xs[:n])
    xbar = _map(lambda a, q: a.read_value() + q, anchors, mean)
    ops = [a.assign(x) for ra, rx in zip(anchors, xbar) for a, x in zip(ra, rx)]
    ops += [e.assign(v - q) for re, rv, rq in zip(res, v_rows, sent) for e, v, q in zip(re, rv, rq)]
    return hl, xbar + ex_bar, _map(lambda m, q: m - q, mean, sent), ops


@_no_autograph
def global_sync(
    avg: TwoLevelAverager, variables: Sequence[Any], state: Any, n_trainable: int, local_steps: Any, lr: Any
) -> tf.Tensor:
    """The global sync (module docstring); ``state=None`` is a plain average of ``variables`` (no Δ).
    Returns its seconds (also in the strategy's telemetry)."""
    t0 = tf.timestamp()
    n = n_trainable if state is not None else 0
    # what crosses the hosts: with one host nothing does, and the global sync is the exact host sync
    codec = state.compression if state is not None and avg.hosts > 1 else None
    s_diff = None
    if n > 0 and state.rule != "gradient":  # chunked: host sums overlap the slow link
        hl, xbar, diff, ops = _pipelined(avg, variables, state, n, t0, codec)
    else:
        hl = _host_level(avg, variables, state, t0)
        if codec is not None:
            xbar, diff, s_diff, ops = _across_compressed(avg, hl, state, n)
        else:
            xbar, diff, sbar = _across_exact(avg, hl)
            s_diff, ops = (_map(lambda s, m: s - m, hl.s_new, sbar) if sbar is not None else None), []
    ops += _corrections(avg, state, n, hl, lr, (diff, s_diff, local_steps)) + _assign(variables, xbar)
    with tf.control_dependencies(ops):
        t1 = tf.timestamp()
    avg.ext.telemetry.add_sync(t1 - t0)
    return t1 - t0
