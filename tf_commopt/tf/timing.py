"""How the profiler times things: compiled calls on a device, fetched outputs, interleaved runs.

* :func:`compiled` — ``tf.function`` of a function, stretched by a slow-down factor inside the graph.
* :func:`time_fn` / :func:`time_interleaved` — wall times (ms) of calls whose outputs are fetched; the
  interleaved form runs several functions in turn each round, so a load change on a shared machine hits
  all of them alike.
* :func:`sync` — a 1-element tensor depending on every output, :func:`random_input` — random inputs of a
  shape and dtype, :func:`check_device` — a clear error for a device that does not exist,
  :class:`KeepState` — restore a model's non-trainable variables after training-mode calls.

Example:
    >>> import tensorflow as tf
    >>> f = compiled(lambda x: sync(x * 2.0))
    >>> len(time_fn(f, [tf.ones([4])], repeats=3, warmup=1))
    3
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Sequence, Tuple

import tensorflow as tf

from tf_commopt.errors import InputError
from tf_commopt.tf.slowdown import canonical_device, slowed

__all__ = ["check_device", "sync", "compiled", "time_fn", "time_interleaved", "random_input", "KeepState"]


def check_device(device: str) -> str:
    """``device`` if it names a local logical device (or a remote job), else a one-line InputError."""
    canonical_device(device)
    names = {canonical_device(d.name) for d in tf.config.list_logical_devices()}
    spec = tf.DeviceSpec.from_string(canonical_device(device))
    local = tf.DeviceSpec(device_type=spec.device_type, device_index=spec.device_index).to_string()
    if spec.job is None and not any(n.endswith(local) for n in names):
        raise InputError(f"no such device here; logical devices: {sorted(names)}", where=f"device {device!r}")
    return device


def sync(out: Any) -> Any:
    """A 1-element tensor depending on every output: fetching it waits for all of them."""
    parts = [
        tf.reshape(tf.cast(tf.reshape(t, [-1])[:1], tf.float32), [-1])
        for t in tf.nest.flatten(out)
        if tf.is_tensor(t) and t.shape.num_elements() != 0
    ]
    return tf.concat(parts, 0) if parts else tf.zeros([1])


def compiled(fn: Callable[..., Any], factor: float = 1.0) -> Callable[..., Any]:
    """``tf.function`` of ``fn`` stretched by ``factor`` *inside* the graph (no eager overhead)."""
    return tf.function(slowed(fn, factor), autograph=False)


def _fetch(out: Any) -> None:
    tf.nest.map_structure(lambda t: t.numpy() if tf.is_tensor(t) else t, out)


def time_fn(fn: Callable[..., Any], args: Sequence[Any], repeats: int, warmup: int) -> List[float]:
    """Wall times (ms) of ``repeats`` calls of ``fn(*args)`` after ``warmup`` calls; outputs fetched."""
    for _ in range(max(warmup, 0)):
        _fetch(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _fetch(fn(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def time_interleaved(
    fns: Sequence[Tuple[Callable[..., Any], Sequence[Any]]], repeats: int, warmup: int
) -> List[List[float]]:
    """Wall times (ms) of several ``(fn, args)``, run in turn each round so load changes hit all alike."""
    for _ in range(max(warmup, 0)):
        for fn, args in fns:
            fn(*args).numpy()
    times: List[List[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, (fn, args) in enumerate(fns):
            t0 = time.perf_counter()
            fn(*args).numpy()
            times[i].append((time.perf_counter() - t0) * 1e3)
    return times


def random_input(shape: Tuple[int, ...], dtype: Any, rng: tf.random.Generator) -> tf.Tensor:
    """Normal floats, or zeros for integers and booleans (valid indices for Embedding/Gather, a no-op mask)."""
    d = tf.as_dtype(dtype)
    if d.is_floating:
        return tf.cast(rng.normal(shape), d)
    if d.is_integer or d == tf.bool:
        return tf.zeros(shape, d)
    raise InputError(f"cannot make a random input of dtype {d.name}", where="profile_keras_model")


class KeepState:
    """Restore a model's non-trainable variables (BatchNorm statistics) on exit."""

    def __init__(self, model: Any):
        self.vars = list(
            getattr(model, "non_trainable_variables", None) or getattr(model, "non_trainable_weights", [])
        )

    def __enter__(self):
        self.saved = [v.numpy() for v in self.vars]
        return self

    def __exit__(self, *exc):
        for v, value in zip(self.vars, self.saved):
            v.assign(value)
        return False
