"""Graceful preemption: after a SIGTERM to any worker, every worker stops at the same step boundary, so a
backup can be written there and the job exits with :data:`PREEMPTED_EXIT_CODE` to be started again.

Kubernetes and SLURM send SIGTERM before they kill a task. :class:`PreemptionWatch` turns that signal
into a decision every worker takes at the same step:

1. the signal handler only sets a flag (it runs between two Python bytecodes of the main thread);
2. at an *agreement point* — a step boundary every worker reaches with the same model step — each
   worker calls :meth:`PreemptionWatch.should_stop`, which all-reduces the flags (one float per worker);
   if any worker was signalled, every worker gets True at this same step.

Agreement points: under :class:`~tf_commopt.distribute.SkipCorrectStrategy` the step right after a
sync (k = 0: every worker is at the same step, the averaging just finished; in the warm-up every step);
under every other strategy any step (they all-reduce every step). At most one check per ``every``
steps, so the extra all-reduce costs one small message per ``every`` steps (or per sync if H is
larger); on a single worker nothing is communicated.

TensorFlow's ``tf.distribute.experimental.PreemptionCheckpointHandler`` is not used: it assumes the
workers are at most one step apart (true under MultiWorkerMirroredStrategy) and tells them to save
after the signalled worker's next step; between two skip-and-correct syncs the workers drift up to H
steps apart, so a peer may already be past that step and never save while the others wait for it in
the checkpoint's collectives. tf-keras also enables it only on Google Cloud.

Example (a custom loop; every worker runs the same code)::

    watch = PreemptionWatch(strategy, optimizer).install()
    for step in range(first, steps):
        train_step(next(it))
        if watch.should_stop(step + 1):
            manager.save(checkpoint_number=step + 1)   # every worker: the state's collectives
            raise SystemExit(PREEMPTED_EXIT_CODE)

In ``model.fit``: ``callbacks=[SaveOnPreemption(save)]`` (:func:`save_on_preemption`).

    >>> PREEMPTED_EXIT_CODE
    143
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf

from tf_commopt._compat import num_workers
from tf_commopt.core.restart import PREEMPTED_EXIT_CODE
from tf_commopt.errors import InputError

__all__ = ["PreemptionWatch", "PREEMPTED_EXIT_CODE", "save_on_preemption", "CHECK_EVERY"]

CHECK_EVERY = 8  # steps between two agreement checks at least


class PreemptionWatch:
    """SIGTERM (or ``signals``) to any worker -> every worker stops at the same agreement point.

    Args:
        strategy: the training strategy (a single process needs no communication).
        optimizer: under SkipCorrectStrategy, the optimizer whose local-step counter k marks the syncs
            (None: every optimizer the strategy tracks).
        every: check at most once per this many steps (>= 1).
        signals: the signals that mean "preempted".
    """

    def __init__(
        self,
        strategy: Any,
        optimizer: Any = None,
        every: int = CHECK_EVERY,
        signals: Sequence[int] = (signal.SIGTERM,),
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise InputError(f"must be an integer >= 1, got {every!r}", where="PreemptionWatch(every=...)")
        self.strategy = strategy
        self.optimizer = optimizer
        self.every = every
        self.signals = tuple(signals)
        self._flag = threading.Event()
        self._previous: dict = {}
        self._last_check: Optional[int] = None
        self.stopped_at: Optional[int] = None  # the step every worker agreed to stop at

    # ---- the signal ---------------------------------------------------------------------------------
    def install(self) -> "PreemptionWatch":
        """Catch the signals (main thread only; the previous handlers come back with :meth:`uninstall`)."""
        if threading.current_thread() is not threading.main_thread():
            raise InputError("must be installed from the main thread", where="PreemptionWatch.install")
        for sig in self.signals:
            if sig not in self._previous:
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def uninstall(self) -> None:
        """Put the previous signal handlers back."""
        for sig, old in self._previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handler(self, signum: int, frame: Any) -> None:
        self._flag.set()

    def notify(self) -> None:
        """Act as if this process had been signalled (e.g. from a platform's own preemption notice)."""
        self._flag.set()

    @property
    def received(self) -> bool:
        """Whether this process was signalled."""
        return self._flag.is_set()

    # ---- the agreement -------------------------------------------------------------------------------
    def _at_sync_point(self) -> bool:
        ext = self.strategy.extended
        if not hasattr(ext, "correction_state"):
            return True  # every step all-reduces: every step boundary is shared
        opts = [self.optimizer] if self.optimizer is not None else None
        states = (
            [ext.correction_state(o) for o in opts] if opts is not None else list(ext._sc_states.values())
        )
        return all(s is None or int(s.local_steps.numpy()) == 0 for s in states)

    def is_agreement_point(self, step: int) -> bool:
        """Whether ``step`` (the model step just finished) is a step every worker checks at."""
        if self._last_check is not None and step - self._last_check < self.every:
            return False
        return self._at_sync_point()

    def _anyone(self) -> bool:
        flag = 1.0 if self._flag.is_set() else 0.0
        if num_workers(self.strategy) <= 1:
            return flag > 0
        with self.strategy.scope():
            value = self.strategy.experimental_distribute_values_from_function(
                lambda ctx: tf.constant(flag, tf.float32)
            )
            total = self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
        return float(total.numpy()) > 0

    def should_stop(self, step: int) -> bool:
        """Call at every step boundary on every worker (eagerly), with the model step just finished; True
        (on every worker at the same step) once any worker was signalled."""
        if self.stopped_at is not None:
            return True
        if not self.is_agreement_point(step):
            return False
        self._last_check = step
        if self._anyone():
            self.stopped_at = step
            return True
        return False

    def __enter__(self) -> "PreemptionWatch":
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()


def save_on_preemption(
    save: Callable[[Any, int], None],
    every: int = CHECK_EVERY,
    exit_code: Optional[int] = PREEMPTED_EXIT_CODE,
) -> Any:
    """A tf-keras callback: after a SIGTERM to any worker, every worker calls ``save(model, step)`` at the
    same step boundary, then training stops (``exit_code``: ``SystemExit(exit_code)`` right after the
    save, as TensorFlow's own handler does; None: ``model.stop_training`` and ``fit`` returns).

    Args:
        save: called on every worker with the model and the model step (e.g. a
            ``tf.train.CheckpointManager.save``; its collectives need every worker).
        every: check at most once per this many steps.
        exit_code: the process's exit code after the save, or None to return from ``fit``.

    Example:
        >>> cb = save_on_preemption(lambda model, step: manager.save(step))   # doctest: +SKIP
        >>> model.fit(ds, epochs=3, callbacks=[cb])                            # doctest: +SKIP
    """
    from tf_commopt._keras_callback import Callback

    class SaveOnPreemption(Callback):
        def on_train_begin(self, logs: Any = None) -> None:
            self.watch = PreemptionWatch(
                self.model.distribute_strategy, self.model.optimizer, every
            ).install()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            step = int(self.model.optimizer.iterations.numpy())
            if self.watch.should_stop(step):
                save(self.model, step)
                self.watch.uninstall()
                if exit_code is not None:
                    raise SystemExit(exit_code)
                self.model.stop_training = True

        def on_train_end(self, logs: Any = None) -> None:
            self.watch.uninstall()

    return SaveOnPreemption()
