"""SkipCorrectStrategy(compression=...) against tf_commopt.core.compress (the numpy rule), sync by sync.

* the strategy's scheduled sync, called on chosen replica values, gives the bits of
  ``core.compress.compressed_sync(..., reduce="wire")`` fed with the same values, over consecutive syncs
  (each side carries its own x₀, residuals, Δ_i, G_i), 2 and 4 replicas, bf16 and fp16, vrl and gradient;
  an fp16 overflow falls back to an uncompressed sync on both sides;
* training: compressed syncs halve the bytes, keep Σ Δ_i = 0, stay near the uncompressed run, and the
  compressed run differs from it (the compression is really on);
* compression=None is today's: no extra state, the same bits as the default strategy;
* a checkpoint written after a sync keeps the residuals and x₀: the restored run continues bit for bit.
"""

import numpy as np
import pytest
import tensorflow as tf

from tests.tf.sc_reference import make_batches, softmax_step
from tf_commopt.core import compress
from tf_commopt.distribute import SkipCorrectStrategy
from tf_commopt.errors import InputError

F, C, B, LR = 5, 3, 4, 0.125


def _build(r, codec, correction="vrl", interval=4, seed=0, opt=None):
    rng = np.random.RandomState(seed)
    w0 = (rng.randn(F, C) * 0.3).astype(np.float32)
    b0 = (rng.randn(C) * 0.1).astype(np.float32)
    strategy = SkipCorrectStrategy(
        interval=interval, correction=correction, devices=["/cpu:%d" % i for i in range(r)], compression=codec
    )
    with strategy.scope():
        w, b = tf.Variable(w0), tf.Variable(b0)
        optimizer = opt() if opt else tf.keras.optimizers.SGD(LR)
    return strategy, w, b, optimizer, softmax_step(strategy, w, b, optimizer, r * B)


def _comps(var):
    return [c.numpy() for c in var.values]


@pytest.mark.parametrize("r", [2, 4])
@pytest.mark.parametrize("codec", ["bf16", "fp16"])
@pytest.mark.parametrize("rule", ["vrl", "gradient"])
def test_the_strategy_sync_is_core_compress_bit_for_bit(r, codec, rule):
    opt = (lambda: tf.keras.optimizers.SGD(LR)) if rule == "vrl" else (lambda: tf.keras.optimizers.Adam(0.01))
    strategy, w, b, optimizer, step = _build(r, codec, rule, opt=opt)
    step(make_batches(1, r, B, F, C, seed=1)[0])  # builds the state; x₀ = the initial model
    ext = strategy.extended
    state = ext.correction_state(optimizer)
    assert state.residuals is not None and state.anchors is not None
    vars_ = list(state.variables)
    k = 4

    @tf.function
    def sync():
        return ext._sc_scheduled_sync(optimizer, state, vars_, tf.constant(k, tf.int64))

    # the numpy side: its own x₀, Δ_i, e_i, G_i, r_i per variable, carried from sync to sync
    np_state = []
    for v, a in zip(vars_, state.anchors):
        zeros = [np.zeros(v.shape, np.float32) for _ in range(r)]
        np_state.append(dict(x0=a.values[0].numpy(), d=list(zeros), e=list(zeros), gr=list(zeros)))
    rng = np.random.RandomState(7)
    bound = [0.0]
    for n in range(4):
        scale = 1e-2 * 10.0 ** (n - 1)
        for j, v in enumerate(vars_):
            xs = [np_state[j]["x0"] + (rng.randn(*v.shape) * scale).astype(np.float32) for _ in range(r)]
            for c, x in zip(v.values, xs):
                c.assign(x)
            np_state[j]["xs"] = xs
            if rule == "gradient":
                gs = [(rng.randn(*v.shape)).astype(np.float32) for _ in range(r)]
                for c, g in zip(state.grad_sums[j].values, gs):
                    c.assign(g)
                np_state[j]["gs"] = gs
        with strategy.scope():
            sync()
        for j, v in enumerate(vars_):
            s = np_state[j]
            want = compress.compressed_sync(
                s["x0"], s["xs"], rule, k, clr=LR, deltas=s["d"], residuals=s["e"],
                grad_sums=s.get("gs"), grad_residuals=s["gr"], codec=codec, reduce="wire",
            )  # fmt: skip
            assert not want.fallback
            for i in range(r):
                np.testing.assert_array_equal(v.values[i].numpy(), want.x, err_msg=f"x sync {n} var {j}")
                np.testing.assert_array_equal(state.residuals[j].values[i].numpy(), want.residuals[i])
                np.testing.assert_array_equal(state.deltas[j].values[i].numpy(), want.deltas[i])
                if rule == "gradient":
                    np.testing.assert_array_equal(
                        state.grad_residuals[j].values[i].numpy(), want.grad_residuals[i]
                    )
                    assert not state.grad_sums[j].values[i].numpy().any()
            np.testing.assert_array_equal(state.anchors[j].values[0].numpy(), want.x)
            assert np.abs(want.residuals[0]).max() > 0  # rounding happened
            if j == 0:  # Σ|sent| / (k·clr) (vrl, accumulating) or Σ|Ĝ_i| / k (gradient, this sync's)
                if rule == "vrl":
                    bound[0] += sum(np.abs(q) for q in want.sent) / (k * LR)
                else:
                    sent_g = [g + a - c for g, a, c in zip(s["gs"], s["gr"], want.grad_residuals)]
                    bound[0] = sum(np.abs(q) for q in sent_g) / k
            s.update(x0=want.x, d=want.deltas, e=want.residuals, gr=want.grad_residuals or s["gr"])
    # the wire-dtype sum's rounding is all that keeps Σ Δ_i from 0 (vrl accumulates it; docs/skip_correct.md)
    gamma = (r - 1) * compress.UNIT_ROUNDOFF[codec] / (1 - (r - 1) * compress.UNIT_ROUNDOFF[codec])
    assert np.all(np.abs(sum(np_state[0]["d"])) <= bound[0] * gamma + 1e-6)
    per = 2 * (F * C + C) * (2 if rule == "gradient" else 1)
    assert strategy.stats()["sync_payload_bytes"] == per
    assert strategy.stats()["bytes_communicated"] == 4 * per  # four syncs, nothing else all-reduced


