"""Plain-numpy reference of the skip-and-correct rule for a softmax-regression model (test helper).

Independent of tf_commopt: written from the rule in docs/skip_correct.md, float64.
(``fresh_mirrored`` is the one TensorFlow helper: the reference strategy for the SSGD tests.)
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np


def softmax_grads(
    w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray
) -> Tuple[np.ndarray, np.ndarray]:
    """Gradient of the mean sparse cross-entropy of softmax(x w + b) over the batch."""
    z = x @ w + b
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    p /= len(y)
    return x.T @ p, p.sum(axis=0)


def run_rule(
    w0: np.ndarray,
    b0: np.ndarray,
    batches: Sequence[Sequence[Tuple[np.ndarray, np.ndarray]]],
    interval: int,
    correction: str,
    lr: float,
    warmup_steps: int = 0,
    momentum: float = 0.0,
    correction_lr: str = "optimizer",
):
    """batches[t][i] = (x, y) of replica i at step t+1. Returns per-step lists of (w_i, b_i, dw_i, db_i).

    With ``momentum`` β > 0 the local optimizer is heavy-ball SGD with local slots (m ← β m − lr u;
    x ← x + m, as tf-keras SGD) and the vrl lr is lr/(1 − β) when correction_lr == "effective".
    """
    assert warmup_steps == 0 or momentum == 0.0
    clr = lr / (1.0 - momentum) if correction_lr == "effective" else lr
    r = len(batches[0])
    ws = [w0.astype(np.float64).copy() for _ in range(r)]
    bs = [b0.astype(np.float64).copy() for _ in range(r)]
    dws = [np.zeros_like(ws[0]) for _ in range(r)]
    dbs = [np.zeros_like(bs[0]) for _ in range(r)]
    mws = [np.zeros_like(ws[0]) for _ in range(r)]
    mbs = [np.zeros_like(bs[0]) for _ in range(r)]
    k = 0
    history: List = []
    for t, step in enumerate(batches, start=1):
        grads = [softmax_grads(ws[i], bs[i], *step[i]) for i in range(r)]
        if t <= warmup_steps:
            gw = sum(g[0] for g in grads) / r
            gb = sum(g[1] for g in grads) / r
            for i in range(r):
                ws[i] = ws[i] - lr * gw
                bs[i] = bs[i] - lr * gb
        else:
            for i in range(r):
                mws[i] = momentum * mws[i] - lr * (grads[i][0] - dws[i])
                mbs[i] = momentum * mbs[i] - lr * (grads[i][1] - dbs[i])
                ws[i] = ws[i] + mws[i]
                bs[i] = bs[i] + mbs[i]
            k += 1
            if k == interval:
                wbar = sum(ws) / r
                bbar = sum(bs) / r
                if correction == "vrl":
                    for i in range(r):
                        dws[i] = dws[i] + (wbar - ws[i]) / (interval * clr)
                        dbs[i] = dbs[i] + (bbar - bs[i]) / (interval * clr)
                ws = [wbar.copy() for _ in range(r)]
                bs = [bbar.copy() for _ in range(r)]
                k = 0
        history.append(
            ([w.copy() for w in ws], [b.copy() for b in bs], [d.copy() for d in dws], [d.copy() for d in dbs])
        )
    return history


def make_batches(steps: int, replicas: int, per_replica: int, features: int, classes: int, seed: int):
    """Different, skewed data per replica (replica i sees mostly its own classes)."""
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(steps):
        row = []
        for i in range(replicas):
            x = rng.randn(per_replica, features).astype(np.float32) + i
            y = ((rng.randint(0, 2, size=per_replica) + i) % classes).astype(np.int32)
            row.append((x, y))
        out.append(row)
    return out


def assert_copies_follow(w, b, rw, rb, step: int) -> None:
    """Every replica's copy of the mirrored ``w`` and ``b`` equals the reference rows ``rw[i]``, ``rb[i]``
    after ``step`` (1-based, for the message)."""
    for i in range(len(w.values)):
        np.testing.assert_allclose(
            w.values[i].numpy(), rw[i], rtol=1e-5, atol=1e-5, err_msg=f"w step {step} rep {i}"
        )
        np.testing.assert_allclose(
            b.values[i].numpy(), rb[i], rtol=1e-5, atol=1e-5, err_msg=f"b step {step} rep {i}"
        )


def fresh_mirrored(devices):
    """A tf.distribute.MirroredStrategy with collective keys no other strategy in this process uses
    (two instances over the same devices otherwise share instance keys and abort each other)."""
    from tf_commopt._compat import fresh_mirrored_strategy

    return fresh_mirrored_strategy(devices)


def softmax_step(strategy, w, b, opt, global_batch: int):
    """The custom-loop step the skip-and-correct tests share: softmax regression on variables ``w, b``
    inside ``strategy.run`` + ``opt.apply_gradients`` in a tf.function. Returns ``step(row)`` where
    ``row[r] = (x, y)`` is replica r's batch; it returns the per-replica losses."""
    import tensorflow as tf

    @tf.function
    def step(xs, ys):
        def fn(x, y):
            with tf.GradientTape() as tape:
                per_ex = tf.keras.losses.sparse_categorical_crossentropy(
                    y, tf.matmul(x, w) + b, from_logits=True
                )
                loss = tf.nn.compute_average_loss(per_ex, global_batch_size=global_batch)
            opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))
            return loss

        return strategy.run(fn, args=(xs, ys))

    def run_row(row):
        xs = strategy.experimental_distribute_values_from_function(
            lambda ctx: row[ctx.replica_id_in_sync_group][0]
        )
        ys = strategy.experimental_distribute_values_from_function(
            lambda ctx: row[ctx.replica_id_in_sync_group][1]
        )
        return step(xs, ys)

    return run_row


