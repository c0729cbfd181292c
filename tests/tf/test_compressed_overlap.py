"""SkipCorrectStrategy(compression=..., overlap=True) against tf_commopt.core.compress, sync by sync.

The mean launched at a sync is ``core.compress.compressed_sync(..., reduce="wire")`` of that sync's
snapshots y_i against x₀ (each side carries its own x₀, residuals and Δ_i). It lands at the next sync:
x_i += x̄ − y_i (the local progress made meanwhile is kept), x₀ ← x̄, e_i and Δ_i (vrl; gradient: from the snapshot's G_i, with its residual r_i) from the same call.
An fp16 overflow falls back to the uncompressed mean like core; a run with it sends half the bytes of the
uncompressed overlapped run and stays close to it.
"""

import numpy as np
import pytest
import tensorflow as tf

from tests.tf.sc_reference import make_batches, softmax_step
from tf_commopt.core import compress
from tf_commopt.distribute import SkipCorrectStrategy

F, C, B, LR, K = 5, 3, 4, 0.125, 4


def _build(r, codec, rule="vrl", seed=0):
    rng = np.random.RandomState(seed)
    w0 = (rng.randn(F, C) * 0.3).astype(np.float32)
    b0 = (rng.randn(C) * 0.1).astype(np.float32)
    devices = ["/cpu:%d" % i for i in range(r)]
    strategy = SkipCorrectStrategy(
        interval=K, correction=rule, devices=devices, compression=codec, overlap=True
    )
    with strategy.scope():
        w, b = tf.Variable(w0), tf.Variable(b0)
        optimizer = tf.keras.optimizers.SGD(LR)
    return strategy, w, b, optimizer, softmax_step(strategy, w, b, optimizer, r * B)


def _synced(r, codec, rule, values, g_scale=None):
    """Run scheduled syncs on ``values(n, j, x0)`` (each replica's model before sync n; gradient: random
    G_i of scale ``g_scale.get(n, 0.3)``) and check every variable against core after each; either may push
    a sum out of fp16's range."""
    strategy, w, b, optimizer, step = _build(r, codec, rule)
    step(make_batches(1, r, B, F, C, seed=1)[0])  # builds the state; x₀ = the model at this local step
    ext = strategy.extended
    state = ext.correction_state(optimizer)
    vars_ = list(state.variables)
    sync = tf.function(lambda: ext._sc_scheduled_sync(optimizer, state, vars_, tf.constant(K, tf.int64)))
    sides = []
    for a in state.anchors:
        zeros = [np.zeros(a.shape, np.float32) for _ in range(r)]
        sides.append(dict(x0=a.values[0].numpy(), d=list(zeros), e=list(zeros), ge=list(zeros), ys=None))
    fallbacks, rng = [], np.random.RandomState(11)
    for n in range(5):
        for j, (v, s) in enumerate(zip(vars_, sides)):
            s["xs"] = values(n, j, s["x0"])
            for c, x in zip(v.values, s["xs"]):
                c.assign(x)
            if rule == "gradient":  # this period's G_i
                scale = (g_scale or {}).get(n, 0.3)
                s["gs"] = [(rng.randn(*s["x0"].shape) * scale).astype(np.float32) for _ in range(r)]
                for c, g in zip(state.grad_sums[j].values, s["gs"]):
                    c.assign(g)
        with strategy.scope():
            sync()
        for j, (v, s) in enumerate(zip(vars_, sides)):
            if s["ys"] is not None:  # the previous sync's mean lands now
                want = compress.compressed_sync(
                    s["x0"], s["ys"], rule, K, clr=LR, deltas=s["d"], residuals=s["e"], codec=codec,
                    reduce="wire", grad_sums=s.get("ss"), grad_residuals=s["ge"],
                )  # fmt: skip
                fallbacks.append(want.fallback)
                s["xs"] = [x + (want.x - y) for x, y in zip(s["xs"], s["ys"])]
                s.update(x0=want.x, d=want.deltas, e=want.residuals, ge=want.grad_residuals or s["ge"])
            s["ys"], s["ss"] = [x.copy() for x in s["xs"]], s.get("gs")
            for i in range(r):
                np.testing.assert_array_equal(v.values[i].numpy(), s["xs"][i], err_msg=f"x sync {n} var {j}")
                np.testing.assert_array_equal(state.residuals[j].values[i].numpy(), s["e"][i])
                np.testing.assert_array_equal(state.anchors[j].values[i].numpy(), s["x0"])
                if rule != "none":
                    np.testing.assert_array_equal(state.deltas[j].values[i].numpy(), s["d"][i])
                if rule == "gradient":  # G_i restarts at 0; r_i as core's
                    assert not state.grad_sums[j].values[i].numpy().any()
                    np.testing.assert_array_equal(state.grad_residuals[j].values[i].numpy(), s["ge"][i])
    return strategy, sides, fallbacks


