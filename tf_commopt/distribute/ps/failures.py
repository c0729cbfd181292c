"""Lost tasks during a round: how they are noticed (bounded waits, TCP probes) and what they mean.

The policy:

* a **worker** lost mid-round costs only its closure: TensorFlow's coordinator re-runs it on a live
  worker from the same ps state and batches, so the round result is unchanged. It is reported once (one
  line on stderr) when it runs no shard and does not answer, and again when it runs shards again;
* a **ps task** lost: the global model and the corrections lived there, so training stops with one
  ClusterError naming it and the last completed round (resume from the last ``save``);
* a round that does not finish within ``round_timeout_s`` (e.g. every worker gone) is a ClusterError
  naming the unreachable tasks, never a hang.

Example:
    >>> watch = FailureWatch({"worker": ["127.0.0.1:1"], "ps": []}, round_timeout_s=1.0, num_workers=1)
    >>> rec = {"round": 3, "workers": []}
    >>> watch.after_round(rec, num_shards=1)                   # doctest: +ELLIPSIS
    >>> rec["lost_workers"], watch.lost_workers
    ([0], {0})
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Dict, List, Optional, Sequence

from tf_commopt.distribute.ps.probe import reachable, unreachable
from tf_commopt.errors import ClusterError

__all__ = ["FailureWatch", "bounded_join"]


def bounded_join(coordinator: Any, timeout_s: float) -> Optional[BaseException]:
    """Wait at most ``timeout_s`` for ``coordinator.join()``; returns its exception (None if it finished
    cleanly); raises TimeoutError if it did not return in time (the waiting thread is a daemon)."""
    errs: List[BaseException] = []

    def join() -> None:
        try:
            coordinator.join()
        except BaseException as e:  # pylint: disable=broad-except
            errs.append(e)

    th = threading.Thread(target=join, daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        raise TimeoutError(f"coordinator.join() still waiting after {timeout_s:g} s")
    return errs[0] if errs else None


def _say(line: str) -> None:
    sys.stderr.write(f"tf_commopt: {line}\n")
    sys.stderr.flush()


class FailureWatch:
    """Notices lost tasks of one trainer's cluster (see the module docstring for what each means).

    Args:
        cluster: job -> task addresses (the strategy's cluster spec).
        round_timeout_s: the longest a round may take.
        num_workers: the cluster's workers.
    """

    def __init__(self, cluster: Dict[str, Sequence[str]], round_timeout_s: float, num_workers: int) -> None:
        self.cluster = {job: list(addrs) for job, addrs in cluster.items()}
        self.round_timeout_s = float(round_timeout_s)
        self.num_workers = int(num_workers)
        self.lost_workers: set = set()
        self.rejoined_workers: List[int] = []  # workers seen lost and later running shards again, in order

    def join(self, coordinator: Any, what: str, rounds_done: int) -> None:
        """Wait for the scheduled closures of ``what`` (e.g. ``"round 7"``); ClusterError if they fail or
        time out (naming a lost ps task first, with ``rounds_done``, the last completed round)."""
        try:
            err = bounded_join(coordinator, self.round_timeout_s)
        except TimeoutError:
            down = unreachable(self.cluster)
            self._raise_if_ps_lost(what, down, rounds_done)
            why = (
                f"unreachable: {', '.join(down)}"
                if down
                else "no live worker could run it, or a ps task is gone"
            )
            raise ClusterError(
                f"{what} did not finish within {self.round_timeout_s:g} s (round_timeout_s); {why}"
            ) from None
        if err is not None:
            down = unreachable(self.cluster)
            self._raise_if_ps_lost(what, down, rounds_done)
            first = " ".join(str(err).split())[:200]
            why = f"unreachable: {', '.join(down)}; " if down else ""
            raise ClusterError(f"{what} failed: {why}{type(err).__name__}: {first}") from None

    @staticmethod
    def _raise_if_ps_lost(what: str, down: List[str], rounds_done: int) -> None:
        ps = [d for d in down if d.startswith("ps ")]
        if ps:
            raise ClusterError(
                f"{what} failed: parameter-server task {', '.join(ps)} is gone; the global model and "
                f"corrections lived there, so training stops (last completed round: {rounds_done}); "
                "restart the cluster and resume from the last save() (restore_latest(), or "
                "experiments.train --backup_dir)"
            ) from None

    def after_round(self, rec: Dict[str, Any], num_shards: int) -> None:
        """Note workers that came back or went idle in the round record ``rec`` (``round``, ``workers``: the
        worker of each shard); adds ``idle_workers`` and ``lost_workers`` to it when a worker ran nothing."""
        back = sorted(self.lost_workers & set(rec["workers"]))
        if back:  # a restarted worker: TensorFlow's coordinator reconnected it; it pulled x like any worker
            self.lost_workers -= set(back)
            self.rejoined_workers.extend(back)
            _say(f"round {rec['round']}: worker(s) {back} are back and ran shards again")
        idle = sorted(set(range(self.num_workers)) - set(rec["workers"]))
        if idle and num_shards >= self.num_workers:
            self._report_idle(idle, rec)

    def _report_idle(self, idle: List[int], rec: Dict[str, Any]) -> None:
        """A worker that ran no shard this round: say once, in one line, if it is unreachable."""
        rec["idle_workers"] = idle
        addrs = self.cluster.get("worker", [])
        for w in idle:
            if w in self.lost_workers or w >= len(addrs) or reachable(addrs[w]):
                continue
            self.lost_workers.add(w)
            _say(
                f"round {rec['round']}: worker {w} ({addrs[w]}) is unreachable; its shards ran on "
                f"worker(s) {sorted(set(rec['workers']))} (TensorFlow's coordinator re-ran them; the "
                "round result is unchanged)"
            )
        rec["lost_workers"] = sorted(self.lost_workers)
