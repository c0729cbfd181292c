"""Compressed syncs with error feedback (tf_commopt.core.compress) against independent numpy references.

* the roundings: bf16 against known bit patterns and against a second, frexp-based rounding; fp16 at its
  range's edge;
* compression None is today's rule, against tests/tf/sc_reference.py (vrl with momentum, gradient with Adam);
* local SGD on least squares, 2 and 4 workers, bf16 and fp16, every rule, step by step against a reference
  written in matrix form with its own bf16 rounding;
* error feedback: the running sum of applied averages stays within one rounding of the exact sum
  (property, many random sequences); without it tiny fp16 deltas are lost for ever;
* the corrections' invariants (Σ Δ_i = 0) and why the literal vrl form is not used;
* fp16 overflow falls back to an uncompressed sync; the wire-dtype reduction's bound; bytes.
"""

import numpy as np
import pytest

from tests.tf.sc_reference import (
    _NumpyOpt,
    least_squares,
    make_batches,
    run_gradient_rule,
    run_rule,
    softmax_grads,
)
from tf_commopt.core import compress
from tf_commopt.errors import InputError


def ref_bf16(x):
    """Round-to-nearest-even to 8 significant bits of the float32 value (normal range), via frexp."""
    v = np.asarray(x, dtype=np.float32).astype(np.float64)
    m, e = np.frexp(v)
    return np.ldexp(np.rint(m * 256.0), e - 8)


def ref_fp16(x):
    return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)


REF = {"bf16": ref_bf16, "fp16": ref_fp16}


# ------------------------------------------------------------------------------------------ roundings
@pytest.mark.parametrize(
    "value,bits",
    [
        (1.0, 0x3F80),
        (1.0 + 2.0**-8, 0x3F80),  # a tie: to the even neighbour (down)
        (1.0 + 3 * 2.0**-8, 0x3F82),  # a tie: to the even neighbour (up)
        (1.0 + 2.0**-8 + 2.0**-20, 0x3F81),  # just above the tie: up
        (np.float32(np.pi), 0x4049),
        (-2.0, 0xC000),
        (-0.0, 0x8000),
        (3.3895314e38, 0x7F7F),  # the largest bfloat16
        (3.4028235e38, 0x7F80),  # float32's max rounds to inf
        (float("inf"), 0x7F80),
        (1e-45, 0x0000),  # the smallest float32 subnormal rounds to 0
        (float("nan"), 0x7FC0),
    ],
)
def test_bf16_bits_are_round_to_nearest_even_of_float32(value, bits):
    assert int(compress.bf16_bits(np.float32(value))) == bits


def test_bf16_matches_an_independent_rounding_and_its_bound():
    rng = np.random.RandomState(0)
    x = (rng.randn(50000) * 10.0 ** rng.randint(-20, 20, 50000)).astype(np.float32)
    got = compress.round_bf16(x.astype(np.float64))
    np.testing.assert_array_equal(got, ref_bf16(x))
    assert np.all(np.abs(got - x) <= compress.UNIT_ROUNDOFF["bf16"] * np.abs(x.astype(np.float64)))
    assert (
        compress.round_bf16(x).dtype == np.float32
        and compress.round_bf16(x.astype(np.float64)).dtype == np.float64
    )


def test_fp16_range_edge():
    got = compress.round_fp16(np.array([65504.0, 65519.0, 65520.0, -7e4, 1.0 / 3]))
    assert list(got[:4]) == [65504.0, 65504.0, np.inf, -np.inf]
    assert got[4] == 0.333251953125


def test_encode_keeps_exactly_what_it_did_not_send():
    rng = np.random.RandomState(1)
    for codec in compress.CODECS:
        d, e = rng.randn(1000) * 1e-3, rng.randn(1000) * 1e-6
        q, e2 = compress.encode(d, e, compress.rounder(codec))
        np.testing.assert_array_equal(q + e2, d + e)
        np.testing.assert_array_equal(q, REF[codec](d + e))


# ------------------------------------------------------------------- compression None = today's rule
@pytest.mark.parametrize("momentum,interval", [(0.0, 4), (0.9, 3)])
def test_none_is_todays_vrl_rule(momentum, interval):
    lr, r = 0.1, 4
    rng = np.random.RandomState(3)
    w0, b0 = rng.randn(4, 3) * 0.1, np.zeros(3)
    batches = make_batches(12, r, 8, 4, 3, seed=5)
    want = run_rule(w0, b0, batches, interval, "vrl", lr, momentum=momentum, correction_lr="effective")
    got = _softmax_drive(
        w0, b0, batches, interval, "vrl", lambda: _NumpyOpt("sgd", lr, momentum), lr / (1 - momentum)
    )
    for t, (ws, bs, dws, dbs) in enumerate(want):
        for i in range(r):
            for mine, ref in zip(
                (got[t][0][i], got[t][1][i], got[t][2][i], got[t][3][i]), (ws[i], bs[i], dws[i], dbs[i])
            ):
                np.testing.assert_array_equal(mine, ref)  # bit for bit


