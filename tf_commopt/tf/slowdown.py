"""Emulate slower devices on one machine: stretch a computation's wall time by a factor.

``slowed(fn, factor)`` runs ``fn``, measures its wall time ``t`` with ``tf.timestamp()`` just
before and just after, then sleeps ``(factor - 1) * t`` before releasing the outputs. The exact
rule: the outputs become available ``factor * t`` after the inputs were (plus sleep jitter,
~0.1 ms). Sleeping instead of repeating the work keeps the CPU free, so emulated devices that
share the cores do not slow each other down further: a stage on a device with factor 2 takes
twice its own time whatever the others do.

It works eagerly and inside a ``tf.function`` (the delay is a ``tf.py_function`` ordered by
control dependencies after the work), so a pipeline or hybrid executor can wrap each stage's
forward function and the function computing its backward::

    fwd = slowed(stage_forward, get_slowdown(device))        # inside the schedule's tf.function
    bwd = slowed(stage_backward, get_slowdown(device))

A process-wide registry maps device names to factors (``set_slowdown("/CPU:1", 2.0)``); the
profiler (:mod:`tf_commopt.tf.profiler`) honours it, so ``device_capacity("/CPU:1")`` measures
about half of ``device_capacity("/CPU:0")``.

Example:
    >>> import tensorflow as tf
    >>> set_slowdown("/CPU:1", 3.0)
    >>> get_slowdown("/device:CPU:1"), get_slowdown("/CPU:0")
    (3.0, 1.0)
    >>> f = slowed(lambda x: x * 2.0, 3.0)
    >>> float(f(tf.constant(1.0)))
    2.0
    >>> clear_slowdowns()
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Callable, Dict, Iterator, Mapping

import tensorflow as tf

from tf_commopt.errors import InputError

__all__ = ["slowed", "set_slowdown", "get_slowdown", "clear_slowdowns", "slowdowns", "canonical_device"]

_REGISTRY: Dict[str, float] = {}


def canonical_device(device: str) -> str:
    """``"/CPU:1"``, ``"cpu:1"`` and ``"/device:CPU:1"`` all give ``"/device:CPU:1"`` (job/task kept)."""
    try:
        spec = tf.DeviceSpec.from_string(device if device.startswith("/") else "/" + device)
    except (ValueError, TypeError, AttributeError):
        raise InputError(f"not a device name: {device!r}", where="device") from None
    return spec.to_string()


def _check_factor(factor: float, where: str) -> float:
    try:
        f = float(factor)
    except (TypeError, ValueError):
        raise InputError(f"slow-down factor is not a number: {factor!r}", where=where) from None
    if not (math.isfinite(f) and f >= 1.0):
        raise InputError(f"slow-down factor must be a finite number >= 1, got {factor!r}", where=where)
    return f


def set_slowdown(device: str, factor: float) -> None:
    """Make ``device`` emulate a device ``factor`` (>= 1) times slower (1 removes it)."""
    key = canonical_device(device)
    f = _check_factor(factor, f"slowdown of {device!r}")
    if f == 1.0:
        _REGISTRY.pop(key, None)
    else:
        _REGISTRY[key] = f


def get_slowdown(device: str) -> float:
    """The factor registered for ``device`` (1.0 if none)."""
    return _REGISTRY.get(canonical_device(device), 1.0)


def clear_slowdowns() -> None:
    """Forget every registered factor."""
    _REGISTRY.clear()


@contextlib.contextmanager
def slowdowns(factors: Mapping[str, float]) -> Iterator[None]:
    """Register ``{device: factor}`` for the duration of a ``with`` block."""
    saved = dict(_REGISTRY)
    try:
        for d, f in factors.items():
            set_slowdown(d, f)
        yield
    finally:
        _REGISTRY.clear()
        _REGISTRY.update(saved)


def _sleep(seconds: Any) -> Any:
    s = float(seconds)
    if s > 0:
        time.sleep(s)
    return tf.constant(0.0, tf.float64)


def slowed(fn: Callable[..., Any], factor: float) -> Callable[..., Any]:
    """``fn`` stretched to ``factor`` times its wall time (see the module docstring).

    Args:
        fn: any function of tensors returning a (nest of) tensor(s).
        factor: >= 1; 1 returns ``fn`` itself.
    """
    factor = _check_factor(factor, "factor")
    if factor == 1.0:
        return fn
    extra = factor - 1.0

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        inputs = [t for t in tf.nest.flatten((args, kwargs)) if tf.is_tensor(t)]
        with tf.control_dependencies(inputs):
            t0 = tf.timestamp()
        with tf.control_dependencies([t0]):
            out = fn(*args, **kwargs)
        flat = [t for t in tf.nest.flatten(out) if tf.is_tensor(t)]
        with tf.control_dependencies(flat):
            t1 = tf.timestamp()
        done = tf.py_function(_sleep, [(t1 - t0) * extra], tf.float64)
        with tf.control_dependencies([done]):
            return tf.nest.map_structure(lambda t: tf.identity(t) if tf.is_tensor(t) else t, out)

    wrapper.__name__ = getattr(fn, "__name__", "fn") + f"_x{factor:g}"
    return wrapper
