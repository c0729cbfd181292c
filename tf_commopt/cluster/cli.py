"""The command line: ``python -m tf_commopt.cluster [options] -- COMMAND [ARG ...]``.

``main(argv)`` returns the exit code and never exits the interpreter itself, so it can be called in
process: 0 when every task finished, the first failing task's code, 124 on timeout, 130 on Ctrl-C, 2 for
a bad flag or a cluster that cannot be set up (one line on stderr). A SIGTERM to the launcher still
ends it with ``SystemExit(143)`` once every task is killed.

Example:
    >>> main(["--workers", "1", "--quiet", "--", "true"])   # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
from typing import List, Optional, Sequence, Tuple

from tf_commopt._cli import CliParser, UsageError, add_tf_log_level, quiet_tensorflow
from tf_commopt.cluster.launch import ClusterResult, run_cluster
from tf_commopt.cluster.policy import DEFAULT_WORKER_RESTARTS
from tf_commopt.cluster.shaping import TOPOLOGIES
from tf_commopt.core.restart import BACKUP_DIR_ENV
from tf_commopt.errors import ClusterError, InputError

__all__ = ["main", "PROG"]

PROG = "tf_commopt.cluster"


def _positive_float(unit: str):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit}") from None
        if not (math.isfinite(v) and v > 0):
            raise argparse.ArgumentTypeError(f"{text!r} must be a number of {unit} > 0")
        return v

    return parse


def _add_cluster_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=2, help="worker tasks (>= 1)")
    p.add_argument("--ps", type=int, default=0, help="parameter-server tasks")
    p.add_argument("--chief", action="store_true", help="add a chief task")
    p.add_argument(
        "--hosts",
        type=int,
        default=None,
        help="hosts of --tasks-per-host workers each (sets --workers to their product)",
    )
    p.add_argument(
        "--tasks-per-host",
        type=int,
        default=1,
        help="consecutive tasks sharing one host: one address, unshaped between them; hosts are joined "
        "by the --bandwidth-mbit links (TF_COMMOPT_HOST tells each task its host)",
    )
    p.add_argument(
        "--bandwidth-mbit",
        type=_positive_float("Mbit/s"),
        default=None,
        help="shape the cluster's network to R Mbit/s with tc tbf (root)",
    )
    p.add_argument(
        "--topology",
        default=None,
        choices=TOPOLOGIES,
        help="with --bandwidth-mbit: switch (a shaped link per task; the default) or shared (one "
        "shaped loopback for all)",
    )
    p.add_argument(
        "--timeout", type=_positive_float("seconds"), default=None, help="kill every task after S seconds"
    )
    p.add_argument("--quiet", action="store_true", help="do not echo the tasks' output")
    p.add_argument(
        "--threads-per-task",
        type=int,
        default=None,
        help="TensorFlow/OpenMP threads per task (default: the cores divided among the tasks; "
        "0 = TensorFlow's defaults)",
    )


def _add_failure_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="collective clusters (no --ps): after a task fails, stop every task and start them all "
        "again with the same TF_CONFIG, at most N times; the training script resumes from its backup "
        f"(tasks given no backup directory get ${BACKUP_DIR_ENV}, a temporary one). Default 0: the "
        "first failure ends the cluster",
    )
    p.add_argument(
        "--restart-workers",
        type=int,
        default=None,
        metavar="N",
        help="parameter-server clusters (--ps >= 1 --chief): start a dead worker again, at most N times "
        f"in all, then go on without it (default {DEFAULT_WORKER_RESTARTS}; a dead ps task or chief "
        "still ends the cluster)",
    )
    p.add_argument(
        "--tolerate-worker-failures",
        action="store_true",
        help="parameter-server clusters: go on without a dead worker, never restart it (--restart-workers 0)",
    )
    p.add_argument(
        "--fail-fast",
        action="store_true",
        help="end the cluster at the first failing task, parameter-server clusters too (their old default)",
    )


def _parser() -> argparse.ArgumentParser:
    p = CliParser(
        raise_usage_errors=True,  # main() prints one line and returns 2
        prog=f"python -m {PROG}",
        usage=f"python -m {PROG} [options] -- COMMAND [ARG ...]",
        description="Run COMMAND once per task of a local TF_CONFIG cluster.",
        epilog=f"Example: python -m {PROG} --workers 2 --bandwidth-mbit 100 -- "
        "python -m experiments.train --steps=20. Flags may also be spelled with "
        "underscores (--bandwidth_mbit).",
    )
    _add_cluster_flags(p)
    _add_failure_flags(p)
    add_tf_log_level(p)
    return p


def _split(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(options, COMMAND): everything after the first ``--`` is the command."""
    argv = list(argv)
    if "--" in argv:
        k = argv.index("--")
        return argv[:k], argv[k + 1 :]
    return argv, []


