"""Two-level averaging (tf_commopt.core.hierarchical) against independent numpy references.

* 4 replicas as 2 hosts x 2 (and 3 + 1), plain SGD on least squares, every rule, with and without
  compression on the inter-host level, step by step against a reference in matrix form that keeps the
  within-host correction α_i and the host correction β_c apart (the module keeps only Δ_i = α_i + β_c);
* for plain SGD the two-level vrl and gradient rules are the same rule (derived in docs/skip_correct.md);
* one host, and m = 1, are today's rule at H = h, bit for bit, against tests/tf/sc_reference.py;
* Σ_i Δ_i = 0 after every sync, at both levels.
"""

import numpy as np
import pytest

from tests.core.test_compress import REF
from tests.tf.sc_reference import least_squares, make_batches, run_gradient_rule, run_rule, softmax_grads
from tf_commopt.core import hierarchical as hier
from tf_commopt.errors import InputError


def drive(grads, x0s, host_of, h, m, periods, rule, lr, codec=None):
    """Plain SGD local steps on every replica, the module's syncs; per-variable states.

    ``grads(i, params, t)`` = replica i's gradients (one per variable) at its t-th step. Returns the
    trace: after every local step the models, after every sync the models and the Δ_i.
    """
    hosts = hier.host_groups(host_of)
    r = len(host_of)
    zeros = [[np.zeros_like(x) for _ in range(r)] for x in x0s]
    states = [
        hier.LevelState([x.copy() for _ in range(r)], *[[z.copy() for z in zeros[v]] for _ in range(6)])
        for v, x in enumerate(x0s)
    ]
    last_global = [x.copy() for x in x0s]
    trace, t, syncs = [], 0, 0
    for _ in range(periods * m):
        for _ in range(h):
            for i in range(r):
                g = grads(i, [s.xs[i] for s in states], t)
                for v, s in enumerate(states):
                    s.grad_sums[i] = s.grad_sums[i] + g[v]
                    s.xs[i] = s.xs[i] - lr * (g[v] - s.deltas[i])
            t += 1
            trace.append([np.array(s.xs) for s in states])
        syncs += 1
        is_global = syncs % m == 0
        states = [
            hier.two_level_sync(last_global[v], s, hosts, rule, h, m, is_global, lr, codec)
            for v, s in enumerate(states)
        ]
        if is_global or len(hosts) == 1:
            last_global = [s.xs[0].copy() for s in states]
        trace.append([np.array(s.xs) for s in states])
        trace.append([np.array(s.deltas) for s in states])
    return trace


def reference(grad, host_of, h, m, periods, rule, lr, codec=None, dim=6):
    """Matrix form, one variable: α (replicas), β (hosts), residuals per host, host weights n_c/R."""
    host = np.array(host_of)
    c_count = host.max() + 1
    r = len(host)
    w = np.array([np.sum(host == c) / r for c in range(c_count)])
    rnd = REF[codec] if codec else (lambda v: v)
    x, x0 = np.zeros((r, dim)), np.zeros(dim)
    alpha, beta = np.zeros((r, dim)), np.zeros((c_count, dim))
    big_g, s, e, er = (
        np.zeros((r, dim)),
        np.zeros((c_count, dim)),
        np.zeros((c_count, dim)),
        np.zeros((c_count, dim)),
    )
    trace, t = [], 0
    for _ in range(periods):
        for _sub in range(m):
            for _ in range(h):
                g = np.array([grad(i, x[i], t) for i in range(r)])
                big_g += g
                x = x - lr * (g - (alpha + beta[host]))
                t += 1
                trace.append([x.copy()])
            for c in range(c_count):
                mine = host == c
                xc = x[mine].sum(axis=0) / mine.sum()
                if rule == "vrl":
                    alpha[mine] += (xc - x[mine]) / (h * lr)
                elif rule == "gradient":
                    gc = big_g[mine].sum(axis=0) / mine.sum()
                    alpha[mine] = (big_g[mine] - gc) / h
                    s[c] += gc
                x[mine] = xc
            big_g[:] = 0.0
            if _sub < m - 1:
                trace.append([x.copy()])
                trace.append([alpha + beta[host]])
        xc = np.array([x[host == c][0] for c in range(c_count)])
        v = xc - x0 + e
        q = rnd(v)
        e = v - q
        q_bar = (w[:, None] * q).sum(axis=0)
        x0 = x0 + q_bar
        if rule == "vrl":
            beta += (q_bar - q) / (h * m * lr)
        elif rule == "gradient":
            vs = s + er
            qs = rnd(vs)
            er = vs - qs
            beta = (qs - (w[:, None] * qs).sum(axis=0)) / (h * m)
            s[:] = 0.0
        x[:] = x0
        trace.append([x.copy()])
        trace.append([alpha + beta[host]])
    return trace


