"""Parameter-server skip-and-correct vs collective skip-and-correct vs SSGD, and the cost of one worker
failure against TensorFlow's own ParameterServerStrategy (``model.fit``, asynchronous). Results:
docs/results/ps.md.

Example::

    python -m experiments.ps_bench --bandwidth_mbit=100 --out=docs/results/ps.jsonl

Every run is a real local cluster (``tf_commopt.cluster.run_cluster``): 2 workers (+ 1 ps + a chief on
the ps runs), each task on its own ``--bandwidth_mbit`` link (switch topology), the ``mlp`` on the
bundled MNIST, plain SGD (lr 0.1, no momentum), the same number of training examples in every run
(``--steps`` global steps of batch 64 = 2 workers x 32; TensorFlow's asynchronous run takes 2 x steps
closures of batch 32). ``kill`` runs SIGKILL worker 1 once the chief has finished a fifth of the
training (our runner: round steps/20 + 1 of steps/4 printed; TF: after ``EPOCH 1`` of 5) and go on with
``tolerate_worker_failures`` (no restart). One JSON line per run to ``--out``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from typing import Any, Dict, List, Optional

from absl import flags

from tf_commopt.cluster import run_cluster, task_pid

FLAGS = flags.FLAGS
flags.DEFINE_float("bandwidth_mbit", 100.0, "each task's link (Mbit/s); 0 = plain loopback")
flags.DEFINE_integer("steps", 800, "global steps (batch 64)")
flags.DEFINE_string("out", "", "append one JSON line per run here")
flags.DEFINE_string("only", "", "comma-separated run names (default: all)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Watch:
    """Stream for run_cluster: SIGKILL worker 1 when a chief line starts with ``trigger``."""

    def __init__(self, token: str, trigger: Optional[str]):
        self.token, self.trigger, self.killed_at = token, trigger, None
        self.t0 = time.monotonic()

    def write(self, text: str) -> None:
        for line in text.splitlines():
            if self.trigger and self.killed_at is None and line.startswith("[chief:0] " + self.trigger):
                pid = task_pid(f"PS_BENCH_TOKEN={self.token}", "worker", 1)
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    self.killed_at = round(time.monotonic() - self.t0, 2)

    def flush(self) -> None:
        pass


def runs(steps: int) -> Dict[str, Dict[str, Any]]:
    train = [
        sys.executable,
        "-m",
        "experiments.train",
        "--model=mlp",
        "--batch_size=64",
        "--momentum=0",
        "--learning_rate=0.1",
        f"--steps={steps}",
    ]
    sc = ["--strategy=skip_correct", "--interval=4", "--correction=vrl"]
    tfb = [
        sys.executable,
        "-m",
        "experiments.ps_tf_baseline",
        f"--steps={2 * steps}",
        "--epochs=5",
        "--batch_size=32",
        "--learning_rate=0.1",
    ]
    ps = dict(ps=1, chief=True)
    return {
        "ssgd_collective": dict(cmd=train + ["--strategy=ssgd"], kw={}),
        "skip_correct_collective": dict(cmd=train + sc, kw={}),
        "ssgd_ps": dict(cmd=train + ["--strategy=ssgd"], kw=ps),
        "skip_correct_ps": dict(cmd=train + sc, kw=ps),
        "skip_correct_ps_kill": dict(cmd=train + sc, kw=ps, trigger=f"round {steps // 20 + 1}/{steps // 4}"),
        "tf_ps_async": dict(cmd=tfb, kw=ps),
        "tf_ps_async_kill": dict(cmd=tfb, kw=ps, trigger="EPOCH 1 "),
    }


def run_one(name: str, spec: Dict[str, Any], bandwidth: float) -> Dict[str, Any]:
    token = uuid.uuid4().hex
    watch = _Watch(token, spec.get("trigger"))
    kw = dict(spec["kw"])
    if spec.get("trigger"):
        kw["tolerate_worker_failures"] = True
    r = run_cluster(
        spec["cmd"],
        workers=2,
        bandwidth_mbit=bandwidth or None,
        timeout=900,
        echo=True,
        stream=watch,
        cwd=ROOT,
        env={"PS_BENCH_TOKEN": token},
        **kw,
    )
    lines = [ln for ln in r.outputs.get("chief:0", r.outputs.get("worker:0", [])) if ln.startswith("{")]
    rec = json.loads(lines[-1]) if lines else {}
    out = {
        "run": name,
        "ok": r.ok,
        "cluster_wall_s": round(r.wall_s, 2),
        "bandwidth_mbit": bandwidth,
        "killed_at_s": watch.killed_at,
        "worker_failures": r.worker_failures,
    }
    for k in (
        "strategy",
        "steps",
        "wall_s",
        "steps_per_s",
        "test_accuracy",
        "train_loss",
        "bytes_communicated",
        "median_round_s",
        "lost_workers",
        "interval",
    ):
        if k in rec:
            out[k] = rec[k]
    if not r.ok:
        out["message"] = r.message
    return out


def main(argv: List[str]) -> None:
    del argv
    specs = runs(FLAGS.steps)
    names = FLAGS.only.split(",") if FLAGS.only else list(specs)
    for name in names:
        res = run_one(name, specs[name], FLAGS.bandwidth_mbit)
        res["command"] = " ".join(
            [
                "python",
                "-m",
                "experiments.ps_bench",
                f"--bandwidth_mbit={FLAGS.bandwidth_mbit:g}",
                f"--steps={FLAGS.steps}",
                f"--only={name}",
            ]
        )
        print(json.dumps(res), flush=True)
        if FLAGS.out:
            with open(FLAGS.out, "a", encoding="utf-8") as f:
                f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    from experiments import _cli

    _cli.run(main)
