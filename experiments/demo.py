"""The README's first command: skip-and-correct next to synchronous SGD on the bundled data, in two lines.

Starts a local 2-worker cluster twice (two processes each, TensorFlow collectives over loopback: no
network set-up, no root), runs ``experiments.train`` with ``--strategy=ssgd``
(MultiWorkerMirroredStrategy) and with ``--strategy=skip_correct --interval=auto`` on the bundled 5,000
MNIST images, and prints one line per run: wall time of training, test accuracy, syncs, bytes each
worker sent to the all-reduces. ``--bandwidth_mbit`` shapes the cluster's links (root, ``tc``).

Example:
    python -m experiments.demo
    python -m experiments.demo --steps=600 --model=cnn
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List

from absl import flags  # noqa: E402

from experiments._cli import fail, run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
flags.DEFINE_integer("workers", 2, "worker processes")
flags.DEFINE_integer("steps", 300, "training steps")
flags.DEFINE_string("model", "mlp", "mlp, cnn or big_mlp (experiments.models)")
flags.DEFINE_float(
    "bandwidth_mbit", 0.0, "shape each worker's link to this rate (0 = plain loopback; needs root)"
)


def _run(strategy_flags: List[str]) -> Dict[str, Any]:
    from tf_commopt.cluster import run_cluster

    cmd = [
        sys.executable,
        "-m",
        "experiments.train",
        f"--model={FLAGS.model}",
        f"--steps={FLAGS.steps}",
        "--momentum=0",
        *strategy_flags,
    ]
    r = run_cluster(
        cmd,
        workers=FLAGS.workers,
        bandwidth_mbit=FLAGS.bandwidth_mbit or None,
        cwd=ROOT,
        env={"PYTHONPATH": ROOT},
        echo=False,
        timeout=1800,
    )
    if r.returncode != 0:
        for t in r.outputs:  # the failing run's last lines, then the one-line error
            for x in r.last_lines(t, 5):
                sys.stderr.write(f"  [{t}] {x}\n")
        fail(f"{' '.join(strategy_flags)}: {r.message}")
    lines = [x for x in r.outputs["worker:0"] if x.startswith("{")]
    return json.loads(lines[-1])


def main(argv: List[str]) -> None:
    if FLAGS.workers < 2 or FLAGS.steps < 1 or FLAGS.bandwidth_mbit < 0:
        fail("--workers must be >= 2, --steps >= 1, --bandwidth_mbit >= 0")
    net = f"{FLAGS.bandwidth_mbit:g} Mbit/s links" if FLAGS.bandwidth_mbit else "loopback, unshaped"
    print(
        f"{FLAGS.workers} worker processes ({net}), {FLAGS.model} on the bundled MNIST, {FLAGS.steps} steps; "
        "training...",
        flush=True,
    )
    ssgd = _run(["--strategy=ssgd"])
    sc = _run(["--strategy=skip_correct", "--interval=auto"])
    params = ssgd["param_bytes"]
    for name, r, syncs, sent in (
        ("synchronous SGD (MultiWorkerMirrored)", ssgd, ssgd["steps"], ssgd["steps"] * params),
        (
            f"skip-and-correct (auto: H = {sc.get('interval')})",
            sc,
            sc.get("syncs", 0),
            sc.get("bytes_communicated", 0),
        ),
    ):
        print(
            f"{name:<40} {r['wall_s']:6.1f} s, test accuracy {100 * r['test_accuracy']:.1f}%, "
            f"{syncs} all-reduces, {sent / 1e6:.1f} MB per worker",
            flush=True,
        )
    print(
        f"skip-and-correct: {ssgd['wall_s'] / sc['wall_s']:.1f}x faster, "
        f"{100 * (sc['test_accuracy'] - ssgd['test_accuracy']):+.1f} accuracy points",
        flush=True,
    )


if __name__ == "__main__":
    run(main)
