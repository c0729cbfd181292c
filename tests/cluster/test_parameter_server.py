"""Skip-and-correct on a parameter-server cluster (2 workers, 1 ps, a chief), against a numpy reference.

Every task runs tests/cluster/_ps_job.py: worker and ps tasks serve, the chief trains a linear model on
fixed data and prints the global model after every round. A plain numpy implementation of the rule
(docs/parameter_server.md, "The rule") must give the same models to 1e-5.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tf_commopt.cluster import run_cluster
from tf_commopt.cluster.layout import pick_ports

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JOB = os.path.join(HERE, "_ps_job.py")
sys.path.insert(0, HERE)
import _ps_job as job  # noqa: E402  (data and constants only; importing it starts nothing)


def reference(rec, rounds):
    """The rule in numpy (float64): global (W, b) after each round, and the final corrections D_i."""
    x, y = job.data()
    k, bsz, lr = job.SHARDS, job.BATCH, job.LR
    h, vrl, mu = rec["interval"], rec["correction"] == "vrl", rec["momentum"]
    n = len(x) // k
    xs = [x[i::k][:n].astype(np.float64) for i in range(k)]
    ys = [y[i::k][:n].astype(np.float64) for i in range(k)]
    params = [np.array(w, np.float64) for w in rec["init"]]
    corr = [[np.zeros_like(p) for p in params] for _ in range(k)]
    mom = [[np.zeros_like(p) for p in params] for _ in range(k)]
    out = []
    for r in range(rounds):
        deltas = []
        for i in range(k):
            w, b = (p.copy() for p in params)
            for j in range(h):
                rows = ((r * h + j) * bsz + np.arange(bsz)) % n
                xb, yb = xs[i][rows], ys[i][rows]
                err = xb @ w + b - yb
                scale = 2.0 / err.size  # MSE: mean over examples and outputs
                grads = [scale * xb.T @ err, scale * err.sum(0)]
                if mu > 0:
                    mom[i] = [mu * m - lr * (g - c) for m, g, c in zip(mom[i], grads, corr[i])]
                    w, b = w + mom[i][0], b + mom[i][1]
                else:
                    w, b = w - lr * (grads[0] - corr[i][0]), b - lr * (grads[1] - corr[i][1])
            deltas.append([w - params[0], b - params[1]])
        mean = [np.mean([d[v] for d in deltas], axis=0) for v in range(2)]
        params = [p + m for p, m in zip(params, mean)]
        if vrl:
            clr = lr / (1.0 - mu)  # correction_lr="effective" (the default): lr / (1 - momentum)
            corr = [[c + (m - d) / (h * clr) for c, m, d in zip(corr[i], mean, deltas[i])] for i in range(k)]
        out.append([p.copy() for p in params])
    return out, corr


def _records(lines, tag):
    return [json.loads(line[len(tag) + 1 :]) for line in lines if line.startswith(tag + " ")]


def _check_rounds(rec, upto=None):
    rounds = rec["rounds"][:upto] if upto else rec["rounds"]
    want, corr = reference(rec, len(rounds))
    for r, (got, exp) in enumerate(zip(rounds, want)):
        for g, e in zip(got["weights"], exp):
            np.testing.assert_allclose(
                np.array(g),
                e,
                atol=1e-5,
                rtol=0,
                err_msg=f"H={rec['interval']} {rec['correction']} mu={rec['momentum']} round {r}",
            )
    return corr


def test_rounds_equal_numpy_reference_on_launcher_cluster():
    r = run_cluster(
        [sys.executable, JOB, "exact"],
        workers=2,
        ps=1,
        chief=True,
        timeout=200,
        echo=False,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        cwd=ROOT,
    )
    assert r.ok, f"{r.message}\n" + "\n".join(r.last_lines(r.failed_task or "chief:0"))
    recs = _records(r.outputs["chief:0"], "RESULT")
    assert [(q["interval"], q["correction"], q["momentum"]) for q in recs] == [tuple(s) for s in job.SETTINGS]
    for rec in recs:
        corr = _check_rounds(rec)
        got = [np.array(c) for c in rec["corrections"]]  # [K, ...] per variable
        for v in range(2):
            np.testing.assert_allclose(got[v], np.stack([c[v] for c in corr]), atol=1e-4, rtol=0)
            np.testing.assert_allclose(got[v].sum(0), 0.0, atol=1e-5)  # sum_i D_i = 0
        if rec["correction"] == "none":
            assert not np.any(got[0])
        # both workers took part, and the averaging really moved the model
        assert sorted(set(w for q in rec["rounds"] for w in q["workers"])) == [0, 1]
        assert not np.allclose(rec["rounds"][-1]["weights"][0], rec["init"][0])
        st = rec["stats"]
        assert (st["syncs"], st["steps"]) == (4, 4 * rec["interval"])
        per = 2 if rec["interval"] == 1 else 2 + (rec["correction"] == "vrl") + 2 * (rec["momentum"] > 0)
        assert st["bytes_communicated"] == 4 * job.SHARDS * per * (3 * 2 + 2) * 4
        assert st["comm_s"] > 0 and st["compute_s"] > 0
    # the workers and the ps exited by themselves once the chief was gone
    assert "exiting" in " ".join(r.outputs["worker:1"])


class _Proc:
    """A task started with its own TF_CONFIG, output collected line by line."""

    def __init__(self, name, argv, tf_config):
        env = dict(
            os.environ, TF_CONFIG=json.dumps(tf_config), PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2"
        )
        self.name, self.lines = name, []
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, prefix, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(line.startswith(prefix) for line in list(self.lines)):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(
            f"{self.name}: no line {prefix!r} within {timeout} s; last lines:\n" + "\n".join(self.lines[-15:])
        )

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def test_worker_killed_mid_training_then_all_workers_lost():
    """SIGKILL worker 1 mid-training: the chief goes on with worker 0 and the rounds stay exact (the
    coordinator re-ran the lost shard); then SIGKILL worker 0: the chief stops with a one-line
    ClusterError after round_timeout_s, not a hang. (Own processes: tf_commopt.cluster ends the whole
    cluster as soon as any worker dies.)"""
    ports = pick_ports(4)
    cluster = {
        "chief": [f"127.0.0.1:{ports[0]}"],
        "worker": [f"127.0.0.1:{p}" for p in ports[1:3]],
        "ps": [f"127.0.0.1:{ports[3]}"],
    }
    argv = [sys.executable, JOB, "kill", "200", "12"]
    names = [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
    procs = {}
    try:
        for t, i in names:
            procs[f"{t}:{i}"] = _Proc(f"{t}:{i}", argv, {"cluster": cluster, "task": {"type": t, "index": i}})
        chief = procs["chief:0"]
        chief.wait_for("ROUND 2 ", 150)
        procs["worker:1"].kill()
        n_before = sum(line.startswith("ROUND ") for line in chief.lines)
        chief.wait_for(f"ROUND {n_before + 4} ", 60)  # goes on without worker 1
        procs["worker:0"].kill()
        rc = chief.proc.wait(60)  # 12 s round timeout + exit
        chief.reader.join(5)
        out = chief.lines
        assert rc == 3, "\n".join(out[-15:])
        err = [line for line in out if line.startswith("ERROR ")]
        assert err and "did not finish within 12 s" in err[0], "\n".join(out[-15:])
        assert any("worker 1" in line and "unreachable" in line for line in out), "\n".join(out[-30:])
        rec = _records(out, "PARTIAL")[0]
        workers = [q["workers"] for q in rec["rounds"]]
        assert [0, 0] in workers and sorted(set(workers[0])) == [0, 1]
        _check_rounds(rec)  # every completed round, before and after the loss, equals the reference
        assert procs["ps:0"].proc.wait(30) == 0  # the ps task saw the chief go and exited
    finally:
        for p in procs.values():
            p.kill()


@pytest.mark.parametrize(
    "strategy,extra",
    [
        ("skip_correct", ["--interval=2", "--correction=vrl"]),
        ("ssgd", []),
        ("skip_correct", ["--interval=2", "--optimizer=adam", "--learning_rate=0.003"]),
    ],
)
def test_runner_on_launcher_ps_cluster(strategy, extra):
    """``experiments.train`` under ``tf_commopt.cluster --workers 2 --ps 1 --chief`` prints its JSON line."""
    cmd = [
        sys.executable,
        "-m",
        "experiments.train",
        f"--strategy={strategy}",
        "--model=mlp",
        "--steps=8",
        "--batch_size=64",
        *extra,
    ]
    r = run_cluster(
        cmd, workers=2, ps=1, chief=True, timeout=200, echo=False, cwd=ROOT, env={"TF_CPP_MIN_LOG_LEVEL": "2"}
    )
    assert r.ok, f"{r.message}\n" + "\n".join(r.last_lines(r.failed_task or "chief:0"))
    rec = json.loads([line for line in r.outputs["chief:0"] if line.startswith("{")][-1])
    h = 2 if strategy == "skip_correct" else 1
    assert (rec["strategy"], rec["ps"], rec["interval"], rec["steps"], rec["syncs"]) == (
        strategy,
        1,
        h,
        8,
        8 // h,
    )
    pbytes = rec["param_bytes"]
    per = (2 + 1 + 2) if strategy == "skip_correct" else 2  # pull x, push s_i (g_i), pull D_i, momentum
    if (
        "--optimizer=adam" in extra
    ):  # through fit: Adam's m, v per shard; correction auto = gradient (push G_i)
        assert (rec["optimizer"], rec["correction"]) == ("adam", "gradient")
        per = 2 + 1 + 1 + 2 * 2
    assert rec["bytes_communicated"] == (8 // h) * 2 * per * pbytes
    assert rec["comm_s"] > 0 and rec["compute_s"] > 0
    assert rec["train_loss"] < 2.0 and rec["test_accuracy"] > 0.3  # it learned (chance: 2.30, 0.1)
    assert not any(line.startswith("{") for line in r.outputs["worker:0"])  # only the chief reports


def test_runner_interval_auto_on_ps_cluster():
    """``--interval=auto``: 3 probe rounds with H = 1, then H from their timings by thesis 001's rule."""
    from tf_commopt.core.interval import first_iteration_interval

    cmd = [
        sys.executable,
        "-m",
        "experiments.train",
        "--strategy=skip_correct",
        "--interval=auto",
        "--model=mlp",
        "--steps=40",
        "--batch_size=64",
        "--momentum=0.5",
        "--max_interval=8",
    ]
    r = run_cluster(
        cmd, workers=2, ps=1, chief=True, timeout=200, echo=False, cwd=ROOT, env={"TF_CPP_MIN_LOG_LEVEL": "2"}
    )
    assert r.ok, f"{r.message}\n" + "\n".join(r.last_lines(r.failed_task or "chief:0"))
    rec = json.loads([line for line in r.outputs["chief:0"] if line.startswith("{")][-1])
    h = rec["interval"]
    assert h == first_iteration_interval(rec["interval_t_comm_s"], rec["interval_t_comp_s"], 1.0, 8)
    # exactly --steps: the last round is cut to the steps left (run_round(steps=), no re-trace)
    assert rec["steps"] == 40 and rec["syncs"] == 3 + -(-37 // h)
    assert any(f"-> H = {h} from round 3" in line for line in r.outputs["chief:0"])
    # auto -> gradient for SGD with momentum (vrl for plain SGD), as SkipCorrectStrategy; it learned (chance: 2.30)
    assert rec["correction"] == "gradient" and rec["optimizer"] == "sgd" and rec["train_loss"] < 2.0
