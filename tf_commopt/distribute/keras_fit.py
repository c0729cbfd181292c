"""What ``model.fit`` adds under a SkipCorrectStrategy: the graph loop (``graph_loop.py``) and, with
``overlap=True``, applying the averaging still in flight when training ends.

``_keras_hooks.py`` binds a ``fit`` wrapper on every adopted model; under the strategy it calls
:func:`fit` here, which runs tf-keras's own ``fit`` with one or two callbacks added.

Example:
    >>> history = fit(model, strategy, type(model).fit, signature, (x, y), {"epochs": 1}, tk)  # doctest: +SKIP
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, Tuple

from tf_commopt.distribute.graph_loop import GraphLoop

__all__ = ["fit"]


def _drain_callback(tk: Any, strategy: Any) -> Any:
    """A callback whose ``on_train_end`` applies the overlapped averaging still in flight."""

    class _DrainOverlap(tk.callbacks.Callback):
        _supports_tf_logs = True

        def on_train_end(self, logs: Any = None) -> None:
            strategy.extended.drain()

    return _DrainOverlap()


def fit(
    model: Any,
    strategy: Any,
    original_fit: Any,
    signature: inspect.Signature,
    args: Tuple[Any, ...],
    kwargs: Dict[str, Any],
    tk: Any,
) -> Any:
    """tf-keras's ``fit`` (``original_fit``, unbound) on ``model`` under ``strategy``, with the graph loop
    and the overlap drain. A call tf-keras would reject goes to it unchanged (it reports the error)."""
    try:
        bound = signature.bind(model, *args, **kwargs)
    except TypeError:
        return original_fit(model, *args, **kwargs)
    given = bound.arguments.get("callbacks")
    user = list(getattr(given, "callbacks", given) or [])  # a CallbackList or a list
    loop = GraphLoop(model, strategy, tk, user)
    extra = [loop.callback()] if loop.active else []
    if strategy.overlap:  # before tf-keras tears down its data handler; local, no communication
        extra.append(_drain_callback(tk, strategy))
    if extra:
        if isinstance(given, tk.callbacks.CallbackList):
            for cb in extra:
                given.append(cb)
        else:
            bound.arguments["callbacks"] = user + extra
    loop.begin()
    try:
        history = original_fit(*bound.args, **bound.kwargs)
    finally:
        loop.end()
    if strategy.overlap:
        strategy.extended.drain()  # nothing left unless training ended without on_train_end
    return history
