"""``--optimizer`` of the runners: the tf-keras optimizer a run trains with (collective and ps clusters).

Example:
    >>> validate_optimizer("adam")
    'adam'
    >>> opt = build_optimizer("adam", learning_rate=1e-3)   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from tf_commopt.errors import InputError

__all__ = ["OPTIMIZERS", "validate_optimizer", "build_optimizer"]

OPTIMIZERS = ("sgd", "adam", "rmsprop", "adagrad")


def validate_optimizer(name: object, where: str = "--optimizer") -> str:
    """``name`` if it is one of :data:`OPTIMIZERS`, else a one-line InputError naming the flag.

    >>> validate_optimizer("lamb")
    Traceback (most recent call last):
    ...
    tf_commopt.errors.InputError: --optimizer: unknown optimizer 'lamb'; choose one of sgd, adam, rmsprop, adagrad
    """
    if not isinstance(name, str) or name not in OPTIMIZERS:
        raise InputError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}", where=where)
    return name


def build_optimizer(name: str, learning_rate: float, momentum: float = 0.0) -> Any:
    """A fresh tf-keras optimizer: ``sgd`` = SGD(learning_rate, momentum), the others with tf-keras's
    defaults and ``learning_rate`` (``momentum`` is SGD's only)."""
    import tf_keras

    validate_optimizer(name)
    if name == "sgd":
        return tf_keras.optimizers.SGD(learning_rate, momentum=momentum)
    cls = {
        "adam": tf_keras.optimizers.Adam,
        "rmsprop": tf_keras.optimizers.RMSprop,
        "adagrad": tf_keras.optimizers.Adagrad,
    }[name]
    return cls(learning_rate)
