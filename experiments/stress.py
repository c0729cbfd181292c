"""Bounded stress run: a skip-and-correct job on N workers over loopback, memory and threads per epoch.

``python -m experiments.stress`` (the driver) starts ``--workers`` tasks through
``tf_commopt.cluster.run_cluster`` on plain loopback; every task runs this module in worker mode
(``TF_CONFIG`` set): ``experiments.train``'s SkipCorrectStrategy, model and data for ``--epochs`` epochs of
``--steps_per_epoch`` steps, printing after each epoch one line ``STRESS {"epoch", "rss_mb", "threads",
"fds", "epoch_s"}`` (resident set size, threads and open file descriptors of the task, from /proc).
The driver then checks what a long run must not do — and prints a table:

* memory: RSS after the warm-up epochs may grow by at most ``--max_growth_mb`` per task to the end;
* threads and file descriptors: no growth after warm-up;
* after the run: no process of the job alive, no port of the cluster still bound, no extra
  threads in the driver.

It exits 0 when every check passes, 1 otherwise, 2 on bad flags. Example::

    python -m experiments.stress --workers=4 --epochs=12 --steps_per_epoch=25
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Any, Dict, List

from absl import flags  # noqa: E402

import experiments.train  # noqa: E402,F401  (its flags --epochs, --batch_size, --model, --interval are ours too)

FLAGS = flags.FLAGS
for _name, _default in (("epochs", 12), ("batch_size", 64), ("model", "mlp"), ("interval", "3")):
    FLAGS.set_default(_name, _default)
flags.DEFINE_integer("workers", 4, "worker tasks (loopback)")
flags.DEFINE_integer("warmup_epochs", 3, "epochs before the memory/thread baseline is taken")
flags.DEFINE_integer("steps_per_epoch", 25, "global steps per epoch")
flags.DEFINE_string(
    "stress_strategy", "skip_correct", "skip_correct or ssgd (MultiWorkerMirroredStrategy, for comparison)"
)
flags.DEFINE_float("max_growth_mb", 40.0, "allowed RSS growth per task after warm-up (MB)")
flags.DEFINE_float("timeout_s", 300.0, "hard bound on the whole cluster run")

PREFIX = "STRESS "
THREAD_SLACK = 5  # TensorFlow/gRPC pools start and retire a thread or two; a leak grows without bound


def _proc_status() -> Dict[str, float]:
    out: Dict[str, float] = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k == "VmRSS":
                out["rss_mb"] = int(v.split()[0]) / 1024.0
            elif k == "Threads":
                out["threads"] = int(v)
    out["fds"] = len(os.listdir("/proc/self/fd"))
    return out


# --------------------------------------------------------------------------------------------- worker
def worker() -> None:
    """One task of the stress job (TF_CONFIG is set by the launcher)."""
    import tf_keras

    from experiments.models import build_model
    from experiments.train import Config, _train_dataset_fn, make_strategy
    from tf_commopt.core.tfconfig import tf_config_from_env
    from tf_commopt.datasets import load_dataset

    tfc = tf_config_from_env()
    cfg = Config(
        strategy=FLAGS.stress_strategy,
        model=FLAGS.model,
        batch_size=FLAGS.batch_size,
        momentum=0.0,
        interval=int(FLAGS.interval),
        correction="vrl",
    )
    strategy = make_strategy(cfg, tfc)
    tf_keras.utils.set_random_seed(0)
    data = load_dataset("mnist", seed=0)
    with strategy.scope():
        model = build_model(cfg.model, data.input_shape, data.num_classes)
        model.compile(
            optimizer=tf_keras.optimizers.SGD(cfg.learning_rate),
            loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    train = strategy.distribute_datasets_from_function(
        _train_dataset_fn(data.x_train, data.y_train, cfg.batch_size, 0)
    )
    t = {"start": time.perf_counter()}

    def report(epoch: int, logs: Any = None) -> None:
        now = time.perf_counter()
        rec = dict(
            epoch=epoch + 1,
            epoch_s=round(now - t["start"], 3),
            loss=float((logs or {}).get("loss", 0.0)),
            **_proc_status(),
        )
        t["start"] = now
        print(PREFIX + json.dumps(rec), flush=True)

    model.fit(
        train,
        epochs=FLAGS.epochs,
        steps_per_epoch=FLAGS.steps_per_epoch,
        verbose=0,
        callbacks=[tf_keras.callbacks.LambdaCallback(on_epoch_end=report)],
    )
    stats = {}
    if hasattr(strategy, "sync"):
        strategy.sync()
        stats = strategy.stats()
    print(
        PREFIX
        + json.dumps(
            {
                "done": True,
                "steps": int(model.optimizer.iterations.numpy()),
                "syncs": stats.get("syncs"),
                "bytes": stats.get("bytes_communicated"),
            }
        ),
        flush=True,
    )


# --------------------------------------------------------------------------------------------- driver
def _port_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is fine; a listener is not
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _live_pids_with(marker: str) -> List[int]:
    from tf_commopt.cluster import live_processes

    return [pid for pid, _ in live_processes(marker)]


def run_stress(
    workers: int = 4,
    epochs: int = 12,
    warmup_epochs: int = 3,
    steps_per_epoch: int = 25,
    batch_size: int = 64,
    model: str = "mlp",
    interval: int = 3,
    max_growth_mb: float = 40.0,
    timeout_s: float = 300.0,
    out=None,
    strategy: str = "skip_correct",
) -> Dict[str, Any]:
    """Run the stress job and return the measurements and the verdict of every check.

    Example:
        >>> r = run_stress(workers=2, epochs=4, warmup_epochs=1)   # doctest: +SKIP
        >>> r["ok"], r["rows"][0]["rss_mb"]                          # doctest: +SKIP
    """
    from tf_commopt.cluster import run_cluster
    from tf_commopt.errors import InputError

    if strategy not in ("skip_correct", "ssgd"):
        raise InputError(f"must be skip_correct or ssgd, got {strategy!r}", where="--stress_strategy")
    if not (1 <= warmup_epochs < epochs):
        raise InputError(
            f"need 1 <= warmup_epochs < epochs, got {warmup_epochs} and {epochs}", where="--warmup_epochs"
        )
    out = out or sys.stdout
    marker = f"--stress_tag={os.getpid()}_{time.time_ns()}"
    cmd = [
        sys.executable,
        "-m",
        "experiments.stress",
        f"--epochs={epochs}",
        f"--steps_per_epoch={steps_per_epoch}",
        f"--batch_size={batch_size}",
        f"--model={model}",
        f"--interval={interval}",
        f"--stress_strategy={strategy}",
        marker,
    ]
    threads_before = threading.active_count()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = run_cluster(cmd, workers=workers, timeout=timeout_s, cwd=root, echo=False)
    time.sleep(0.5)
    ports = (
        [int(a.rpartition(":")[2]) for a in r.tf_configs["worker:0"]["cluster"]["worker"]]
        if r.tf_configs
        else []
    )
    rows: List[Dict[str, Any]] = []
    done: Dict[str, Dict[str, Any]] = {}
    for task, lines in r.outputs.items():
        for line in lines:
            if line.startswith(PREFIX):
                rec = json.loads(line[len(PREFIX) :])
                if rec.get("done"):
                    done[task] = rec
                else:
                    rows.append(dict(task=task, **rec))
    checks: Dict[str, bool] = {
        "cluster exited 0": r.returncode == 0,
        "every task finished": len(done) == workers
        and all(d["steps"] == epochs * steps_per_epoch for d in done.values()),
    }
    growth: Dict[str, Dict[str, float]] = {}
    for task in sorted({row["task"] for row in rows}):
        mine = sorted((row for row in rows if row["task"] == task), key=lambda row: row["epoch"])
        base = next((row for row in mine if row["epoch"] == warmup_epochs), None)
        last = mine[-1]
        if base is None or last["epoch"] != epochs:
            checks[f"{task}: every epoch reported"] = False
            continue
        judged = [row for row in mine if row["epoch"] >= warmup_epochs]
        warm = [row for row in mine if row["epoch"] <= warmup_epochs]
        xs = [row["epoch"] for row in judged]
        ys = [row["rss_mb"] for row in judged]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(sum((x - mx) ** 2 for x in xs), 1e-9)
        g = {
            "rss_mb": last["rss_mb"] - base["rss_mb"],
            "rss_base_mb": base["rss_mb"],
            "rss_last_mb": last["rss_mb"],
            "rss_slope_mb_per_epoch": slope,
            "threads": max(row["threads"] for row in judged) - max(row["threads"] for row in warm),
            "fds": max(row["fds"] for row in judged) - max(row["fds"] for row in warm),
        }
        growth[task] = g
        checks[
            f"{task}: RSS {base['rss_mb']:.1f} -> {last['rss_mb']:.1f} MB after warm-up ({g['rss_mb']:+.1f} MB, "
            f"slope {1024 * slope:+.0f} KB/epoch) within {max_growth_mb:g} MB"
        ] = g["rss_mb"] <= max_growth_mb
        checks[
            f"{task}: peak threads {g['threads']:+d}, peak fds {g['fds']:+d} vs warm-up (<= +{THREAD_SLACK})"
        ] = g["threads"] <= THREAD_SLACK and g["fds"] <= THREAD_SLACK
    checks["no process of the job left"] = _live_pids_with(marker) == []
    checks["every cluster port released"] = bool(ports) and all(_port_free(p) for p in ports)
    checks["no extra thread in the driver"] = threading.active_count() <= threads_before
    result = {
        "ok": all(checks.values()),
        "checks": checks,
        "rows": rows,
        "growth": growth,
        "wall_s": r.wall_s,
        "returncode": r.returncode,
        "message": r.message,
        "ports": ports,
        "tail": {t: r.last_lines(t, 8) for t in r.outputs} if r.returncode else {},
    }
    _print(result, workers, epochs, steps_per_epoch, out, strategy)
    return result


def _print(res: Dict[str, Any], workers: int, epochs: int, steps: int, out, strategy: str) -> None:
    print(
        f"stress ({strategy}): {workers} workers x {epochs} epochs x {steps} steps on loopback, {res['wall_s']:.1f} s wall "
        f"({res['message']})",
        file=out,
    )
    tasks = sorted({row["task"] for row in res["rows"]})
    print("epoch | " + " | ".join(f"{t} RSS MB (threads, fds)" for t in tasks), file=out)
    for e in sorted({row["epoch"] for row in res["rows"]}):
        cells = []
        for t in tasks:
            row = next((x for x in res["rows"] if x["task"] == t and x["epoch"] == e), None)
            cells.append(f"{row['rss_mb']:.1f} ({row['threads']}, {row['fds']})" if row else "-")
        print(f"{e:5d} | " + " | ".join(cells), file=out)
    for name, ok in res["checks"].items():
        print(f"  [{'ok' if ok else 'FAIL'}] {name}", file=out)
    for t, lines in res.get("tail", {}).items():
        for line in lines:
            print(f"  [{t}] {line}", file=out)
    out.flush()


flags.DEFINE_string("stress_tag", "", "internal: marks the worker processes of one run")


def main(argv: List[str]) -> None:
    if len(argv) > 1:
        sys.stderr.write(f"experiments.stress: error: unexpected argument(s): {' '.join(argv[1:])}\n")
        sys.exit(2)
    if os.environ.get("TF_CONFIG", "").strip():
        worker()
        return
    from tf_commopt.errors import InputError, TfCommoptError

    try:
        try:
            interval = int(FLAGS.interval)
        except ValueError:
            raise InputError(
                f"must be a positive integer, got {FLAGS.interval!r}", where="--interval"
            ) from None
        res = run_stress(
            FLAGS.workers,
            FLAGS.epochs,
            FLAGS.warmup_epochs,
            FLAGS.steps_per_epoch,
            FLAGS.batch_size,
            FLAGS.model,
            interval,
            FLAGS.max_growth_mb,
            FLAGS.timeout_s,
            strategy=FLAGS.stress_strategy,
        )
    except TfCommoptError as e:
        sys.stderr.write(f"experiments.stress: error: {e}\n")
        sys.exit(2)
    sys.exit(0 if res["ok"] else 1)


if __name__ == "__main__":
    from experiments import _cli

    _cli.run(main)  # bad flags: one line, exit 2; dashed aliases; quiet TensorFlow