def test_none_is_todays_gradient_rule_with_adam():
    lr, r, interval = 0.01, 2, 3
    rng = np.random.RandomState(4)
    w0, b0 = rng.randn(4, 3) * 0.1, np.zeros(3)
    batches = make_batches(9, r, 8, 4, 3, seed=6)
    want = run_gradient_rule(w0, b0, batches, interval, lambda: _NumpyOpt("adam", lr))
    got = _softmax_drive(w0, b0, batches, interval, "gradient", lambda: _NumpyOpt("adam", lr), lr)
    for t, (ws, bs, dws) in enumerate(want):
        for i in range(r):
            np.testing.assert_array_equal(got[t][0][i], ws[i])
            np.testing.assert_array_equal(got[t][1][i], bs[i])
            np.testing.assert_array_equal(got[t][2][i], dws[i])


def _softmax_drive(w0, b0, batches, interval, rule, make_opt, clr):
    r = len(batches[0])
    ps = [[w0.astype(np.float64).copy(), b0.astype(np.float64).copy()] for _ in range(r)]
    ds = [[np.zeros_like(p) for p in ps[0]] for _ in range(r)]
    gs = [[np.zeros_like(p) for p in ps[0]] for _ in range(r)]
    opts = [make_opt() for _ in range(r)]
    start, k, history = [p.copy() for p in ps[0]], 0, []
    for step in batches:
        for i in range(r):
            g = softmax_grads(ps[i][0], ps[i][1], *step[i])
            for j, name in enumerate("wb"):
                gs[i][j] = gs[i][j] + g[j]
                ps[i][j] = opts[i].step(name, ps[i][j], g[j] - ds[i][j])
            opts[i].done_step()
        k += 1
        if k == interval:
            for j in range(2):
                out = compress.compressed_sync(
                    start[j],
                    [p[j] for p in ps],
                    rule,
                    k,
                    clr,
                    [d[j] for d in ds],
                    grad_sums=[g[j] for g in gs],
                )
                for i in range(r):
                    ps[i][j], ds[i][j], gs[i][j] = out.x.copy(), out.deltas[i], np.zeros_like(out.x)
            start, k = [p.copy() for p in ps[0]], 0
        history.append(tuple([p[j].copy() for p in grid] for grid, j in ((ps, 0), (ps, 1), (ds, 0), (ds, 1))))
    return history


# ---------------------------------------------------------------- least squares, step by step


def drive(grad, r, interval, periods, rule, lr, codec):
    """Workers as lists, the module's sync."""
    x0 = np.zeros(6)
    xs, ds = [x0.copy() for _ in range(r)], [np.zeros(6) for _ in range(r)]
    es, rs, gs = (
        [np.zeros(6) for _ in range(r)],
        [np.zeros(6) for _ in range(r)],
        [np.zeros(6) for _ in range(r)],
    )
    trace, t = [], 0
    for _ in range(periods):
        for _ in range(interval):
            for i in range(r):
                g = grad(i, xs[i], t)
                gs[i] = gs[i] + g
                xs[i] = xs[i] - lr * (g - ds[i])
            t += 1
            trace.append(np.array(xs))
        out = compress.compressed_sync(x0, xs, rule, interval, lr, ds, es, gs, rs, codec=codec)
        assert not out.fallback
        x0, ds, es = out.x, out.deltas, out.residuals
        rs = out.grad_residuals or rs
        xs, gs = [out.x.copy() for _ in range(r)], [np.zeros(6) for _ in range(r)]
        trace.append(np.array(xs))
        trace.append(np.array(ds))
    return trace


