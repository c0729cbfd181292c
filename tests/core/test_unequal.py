"""The sync for unequal local step counts (tf_commopt.core.unequal) against independent numpy references.

* equal counts: today's rule, as its own numpy reference (tests/tf/sc_reference.py) computes it, with
  momentum and the effective lr (vrl) and with Adam (gradient);
* unequal counts, 2 and 4 workers, step by step: a reference written in gradient space (each worker's
  applied updates and raw gradients summed over its period; FedNova's x⁺ = x₀ − lr·τ_eff·Σ p_i S_i/τ_i;
  Δ_i = G_i/τ_i − Σ p_j G_j/τ_j), not from model differences as the module is;
* a quadratic with a closed-form optimum: plain averaging with unequal counts converges to the wrong
  point (its closed-form fixed point), the normalised rule to the right one up to O(lr), and with the
  vrl correction exactly.
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
from tf_commopt.core import unequal
from tf_commopt.errors import InputError


# ------------------------------------------------------------------------------------------ drivers
def drive(x0, grad, steps_of_period, periods, rule, lr, weights=None, make_opt=None, clr=None):
    """Local steps by ``make_opt()`` (plain SGD(lr) by default) on each worker, syncs by the module.

    ``grad(i, x, t)`` = worker i's gradient at its t-th local step of the run; ``steps_of_period(n)`` the
    step counts of period n. Returns per worker-step snapshots [(period, worker, x_i, Δ_i)] and the model
    after each sync.
    """
    r = len(steps_of_period(0))
    make_opt = make_opt or (lambda: _NumpyOpt("sgd", lr))
    opts = [make_opt() for _ in range(r)]
    xs = [x0.copy() for _ in range(r)]
    deltas = [np.zeros_like(x0) for _ in range(r)]
    counts = [0] * r
    trace, synced = [], []
    for n in range(periods):
        taus = steps_of_period(n)
        start = xs[0].copy()
        sums = [np.zeros_like(x0) for _ in range(r)]
        for i in range(r):
            for _ in range(taus[i]):
                g = grad(i, xs[i], counts[i])
                counts[i] += 1
                sums[i] = sums[i] + g
                xs[i] = opts[i].step("x", xs[i], g - deltas[i])
                opts[i].done_step()
                trace.append((n, i, xs[i].copy(), deltas[i].copy()))
        new_x, deltas = unequal.unequal_sync(
            start, xs, taus, rule, clr=clr or lr, deltas=deltas, grad_sums=sums, weights=weights
        )
        xs = [new_x.copy() for _ in range(r)]
        synced.append(new_x.copy())
    return trace, synced


def reference(x0, grad, steps_of_period, periods, rule, lr, weights=None):
    """Plain SGD local steps; the sync from the summed applied updates S_i and raw gradients G_i."""
    r = len(steps_of_period(0))
    p = weights or [1.0 / r] * r
    x = x0.copy()
    deltas = [np.zeros_like(x0) for _ in range(r)]
    counts = [0] * r
    trace, synced = [], []
    for n in range(periods):
        taus = steps_of_period(n)
        applied, raw = [], []
        for i in range(r):
            xi, s, gsum = x.copy(), np.zeros_like(x0), np.zeros_like(x0)
            for _ in range(taus[i]):
                g = grad(i, xi, counts[i])
                counts[i] += 1
                u = g - deltas[i]
                xi = xi - lr * u
                s, gsum = s + u, gsum + g
                trace.append((n, i, xi.copy(), deltas[i].copy()))
            applied.append(s)
            raw.append(gsum)
        tau_eff = sum(p[i] * taus[i] for i in range(r))
        x = x - lr * tau_eff * sum(p[i] * applied[i] / taus[i] for i in range(r))
        if rule != "none":
            mean_g = sum(p[i] * raw[i] / taus[i] for i in range(r))
            deltas = [raw[i] / taus[i] - mean_g for i in range(r)]
        synced.append(x.copy())
    return trace, synced


def by_worker(trace):
    out = {}
    for n, i, x, d in trace:
        out.setdefault(i, []).append((n, x, d))
    return out


# --------------------------------------------------------------------------- unequal, step by step
@pytest.mark.parametrize("rule", ["vrl", "gradient", "none"])
@pytest.mark.parametrize(
    "taus",
    [
        lambda n: [4, 2],
        lambda n: [3, 7],
        lambda n: [8, 4, 6, 2],
        lambda n: [1 + (n + i) % 4 for i in range(4)],  # counts that change every period
    ],
)
def test_unequal_counts_match_the_gradient_space_reference(rule, taus):
    r = len(taus(0))
    for weights in (None, unequal.batch_weights([16 * (i + 1) for i in range(r)])):
        grad = least_squares(r, features=5)
        x0 = np.zeros(5)
        got_trace, got = drive(x0, grad, taus, 6, rule, lr=0.02, weights=weights)
        grad = least_squares(r, features=5)  # the same batches again
        want_trace, want = reference(x0, grad, taus, 6, rule, lr=0.02, weights=weights)
        for i, steps in by_worker(want_trace).items():
            mine = by_worker(got_trace)[i]
            assert len(mine) == len(steps)
            for (n, x, d), (m, y, e) in zip(steps, mine):
                assert n == m
                np.testing.assert_allclose(y, x, rtol=1e-10, atol=1e-12)
                np.testing.assert_allclose(e, d, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_weighted_deltas_sum_to_zero_and_the_allreduce_form_is_the_same_rule():
    rng = np.random.RandomState(1)
    x0, xs = rng.randn(3), [rng.randn(3) for _ in range(4)]
    taus, p = [5, 2, 9, 1], unequal.batch_weights([10, 20, 30, 40])
    _, deltas = unequal.unequal_sync(x0, xs, taus, "vrl", clr=0.1, weights=p)
    np.testing.assert_allclose(sum(pi * d for pi, d in zip(p, deltas)), 0.0, atol=1e-12)
    shares = [unequal.worker_share(x0, x, t, pi) for x, t, pi in zip(xs, taus, p)]
    by_sums = unequal.from_sums(x0, sum(s[0] for s in shares), sum(s[1] for s in shares))
    np.testing.assert_allclose(by_sums, unequal.normalised_average(x0, xs, taus, p), rtol=1e-14)
    assert sum(s[1] for s in shares) == pytest.approx(unequal.effective_steps(taus, p))


# ------------------------------------------------------------------------- equal counts = today's rule
@pytest.mark.parametrize("momentum,interval", [(0.0, 4), (0.9, 3), (0.9, 1)])
def test_equal_counts_are_todays_vrl_rule(momentum, interval):
    """Against sc_reference.run_rule (the numpy reference the TF strategy is tested against)."""
    lr, r, steps = 0.1, 4, 12
    rng = np.random.RandomState(3)
    w0, b0 = rng.randn(4, 3) * 0.1, np.zeros(3)
    batches = make_batches(steps, r, 8, 4, 3, seed=5)
    want = run_rule(w0, b0, batches, interval, "vrl", lr, momentum=momentum, correction_lr="effective")
    got = _softmax_drive(
        w0, b0, batches, interval, "vrl", lambda: _NumpyOpt("sgd", lr, momentum), lr / (1 - momentum)
    )
    for t, (ws, bs, dws, dbs) in enumerate(want):
        for i in range(r):
            np.testing.assert_allclose(got[t][0][i], ws[i], rtol=1e-11, atol=1e-13)
            np.testing.assert_allclose(got[t][1][i], bs[i], rtol=1e-11, atol=1e-13)
            np.testing.assert_allclose(got[t][2][i], dws[i], rtol=1e-11, atol=1e-11)
            np.testing.assert_allclose(got[t][3][i], dbs[i], rtol=1e-11, atol=1e-11)


def test_equal_counts_are_todays_gradient_rule_with_adam():
    lr, r, steps, interval = 0.01, 2, 9, 3
    rng = np.random.RandomState(4)
    w0, b0 = rng.randn(4, 3) * 0.1, np.zeros(3)
    batches = make_batches(steps, r, 8, 4, 3, seed=6)
    want = run_gradient_rule(w0, b0, batches, interval, lambda: _NumpyOpt("adam", lr))
    got = _softmax_drive(w0, b0, batches, interval, "gradient", lambda: _NumpyOpt("adam", lr), lr)
    for t, (ws, bs, dws) in enumerate(want):
        for i in range(r):
            np.testing.assert_allclose(got[t][0][i], ws[i], rtol=1e-11, atol=1e-13)
            np.testing.assert_allclose(got[t][1][i], bs[i], rtol=1e-11, atol=1e-13)
            np.testing.assert_allclose(got[t][2][i], dws[i], rtol=1e-11, atol=1e-11)


def _softmax_drive(w0, b0, batches, interval, rule, make_opt, clr):
    """Lockstep softmax regression (every worker steps at every t) with the module's sync every H steps."""
    r = len(batches[0])
    ps = [[w0.astype(np.float64).copy(), b0.astype(np.float64).copy()] for _ in range(r)]
    ds = [[np.zeros_like(p) for p in ps[0]] for _ in range(r)]
    gs = [[np.zeros_like(p) for p in ps[0]] for _ in range(r)]
    opts = [make_opt() for _ in range(r)]
    start = [p.copy() for p in ps[0]]
    k, history = 0, []
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
                new, deltas = unequal.unequal_sync(
                    start[j],
                    [p[j] for p in ps],
                    [k] * r,
                    rule,
                    clr=clr,
                    deltas=[d[j] for d in ds],
                    grad_sums=[g[j] for g in gs],
                )
                for i in range(r):
                    ps[i][j], ds[i][j], gs[i][j] = new.copy(), deltas[i], np.zeros_like(new)
            start, k = [p.copy() for p in ps[0]], 0
        history.append(tuple([p[j].copy() for p in grid] for grid, j in ((ps, 0), (ps, 1), (ds, 0), (ds, 1))))
    return history