def _ls(r):
    grad = least_squares(r)
    return lambda i, params, t: [grad(i, params[0], t)]


@pytest.mark.parametrize("codec", [None, "bf16", "fp16"])
@pytest.mark.parametrize("rule", ["vrl", "gradient", "none"])
@pytest.mark.parametrize("host_of,h,m", [([0, 0, 1, 1], 2, 3), ([0, 0, 1, 1], 3, 2), ([0, 0, 0, 1], 2, 2)])
def test_two_level_matches_the_matrix_reference_step_by_step(codec, rule, host_of, h, m):
    got = drive(_ls(4), [np.zeros(6)], host_of, h, m, 4, rule, 0.02, codec)
    want = reference(least_squares(4), host_of, h, m, 4, rule, 0.02, codec)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a[0], b[0], rtol=1e-11, atol=1e-13)


def test_plain_sgd_two_level_vrl_is_the_two_level_gradient_rule():
    """Uncompressed only: compressed, the two round different quantities (the model vs S_c)."""
    vrl = drive(_ls(4), [np.zeros(6)], [0, 0, 1, 1], 2, 3, 4, "vrl", 0.02)
    grad = drive(_ls(4), [np.zeros(6)], [0, 0, 1, 1], 2, 3, 4, "gradient", 0.02)
    for a, b in zip(vrl, grad):
        np.testing.assert_allclose(a[0], b[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("codec", [None, "bf16", "fp16"])
def test_deltas_sum_to_zero_after_every_sync(codec):
    for rule in ("vrl", "gradient"):
        trace = drive(_ls(4), [np.zeros(6)], [0, 0, 1, 1], 2, 3, 3, rule, 0.02, codec)
        deltas = trace[3::4]  # h = 2 steps, then the synced models, then the Δ
        for d in deltas:
            assert np.abs(d[0].sum(axis=0)).max() < 1e-11


def _softmax(batches):
    return lambda i, params, t: list(softmax_grads(params[0], params[1], *batches[t][i]))


@pytest.mark.parametrize("rule", ["vrl", "gradient"])
@pytest.mark.parametrize("host_of,h,m", [([0, 0, 0, 0], 3, 4), ([0, 0, 1, 1], 3, 1)])
def test_one_host_or_m_1_is_todays_rule_bit_for_bit(rule, host_of, h, m):
    lr, r = 0.1, 4
    rng = np.random.RandomState(3)
    w0, b0 = rng.randn(4, 3) * 0.1, np.zeros(3)
    batches = make_batches(12, r, 8, 4, 3, seed=5)
    if rule == "vrl":
        want = [(ws, bs) for ws, bs, _, _ in run_rule(w0, b0, batches, h, "vrl", lr)]
    else:
        from tests.tf.sc_reference import _NumpyOpt

        want = [(ws, bs) for ws, bs, _ in run_gradient_rule(w0, b0, batches, h, lambda: _NumpyOpt("sgd", lr))]
    got = drive(
        _softmax(batches),
        [w0.astype(np.float64), b0.astype(np.float64)],
        host_of,
        h,
        m,
        12 // (h * m),
        rule,
        lr,
    )
    steps = [entry for entry in _model_after_each_step(got, h)]
    assert len(steps) == len(want)
    for (gw, gb), (ws, bs) in zip(steps, want):
        np.testing.assert_array_equal(gw, np.array(ws))
        np.testing.assert_array_equal(gb, np.array(bs))


def _model_after_each_step(trace, h):
    """The models after each step, with the sync's result in place of the step that ended a period."""
    out, k = [], 0
    it = iter(trace)
    for entry in it:
        k += 1
        if k == h:
            entry = next(it)  # the synced models
            next(it)  # the Δ
            k = 0
        out.append(entry)
    return out


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: hier.host_groups([]), "host_of: must be a non-empty list"),
        (lambda: hier.host_groups([0, None]), "host_of[1]: must be a host name or number"),
        (lambda: _sync(hosts=((0,), (2,))), "hosts: the hosts' replicas must be 0..1"),
        (lambda: _sync(h=0), "h: must be an integer >= 1"),
        (lambda: _sync(m=1.5), "m: must be an integer >= 1"),
        (lambda: _sync(rule="avg"), "rule: unknown rule 'avg'"),
        (lambda: _sync(rule="gradient"), "grad_sums: the gradient rule needs"),
    ],
)
def test_bad_input_is_one_line_naming_where(call, message):
    with pytest.raises(InputError) as e:
        call()
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def _sync(hosts=((0,), (1,)), h=1, m=2, rule="vrl"):
    state = hier.LevelState([np.zeros(1), np.zeros(1)], [np.zeros(1), np.zeros(1)])
    return hier.two_level_sync(np.zeros(1), state, hosts, rule, h, m, True)