def reference(grad, r, interval, periods, rule, lr, codec):
    """The same rule in matrix form (rows = workers), with its own roundings."""
    rnd = REF[codec]
    x0 = np.zeros(6)
    x, d, e, er, gsum = (
        np.zeros((r, 6)),
        np.zeros((r, 6)),
        np.zeros((r, 6)),
        np.zeros((r, 6)),
        np.zeros((r, 6)),
    )
    trace, t = [], 0
    for _ in range(periods):
        for _ in range(interval):
            g = np.array([grad(i, x[i], t) for i in range(r)])
            gsum += g
            x = x - lr * (g - d)
            t += 1
            trace.append(x.copy())
        v = x - x0 + e
        q = rnd(v)
        e = v - q
        x0 = x0 + q.sum(axis=0) / r
        if rule == "vrl":
            d = d + (q.sum(axis=0) / r - q) / (interval * lr)
        elif rule == "gradient":
            vg = gsum + er
            qg = rnd(vg)
            er = vg - qg
            d = (qg - qg.sum(axis=0) / r) / interval
        x, gsum = np.tile(x0, (r, 1)), np.zeros((r, 6))
        trace.append(x.copy())
        trace.append(d.copy())
    return trace


@pytest.mark.parametrize("codec", ["bf16", "fp16"])
@pytest.mark.parametrize("rule", ["vrl", "gradient", "none"])
@pytest.mark.parametrize("r", [2, 4])
def test_local_sgd_on_least_squares_step_by_step(codec, rule, r):
    got = drive(least_squares(r), r, 4, 8, rule, 0.02, codec)
    want = reference(least_squares(r), r, 4, 8, rule, 0.02, codec)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    exact = drive(least_squares(r), r, 4, 8, rule, 0.02, None)
    assert np.abs(got[-2] - exact[-2]).max() > 0  # the compression did something
    assert np.abs(got[-2] - exact[-2]).max() < 0.05 * np.abs(exact[-2]).max()  # and stayed close


# ------------------------------------------------------------------------------ error feedback
@pytest.mark.parametrize("codec", ["bf16", "fp16"])
def test_error_feedback_keeps_the_applied_sum_within_one_rounding(codec):
    """Σ_n (x̄_n − x̄_{n−1}) = Σ_n mean_i d_i − mean_i e_i: within one rounding of the exact sum."""
    u = compress.UNIT_ROUNDOFF[codec]
    for seed in range(40):
        rng = np.random.RandomState(seed)
        r, n = rng.randint(2, 6), rng.randint(5, 60)
        x0 = rng.randn(20)
        start, es, applied, exact = x0.copy(), [np.zeros(20) for _ in range(r)], np.zeros(20), np.zeros(20)
        for _ in range(n):
            moves = [rng.randn(20) * 10.0 ** rng.uniform(-6, 0) for _ in range(r)]
            out = compress.compressed_sync(
                x0, [x0 + mv for mv in moves], "none", 1, residuals=es, codec=codec
            )
            applied += out.x - x0
            exact += sum((x0 + mv) - x0 for mv in moves) / r
            x0, es = out.x, out.residuals
            v_last = [mv + e for mv, e in zip(moves, es)]
        bound = u * max(np.abs(v).max() for v in v_last) + 1e-12 * n * (1 + np.abs(start).max())
        assert np.abs(applied - exact).max() <= 2 * bound
        np.testing.assert_allclose(applied - exact, -sum(es) / r, atol=1e-12 * n * (1 + np.abs(start).max()))


def test_without_error_feedback_tiny_fp16_deltas_are_lost():
    """Moves of 2e-8 per sync are below half fp16's smallest subnormal (6e-8): rounded to 0 every time
    without the residual; with it the model moves by the exact total within one rounding."""
    x0, total = np.zeros(3), np.zeros(3)
    es = [np.zeros(3), np.zeros(3)]
    no_ef = np.zeros(3)
    for _ in range(30):
        xs = [x0 + 2e-8, x0 + 2e-8]
        out = compress.compressed_sync(x0, xs, "none", 1, residuals=es, codec="fp16")
        lost = compress.compressed_sync(no_ef, [no_ef + 2e-8] * 2, "none", 1, codec="fp16")
        x0, es, no_ef, total = out.x, out.residuals, lost.x, total + 2e-8
    assert np.all(no_ef == 0.0)
    assert np.all(np.abs(x0 - total) <= 2.0**-24)  # one fp16 subnormal step


