"""The README's first command: skip-and-correct next to synchronous SGD on the bundled data, in two lines.

Starts a local 2-worker cluster twice (two processes each, TensorFlow collectives over loopback: no
network set-up, no root), runs the runner with ``--strategy=ssgd`` (MultiWorkerMirroredStrategy) and with
``--strategy=skip_correct --interval=auto`` on the bundled 5,000 MNIST images, and prints one line per
run: wall time of training, test accuracy, syncs, bytes each worker sent to the all-reduces.
``--bandwidth_mbit`` shapes the cluster's links (root, ``tc``).

Example:
    python -m experiments.demo
    python -m experiments.demo --steps=600 --model=cnn
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from experiments import _cli
from experiments.harness import Launch, launch


def define(fv: Any) -> None:
    from absl import flags

    d = dict(flag_values=fv)
    flags.DEFINE_integer("workers", 2, "worker processes", **d)
    flags.DEFINE_integer("steps", 300, "training steps", **d)
    flags.DEFINE_string("model", "mlp", "mlp, cnn or big_mlp (experiments.models)", **d)
    flags.DEFINE_float(
        "bandwidth_mbit", 0.0, "shape each worker's link to this rate (0 = plain loopback; needs root)", **d
    )


def _run(fv: Any, strategy_flags: List[str]) -> Dict[str, Any]:
    argv = [f"--model={fv.model}", f"--steps={fv.steps}", "--momentum=0", *strategy_flags]
    try:
        return launch(Launch(argv, workers=fv.workers, mbit=fv.bandwidth_mbit or None))
    except RuntimeError as e:  # the failing run's last lines, then the one-line error
        lines = str(e).splitlines()
        print("\n".join(f"  {x}" for x in lines[1:]))
        _cli.fail(f"{' '.join(strategy_flags)}: {lines[0]}")


def _body(fv: Any) -> int:
    if fv.workers < 2 or fv.steps < 1 or fv.bandwidth_mbit < 0:
        _cli.fail("--workers must be >= 2, --steps >= 1, --bandwidth_mbit >= 0")
    net = f"{fv.bandwidth_mbit:g} Mbit/s links" if fv.bandwidth_mbit else "loopback, unshaped"
    print(
        f"{fv.workers} worker processes ({net}), {fv.model} on the bundled MNIST, {fv.steps} steps; training...",
        flush=True,
    )
    ssgd = _run(fv, ["--strategy=ssgd"])
    sc = _run(fv, ["--strategy=skip_correct", "--interval=auto"])
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
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.demo`` in process; returns the exit code."""
    return _cli.main("experiments.demo", argv, define, _body)


if __name__ == "__main__":
    raise SystemExit(main())
