"""Runner add-ons for time-to-accuracy benches: a test-accuracy curve during training (``--eval_every``)
and the baseline interval searches (``--interval_search=adacomm|grid``).

With ``--eval_every=N`` the runner evaluates the (averaged) model on the held-out images before training
and every N steps (and after the last): the clock pauses meanwhile, the averaging before an evaluation is
not counted as a training sync, and every worker evaluates so the workers stay in step. The record gets
``curve`` ([{step, wall_s, test_loss, test_accuracy}], wall_s = training seconds so far), ``eval_s``
(the paused seconds) and ``syncs`` / ``comm_s`` without the evaluation averagings.

Example:
    python -m experiments.train --strategy=skip_correct --model=mlp --steps=60 --eval_every=20
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Tuple

__all__ = ["Curve", "interval_search"]

SEARCHES = ("", "adacomm", "grid")


class Curve:
    """The evaluation curve of one run (a tf-keras callback from :meth:`callback`)."""

    def __init__(
        self, strategy: Any, model: Any, plain: Any, data: Any, every: int, steps: int, spe: int = 1
    ):
        self.strategy, self.model, self.plain, self.data = strategy, model, plain, data
        self.every, self.steps, self.spe, self.done, self.base = every, steps, spe, 0, 0
        self.points: List[Dict[str, float]] = []
        self.wall, self.paused, self.eval_syncs, self.eval_comm = 0.0, 0.0, 0, 0.0
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
        loss, acc = self.plain.evaluate(self.data.x_test, self.data.y_test, batch_size=500, verbose=0)
        point = {"step": step, "wall_s": round(self.wall, 3), "test_loss": round(float(loss), 4)}
        self.points.append(dict(point, test_accuracy=round(float(acc), 4)))
        if sc and hasattr(self.strategy, "reset_step_clock"):
            self.strategy.reset_step_clock()
        self.t = time.perf_counter()
        self.paused += self.t - now

    def callback(self, tf_keras: Any) -> Any:
        curve = self

        class EvalEvery(tf_keras.callbacks.Callback):
            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                curve.base = curve.done

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                before, curve.done = curve.done, curve.base + batch + 1  # batch: the call's last step
                if curve.done // curve.every > before // curve.every or curve.done == curve.steps:
                    curve.evaluate(curve.done)

            def steps_to_next_stop(self) -> int:
                """SkipCorrectStrategy's graph loop ends a call here, so evaluations land on every N-th step."""
                return curve.every - curve.done % curve.every

        return EvalEvery()

    def record(self, record: Dict[str, Any]) -> Dict[str, Any]:
        """``record`` with the curve and without the evaluation averagings in syncs / comm_s."""
        out = dict(record, curve=self.points, eval_s=round(self.paused, 3))
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
