"""The two tf-keras touch points of SkipCorrectStrategy, installed once and inert for other strategies.

1. ``apply_gradients`` of tf-keras optimizers (the current ``Optimizer`` and the legacy
   ``OptimizerV2``): called in a replica context of a SkipCorrectStrategy, it is routed to the
   strategy's extended (local step with correction, then maybe a sync) instead of all-reducing the
   gradients. Any other strategy gets the original method, unchanged.
2. ``Model.evaluate/predict/save/save_weights``: under a SkipCorrectStrategy they average the replicas
   first (``strategy.sync()``), so users always evaluate and save the global model.

Example:
    >>> from tf_commopt.distribute import _keras_hooks
    >>> _keras_hooks.install()   # doctest: +SKIP  (SkipCorrectStrategy() does it)
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import tensorflow as tf

__all__ = ["install"]

_INSTALLED = {"done": False}


def _wrap_apply(cls: Any, legacy: bool) -> None:
    original = cls.apply_gradients
    if getattr(original, "_tf_commopt_wrapped", False):
        return

    @tf.autograph.experimental.do_not_convert
    @functools.wraps(original)
    def apply_gradients(self, grads_and_vars, name=None, *args, **kwargs):
        from tf_commopt.distribute.skip_correct import SkipCorrectStrategy
        if (tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()
                and isinstance(tf.distribute.get_strategy(), SkipCorrectStrategy) and not args
                and not getattr(self, "_mesh", None)):
            extended = tf.distribute.get_strategy().extended
            return extended._sc_apply(self, original, grads_and_vars, name, legacy)
        return original(self, grads_and_vars, name, *args, **kwargs)

    apply_gradients._tf_commopt_wrapped = True  # type: ignore[attr-defined]
    cls.apply_gradients = apply_gradients


def _wrap_sync_first(cls: Any, method: str) -> None:
    original: Callable = getattr(cls, method)
    if getattr(original, "_tf_commopt_wrapped", False):
        return

    @functools.wraps(original)
    def wrapped(self, *args, **kwargs):
        from tf_commopt.distribute.skip_correct import SkipCorrectStrategy
        strategy = getattr(self, "_distribution_strategy", None)
        if isinstance(strategy, SkipCorrectStrategy) and tf.executing_eagerly():
            strategy.sync()
        return original(self, *args, **kwargs)

    wrapped._tf_commopt_wrapped = True  # type: ignore[attr-defined]
    setattr(cls, method, wrapped)


def install() -> None:
    """Install the hooks (idempotent). A no-op when tf-keras is not importable."""
    if _INSTALLED["done"]:
        return
    try:
        from tf_keras.src.engine import training
        from tf_keras.src.optimizers import optimizer as new_opt
        from tf_keras.src.optimizers.legacy import optimizer_v2
    except ImportError:
        return
    _wrap_apply(new_opt.Optimizer, legacy=False)
    _wrap_apply(optimizer_v2.OptimizerV2, legacy=True)
    for m in ("evaluate", "predict", "save", "save_weights"):
        _wrap_sync_first(training.Model, m)
    _INSTALLED["done"] = True