@pytest.mark.parametrize("codec", ["bf16", "fp16"])
def test_corrections_sum_to_zero_and_the_literal_vrl_form_does_not(codec):
    rng = np.random.RandomState(7)
    x0 = rng.randn(50)
    xs = [x0 + rng.randn(50) * 1e-2 for _ in range(4)]
    gs = [rng.randn(50) for _ in range(4)]
    for rule in ("vrl", "gradient"):
        out = compress.compressed_sync(x0, xs, rule, 4, 0.1, grad_sums=gs, codec=codec)
        assert np.abs(sum(out.deltas)).max() < 1e-12
    out = compress.compressed_sync(x0, xs, "vrl", 4, 0.1, codec=codec)
    literal = [(out.x - x) / (4 * 0.1) for x in xs]  # Δ_i + (x̄ − x_i)/(k·clr) with the compressed x̄
    np.testing.assert_allclose(sum(literal), -sum(out.residuals) / (4 * 0.1), rtol=1e-9, atol=1e-12)
    assert np.abs(sum(literal)).max() > 1e-6


# ----------------------------------------------------------------------- overflow, wire sum, bytes
def test_fp16_overflow_falls_back_to_an_uncompressed_sync():
    x0 = np.zeros(3)
    xs = [np.array([7e4, 1.0, 1.0 / 3]), np.array([0.0, 2.0, 1.0 / 3])]
    es = [np.array([0.0, 1e-4, 0.0]), np.zeros(3)]
    out = compress.compressed_sync(x0, xs, "vrl", 2, 0.5, residuals=es, codec="fp16")
    assert out.fallback
    np.testing.assert_array_equal(out.x, (xs[0] + es[0] + xs[1]) / 2)
    assert all(np.all(e == 0) for e in out.residuals)
    assert np.abs(sum(out.deltas)).max() < 1e-12
    big_sum = compress.compressed_sync(
        np.zeros(2), [np.full(2, 4e4)] * 2, "none", 1, codec="fp16", reduce="wire"
    )
    assert big_sum.fallback and np.all(big_sum.x == 4e4)  # each fits, their wire-dtype sum does not


@pytest.mark.parametrize("codec", ["bf16", "fp16"])
def test_the_wire_dtype_reduction_stays_within_its_bound(codec):
    u = compress.UNIT_ROUNDOFF[codec]
    rng = np.random.RandomState(9)
    for r in (2, 4, 8):
        x0 = np.zeros(2000)
        xs = [rng.randn(2000) * 1e-3 for _ in range(r)]
        exact = compress.compressed_sync(x0, xs, "none", 1, codec=codec)
        wire = compress.compressed_sync(x0, xs, "none", 1, codec=codec, reduce="wire")
        gamma = (r - 1) * u / (1 - (r - 1) * u)
        bound = gamma * sum(np.abs(q) for q in exact.sent) / r
        assert np.all(np.abs(wire.x - exact.x) <= bound + 1e-300)
        assert np.abs(wire.x - exact.x).max() > 0


def test_sync_bytes_halves_fp32():
    for rule in ("vrl", "gradient", "none"):
        for n in (0, 1, 102_730, 10_020_874):
            assert compress.sync_bytes(n, "bf16", rule) * 2 == compress.sync_bytes(n, None, rule)
            assert compress.sync_bytes(n, "fp16", rule) == compress.sync_bytes(n, "bf16", rule)
    assert (
        compress.sync_bytes(100, None, "gradient") == 800
        and compress.sync_bytes(100, "bf16", state_count=3) == 212
    )


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda: compress.validate_compression("int4"),
            "compression: must be 'bf16', 'fp16', 'int8' or None",
        ),
        (lambda: compress.sync_bytes(-1), "param_count: must be an integer >= 0"),
        (lambda: compress.sync_bytes(1, "fp8"), "compression: must be"),
        (lambda: compress.sync_bytes(1, None, "avg"), "correction: unknown rule 'avg'"),
        (lambda: compress.compressed_sync(np.zeros(1), [np.zeros(1)], "avg", 1), "rule: unknown rule"),
        (lambda: compress.compressed_sync(np.zeros(1), [np.zeros(1)], "vrl", 0), "interval: must be"),
        (lambda: compress.compressed_sync(np.zeros(1), [np.zeros(1)], "vrl", 1, 0.0), "clr: must be"),
        (
            lambda: compress.compressed_sync(np.zeros(1), [np.zeros(1)], "none", 1, codec="x"),
            "codec: must be",
        ),
        (
            lambda: compress.compressed_sync(np.zeros(1), [np.zeros(1)], "none", 1, reduce="ring"),
            "reduce: must be",
        ),
        (
            lambda: compress.compressed_sync(np.zeros(1), [np.zeros(1)], "gradient", 1),
            "grad_sums: the gradient",
        ),
        (lambda: compress.compressed_sync(np.zeros(1), [], "none", 1), "xs: no worker models"),
    ],
)
def test_bad_input_is_one_line_naming_where(call, message):
    with pytest.raises(InputError) as e:
        call()
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
