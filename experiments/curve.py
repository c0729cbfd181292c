"""Runner add-ons for time-to-accuracy benches: a test-accuracy curve during training (``--eval_every``,
``--eval_every_s``), the time to a target accuracy (``--target_accuracy``) and the baseline interval
searches (``--interval_search=adacomm|grid``).

With ``--eval_every=N`` the runner evaluates the (averaged) model on the held-out images before training
and every N steps (and after the last); with ``--eval_every_s=S`` whenever S seconds of training time
have passed since the previous evaluation. The clock pauses meanwhile, the averaging before an evaluation
is not counted as a training sync, and every worker evaluates so the workers stay in step. On a cluster
the workers agree on a time-based evaluation by a MEAN all-reduce of their "due" flags, at the points
where they are in step anyway: after each skip-and-correct sync, or every step under SSGD (its time is
paused too). The record gets ``curve`` ([{step, wall_s, test_loss, test_accuracy}], wall_s = training
seconds so far), ``eval_s`` (the paused seconds), ``curve_test_images`` (the held-out images each point scores: all of them, on every
worker), ``train_s`` (``wall_s`` without them) and ``syncs`` / ``comm_s`` without the evaluation
averagings; with ``--target_accuracy=A`` also ``target_accuracy``, ``time_to_target_s`` and
``steps_to_target``: the training seconds and steps at the first evaluation reaching A (null if none).

Example:
    python -m experiments.train --strategy=skip_correct --model=mlp --steps=60 --eval_every=20
    python -m experiments.train --strategy=single --model=mlp --steps=300 --eval_every_s=2 --target_accuracy=0.85
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

from experiments.models import held_out_figures

__all__ = ["Curve", "interval_search"]

SEARCHES = ("", "adacomm", "grid")


class Curve:
    """The evaluation curve of one run (a tf-keras callback from :meth:`callback`).

    Args:
        strategy, model, plain, data: the run's strategy, its model, a plain copy, the data set.
        every: evaluate every this many steps (0: not by steps).
        steps: the run's steps (the last one is always evaluated).
        spe: steps per execution (a callback sees one batch end per call).
        every_s: evaluate when this many training seconds passed since the last evaluation (0: not by time).
        target: the test accuracy whose first reaching is recorded (None: none).
        multi: a multi-worker run (time-based evaluations are agreed on).
    """

    def __init__(
        self,
        strategy: Any,
        model: Any,
        plain: Any,
        data: Any,
        every: int,
        steps: int,
        spe: int = 1,
        every_s: float = 0.0,
        target: Optional[float] = None,
        multi: bool = False,
    ):
        self.strategy, self.model, self.plain, self.data = strategy, model, plain, data
        self.every, self.steps, self.spe, self.done, self.base = every, steps, spe, 0, 0
        self.every_s, self.target, self.multi = float(every_s), target, multi
        self.points: List[Dict[str, float]] = []
        self.wall, self.paused, self.eval_syncs, self.eval_comm = 0.0, 0.0, 0, 0.0
        self.reached: Optional[Dict[str, float]] = None
        self.last_eval_wall, self.seen_syncs, self.before_fit = 0.0, 0, 0.0
        self.t = time.perf_counter()

    def evaluate(self, step: int) -> None:
        """Pause the clock, average (skip-and-correct), evaluate, resume."""
        now = time.perf_counter()
        self.wall += now - self.t
        sc = hasattr(self.strategy, "sync")
        if sc:
            before = self.strategy.stats()
            self.strategy.sync()
            after = self.strategy.stats()
            self.eval_syncs += after["syncs"] - before["syncs"]
            self.eval_comm += after["comm_s"] - before["comm_s"]
        self.plain.set_weights(self.model.get_weights())
        loss, acc = held_out_figures(
            self.plain, self.data.x_test, self.data.y_test
        )  # all of it, on every worker
        point = {"step": step, "wall_s": round(self.wall, 3), "test_loss": round(float(loss), 4)}
        self.points.append(dict(point, test_accuracy=round(float(acc), 4)))
        if self.target is not None and self.reached is None and float(acc) >= self.target:
            self.reached = {"time_to_target_s": round(self.wall, 3), "steps_to_target": step}
        if sc and hasattr(self.strategy, "reset_step_clock"):
            self.strategy.reset_step_clock()
        self.last_eval_wall = self.wall
        self.seen_syncs = self._syncs()
        self.t = time.perf_counter()
        self.paused += self.t - now
        if self.done == 0:  # before training: outside the record's wall_s
            self.before_fit = self.paused

    def _syncs(self) -> int:
        tele = getattr(getattr(self.strategy, "extended", None), "telemetry", None)
        return int(tele.syncs.numpy()) if tele is not None else 0

    def _due_by_time(self) -> bool:
        """Whether S training seconds have passed; on a cluster, agreed at the points the workers share."""
        now = time.perf_counter()
        due = self.wall + (now - self.t) - self.last_eval_wall >= self.every_s
        if not self.multi:
            return due
        if hasattr(self.strategy, "sync"):  # skip-and-correct: only right after a sync
            syncs = self._syncs()
            if syncs == self.seen_syncs:
                return False
            self.seen_syncs = syncs
        import tensorflow as tf

        from tf_commopt.distribute.averaging import agree

        vote = agree(self.strategy.extended, tf.constant([1.0 if due else 0.0], tf.float64))
        later = time.perf_counter()
        self.paused += later - now  # the vote is not training time
        self.wall += now - self.t
        self.t = later
        return float(vote.numpy()[0]) > 0.0

    def callback(self, tf_keras: Any) -> Any:
        curve = self

        class EvalEvery(tf_keras.callbacks.Callback):
            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                curve.base = curve.done

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                before, curve.done = curve.done, curve.base + batch + 1  # batch: the call's last step
                by_steps = curve.every and curve.done // curve.every > before // curve.every
                if by_steps or curve.done == curve.steps or (curve.every_s and curve._due_by_time()):
                    curve.evaluate(curve.done)

            def steps_to_next_stop(self) -> int:
                """SkipCorrectStrategy's graph loop ends a call here, so evaluations land on every N-th step
                (time-based evaluations come at call ends)."""
                if not curve.every:
                    return max(1, curve.steps - curve.done)
                return curve.every - curve.done % curve.every

        return EvalEvery()

    def record(self, record: Dict[str, Any]) -> Dict[str, Any]:
        """``record`` with the curve, the time to target and without the evaluation averagings."""
        out = dict(record, curve=self.points, eval_s=round(self.paused, 3))
        out["curve_test_images"] = len(self.data.x_test)  # every point scores all of them
        if "wall_s" in out:  # wall_s keeps the evaluations during fit (as before); train_s is without them
            out["train_s"] = round(out["wall_s"] - (self.paused - self.before_fit), 3)
        if self.target is not None:
            out.update(target_accuracy=self.target, time_to_target_s=None, steps_to_target=None)
            out.update(self.reached or {})
        if "syncs" in out:
            out["syncs"] -= self.eval_syncs
            out["comm_s"] = round(out["comm_s"] - self.eval_comm, 4)
        return out


def interval_search(cfg: Any, model: Any, strategy: Any, train: Any) -> Tuple[List[Any], Any]:
    """The callbacks of ``--interval_search`` and a function adding its figures to the record.

    ``adacomm``: :class:`tf_commopt.distribute.auto_interval.AdaCommCallback` from H = ``--interval``.
    ``grid``: :func:`~tf_commopt.distribute.auto_interval.keras_grid_search` before training (its trials,
    at least two syncs each, train the model too; their seconds are ``interval_overhead_s``).
    """
    from tf_commopt.distribute import auto_interval

    if cfg.interval_search == "adacomm":
        ada = auto_interval.AdaCommCallback(
            strategy, initial_interval=cfg.interval, max_interval=cfg.max_interval
        )
        policy = ada.policy
        return [ada], lambda rec: dict(
            rec, interval_overhead_s=round(policy.overhead_s, 4), adacomm_history=policy.history[:40]
        )
    model.fit(train, epochs=1, steps_per_epoch=2, verbose=0)  # trace first
    h, policy = auto_interval.keras_grid_search(
        model, strategy, train, steps_per_trial=lambda c: max(8, 2 * c)
    )
    return [], lambda rec: dict(rec, interval_overhead_s=round(policy.overhead_s, 3), grid_chosen=h)
