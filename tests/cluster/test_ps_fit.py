"""``model.fit`` on a parameter-server cluster (distribute/ps/keras_fit.py): 2 workers, 1 ps, a chief, real processes.

Every task runs tests/cluster/_ps_fit_job.py. Checked: ``model.fit`` (wrapped instance) equals the
low-level ``run_round`` with the same round lengths to 1e-6 and a dataset function per shard gives the
same rounds; every round (including the epochs' cut last rounds and the auto-H probe rounds) equals a
plain numpy implementation of local SGD / SGD with momentum / Adam with the correction
(auto: vrl for plain SGD, gradient otherwise) to 1e-5; Σ_i Δ_i = 0; with a worker SIGKILLed mid-fit the
rounds still equal the reference.
"""

import os
import signal
import sys

import numpy as np
import pytest

from tf_commopt.cluster import run_cluster

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JOB = os.path.join(HERE, "_ps_fit_job.py")
sys.path.insert(0, HERE)
import _ps_fit_job as job  # noqa: E402  (data and constants only)
from test_parameter_server import _records  # noqa: E402
from test_ps_worker_failure import _pid, _start  # noqa: E402


def reference(rec, round_steps):
    """The rule in numpy (float64): the global (W, b) after each round, and the final D_i."""
    x, y = job.data()
    k, bsz = job.SHARDS, job.BATCH
    name, kw = rec["name"], rec["kwargs"]
    lr, mu = kw["learning_rate"], kw.get("momentum", 0.0)
    corr_rule = rec["correction"]
    n = len(x) // k
    xs = [x[i::k][:n].astype(np.float64) for i in range(k)]
    ys = [y[i::k][:n].astype(np.float64) for i in range(k)]
    params = [np.array(w, np.float64) for w in rec["init"]]

    def zeros():
        return [np.zeros_like(p) for p in params]

    corr = [zeros() for _ in range(k)]
    slots = [[zeros(), zeros()] for _ in range(k)]  # SGD: [momentum, -]; Adam: [m, v]
    out, done, metrics = [], 0, []
    sync = rec.get("interval") == 1 and corr_rule == "none"  # H = 1, none: the mean gradient, one update
    if sync:
        return _reference_sync(rec, round_steps, xs, ys, params)
    for m in round_steps:
        deltas, gsums, mae, acc = [], [], [], []
        for i in range(k):
            p = [q.copy() for q in params]
            gsum = zeros()
            for j in range(m):
                t = done + j  # global step before this one
                rows = (t * bsz + np.arange(bsz)) % n
                xb, yb = xs[i][rows], ys[i][rows]
                err = xb @ p[0] + p[1] - yb
                mae.append(np.abs(err).mean())  # the metrics: on the shard's model before the update
                acc.append(np.mean(np.argmax(xb @ p[0] + p[1], 1) == np.argmax(yb, 1)))
                scale = 2.0 / err.size  # MSE: mean over examples and outputs
                grads = [scale * xb.T @ err, scale * err.sum(0)]
                gsum = [a + g for a, g in zip(gsum, grads)]
                g_eff = [g - c for g, c in zip(grads, corr[i])]
                for v in range(2):
                    if name == "adam":
                        b1, b2, eps = 0.9, 0.999, 1e-7
                        sm, sv = slots[i]
                        sm[v] = sm[v] + (g_eff[v] - sm[v]) * (1 - b1)
                        sv[v] = sv[v] + (g_eff[v] ** 2 - sv[v]) * (1 - b2)
                        alpha = lr * np.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
                        p[v] = p[v] - sm[v] * alpha / (np.sqrt(sv[v]) + eps)
                    elif mu > 0:
                        slots[i][0][v] = mu * slots[i][0][v] - lr * g_eff[v]
                        p[v] = p[v] + slots[i][0][v]
                    else:
                        p[v] = p[v] - lr * g_eff[v]
            deltas.append([a - b for a, b in zip(p, params)])
            gsums.append(gsum)
        mean = [np.mean([d[v] for d in deltas], axis=0) for v in range(2)]
        params = [p + q for p, q in zip(params, mean)]
        if corr_rule == "vrl":
            clr = lr / (1.0 - mu)
            corr = [[c + (a - d) / (m * clr) for c, a, d in zip(corr[i], mean, deltas[i])] for i in range(k)]
        elif corr_rule == "gradient":
            gbar = [np.mean([g[v] for g in gsums], axis=0) for v in range(2)]
            corr = [[(g - b) / m for g, b in zip(gsums[i], gbar)] for i in range(k)]
        done += m
        out.append([q.copy() for q in params])
        metrics.append({"mae": float(np.mean(mae)), "acc": float(np.mean(acc))})
    reference.metrics = metrics  # per round (mean over the shards and local steps)
    return out, corr