@pytest.mark.parametrize("r", [2, 4])
@pytest.mark.parametrize("codec", ["bf16", "fp16"])
@pytest.mark.parametrize("rule", ["vrl", "none", "gradient"])
def test_each_applied_mean_is_core_compress_of_the_previous_snapshots(r, codec, rule):
    rng = np.random.RandomState(7)

    def values(n, j, x0):
        scale = 1e-2 * 10.0 ** (n % 3 - 1)
        return [x0 + (rng.randn(*x0.shape) * scale).astype(np.float32) for _ in range(r)]

    strategy, sides, fallbacks = _synced(r, codec, rule, values)
    assert not any(fallbacks) and np.abs(sides[0]["e"][0]).max() > 0  # compressed, and rounding happened
    if rule == "gradient":
        assert np.abs(sides[0]["ge"][0]).max() > 0
    strategy.extended.drain()  # the last sync's all-reduce has run (its bytes are counted when it runs)
    st, rows = strategy.stats(), 2 if rule == "gradient" else 1  # G_i's row beside the deltas
    assert st["sync_payload_bytes"] == rows * 2 * (F * C + C)
    assert st["bytes_communicated"] == 5 * rows * 2 * (F * C + C)
    assert st["syncs"] == 5 and st["background_comm_s"] > 0


def test_an_fp16_overflow_falls_back_to_the_uncompressed_mean_like_core():
    def values(n, j, x0):
        big = 1e5 if n == 2 else 1e-2  # the snapshots of sync 2: |v| >= 65520, inf in fp16
        return [x0 + np.float32(big * (i + 1)) for i in range(2)]

    _, sides, fallbacks = _synced(2, "fp16", "vrl", values)
    # two variables per applied mean: sync 2's snapshots land at sync 3 as core's fallback (the residuals
    # were checked as core's: zero); the earlier means were compressed
    assert fallbacks[4:6] == [True, True] and not any(fallbacks[:4])


def _train(codec, steps=24, r=4):
    strategy, w, b, optimizer, step = _build(r, codec, "vrl")
    for row in make_batches(steps, r, B, F, C, seed=3):
        step(row)
    strategy.sync()  # applies the in-flight mean, then averages
    return strategy, np.stack([c.numpy() for c in w.values])


def test_a_run_sends_half_the_bytes_and_stays_close_to_the_uncompressed_overlap():
    s0, w0 = _train(None)
    s1, w1 = _train("bf16")
    st0, st1 = s0.stats(), s1.stats()
    assert st1["compression"] == "bf16" and st1["syncs"] == st0["syncs"]
    # the scheduled syncs' bytes halve; strategy.sync()'s own average is float32 in both
    scheduled = st0["syncs"] - 1
    assert st0["bytes_communicated"] - st1["bytes_communicated"] == scheduled * 2 * (F * C + C)
    assert np.all(w1 == w1[0]) and not np.array_equal(w1, w0)  # synced, and really compressed
    np.testing.assert_allclose(w1, w0, atol=1e-2)


def test_an_fp16_overflow_of_the_gradient_row_falls_back_like_core():
    def values(n, j, x0):
        return [x0 + np.float32(1e-2 * (i + 1)) for i in range(2)]

    # the G_i of sync 1 beyond fp16's range: that mean lands at sync 2, uncompressed for both variables
    _, sides, fallbacks = _synced(2, "fp16", "gradient", values, g_scale={1: 1e6})
    assert fallbacks[2:4] == [True, True] and not any(fallbacks[:2] + fallbacks[4:])


def test_adam_with_auto_correction_trains_with_compressed_overlap():
    """correction="auto" picks the gradient rule for Adam; compressed and overlapped, the replicas agree
    after strategy.sync() and the run stays close to the uncompressed overlapped one."""
    runs = []
    for codec in (None, "bf16"):
        strategy = SkipCorrectStrategy(
            interval=2, compression=codec, overlap=True, devices=["/cpu:0", "/cpu:1"]
        )
        with strategy.scope():
            w, b = tf.Variable(np.zeros((F, C), np.float32)), tf.Variable(np.zeros(C, np.float32))
            optimizer = tf.keras.optimizers.Adam(0.01)
        step = softmax_step(strategy, w, b, optimizer, 2 * B)
        for row in make_batches(12, 2, B, F, C, seed=1):
            step(row)
        strategy.sync()
        state = strategy.extended.correction_state(optimizer)
        assert state.rule == "gradient" and (state.grad_residuals is not None) == (codec is not None)
        runs.append(np.stack([c.numpy() for c in w.values]))
    assert np.all(runs[1] == runs[1][0]) and not np.array_equal(runs[1], runs[0])
    np.testing.assert_allclose(runs[1], runs[0], atol=1e-2)