class _NumpyOpt:
    """tf-keras SGD (momentum, nesterov) and Adam update rules on float64 arrays, one instance per replica."""

    def __init__(
        self,
        kind: str,
        lr: float,
        momentum: float = 0.0,
        nesterov: bool = False,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
    ):
        self.kind, self.lr, self.mu, self.nesterov = kind, lr, momentum, nesterov
        self.b1, self.b2, self.eps = beta_1, beta_2, epsilon
        self.t = 0
        self.slots = {}

    def step(self, key: str, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        if self.kind == "sgd":
            if self.mu == 0.0:
                return x - self.lr * g
            m = self.slots.get(key, np.zeros_like(x))
            m = self.mu * m - self.lr * g
            self.slots[key] = m
            return x + (self.mu * m - self.lr * g if self.nesterov else m)
        assert self.kind == "adam"
        m, v = self.slots.get(key, (np.zeros_like(x), np.zeros_like(x)))
        t = self.t + 1
        m = m + (g - m) * (1 - self.b1)
        v = v + (g * g - v) * (1 - self.b2)
        self.slots[key] = (m, v)
        alpha = self.lr * np.sqrt(1 - self.b2**t) / (1 - self.b1**t)
        return x - m * alpha / (np.sqrt(v) + self.eps)

    def done_step(self) -> None:
        self.t += 1


def run_gradient_rule(w0: np.ndarray, b0: np.ndarray, batches, interval: int, make_opt):
    """The "gradient" correction (docs/skip_correct.md): replica i applies u = g_i − Δ_i with its own
    optimizer (``make_opt()``, local slots), sums the raw g_i over the period (G_i); at a sync after k
    steps x ← mean x_i and Δ_i ← (G_i − mean G)/k, G_i ← 0. Returns per-step (w_i, b_i, dw_i)."""
    r = len(batches[0])
    ws = [w0.astype(np.float64).copy() for _ in range(r)]
    bs = [b0.astype(np.float64).copy() for _ in range(r)]
    dws = [np.zeros_like(ws[0]) for _ in range(r)]
    dbs = [np.zeros_like(bs[0]) for _ in range(r)]
    gws = [np.zeros_like(ws[0]) for _ in range(r)]
    gbs = [np.zeros_like(bs[0]) for _ in range(r)]
    opts = [make_opt() for _ in range(r)]
    k, history = 0, []
    for step in batches:
        for i in range(r):
            gw, gb = softmax_grads(ws[i], bs[i], *step[i])
            gws[i] += gw
            gbs[i] += gb
            ws[i] = opts[i].step("w", ws[i], gw - dws[i])
            bs[i] = opts[i].step("b", bs[i], gb - dbs[i])
            opts[i].done_step()
        k += 1
        if k == interval:
            wbar, bbar = sum(ws) / r, sum(bs) / r
            gwbar, gbbar = sum(gws) / r, sum(gbs) / r
            for i in range(r):
                dws[i] = (gws[i] - gwbar) / k
                dbs[i] = (gbs[i] - gbbar) / k
            gws = [np.zeros_like(g) for g in gws]
            gbs = [np.zeros_like(g) for g in gbs]
            ws = [wbar.copy() for _ in range(r)]
            bs = [bbar.copy() for _ in range(r)]
            k = 0
        history.append(([w.copy() for w in ws], [b.copy() for b in bs], [d.copy() for d in dws]))
    return history


def run_overlap_rule(
    w0: np.ndarray,
    b0: np.ndarray,
    batches,
    interval: int,
    correction: str,
    lr: float,
    make_opt=None,
    clr: float = None,
    sync_after: Sequence[int] = (),
    drain_after: Sequence[int] = (),
    avg_slots: bool = False,
):
    """The overlapped rule (docs/skip_correct.md, "Overlap"), float64. Local steps as in the blocking
    rule (optimizer ``make_opt()``, default plain SGD(lr); u = g_i − Δ_i; G_i += g_i). At a sync (k = H):
    if a mean is in flight (snapshots y_i, S_i, k_y): x_i += ȳ − y_i; vrl: Δ_i += (ȳ − y_i)/(k_y·clr);
    gradient: Δ_i = (S_i − S̄)/k_y; then y_i ← x_i, S_i ← G_i, G_i ← 0, k_y ← k; k ← 0.
    ``sync_after``: steps after which ``strategy.sync()`` runs (apply the in-flight mean, k unchanged,
    then x_i ← mean x_i with no Δ update); ``drain_after``: steps after which only the in-flight mean is
    applied (the end of ``fit``). ``avg_slots`` (momentum SGD): the momenta m_i are averaged too, the
    applied mean adding μ^k (m̄_y − m_i,y), k the local steps since the snapshot; ``strategy.sync()``
    averages them. Returns per-step (w_i, b_i, dw_i, db_i) (with ``avg_slots``, then m_i of w and b)."""
    make_opt = make_opt or (lambda: _NumpyOpt("sgd", lr))
    clr = lr if clr is None else clr
    r = len(batches[0])
    xs = [[w0.astype(np.float64).copy(), b0.astype(np.float64).copy()] for _ in range(r)]
    ds = [[np.zeros_like(p) for p in xs[0]] for _ in range(r)]
    gs = [[np.zeros_like(p) for p in xs[0]] for _ in range(r)]
    opts = [make_opt() for _ in range(r)]
    k, pending, history = 0, None, []

    def apply(pend, k_now):
        ys, ss, ky, ms = pend
        for name in "wb" if avg_slots else "":
            mbar = sum(m[name] for m in ms) / r
            for i in range(r):
                opts[i].slots[name] = opts[i].slots[name] + opts[i].mu ** k_now * (mbar - ms[i][name])
        for p in range(2):
            ybar = sum(ys[i][p] for i in range(r)) / r
            sbar = sum(ss[i][p] for i in range(r)) / r
            for i in range(r):
                xs[i][p] = xs[i][p] + (ybar - ys[i][p])
                if correction == "vrl":
                    ds[i][p] = ds[i][p] + (ybar - ys[i][p]) / (ky * clr)
                elif correction == "gradient":
                    ds[i][p] = (ss[i][p] - sbar) / ky

    for t, step in enumerate(batches, start=1):
        for i in range(r):
            g = softmax_grads(xs[i][0], xs[i][1], *step[i])
            for p, name in enumerate("wb"):
                gs[i][p] = gs[i][p] + g[p]
                xs[i][p] = opts[i].step(name, xs[i][p], g[p] - ds[i][p])
            opts[i].done_step()
        k += 1
        if k == interval:
            if pending is not None:
                apply(pending, k)
            ms = [dict((n, m.copy()) for n, m in o.slots.items()) for o in opts]
            pending = ([[p.copy() for p in x] for x in xs], [[p.copy() for p in g] for g in gs], k, ms)
            gs = [[np.zeros_like(p) for p in g] for g in gs]
            k = 0
        if (t in sync_after or t in drain_after) and pending is not None:
            apply(pending, k)
            pending = None
        if t in sync_after:
            for p in range(2):
                mean = sum(x[p] for x in xs) / r
                for x in xs:
                    x[p] = mean.copy()
            for name in "wb" if avg_slots else "":
                mean = sum(o.slots[name] for o in opts) / r
                for o in opts:
                    o.slots[name] = mean.copy()
        row = [[x[0].copy() for x in xs], [x[1].copy() for x in xs], [d[0].copy() for d in ds]]
        row.append([d[1].copy() for d in ds])
        if avg_slots:
            row += [[o.slots[name].copy() for o in opts] for name in "wb"]
        history.append(tuple(row))
    return history


def least_squares(r: int, features: int = 6, rows: int = 16, seed: int = 0):
    """Worker i's mini-batch least-squares gradient at its t-th step, ``grad(i, x, t)`` (different data
    per worker, each batch drawn once and kept)."""
    rng = np.random.RandomState(seed)
    truth = [rng.randn(features) + 2 * i for i in range(r)]
    cache = {}

    def grad(i, x, t):
        if (i, t) not in cache:
            a = rng.randn(rows, features)
            cache[(i, t)] = (a, a @ truth[i] + 0.1 * rng.randn(rows))
        a, b = cache[(i, t)]
        return a.T @ (a @ x - b) / rows

    return grad


def run_time_rule(w0, b0, batches, h, taus, correction, make_opt, clr, mean_after=(), tau_eff="mean"):
    """period="time" (docs/skip_correct.md, "Workers of different speeds"), float64. A period is H
    global steps; replica i applies only the last τ_i; at k == H FedNova's normalised average
    x⁺ = x₀ − τ_eff·mean_i (x₀ − x_i)/τ_i, τ_eff = mean(τ) or max(τ); vrl Δ_i += (d_i − mean d)/clr;
    gradient Δ_i = G_i/τ_i − mean_j G_j/τ_j. Per step: (xs, deltas).
    ``mean_after``: steps after which every replica's model is set to the replicas' mean
    (``strategy.sync()`` mid-period; Δ_i, G_i, x₀ and k are kept)."""
    r = len(taus)
    x0 = [w0.astype(np.float64), b0.astype(np.float64)]
    xs = [[p.copy() for p in x0] for _ in range(r)]
    ds = [[np.zeros_like(p) for p in x0] for _ in range(r)]
    gs = [[np.zeros_like(p) for p in x0] for _ in range(r)]
    opts = [make_opt() for _ in range(r)]
    k, history, syncs = 0, [], []
    for row in batches:
        for i in range(r):
            if k < h - taus[i]:
                continue  # idle
            g = softmax_grads(xs[i][0], xs[i][1], *row[i])
            for p, name in enumerate("wb"):
                gs[i][p] += g[p]
                xs[i][p] = opts[i].step(name, xs[i][p], g[p] - ds[i][p])
            opts[i].done_step()
        k += 1
        if k == h:
            scale = max(taus) if tau_eff == "max" else sum(taus) / r
            for p in range(2):
                d = [(x0[p] - xs[i][p]) / taus[i] for i in range(r)]
                d_bar = sum(d) / r
                new = x0[p] - scale * d_bar
                if correction == "vrl":
                    for i in range(r):
                        ds[i][p] = ds[i][p] + (d[i] - d_bar) / clr
                elif correction == "gradient":
                    m = [gs[i][p] / taus[i] for i in range(r)]
                    for i in range(r):
                        ds[i][p] = m[i] - sum(m) / r
                        gs[i][p] = np.zeros_like(gs[i][p])
                syncs.append((p, [x[p].copy() for x in xs], x0[p].copy(), new))
                x0[p] = new
                for i in range(r):
                    xs[i][p] = new.copy()
            k = 0
        if len(history) + 1 in mean_after:
            for p in range(2):
                mean = sum(x[p] for x in xs) / r
                for x in xs:
                    x[p] = mean.copy()
        history.append(([x[0].copy() for x in xs], [x[1].copy() for x in xs], [d[0].copy() for d in ds]))
    return history, syncs


def arrange_real_batches(own, h, taus, steps):
    """``own[i]`` = replica i's batches in the order it reads them; at global step t a replica that is
    idle reads nothing (the graph loop skips the step): the rows ``run_time_rule`` takes, idle slots None."""
    taken = [0] * len(taus)
    rows = []
    for t in range(steps):
        k = t % h
        row = []
        for i, tau in enumerate(taus):
            if k < h - tau:
                row.append(None)
            else:
                row.append(own[i][taken[i]])
                taken[i] += 1
        rows.append(row)
    return rows