def _reference_sync(rec, round_steps, xs, ys, params):
    """H = 1, correction none: synchronous Adam (the mean of the shards' gradients, one Adam update)."""
    k, bsz, lr, n = job.SHARDS, job.BATCH, rec["kwargs"]["learning_rate"], len(xs[0])
    b1, b2, eps = 0.9, 0.999, 1e-7
    sm, sv = [np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params]
    out, metrics = [], []
    for t in range(len(round_steps)):
        grads, mae, acc = [np.zeros_like(p) for p in params], [], []
        for i in range(k):
            rows = (t * bsz + np.arange(bsz)) % n
            xb, yb = xs[i][rows], ys[i][rows]
            pred = xb @ params[0] + params[1]
            err = pred - yb
            mae.append(np.abs(err).mean())
            acc.append(np.mean(np.argmax(pred, 1) == np.argmax(yb, 1)))
            scale = 2.0 / err.size
            grads = [g + q / k for g, q in zip(grads, [scale * xb.T @ err, scale * err.sum(0)])]
        for v in range(2):
            sm[v] = sm[v] + (grads[v] - sm[v]) * (1 - b1)
            sv[v] = sv[v] + (grads[v] ** 2 - sv[v]) * (1 - b2)
            alpha = lr * np.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
            params[v] = params[v] - sm[v] * alpha / (np.sqrt(sv[v]) + eps)
        out.append([p.copy() for p in params])
        metrics.append({"mae": float(np.mean(mae)), "acc": float(np.mean(acc))})
    reference.metrics = metrics
    return out, [[np.zeros_like(p) for p in params] for _ in range(k)]


def _flat(weights):
    return np.concatenate([np.ravel(np.array(w)) for w in weights])


def _check(rec, rounds, atol=1e-5):
    want, corr = reference(rec, [q["steps"] for q in rounds])
    for r, (got, exp) in enumerate(zip(rounds, want)):
        np.testing.assert_allclose(
            _flat(got["weights"]),
            _flat(exp),
            atol=atol,
            rtol=0,
            err_msg=f"{rec['name']} {rec['correction']} round {r}",
        )
    return corr


def _run(mode, timeout=200):
    r = run_cluster(
        [sys.executable, JOB, *mode],
        workers=2,
        ps=1,
        chief=True,
        timeout=timeout,
        echo=False,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        cwd=ROOT,
    )
    assert r.ok, f"{r.message}\n" + "\n".join(r.last_lines(r.failed_task or "chief:0"))
    return r, _records(r.outputs["chief:0"], "RESULT")


@pytest.fixture(scope="module")
def exact_and_auto():
    """One cluster runs the job's ``exact`` settings, then its ``auto`` one: (run, records by mode)."""
    r, recs = _run(["exact", "auto"], timeout=300)
    return r, {"exact": recs[:-1], "auto": recs[-1:]}