# ---------------------------------------------------------------------- objective inconsistency
def _quadratic(r=4, dim=3, seed=7):
    rng = np.random.RandomState(seed)
    a = [rng.uniform(1.0, 2.0, dim) for _ in range(r)]  # F_i(x) = ½ Σ a_i (x − c_i)², diagonal
    c = [rng.randn(dim) * 3 for _ in range(r)]
    return a, c


def _rounds(a, c, taus, lr, normalised, rule, periods):
    r = len(a)
    x, deltas = np.zeros_like(c[0]), [np.zeros_like(c[0]) for _ in range(r)]
    for _ in range(periods):
        xs, sums = [], []
        for i in range(r):
            xi, gsum = x.copy(), np.zeros_like(x)
            for _ in range(taus[i]):
                g = a[i] * (xi - c[i])
                gsum += g
                xi = xi - lr * (g - deltas[i])
            xs.append(xi)
            sums.append(gsum)
        if normalised:
            x, deltas = unequal.unequal_sync(x, xs, taus, rule, clr=lr, deltas=deltas, grad_sums=sums)
        else:  # plain averaging (FedAvg / today's average with no regard to the counts)
            x = sum(xs) / r
    return x


def test_normalised_averaging_removes_the_objective_inconsistency():
    a, c = _quadratic()
    taus, lr = [8, 4, 2, 1], 0.004
    optimum = sum(ai * ci for ai, ci in zip(a, c)) / sum(a)  # of F = mean_i F_i, closed form
    # each rule is an affine map of x with a closed-form fixed point: Σ_i w_i (x − c_i) = 0
    shrink = [1 - (1 - lr * ai) ** t for ai, t in zip(a, taus)]
    plain_fixed = sum(s * ci for s, ci in zip(shrink, c)) / sum(shrink)
    nova_w = [s / t for s, t in zip(shrink, taus)]
    nova_fixed = sum(w * ci for w, ci in zip(nova_w, c)) / sum(nova_w)
    plain = _rounds(a, c, taus, lr, False, "none", 1500)
    nova = _rounds(a, c, taus, lr, True, "none", 1500)
    corrected = _rounds(a, c, taus, lr, True, "vrl", 1500)
    np.testing.assert_allclose(plain, plain_fixed, atol=1e-9)
    np.testing.assert_allclose(nova, nova_fixed, atol=1e-9)
    plain_err, nova_err = np.abs(plain - optimum).max(), np.abs(nova - optimum).max()
    assert plain_err > 0.3  # converges, but to the counts-weighted objective's optimum
    assert nova_err < plain_err / 20  # O(lr·τ) from the optimum
    np.testing.assert_allclose(corrected, optimum, atol=1e-9)  # the correction removes the rest


# ---------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: unequal.validate_steps([]), "steps: must be a non-empty list"),
        (lambda: unequal.validate_steps([2, 1.5]), "steps[1]: must be an integer >= 1, got 1.5"),
        (lambda: unequal.batch_weights([32, 0]), "batch_sizes[1]: must be a number > 0, got 0"),
        (lambda: unequal.effective_steps([2, 2], [0.5, 0.6]), "weights: must sum to 1"),
        (lambda: unequal.effective_steps([2, 2], [1.0]), "weights: 1 weights for 2 workers"),
        (lambda: unequal.normalised_average(np.zeros(1), [np.zeros(1)], [1, 2]), "xs: 1 models for 2"),
        (lambda: unequal.unequal_sync(np.zeros(1), [np.zeros(1)], [1], "avg"), "rule: unknown rule 'avg'"),
        (lambda: unequal.unequal_sync(np.zeros(1), [np.zeros(1)], [1], "vrl", clr=0.0), "clr: must be"),
        (
            lambda: unequal.unequal_sync(np.zeros(1), [np.zeros(1)], [1], "gradient"),
            "grad_sums: the gradient",
        ),
    ],
)
def test_bad_input_is_one_line_naming_where(call, message):
    with pytest.raises(InputError) as e:
        call()
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
