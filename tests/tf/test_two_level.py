"""SkipCorrectStrategy(host_interval=h): two-level averaging against tf_commopt.core.hierarchical (numpy),
step by step, in one process with logical devices grouped into hosts.

* training with vrl and none, 4 replicas as 2 hosts x 2 and as hosts of 1 and 3: every replica's model
  and Δ_i after every step equal the numpy rule (local steps, host syncs every h, global every H);
* bf16 compressed host level: the same, within the wire dtype's rounding of the host values;
* h = H is the flat rule (the host level adds nothing between global syncs);
* the gradient correction (plain and bf16) against the same rule;
* telemetry counts host syncs; bad arguments are one-line errors;
* host_interval="auto": the rule gets the agreed medians stats() reports and (h, H) is what it chose;
  every step (warm-up at H = h = 1, the probe at h = 1, then the chosen h and H) follows the numpy rule;
  a checkpoint keeps the chosen h; the runner takes --host_interval=auto.
"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tests.tf.sc_reference import make_batches, softmax_grads, softmax_step
from tf_commopt.core import compress, hierarchical
from tf_commopt.core.levels import TwoLevelInterval
from tf_commopt.distribute import AutoInterval, SkipCorrectStrategy
from tf_commopt.errors import InputError

F, C, B, LR = 5, 3, 4, 0.125


def _start(seed=0):
    rng = np.random.RandomState(seed)
    return (rng.randn(F, C) * 0.3).astype(np.float32), (rng.randn(C) * 0.1).astype(np.float32)


def _strategy(r, **kw):
    return SkipCorrectStrategy(devices=["/cpu:%d" % i for i in range(r)], **kw)


def _train(strategy, w0, b0, batches, r):
    with strategy.scope():
        w, b = tf.Variable(w0), tf.Variable(b0)
        opt = tf.keras.optimizers.SGD(LR)
    step = softmax_step(strategy, w, b, opt, r * B)
    out = []
    for row in batches:
        step(row)
        state = strategy.extended.correction_state(opt)
        deltas = state.delta_numpy() if state.deltas is not None else None
        out.append(([c.numpy() for c in w.values], [c.numpy() for c in b.values], deltas))
    return out, opt


def two_level_reference(
    w0, b0, batches, hosts, rule, big_h, h, codec=None, lr=LR, schedule=None, restart_after=None
):
    """Local steps x_i ← x_i − lr(∇f_i − Δ_i) (G_i += ∇f_i), then core.hierarchical's sync every h (global
    every H). ``schedule``: the (H, h) in force at each step instead (changing only after a global sync);
    ``restart_after``: the step after whose sync Δ_i and β_c are zeroed (where "auto" chose).
    Per step: each replica's [w, b], then each replica's [Δw, Δb]."""
    r = len(batches[0])
    schedule = schedule or [(big_h, h)] * len(batches)
    groups = hierarchical.host_groups(hosts)
    xs = [[w0.astype(np.float64), b0.astype(np.float64)] for _ in range(r)]
    fields = ("deltas", "grad_sums", "host_sums", "host_deltas", "residuals", "grad_residuals")
    st = {f: [[np.zeros_like(x) for x in xs[0]] for _ in range(r)] for f in fields}
    x0 = [x.copy() for x in xs[0]]
    k, out = 0, []
    for row, (big_h, h) in zip(batches, schedule):
        for i in range(r):
            g = softmax_grads(xs[i][0], xs[i][1], *row[i])
            xs[i] = [x - lr * (gv - d) for x, gv, d in zip(xs[i], g, st["deltas"][i])]
            st["grad_sums"][i] = [a + gv for a, gv in zip(st["grad_sums"][i], g)]
        k += 1
        if k % h == 0:
            is_global = k == big_h
            # int8 rounds blocks of the packed buffer [w, b] (as the strategy packs): sync it as one
            views = _packed if codec == "int8" else _split
            for get, put in views(xs, st, x0, fields):
                anchor, level = get()
                kw = dict(clr=lr, codec=codec, round_fn=_ROUND.get(codec))
                if is_global and len(groups) > 1:  # also for m = 1: β_c then holds for a later m (auto)
                    new = hierarchical.global_sync(anchor, level, groups, rule, h, big_h // h, **kw)
                else:
                    new = hierarchical.two_level_sync(
                        anchor, level, groups, rule, h, big_h // h, is_global, **kw
                    )
                put(new, is_global)
            if is_global:
                k = 0
        if len(out) + 1 == restart_after:
            st["deltas"] = [[np.zeros_like(x) for x in xi] for xi in st["deltas"]]
            st["host_deltas"] = [[np.zeros_like(x) for x in xi] for xi in st["host_deltas"]]
        out.append([[x.copy() for x in xi] for xi in xs] + [[d.copy() for d in di] for di in st["deltas"]])
    return out


def _bf16(v):
    """Round float64 to bfloat16 (nearest even), back to float64 (as TF rounds a float32 value)."""
    return tf.cast(tf.cast(tf.constant(np.asarray(v, np.float32)), tf.bfloat16), tf.float64).numpy()


_ROUND = {"bf16": _bf16, "int8": compress.round_int8}


def _split(xs, st, x0, fields):
    """Per variable j: (get, put) of the reference's state as core.hierarchical takes it (x₀, LevelState)
    and back."""
    r = len(xs)
    for j in range(len(x0)):

        def get(j=j):
            per = {f: [st[f][i][j] for i in range(r)] for f in fields}
            return x0[j], hierarchical.LevelState([xs[i][j] for i in range(r)], **per)

        def put(new, is_global, j=j):
            for i in range(r):
                xs[i][j] = new.xs[i]
                for f in fields:
                    if getattr(new, f) is not None:
                        st[f][i][j] = getattr(new, f)[i]
            if is_global:
                x0[j] = new.xs[0].copy()

        yield get, put


def _packed(xs, st, x0, fields):
    """One (get, put): every variable flattened into one buffer in order, as the strategy packs them."""
    r, shapes = len(xs), [x.shape for x in x0]

    def cat(arrays):
        return np.concatenate([np.ravel(a) for a in arrays])

    def split(v):
        parts = np.split(v, np.cumsum([int(np.prod(sh)) for sh in shapes])[:-1])
        return [p.reshape(sh) for p, sh in zip(parts, shapes)]

    def get():
        per = {f: [cat(st[f][i]) for i in range(r)] for f in fields}
        return cat(x0), hierarchical.LevelState([cat(xs[i]) for i in range(r)], **per)

    def put(new, is_global):
        for i in range(r):
            xs[i] = split(new.xs[i])
            for f in fields:
                if getattr(new, f) is not None:
                    st[f][i] = split(getattr(new, f)[i])
        if is_global:
            x0[:] = split(new.xs[0].copy())

    yield get, put


def _compare(got, want, r, rule, atol):
    for t, ((ws, bs, deltas), ref) in enumerate(zip(got, want), start=1):
        for i in range(r):
            np.testing.assert_allclose(ws[i], ref[i][0], rtol=1e-5, atol=atol, err_msg=f"w step {t} rep {i}")
            np.testing.assert_allclose(bs[i], ref[i][1], rtol=1e-5, atol=atol, err_msg=f"b step {t} rep {i}")
            if rule == "vrl":
                np.testing.assert_allclose(deltas[0][i], ref[r + i][0], rtol=1e-4, atol=atol * 10 / LR)


@pytest.mark.parametrize("hosts", [[0, 0, 1, 1], ["a", "b", "b", "b"]])
@pytest.mark.parametrize("rule", ["vrl", "none"])
def test_two_level_training_follows_the_numpy_rule(hosts, rule):
    r, big_h, h = 4, 4, 2
    w0, b0 = _start()
    batches = make_batches(10, r, B, F, C, seed=3)
    strategy = _strategy(r, interval=big_h, host_interval=h, hosts=hosts, correction=rule)
    got, opt = _train(strategy, w0, b0, batches, r)
    want = two_level_reference(w0, b0, batches, hosts, rule, big_h, h)
    _compare(got, want, r, rule, atol=1e-5)
    s = strategy.stats()
    assert (s["syncs"], s["host_syncs"], s["host_interval"], s["hosts"]) == (2, 3, 2, 2)
    # replicas of one host hold one model right after a host sync (step 6 = 2 after the global at 4)
    ws = got[5][0]
    groups = hierarchical.host_groups(hosts)
    for g in groups:
        for i in g:
            np.testing.assert_array_equal(ws[i], ws[g[0]])
    assert not np.allclose(ws[groups[0][0]], ws[groups[1][0]])
    if rule == "vrl":  # Σ_i Δ_i stays 0 at both levels
        np.testing.assert_allclose(sum(got[-1][2][0]), 0.0, atol=1e-4)


def test_compressed_host_level_follows_the_numpy_rule():
    r, big_h, h = 4, 4, 2
    w0, b0 = _start(1)
    batches = make_batches(9, r, B, F, C, seed=4)
    strategy = _strategy(r, interval=big_h, host_interval=h, hosts=[0, 0, 1, 1], compression="bf16")
    got, opt = _train(strategy, w0, b0, batches, r)
    want = two_level_reference(w0, b0, batches, [0, 0, 1, 1], "vrl", big_h, h, codec="bf16")
    _compare(got, want, r, "vrl", atol=2e-5)
    exact = two_level_reference(w0, b0, batches, [0, 0, 1, 1], "vrl", big_h, h)
    assert not np.allclose(got[-1][0][0], exact[-1][0][0], rtol=0, atol=1e-7)  # rounding is on


@pytest.mark.parametrize("hosts", [[0, 0, 1, 1], [0, 0, 0, 0]])
def test_int8_host_values_follow_the_numpy_rule(hosts):
    r, big_h, h = 4, 4, 2
    w0, b0 = _start(1)
    batches = make_batches(9, r, B, F, C, seed=4)
    strategy = _strategy(r, interval=big_h, host_interval=h, hosts=hosts, compression="int8")
    got, opt = _train(strategy, w0, b0, batches, r)
    want = two_level_reference(w0, b0, batches, hosts, "vrl", big_h, h, codec="int8")
    _compare(got, want, r, "vrl", atol=2e-5)
    exact = two_level_reference(w0, b0, batches, hosts, "vrl", big_h, h)
    rounded = not np.allclose(got[-1][0][0], exact[-1][0][0], rtol=0, atol=1e-6)
    assert rounded == (len(set(hosts)) > 1)  # across hosts only: one host is the intra-host rule exactly
    n = F * C + C  # one block: 18 int8 values and one float32 scale per replica and global sync
    assert strategy.stats()["sync_payload_bytes"] == n + 4


def test_int8_on_tensors_is_the_numpy_codec_bit_for_bit():
    from tf_commopt.distribute.compressed_sync import quantize_int8

    rng = np.random.RandomState(5)
    for n in (1, 255, 256, 257, 1000):
        v = (rng.randn(n) * 10.0 ** rng.uniform(-6, 1, n)).astype(np.float32)
        v[: n // 300] = 0.0
        q, scales, sent = quantize_int8(tf.constant(v))
        np.testing.assert_array_equal(sent.numpy(), compress.round_int8(v))
        assert q.dtype == tf.int8 and np.abs(q.numpy()).max() <= 127
        blocks = np.pad(q.numpy().astype(np.float32), (0, -n % 256)).reshape(-1, 256)
        np.testing.assert_array_equal((blocks * scales.numpy()[:, None]).reshape(-1)[:n], sent.numpy())


def test_int8_takes_vrl_and_none_not_the_gradient_correction():
    w0, b0 = _start()
    batches = make_batches(2, 4, B, F, C, seed=1)
    kw = dict(interval=4, host_interval=2, hosts=[0, 0, 1, 1], compression="int8", correction="gradient")
    with pytest.raises(InputError, match="compression=...*gradient correction"):
        _train(_strategy(4, **kw), w0, b0, batches, 4)


@pytest.mark.parametrize("compression", [None, "bf16", "int8"])
def test_a_chunked_global_sync_is_the_one_pass_sync_bit_for_bit(compression):
    r = 4
    w0, b0 = _start(3)
    if compression == "int8":  # chunks of whole int8 blocks: 303 values are chunks of 256 and 47
        w0 = np.random.RandomState(3).randn(100, C).astype(np.float32) * 0.3
    batches = make_batches(9, r, B, w0.shape[0], C, seed=6)
    runs = []
    for chunk in (1 << 20, 5):  # one chunk; four chunks of 5, 5, 5 and 3 values (w: 15, b: 3)
        strategy = _strategy(r, interval=4, host_interval=2, hosts=[0, 0, 1, 1], compression=compression)
        strategy.extended.two_level.chunk_elements = chunk
        runs.append(_train(strategy, w0, b0, batches, r)[0])
    for (wa, ba, da), (wb, bb, db) in zip(*runs):
        for i in range(r):
            np.testing.assert_array_equal(wa[i], wb[i])
            np.testing.assert_array_equal(ba[i], bb[i])
        for dva, dvb in zip(da, db):  # Δ of w, of b
            np.testing.assert_array_equal(dva, dvb)


def test_host_interval_equal_to_interval_is_the_flat_rule():
    r = 4
    w0, b0 = _start(2)
    batches = make_batches(8, r, B, F, C, seed=5)
    two, _ = _train(_strategy(r, interval=4, host_interval=4, hosts=[0, 0, 1, 1]), w0, b0, batches, r)
    flat, _ = _train(_strategy(r, interval=4), w0, b0, batches, r)
    for (w2, b2, d2), (wf, bf, df) in zip(two, flat):
        for i in range(r):
            np.testing.assert_allclose(w2[i], wf[i], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(b2[i], bf[i], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(d2[0][i], df[0][i], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kw, where",
    [
        (dict(interval=8, host_interval=3), "host_interval"),
        (dict(interval=8, host_interval=0), "host_interval"),
        (dict(interval="auto", host_interval=2), "host_interval"),
        (dict(interval=8, host_interval=2, overlap=True), "host_interval"),
        (dict(interval=8, hosts=[0, 1]), "hosts"),
        (dict(interval=8, host_interval=2, hosts=[0, 0, 1]), "hosts"),
        (dict(interval=8, host_interval="auto"), "host_interval"),
        (dict(interval="auto", host_interval="sometimes"), "host_interval"),
        (dict(interval="auto", host_interval="auto", overlap=True), "host_interval"),
        (dict(interval="auto", host_interval="auto", period="time"), "period"),
        (dict(interval="auto", host_interval="auto", auto_probe_interval=1), "host_interval"),
        (dict(interval=AutoInterval(max_interval=64), host_interval=TwoLevelInterval()), "host_interval"),
        (dict(interval=8, compression="int8"), "compression"),
    ],
)
def test_bad_two_level_arguments_are_one_line_errors(kw, where):
    with pytest.raises(InputError) as e:
        _strategy(2, **kw)
    assert where in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("codec", [None, "bf16"])
def test_gradient_correction_follows_the_numpy_rule(codec):
    r, big_h, h = 4, 4, 2
    w0, b0 = _start(3)
    batches = make_batches(10, r, B, F, C, seed=6)
    hosts = [0, 0, 1, 1]
    kw = dict(interval=big_h, host_interval=h, hosts=hosts, correction="gradient", compression=codec)
    strategy = _strategy(r, **kw)
    got, opt = _train(strategy, w0, b0, batches, r)
    want = two_level_reference(w0, b0, batches, hosts, "gradient", big_h, h, codec=codec)
    _compare(got, want, r, "vrl", atol=2e-5)  # "vrl": compare the Δ too
    np.testing.assert_allclose(sum(got[-1][2][0]), 0.0, atol=1e-4)
    beta = strategy.extended.correction_state(opt).host_deltas[0]
    assert all(np.abs(c.numpy()).max() > 0 for c in beta.values)  # β_c is in use
    if codec is None:  # for plain SGD the two rules coincide (docs/skip_correct.md)
        vrl = two_level_reference(w0, b0, batches, hosts, "vrl", big_h, h)
        np.testing.assert_allclose(got[-1][0][0], vrl[-1][0][0], rtol=1e-5, atol=2e-5)


def test_set_interval_keeps_a_multiple_of_the_host_interval():
    strategy = _strategy(2, interval=8, host_interval=2)
    with pytest.raises(InputError, match=r"^SkipCorrectStrategy.set_interval: 3 is not a multiple"):
        strategy.set_interval(3)
    strategy.set_interval(6)
    assert strategy.interval == 6


# ---- host_interval="auto" ------------------------------------------------------------------------------
PROBE = AutoInterval(max_interval=8, warmup_steps=2, probe_interval=4, measure_syncs=2)
CHOSEN_AT = 2 + 4 * 2  # the step of the last probe sync, where (h, H) is chosen
CALLS = []


class _Fixed(TwoLevelInterval):
    """The rule with (h, m) = (2, 2) whatever the timings, recording what it was given."""

    def choose(self, t_intra_s, t_inter_s, t_comp_s, hosts=2):
        CALLS.append((t_intra_s, t_inter_s, t_comp_s, hosts))
        return 2, 2


def _auto_schedule(n, big_h, h):
    """(H, h) at each step: warm-up (1, 1), the probe (probe_interval, probe_interval // 2), then the
    chosen (H, h)."""
    p = PROBE.probe_interval
    probe = [(p, max(1, p // 2))] * (p * PROBE.measure_syncs)
    return [(1, 1)] * PROBE.warmup_steps + probe + [(big_h, h)] * (n - CHOSEN_AT)


def _agreed(s):
    return s["interval_t_intra_s"], s["interval_t_inter_s"], s["interval_t_comp_s"]


@pytest.mark.parametrize("rule", ["vrl", "gradient"])
def test_auto_host_interval_applies_the_choice_and_follows_the_numpy_rule(rule):
    CALLS.clear()
    r, n, hosts = 4, CHOSEN_AT + 8, [0, 0, 1, 1]
    w0, b0 = _start(4)
    batches = make_batches(n, r, B, F, C, seed=7)
    strategy = _strategy(
        r, interval=PROBE, host_interval=_Fixed(max_interval=8), hosts=hosts, correction=rule
    )
    got, _ = _train(strategy, w0, b0, batches, r)
    s = strategy.stats()
    assert (s["interval_chosen"], s["host_interval"], s["interval"]) == (1, 2, 4)
    assert CALLS == [(*_agreed(s), 2)]  # the agreed medians, in the rule's order, once
    assert s["interval_t_inter_s"] == s["interval_t_comm_s"] > 0 and s["interval_t_comp_s"] > 0
    # the medians of this worker's samples (one process: the mean over replicas of equal values)
    for key, count in (("intra", 2), ("comm", 2), ("comp", 8)):
        samples = s[f"interval_t_{key}_samples_s"]
        assert len(samples) == count
        assert s[f"interval_t_{key}_s"] == pytest.approx(np.median(samples), rel=1e-5, abs=2e-6)
    # syncs: 2 warm-up, 2 probe (steps 6, 10), then at 14 and 18; host syncs: at 4 and 8 (the probe's h = 2),
    # then at 12 and 16
    assert (s["syncs"], s["host_syncs"]) == (6, 4)
    want = two_level_reference(
        w0,
        b0,
        batches,
        hosts,
        rule,
        0,
        0,
        schedule=_auto_schedule(n, 4, 2),
        restart_after=CHOSEN_AT,
    )
    _compare(got, want, r, "vrl", atol=2e-5)


def test_a_t_intra_sample_is_the_host_syncs_measured_seconds():
    r, n, hosts = 4, CHOSEN_AT + 8, [0, 0, 1, 1]
    w0, b0 = _start(6)
    strategy = _strategy(r, interval=PROBE, host_interval=_Fixed(max_interval=8), hosts=hosts)
    with strategy.scope():
        w, b = tf.Variable(w0), tf.Variable(b0)
        opt = tf.keras.optimizers.SGD(LR)
    step = softmax_step(strategy, w, b, opt, r * B)
    seen, host_s = [], 0.0
    for t, row in enumerate(make_batches(n, r, B, F, C, seed=9), start=1):
        step(row)
        s = strategy.stats()
        grown = s["host_comm_s"] - host_s
        host_s = s["host_comm_s"]
        new = s["interval_t_intra_samples_s"][len(seen) :]
        if t <= CHOSEN_AT:  # the probe: each host sync's seconds are its sample
            assert len(new) == (1 if grown > 0 else 0), (t, new, grown)
            if new:
                assert new[0] == pytest.approx(grown, abs=1e-6)
        else:  # after the choice host syncs go on (at 12 and 16) but are no sample
            assert not new
        seen += new
    assert len(seen) == 2 and s["host_syncs"] == 4 and all(x > 0 for x in seen)


def test_auto_host_interval_is_the_rule_on_the_agreed_medians():
    r, n, hosts = 4, CHOSEN_AT + 8, ["a", "b", "b", "b"]
    w0, b0 = _start(5)
    batches = make_batches(n, r, B, F, C, seed=8)
    probe = dataclasses.replace(PROBE, target_ratio=0.01)  # H > 1 likely: a sync is not 100x a step
    strategy = _strategy(r, interval=probe, host_interval="auto", hosts=hosts)
    got, _ = _train(strategy, w0, b0, batches, r)
    s = strategy.stats()
    h, m = TwoLevelInterval(target_ratio=0.01, max_interval=8).choose(*_agreed(s), hosts=2)
    assert (s["interval_chosen"], s["host_interval"], s["interval"]) == (1, h, m * h)
    want = two_level_reference(
        w0, b0, batches, hosts, "vrl", 0, 0, schedule=_auto_schedule(n, m * h, h), restart_after=CHOSEN_AT
    )
    _compare(got, want, r, "vrl", atol=2e-5)


def test_a_checkpoint_keeps_the_chosen_host_interval(tmp_path):
    r, hosts = 4, [0, 0, 1, 1]
    w0, b0 = _start(6)
    batches = make_batches(CHOSEN_AT, r, B, F, C, seed=9)
    strategy = _strategy(r, interval=PROBE, host_interval=_Fixed(max_interval=8), hosts=hosts)
    _, opt = _train(strategy, w0, b0, batches, r)
    path = tf.train.Checkpoint(opt=opt).save(str(tmp_path / "ckpt"))
    fresh = _strategy(r, interval=PROBE, host_interval=_Fixed(max_interval=8), hosts=hosts)
    assert (fresh.stats()["host_interval"], fresh.interval) == (1, 1)
    with fresh.scope():
        w, b = tf.Variable(w0), tf.Variable(b0)
        opt2 = tf.keras.optimizers.SGD(LR)
        opt2.build([w, b])
        fresh.extended._sc_state(opt2, [w, b])
    tf.train.Checkpoint(opt=opt2).restore(path).assert_existing_objects_matched()
    s = fresh.stats()
    assert (s["interval_chosen"], s["host_interval"], s["interval"]) == (1, 2, 4)
    assert s["interval_t_intra_s"] == strategy.stats()["interval_t_intra_s"] > 0


def test_the_runner_takes_host_interval_auto():
    from experiments.config import Config, validate

    assert (
        validate(Config(strategy="skip_correct", interval="auto", host_interval="auto")).host_interval
        == "auto"
    )
    assert validate(Config(strategy="skip_correct", interval=4, host_interval="2")).host_interval == 2
    with pytest.raises(InputError, match=r"^--host_interval: .*--interval=auto"):
        validate(Config(strategy="skip_correct", interval=4, host_interval="auto"))
    with pytest.raises(InputError, match=r"^--host_interval: must be an integer >= 0 or 'auto'"):
        validate(Config(strategy="skip_correct", host_interval="often"))


def test_the_runner_says_int8_needs_two_levels(capsys):
    from experiments import train

    argv = ["train", "--strategy=skip_correct", "--model=mlp", "--steps=2", "--compression=int8"]
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("experiments.train: error: --compression: int8 needs"), err
