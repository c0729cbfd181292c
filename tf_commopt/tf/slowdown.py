"""Emulate slower devices on one machine: stretch a computation's wall time by a factor.

``slowed(fn, factor)`` runs ``fn``, measures its wall time ``t`` just before and just after, then
sleeps ``(factor - 1) * t_min`` before releasing the outputs, ``t_min`` the shortest time this
wrapper has measured so far (wrap each call site separately). The exact rule: the outputs become
available ``t + (factor - 1) * t_min`` after the inputs were (plus sleep jitter, ~0.1 ms); unloaded,
``factor * t``. Sleeping instead of repeating the work keeps the CPU free, so emulated devices that
share the cores do not slow each other down further.

It works eagerly and inside a ``tf.function``: the clock reads and the sleep are *stateless*
``tf.numpy_function`` ops tied to the work by data and control dependencies only, so emulated devices
overlap. The sleep releases the GIL and occupies one inter-op thread: give TensorFlow at least as many
inter-op threads as devices sleeping at once. Every sleep is recorded in :func:`sleep_log` (start,
end, seconds; ``time.perf_counter``). The floating outputs are multiplied by the sleep's result (1.0,
exact) so that Grappler cannot drop it. A pipeline or hybrid executor wraps each stage's forward
function and the function computing its backward::

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

import collections
import contextlib
import math
import time
from typing import Any, Callable, Deque, Dict, Iterator, List, Mapping, Tuple

import numpy as np
import tensorflow as tf

from tf_commopt.errors import InputError

__all__ = [
    "slowed",
    "set_slowdown",
    "get_slowdown",
    "clear_slowdowns",
    "slowdowns",
    "canonical_device",
    "sleep_log",
]

_REGISTRY: Dict[str, float] = {}
_LOG: Deque[Tuple[float, float, float]] = collections.deque(maxlen=10000)


def sleep_log(clear: bool = False) -> List[Tuple[float, float, float]]:
    """The emulated delays so far, ``(start, end, requested seconds)`` in ``time.perf_counter`` time."""
    out = list(_LOG)
    if clear:
        _LOG.clear()
    return out


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


def _now(_probe: Any) -> np.ndarray:
    return np.float64(time.perf_counter())


def _sleeper(extra: float) -> Callable[[Any], np.ndarray]:
    """``sleep((factor - 1) * shortest measured time so far)`` for one wrapped call site."""
    state = {"min": float("inf")}

    def sleep(measured: Any) -> np.ndarray:
        state["min"] = min(state["min"], max(0.0, float(measured)))
        s = extra * state["min"]
        if s > 0:
            t0 = time.perf_counter()
            time.sleep(s)
            _LOG.append((t0, time.perf_counter(), s))
        return np.float32(1.0)

    return sleep


def _probe(tensors: List[Any]) -> Any:
    """A cheap scalar that depends on the data of ``tensors`` (so a clock read waits for them and
    cannot be folded or moved), or a constant if there are none."""
    parts = [
        tf.reduce_sum(tf.cast(tf.reshape(t, [-1])[:1], tf.float64))
        for t in tensors
        if t.dtype.is_floating or t.dtype.is_integer
    ]
    return tf.add_n(parts) if parts else tf.constant(0.0, tf.float64)


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
    sleeper = _sleeper(extra)  # one calibration per wrapper: wrap each call site separately

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        inputs = [t for t in tf.nest.flatten((args, kwargs)) if tf.is_tensor(t)]
        with tf.control_dependencies(inputs):
            t0 = tf.numpy_function(_now, [_probe(inputs)], tf.float64, stateful=False)
        with tf.control_dependencies([t0]):
            out = fn(*args, **kwargs)
        flat = [t for t in tf.nest.flatten(out) if tf.is_tensor(t)]
        with tf.control_dependencies(flat):
            t1 = tf.numpy_function(_now, [_probe(flat) + 0.0 * t0], tf.float64, stateful=False)
        one = tf.stop_gradient(tf.numpy_function(sleeper, [t1 - t0], tf.float32, stateful=False))
        one = tf.reshape(one, [])  # a scalar: the outputs keep their static shapes

        def release(t: Any) -> Any:
            # a data dependency on the sleep (its result is 1.0): Grappler turns a stateless op that only
            # feeds control edges into a NoOp, which would drop the sleep
            if not tf.is_tensor(t):
                return t
            if t.dtype.is_floating or t.dtype.is_complex:
                return t * tf.cast(one, t.dtype)
            with tf.control_dependencies([one]):
                return tf.identity(t)

        return tf.nest.map_structure(release, out)

    wrapper.__name__ = getattr(fn, "__name__", "fn") + f"_x{factor:g}"
    return wrapper