def _parse(parser: argparse.ArgumentParser, opts: List[str], command: List[str]) -> argparse.Namespace:
    """The parsed flags; UsageError for anything wrong with the command line."""
    args = parser.parse_args(opts)
    args.workers_given = any(o == "--workers" or o.startswith("--workers=") for o in opts)
    if not command:
        raise UsageError("missing COMMAND: give it after --, e.g. -- python -m experiments.train")
    if args.tasks_per_host < 1:
        raise UsageError(f"argument --tasks-per-host: must be >= 1, got {args.tasks_per_host}")
    if args.hosts is not None:
        if args.hosts < 1:
            raise UsageError(f"argument --hosts: must be >= 1, got {args.hosts}")
        if args.workers_given and args.workers != args.hosts * args.tasks_per_host:
            raise UsageError(
                f"argument --hosts: {args.hosts} hosts x {args.tasks_per_host} tasks is not --workers {args.workers}"
            )
        args.workers = args.hosts * args.tasks_per_host
    if args.workers < 1:
        raise UsageError(f"argument --workers: must be >= 1, got {args.workers}")
    if args.ps < 0:
        raise UsageError(f"argument --ps: must be >= 0, got {args.ps}")
    if args.threads_per_task is not None and args.threads_per_task < 0:
        raise UsageError(f"argument --threads-per-task: must be >= 0, got {args.threads_per_task}")
    if args.topology is not None and args.bandwidth_mbit is None:
        raise UsageError(
            "argument --topology: only with --bandwidth-mbit (an unshaped cluster has no topology)"
        )
    return args


def _report(r: ClusterResult) -> None:
    """How the cluster ended, on stderr: a failure with the failing task's last lines."""
    if r.returncode == 0:
        sys.stderr.write(f"{PROG}: {r.message} in {r.wall_s:.1f} s\n")
        return
    how = f" (killed by signal {r.failed_signal})" if r.failed_signal else ""
    sys.stderr.write(f"{PROG}: {r.message}{how}\n")
    first = r.failed_task or next((n for n, lines in r.outputs.items() if lines), None)
    for show in ([first] if first else []) + r.reporters:
        sys.stderr.write(f"--- last lines of {show} ---\n")
        for line in r.last_lines(show) or ["(no output)"]:
            sys.stderr.write(f"[{show}] {line}\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI: ``python -m tf_commopt.cluster --workers N [...] -- COMMAND ...``; returns the exit code.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
    """
    if threading.current_thread() is threading.main_thread():  # Ctrl-C works even if started ignoring it
        signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = _parser()
    opts, command = _split(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in opts):
        parser.print_help()
        return 0
    try:
        args = _parse(parser, opts, command)
    except UsageError as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 2
    quiet_tensorflow(args.tf_log_level)  # the tasks inherit $TF_CPP_MIN_LOG_LEVEL
    try:
        r = run_cluster(
            command,
            workers=args.workers,
            ps=args.ps,
            chief=args.chief,
            bandwidth_mbit=args.bandwidth_mbit,
            topology=args.topology or "switch",
            timeout=args.timeout,
            echo=not args.quiet,
            threads_per_task=args.threads_per_task,
            tolerate_worker_failures=args.tolerate_worker_failures,
            restart_workers=args.restart_workers,
            max_restarts=args.max_restarts,
            fail_fast=args.fail_fast,
            tasks_per_host=args.tasks_per_host,
        )
    except (InputError, ClusterError) as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted; every task was killed\n")
        return 130
    _report(r)
    return r.returncode
