"""Bounded stress run: a skip-and-correct job on N workers over loopback, memory and threads per epoch.

``python -m experiments.stress`` launches the runner (``experiments.train --proc_stats``) on ``--workers``
tasks of a plain-loopback ``tf_commopt.cluster`` cluster for ``--epochs`` epochs of ``--steps_per_epoch``
steps; every task prints ``PROC {"epoch", "rss_mb", "threads", "fds", "epoch_s"}`` after each epoch
(resident set size, threads and open file descriptors, from /proc). Then it checks what a long run must
not do, and prints a table:

* memory: RSS after the warm-up epochs may grow by at most ``--max_growth_mb`` per task to the end;
* threads and file descriptors: no growth after warm-up (a small slack);
* after the run: no process of the job alive, no port of the cluster still bound, no extra threads in
  the driver.

It exits 0 when every check passes, 1 otherwise, 2 on bad flags. Example::

    python -m experiments.stress --workers=4 --epochs=12 --steps_per_epoch=25
"""

from __future__ import annotations

import shutil
import socket
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

from experiments import _cli
from experiments.harness import Launch, cluster_lines, json_lines

PREFIX = "PROC "
THREAD_SLACK = 5  # TensorFlow/gRPC pools start and retire a thread or two; a leak grows without bound


def define(fv: Any) -> None:
    from absl import flags

    d = dict(flag_values=fv)
    flags.DEFINE_integer("workers", 4, "worker tasks (loopback)", **d)
    flags.DEFINE_integer("epochs", 12, "epochs", **d)
    flags.DEFINE_integer("warmup_epochs", 3, "epochs before the memory/thread baseline is taken", **d)
    flags.DEFINE_integer("steps_per_epoch", 25, "global steps per epoch", **d)
    flags.DEFINE_integer("batch_size", 64, "global batch", **d)
    flags.DEFINE_string("model", "mlp", "experiments.models name", **d)
    flags.DEFINE_integer("interval", 3, "H of skip_correct", **d)
    flags.DEFINE_string(
        "stress_strategy", "skip_correct", "skip_correct or ssgd (MultiWorkerMirroredStrategy)", **d
    )
    flags.DEFINE_float("max_growth_mb", 40.0, "allowed RSS growth per task after warm-up (MB)", **d)
    flags.DEFINE_float("timeout_s", 300.0, "hard bound on the whole cluster run", **d)


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


def _growth(
    rows: List[Dict[str, Any]], epochs: int, warmup_epochs: int, max_growth_mb: float, checks: Dict[str, bool]
) -> Dict[str, Dict[str, float]]:
    """Per task: RSS, thread and descriptor growth after warm-up; adds a check per task to ``checks``."""
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
    return growth


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
    from tf_commopt.errors import InputError

    if strategy not in ("skip_correct", "ssgd"):
        raise InputError(f"must be skip_correct or ssgd, got {strategy!r}", where="--stress_strategy")
    if not (1 <= warmup_epochs < epochs):
        raise InputError(
            f"need 1 <= warmup_epochs < epochs, got {warmup_epochs} and {epochs}", where="--warmup_epochs"
        )
    out = out or sys.stdout
    marker_dir = tempfile.mkdtemp(prefix="stress_")  # --model_dir names this job's processes
    argv = [f"--epochs={epochs}", f"--steps_per_epoch={steps_per_epoch}", f"--batch_size={batch_size}"]
    argv += [f"--model={model}", f"--interval={interval}", f"--strategy={strategy}", "--momentum=0"]
    argv += ["--correction=vrl", "--proc_stats", f"--model_dir={marker_dir}"]
    threads_before = threading.active_count()
    try:
        r, _ = cluster_lines(Launch(argv, workers=workers, timeout=timeout_s))
        time.sleep(0.5)
        left = _live_pids_with(f"--model_dir={marker_dir}")
    finally:
        shutil.rmtree(marker_dir, ignore_errors=True)
    ports = (
        [int(a.rpartition(":")[2]) for a in r.tf_configs["worker:0"]["cluster"]["worker"]]
        if r.tf_configs
        else []
    )
    rows: List[Dict[str, Any]] = []
    for task, lines in r.outputs.items():
        # the chief's line may follow its progress bar on the same line
        rows += [
            dict(task=task, **json_lines([x[x.index(PREFIX) + len(PREFIX) :]])[0])
            for x in lines
            if PREFIX + "{" in x
        ]
    final = json_lines(r.outputs.get("worker:0", []))
    checks: Dict[str, bool] = {
        "cluster exited 0": r.returncode == 0,
        "every task finished": bool(final) and final[-1].get("steps") == epochs * steps_per_epoch,
    }
    growth = _growth(rows, epochs, warmup_epochs, max_growth_mb, checks)
    checks["no process of the job left"] = left == []
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


def _body(fv: Any) -> int:
    res = run_stress(
        fv.workers,
        fv.epochs,
        fv.warmup_epochs,
        fv.steps_per_epoch,
        fv.batch_size,
        fv.model,
        fv.interval,
        fv.max_growth_mb,
        fv.timeout_s,
        strategy=fv.stress_strategy,
    )
    return 0 if res["ok"] else 1


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.stress`` in process; returns the exit code (1: a check failed)."""
    return _cli.main("experiments.stress", argv, define, _body)


if __name__ == "__main__":
    raise SystemExit(main())