def test_fp16_overflow_falls_back_to_an_uncompressed_sync_like_core():
    r = 2
    strategy, w, b, optimizer, step = _build(r, "fp16")
    step(make_batches(1, r, B, F, C, seed=1)[0])
    ext = strategy.extended
    state = ext.correction_state(optimizer)
    x0 = [a.values[0].numpy() for a in state.anchors]
    xs = [[x + 1e5 * (i + 1) for i in range(r)] for x in x0]  # |v| >= 65520: inf in fp16
    for v, rows in zip(state.variables, xs):
        for c, x in zip(v.values, rows):
            c.assign(x)
    with strategy.scope():
        tf.function(
            lambda: ext._sc_scheduled_sync(optimizer, state, list(state.variables), tf.constant(4, tf.int64))
        )()
    for j, v in enumerate(state.variables):
        want = compress.compressed_sync(x0[j], xs[j], "vrl", 4, clr=LR, codec="fp16", reduce="wire")
        assert want.fallback
        np.testing.assert_array_equal(v.values[0].numpy(), want.x)
        np.testing.assert_array_equal(state.deltas[j].values[1].numpy(), want.deltas[1])
        assert not state.residuals[j].values[0].numpy().any()


def _train(codec, steps=24, r=4, seed=0):
    strategy, w, b, optimizer, step = _build(r, codec, "vrl", interval=4, seed=seed)
    for row in make_batches(steps, r, B, F, C, seed=3):
        step(row)
    return strategy, optimizer, np.stack(_comps(w)), np.stack(_comps(b))


def test_training_with_compressed_syncs_halves_the_bytes_and_stays_close():
    s0, o0, w0, b0 = _train(None)
    s1, o1, w1, b1 = _train("bf16")
    st0, st1 = s0.stats(), s1.stats()
    assert st1["compression"] == "bf16" and st0["compression"] is None
    assert st1["syncs"] == st0["syncs"] == 6
    assert st1["bytes_communicated"] * 2 == st0["bytes_communicated"]
    assert st1["sync_payload_bytes"] * 2 == st0["sync_payload_bytes"] == 4 * (F * C + C)
    assert np.all(w1 == w1[0]) and not np.array_equal(w1, w0)  # synced, and really compressed
    np.testing.assert_allclose(w1, w0, atol=1e-2)  # measured 4.2e-3 (bf16 rounds to 2^-8)
    # Σ Δ_i drifts from 0 only by the wire sums' rounding (vrl): measured 1 % of max |Δ| after 6 syncs
    deltas = s1.extended.correction_state(o1).delta_numpy()[0]
    assert np.abs(deltas.sum(0)).max() <= 0.03 * np.abs(deltas).max()


def test_compression_none_is_todays_strategy_bit_for_bit():
    strategy, w, b, optimizer, step = _build(2, None)
    ref, rw, rb, ropt, rstep = _build(2, None)
    ref_default = SkipCorrectStrategy(interval=4, correction="vrl", devices=["/cpu:0", "/cpu:1"])
    assert ref_default.compression is None
    for row in make_batches(9, 2, B, F, C, seed=5):
        step(row)
        rstep(row)
    state = strategy.extended.correction_state(optimizer)
    assert state.residuals is None and state.anchors is None
    np.testing.assert_array_equal(np.stack(_comps(w)), np.stack(_comps(rw)))


def test_bad_compression_is_one_line():
    with pytest.raises(InputError, match=r"compression.*'bf16', 'fp16', 'int8' or None, got 'int4'"):
        SkipCorrectStrategy(compression="int4", devices=["/cpu:0"])
    with pytest.raises(InputError, match=r"compression with period='time' is not supported"):
        SkipCorrectStrategy(interval=4, compression="bf16", period="time", devices=["/cpu:0"])


def test_a_checkpoint_keeps_the_residuals_and_the_anchor(tmp_path):
    r = 2
    batches = make_batches(12, r, B, F, C, seed=9)
    strategy, w, b, optimizer, step = _build(r, "fp16", interval=4)
    for row in batches[:8]:  # two syncs: residuals != 0, k = 0, every replica holds x₀
        step(row)
    state = strategy.extended.correction_state(optimizer)
    res = np.stack(_comps(state.residuals[0]))
    assert np.abs(res).max() > 0
    path = tf.train.Checkpoint(w=w, b=b, opt=optimizer).write(str(tmp_path / "ck"))
    for row in batches[8:]:
        step(row)
    want = np.stack(_comps(w))

    strategy2, w2, b2, opt2, step2 = _build(r, "fp16", interval=4, seed=1)
    step2(batches[0])  # builds the state the restore overwrites
    tf.train.Checkpoint(w=w2, b=b2, opt=opt2).read(path).assert_consumed()
    state2 = strategy2.extended.correction_state(opt2)
    np.testing.assert_array_equal(np.stack(_comps(state2.residuals[0])), res)
    np.testing.assert_array_equal(state2.anchors[0].values[1].numpy(), w2.values[0].numpy())
    assert int(state2.anchor_stale.numpy()) == 0
    for row in batches[8:]:
        step2(row)
    np.testing.assert_array_equal(np.stack(_comps(w2)), want)