def test_fit_equals_run_round_dataset_fn_and_numpy(exact_and_auto):
    r, recs = exact_and_auto[0], exact_and_auto[1]["exact"]
    assert [q["name"] for q in recs] == [s[0] for s in job.SETTINGS]
    # correction="auto": vrl for plain SGD, gradient otherwise; the last setting asks for none at H = 1
    assert [q["correction"] for q in recs] == ["vrl", "gradient", "gradient", "none"]
    for rec in recs:
        fit, h, spe = rec["fit"], rec["interval"], rec["spe"]
        if h == 3:
            assert [q["steps"] for q in fit] == [
                3,
                2,
                3,
                2,
            ]  # steps_per_epoch 5, H = 3: the last round is cut
            assert [q["batch"] for q in fit] == [2, 4, 2, 4]
        else:
            assert [q["steps"] for q in fit] == [1] * 6 and [q["batch"] for q in fit] == [0, 1, 2] * 2
        assert rec["epochs"] == [0, 1]
        for a, b, c in zip(fit, rec["run_round"], rec["dataset_fn"]):
            np.testing.assert_allclose(_flat(a["weights"]), _flat(b["weights"]), atol=1e-6, rtol=0)
            np.testing.assert_allclose(_flat(a["weights"]), _flat(c["weights"]), atol=1e-6, rtol=0)
        if "dataset_fn_step" in rec:  # the dataset_fn(input_context, step) form gives the same rounds
            assert len(rec["dataset_fn_step"]) == len(fit)
            for a, d in zip(fit, rec["dataset_fn_step"]):
                np.testing.assert_allclose(_flat(a["weights"]), _flat(d["weights"]), atol=1e-6, rtol=0)
        corr = _check(rec, fit)
        got = [np.array(c) for c in rec["corrections"]]
        for v in range(2):
            np.testing.assert_allclose(got[v], np.stack([c[v] for c in corr]), atol=1e-4, rtol=0)
            np.testing.assert_allclose(got[v].sum(0), 0.0, atol=1e-5)  # sum_i D_i = 0
        loss = rec["history"]["loss"]
        assert len(loss) == 2 and loss[1] < loss[0]
        # compiled metrics in the History: each epoch's mean over its local steps (rounds of 3 + 2 steps)
        # AUC (stateful) left out, with a warning; validation on the global model at each epoch end
        keys = sorted(
            k for k in rec["history"] if not k.startswith("val_auc")
        )  # AUC(): auc, auc_1, ... per model
        assert keys == ["acc", "loss", "mae", "val_acc", "val_loss", "val_mae"] and len(rec["history"]) == 7
        xv, yv = job.data()[0][:10], job.data()[1][:10]
        for e in range(2):
            w, b = (np.array(a, np.float64) for a in fit[(e + 1) * (len(fit) // 2) - 1]["weights"])
            err = xv @ w + b - yv
            np.testing.assert_allclose(
                [rec["history"]["val_loss"][e], rec["history"]["val_mae"][e]],
                [np.mean(err**2), np.mean(np.abs(err))],
                atol=1e-5,
                rtol=0,
            )
        per_round = reference.metrics
        for name in ("mae", "acc"):
            per_epoch = len(fit) // 2
            want = [
                sum(
                    q["steps"] * m[name]
                    for q, m in zip(
                        fit[e * per_epoch : (e + 1) * per_epoch],
                        per_round[e * per_epoch : (e + 1) * per_epoch],
                    )
                )
                / spe
                for e in range(2)
            ]
            np.testing.assert_allclose(rec["history"][name], want, atol=1e-5, rtol=0, err_msg=name)
        assert rec["iterations"] == rec["stats"]["steps"] == 2 * spe and rec["stats"]["syncs"] == len(fit)
        if h == 1:  # synchronous: the workers push g_i only (pull x, push g_i), the ps runs Adam
            assert rec["stats"]["bytes_communicated"] == len(fit) * job.SHARDS * 2 * (3 * 2 + 2) * 4
        assert rec["stock_fit"]  # wrap() bound fit on the instance; tf_keras.Model.fit is untouched
        w, b = (np.array(a, np.float64) for a in fit[-1]["weights"])  # evaluate/predict: the global model
        x, y = job.data()
        pred = x @ w + b
        np.testing.assert_allclose(rec["predict"], pred[:3], atol=1e-5, rtol=0)
        np.testing.assert_allclose(
            rec["evaluate"][:2], [np.mean((pred - y) ** 2), np.mean(np.abs(pred - y))], atol=1e-5, rtol=0
        )
        assert sorted(set(w for q in fit for w in q["workers"])) == [0, 1]
    chief = "\n".join(r.outputs["chief:0"])
    assert (
        "Epoch 1/2" in chief and "5/5 - " in chief and "loss: " in chief and "mae: " in chief
    )  # Keras progress
    assert "compiled metric(s) auc are stateful and not computed" in chief


def test_fit_interval_auto_cuts_rounds_at_epoch_ends(exact_and_auto):
    r, (rec,) = exact_and_auto[0], exact_and_auto[1]["auto"]
    errors = _records(r.outputs["chief:0"], "ERRORS")[0]
    for where, msg in errors.items():  # bad input to fit: one line starting with the argument's name
        assert msg and msg.startswith(where if where != "dataset" else "x") and "\n" not in msg, (where, msg)
    steps = [q["steps"] for q in rec["fit"]]
    h = rec["stats"]["interval"]
    assert steps[:3] == [1, 1, 1] and 1 <= h <= 4 and sum(steps) == 21
    ends = np.cumsum(steps)
    assert 7 in ends and 14 in ends and all(s <= h for s in steps[3:])  # each epoch ends with a round
    assert rec["correction"] == "gradient"  # Adam, correction auto
    _check(rec, rec["fit"])
    assert len(rec["history"]["loss"]) == 3


def test_fit_with_a_worker_killed_stays_exact():
    th, lines, box = _start([sys.executable, JOB, "kill", "12"], "psfit", tolerate_worker_failures=True)
    lines.wait_for("[chief:0] ROUND 3 ", 150, th)
    os.kill(_pid("psfit", "worker", 1), signal.SIGKILL)
    th.join(200)
    r = box["r"]
    assert r.ok, f"{r.message}\n" + "\n".join(lines.lines[-20:])
    rec = _records(r.outputs["chief:0"], "RESULT")[0]
    workers = [q["workers"] for q in rec["fit"]]
    assert [0, 0] in workers and sorted(set(workers[0])) == [0, 1] and rec["lost"] == [1]
    corr = _check(rec, rec["fit"])  # every round, before and after the loss, equals the reference
    got = [np.array(c) for c in rec["corrections"]]
    for v in range(2):
        np.testing.assert_allclose(got[v], np.stack([c[v] for c in corr]), atol=1e-4, rtol=0)
        np.testing.assert_allclose(got[v].sum(0), 0.0, atol=1e-5)
