"""Restart-and-resume of the collective runner: the backup callback, graceful preemption, the ledger.

* :func:`backup_callback` — at the end of every epoch and, with ``--backup_every=S``, at every global
  step that is a multiple of S, every task writes its backup (:func:`experiments.backup.save_backup`);
  with a :class:`~tf_commopt.distribute.preemption.PreemptionWatch` it also stops every task at the same
  step once any was sent SIGTERM, after writing a backup there (the run then exits with 143).
* :class:`Ledger` — ``<task dir>/ledger.jsonl``: when each backup was written and when each attempt
  took its first step. The time a failure cost is measured from it (:meth:`Ledger.lost_s`): from the end
  of the backup the run resumed from to the end of the first step after the resume (the work redone,
  the restart and the start-up; one step more than the failure cost).
* :func:`chaos_hold` — for tests and the chaos bench only: ``TF_COMMOPT_CHAOS_HOLD=phase:task:step:attempt``
  makes that task wait (to be killed) inside a backup write (``backup``) or just before the step that
  syncs (``sync``: the other workers then wait inside the sync's all-reduce), or send itself SIGTERM
  before that step (``term``).

Example:
    >>> import tempfile, time
    >>> d = tempfile.mkdtemp()
    >>> led = Ledger(d)
    >>> led.first_step(resumed_at=0, attempt=0, step=1) is None        # a fresh start
    True
    >>> led.add("backup", step=40, t=time.time() - 30.0)
    >>> r = led.first_step(resumed_at=40, attempt=1, step=41)
    >>> r["step"], 30.0 <= r["lost_s"] < 40.0
    (40, True)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any, Dict, List, Optional, TextIO

from experiments.backup import backup_name, save_backup

__all__ = ["Ledger", "Preempted", "backup_callback", "chaos_hold", "CHAOS_ENV"]

CHAOS_ENV = "TF_COMMOPT_CHAOS_HOLD"
CHAOS_HOLD_S = 600.0


class Preempted(Exception):
    """Every task stopped at ``step`` after a SIGTERM, with a backup written there."""

    def __init__(self, step: int, where: str):
        super().__init__(f"preempted: stopped at step {step} with a backup in {where}")
        self.step, self.where = step, where


class Ledger:
    """One task's events, one JSON line each, in ``<task dir>/ledger.jsonl``."""

    def __init__(self, task_dir: str):
        self.path = os.path.join(task_dir, "ledger.jsonl")

    def add(self, event: str, **fields: Any) -> None:
        fields.setdefault("t", time.time())
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(dict(event=event, **fields)) + "\n")

    def events(self) -> List[Dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                lines = f.readlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill
                pass
        return out

    def first_step(self, resumed_at: int, attempt: int, step: int) -> Optional[Dict[str, Any]]:
        """Note this run's first step; when the run resumed (from a backup, or afresh after an earlier
        run), note and return ``{"attempt", "step", "lost_s", "from_t", "first_t"}``: the seconds from the
        last time the run was at ``resumed_at`` (the end of its backup, or the first step of an earlier
        resume from it; 0: the previous run's first step) to now."""
        ev = self.events()
        now = time.time()
        self.add("first_step", attempt=attempt, step=step, t=now)
        firsts = [e["t"] for e in ev if e["event"] == "first_step"]
        if resumed_at:  # the last time the run was at that step: its backup, or an earlier resume from it
            saved = [e["t"] for e in ev if e["event"] == "backup" and e.get("step") == resumed_at]
            saved += [e["first_t"] for e in ev if e["event"] == "resume" and e.get("step") == resumed_at]
            start = max(saved) if saved else None
        elif firsts:
            start = firsts[-1]
        else:
            return None  # a fresh start
        lost = None if start is None else round(now - start, 3)
        resume = {"attempt": attempt, "step": resumed_at, "lost_s": lost, "from_t": start, "first_t": now}
        self.add("resume", **resume)
        return resume

    def resumes(self) -> List[Dict[str, Any]]:
        """Every resume so far: ``{"attempt", "step", "lost_s", "from_t", "first_t"}`` (``from_t``: when
        the backup resumed from was written, or the previous run's first step; ``first_t``: this run's
        first step; Unix times)."""
        return [
            {k: e.get(k) for k in ("attempt", "step", "lost_s", "from_t", "first_t")}
            for e in self.events()
            if e["event"] == "resume"
        ]


def _chaos_specs(environ: Any) -> List[tuple]:
    out = []
    for text in environ.get(CHAOS_ENV, "").split(","):
        parts = text.strip().split(":")
        if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
            out.append((parts[0], parts[1], int(parts[2]), int(parts[3])))
    return out


def chaos_hold(
    phase: str, task: str, step: int, attempt: int, out: TextIO, environ: Any = os.environ
) -> None:
    """Tests only: ``$TF_COMMOPT_CHAOS_HOLD`` is a comma-separated list of ``phase:task:step:attempt``; at
    a listed phase, step and attempt every task prints ``CHAOS at <phase> <step> (<task>)`` and the listed
    task waits to be killed (``term``: sends itself SIGTERM; ``step``: only the line, as the step starts)."""
    for spec in _chaos_specs(environ):
        if spec[0] != phase or spec[2] != step or spec[3] != attempt:
            continue
        print(f"CHAOS at {phase} {step} ({task})", file=out, flush=True)
        if phase == "step":
            continue
        if spec[1] == task and phase == "term":
            os.kill(os.getpid(), signal.SIGTERM)
        elif spec[1] == task:
            print(f"CHAOS holding {task} in {phase} {step}", file=out, flush=True)
            time.sleep(CHAOS_HOLD_S)


def backup_callback(
    tf_keras: Any,
    model: Any,
    task: str,
    task_dir: str,
    steps_per_epoch: int,
    every: int,
    resumed_at: int = 0,
    watch: Any = None,
    attempt: int = 0,
    out: Optional[TextIO] = None,
):
    """The runner's backup callback (see the module docstring); ``callback.preempted`` is the step every
    task stopped at after a SIGTERM, or None."""
    out = out or sys.stdout
    ledger = Ledger(task_dir)

    class Backups(tf_keras.callbacks.Callback):
        preempted: Optional[int] = None
        first_step_seen = False
        last_saved = -1

        def save(self, step: int) -> None:
            def hold(tmp: str) -> None:
                chaos_hold("backup", task, step, attempt, out)

            save_backup(model, task_dir, backup_name(step, steps_per_epoch), steps_per_epoch, hold)
            ledger.add("backup", step=step, attempt=attempt)
            self.last_saved = step

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            step = int(model.optimizer.iterations.numpy()) + 1
            chaos_hold("sync", task, step, attempt, out)
            chaos_hold("term", task, step, attempt, out)
            chaos_hold("step", task, step, attempt, out)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            step = int(model.optimizer.iterations.numpy())
            if not self.first_step_seen:
                self.first_step_seen = True
                ledger.first_step(resumed_at, attempt, step)
                if os.environ.get(CHAOS_ENV):
                    print(
                        f"CHAOS training from step {step} ({task}, attempt {attempt})", file=out, flush=True
                    )
            if every and step % every == 0 and step % steps_per_epoch:
                self.save(step)
            if watch is not None and watch.should_stop(step):
                if self.last_saved != step:
                    self.save(step)
                self.preempted = step
                model.stop_training = True

        def steps_to_next_stop(self) -> int:
            """SkipCorrectStrategy's graph loop ends a call here: at every backup step, and (tests) just
            before a chaos hold's step, so both happen at the step they name."""
            t = int(model.optimizer.iterations.numpy())
            stops = [every - t % every] if every else []
            stops += [s - 1 - t for _, _, s, a in _chaos_specs(os.environ) if a == attempt and s - 1 > t]
            return min(stops) if stops else steps_per_epoch

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            step = (epoch + 1) * steps_per_epoch
            if self.preempted is None and self.last_saved != step:
                self.save(step)

    return Backups(), ledger


class Resume:
    """The resume state of one run: where it starts, its backup callback, ledger and preemption watch.

    Build it with :func:`prepare` before ``fit``; :meth:`fit_kwargs` starts ``fit`` where the backup
    left off; :meth:`record` gives the record's fields.
    """

    def __init__(self, backup_dir: str, task_dir: str, step: int, steps_per_epoch: int, attempt: int) -> None:
        self.backup_dir, self.task_dir, self.step = backup_dir, task_dir, step
        self.steps_per_epoch, self.attempt = steps_per_epoch, attempt
        self.epoch, self.skip = divmod(step, steps_per_epoch)
        self.callback: Any = None
        self.ledger: Optional[Ledger] = None
        self.watch: Any = None

    def started(self, model: Any) -> Any:
        """Make ``fit`` start at the resumed batch (mid-epoch); returns the function that undoes it."""
        if not self.skip:
            return lambda: None
        from tf_commopt._compat import fit_starting_at

        return fit_starting_at(model, self.epoch, self.skip)

    def finish(self) -> None:
        """After ``fit``: stop watching for SIGTERM; :class:`Preempted` if every task stopped early."""
        if self.watch is not None:
            self.watch.uninstall()
        if self.callback is not None and self.callback.preempted is not None:
            raise Preempted(self.callback.preempted, self.task_dir)

    def record(self) -> Dict[str, Any]:
        resumes = self.ledger.resumes() if self.ledger is not None else []
        lost = [r["lost_s"] for r in resumes if r.get("lost_s") is not None]
        return {
            "resumed_at_step": self.step,
            "resumed_after_epoch": self.epoch,
            "restarts": self.attempt,
            "resumes": resumes,
            "lost_s": round(sum(lost), 3),
        }


def prepare(cfg: Any, tfc: Any, multi: bool, model: Any, strategy: Any, steps_per_epoch: int, out: TextIO):
    """(the :class:`Resume` of this run, or None without a backup directory): restores the last backup
    every task has, and builds the backup callback and (on every task) the preemption watch."""
    from experiments import backup
    from tf_commopt.core.restart import restart_count
    from tf_commopt.errors import InputError

    backup_dir = backup.resolve_backup_dir(cfg.backup_dir, os.environ)
    if not backup_dir and cfg.backup_every:
        raise InputError(
            "needs a backup directory (--backup_dir, or tf_commopt.cluster --max-restarts)",
            where="--backup_every",
        )
    if not backup_dir:
        return None
    if cfg.non_iid_classes:
        raise InputError(
            "label-skewed shards are not resumable yet (the resumable data order is iid); the launcher's "
            "--max-restarts needs iid shards",
            where="--non_iid_classes",
        )
    tasks, task_dir = backup.backup_tasks(tfc, multi, backup_dir)
    total = cfg.epochs * steps_per_epoch if not cfg.steps else cfg.steps
    step, name = backup.resume_point(backup_dir, tasks, steps_per_epoch)
    step = min(step, total)
    r = Resume(backup_dir, task_dir, step, steps_per_epoch, restart_count(os.environ))
    if name is not None:
        backup.restore_backup(model, os.path.join(task_dir, name, "ckpt"))
        where = f"after epoch {r.epoch}" if not r.skip else f"at step {step} (epoch {r.epoch + 1})"
        print(f"resuming {where} from {task_dir}", file=out, flush=True)
    import tf_keras

    from tf_commopt.distribute.preemption import PreemptionWatch

    r.watch = PreemptionWatch(strategy, model.optimizer).install()
    task = os.path.basename(task_dir)
    r.callback, r.ledger = backup_callback(
        tf_keras, model, task, task_dir, steps_per_epoch, cfg.backup_every, step, r.watch, r.attempt, out
    )
    return r
