"""How fast a device is: whole-model timing, model- and microbenchmark-based relative speeds, a roofline.

* :func:`time_keras_model` — median (forward, forward+backward) ms of a whole model or pipeline stage.
* :func:`model_capacities` — speeds of devices on a real model relative to a reference.
* :func:`device_capacity` / :func:`relative_capacities` — achieved GFLOP/s on a matmul and/or conv2d
  microbenchmark, measured on the devices *interleaved* (round-robin repeats, so a busy machine affects
  all alike); the relative form is the ``capacities`` the partitioner takes.
* :func:`measure_roofline` — peak GFLOP/s (matmul) and memory GB/s (a large add): a
  :class:`~tf_commopt.tf.op_costs.Roofline` for estimates that match this machine.

Every timed call honours the device's slow-down factor (:mod:`tf_commopt.tf.slowdown`).

Example:
    >>> with slowdowns({"/CPU:1": 2.0}):                                   # doctest: +SKIP
    ...     relative_capacities(["/CPU:0", "/CPU:1"])
    [1.0, 0.5]
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tf_commopt.errors import InputError
from tf_commopt.tf.keras_walk import layer_calls
from tf_commopt.tf.op_costs import Roofline
from tf_commopt.tf.slowdown import get_slowdown
from tf_commopt.tf.timing import (
    KeepState,
    check_device,
    compiled,
    random_input,
    sync,
    time_fn,
    time_interleaved,
)

__all__ = [
    "time_keras_model",
    "model_capacities",
    "device_capacity",
    "relative_capacities",
    "measure_roofline",
]


def _check_stat(stat: str, devices: Sequence[str]) -> None:
    if not devices:
        raise InputError("no devices given", where="devices")
    if stat not in ("min", "median"):
        raise InputError(f"stat must be 'min' or 'median', got {stat!r}", where="stat")


def _relative(values: List[float], devices: Sequence[str], reference: Optional[str]) -> List[float]:
    """``values`` divided by the reference device's (default: the largest)."""
    if reference is not None:
        if reference not in devices:
            raise InputError(f"reference {reference!r} is not among the devices", where="reference")
        base = values[list(devices).index(reference)]
    else:
        base = max(values)
    return [v / base for v in values]


def _model_fns(
    model: Any, batch_size: int, device: str, seed: int
) -> Tuple[Callable, Callable, List[tf.Tensor]]:
    """Compiled whole-model forward and forward+backward functions on ``device`` and their inputs."""
    check_device(device)
    factor = get_slowdown(device)
    specs = [c.outputs[0] for c in layer_calls(model, batch_size) if c.is_input]
    rng = tf.random.Generator.from_seed(seed)

    def run(xs):
        return model(xs if len(xs) > 1 else xs[0], training=True)

    def forward(*xs):
        return sync(run(list(xs)))

    def forward_backward(*xs):
        with tf.GradientTape() as tape:
            outs = [o for o in tf.nest.flatten(run(list(xs))) if o.dtype.is_floating]
        variables = list(getattr(model, "trainable_variables", []))
        grads = tape.gradient(outs, variables, output_gradients=[tf.ones_like(o) for o in outs])
        return sync([outs, [g for g in grads if g is not None]])

    with tf.device(device):
        xs = [random_input(s, d, rng) for s, d in specs]
    return compiled(forward, factor), compiled(forward_backward, factor), xs


def time_keras_model(
    model: Any, batch_size: int, device: str = "/CPU:0", repeats: int = 5, warmup: int = 1, seed: int = 0
) -> Tuple[float, float]:
    """Median (forward_ms, forward+backward_ms) of the whole model on ``device`` (random inputs, tf.function).

    Works on any built Keras model, e.g. a pipeline stage's sub-model: per-stage timing.

    Example:
        >>> f, fb = time_keras_model(model, batch_size=32, device="/CPU:0")     # doctest: +SKIP
    """
    with KeepState(model):
        fwd, fwdbwd, xs = _model_fns(model, batch_size, device, seed)
        with tf.device(device):
            tf_, tfb = time_interleaved([(fwd, xs), (fwdbwd, xs)], repeats, warmup + 1)
    f, fb = statistics.median(tf_), statistics.median(tfb)
    return f, max(fb, f)


def model_capacities(
    model: Any,
    batch_size: int,
    devices: Sequence[str],
    reference: Optional[str] = None,
    repeats: int = 5,
    warmup: int = 1,
    stat: str = "min",
    seed: int = 0,
) -> List[float]:
    """Speeds of ``devices`` on a real model (or stage) relative to ``reference`` (default: the fastest).

    The model's forward+backward runs on every device in turn each round (interleaved); the
    fastest (``stat="min"``) or median run per device is kept, and speed = 1 / time. Unlike the
    matmul benchmark this captures how a device runs *this* model (memory-bound layers included).

    Example:
        >>> with slowdowns({"/CPU:1": 2.0}):                                   # doctest: +SKIP
        ...     model_capacities(model, 32, ["/CPU:0", "/CPU:1"])
        [1.0, 0.5]
    """
    _check_stat(stat, devices)
    with KeepState(model):
        runs = [(d, *_model_fns(model, batch_size, d, seed)[1:]) for d in devices]
        for _ in range(warmup + 1):
            for d, fn, xs in runs:
                with tf.device(d):
                    fn(*xs).numpy()
        samples: List[List[float]] = [[] for _ in runs]
        for _ in range(repeats):
            for i, (d, fn, xs) in enumerate(runs):
                with tf.device(d):
                    t0 = time.perf_counter()
                    fn(*xs).numpy()
                    samples[i].append(time.perf_counter() - t0)
    pick = min if stat == "min" else statistics.median
    return _relative([1.0 / pick(s) for s in samples], devices, reference)


def _bench_ops(kind: str, size: int, device: str, dtype: Any) -> Tuple[Callable, List[tf.Tensor], float]:
    rng = tf.random.Generator.from_seed(1)
    with tf.device(device):
        if kind == "matmul":
            a = tf.cast(rng.normal([size, size]), dtype)
            b = tf.cast(rng.normal([size, size]), dtype)
            return lambda x, y: sync(tf.matmul(x, y)), [a, b], 2.0 * size**3
        if kind == "conv":
            hw, c, n = max(size // 16, 4), 64, 4
            x = tf.cast(rng.normal([n, hw, hw, c]), dtype)
            w = tf.cast(rng.normal([3, 3, c, c]), dtype)
            return lambda x, w: sync(tf.nn.conv2d(x, w, 1, "SAME")), [x, w], 2.0 * n * hw * hw * c * 9 * c
    raise InputError(f"unknown benchmark kind {kind!r}; use 'matmul', 'conv' or 'both'", where="kind")


def device_capacity(
    device: str = "/CPU:0",
    kind: str = "matmul",
    size: int = 512,
    repeats: int = 50,
    warmup: int = 1,
    dtype: Any = tf.float32,
    stat: str = "min",
) -> float:
    """Achieved GFLOP/s of ``device`` on a microbenchmark (fastest of ``repeats`` runs by default).

    Example:
        >>> device_capacity("/CPU:0", kind="matmul", size=256) > 0             # doctest: +SKIP
        True

    Args:
        device: a local logical device; its slow-down factor applies.
        kind: ``"matmul"`` (size x size times size x size), ``"conv"`` (3x3 conv, 64 channels,
            4 x size/16 x size/16 images) or ``"both"`` (geometric mean of the two).
        size: problem size (see ``kind``).
        stat: ``"min"`` or ``"median"`` of the run times.
    """
    return relative_capacities(
        [device], kind=kind, size=size, repeats=repeats, warmup=warmup, dtype=dtype, absolute=True, stat=stat
    )[0]


def _bench_gflops(
    kind: str, devices: Sequence[str], size: int, repeats: int, warmup: int, dtype: Any, stat: str
):
    """GFLOP/s of every device on one benchmark kind: each round runs it, then an empty call, on every
    device in turn; the kept run (min or median) minus the empty call's."""
    benches = []
    for d in devices:
        check_device(d)
        fn, args, flops = _bench_ops(kind, size, d, dtype)
        factor = get_slowdown(d)
        with tf.device(d):
            tiny = tf.zeros([1])
        benches.append((d, compiled(fn, factor), args, flops, compiled(sync, factor), [tiny]))
    samples: Dict[str, List[float]] = {d: [] for d in devices}
    probes: Dict[str, List[float]] = {d: [] for d in devices}
    for r in range(warmup + repeats):
        for d, fn, args, _, probe, probe_args in benches:
            with tf.device(d):
                t0 = time.perf_counter()
                fn(*args).numpy()
                t1 = time.perf_counter()
                probe(*probe_args).numpy()
                t2 = time.perf_counter()
            if r >= warmup:
                samples[d].append(t1 - t0)
                probes[d].append(t2 - t1)
    pick = min if stat == "min" else statistics.median
    return [flops / max(pick(samples[d]) - pick(probes[d]), 1e-9) / 1e9 for d, _, _, flops, _, _ in benches]


def relative_capacities(
    devices: Sequence[str],
    kind: str = "matmul",
    size: int = 512,
    repeats: int = 50,
    warmup: int = 1,
    dtype: Any = tf.float32,
    reference: Optional[str] = None,
    absolute: bool = False,
    stat: str = "min",
) -> List[float]:
    """Speeds of ``devices`` relative to ``reference`` (default: the fastest), measured interleaved.

    Each repeat runs the benchmark once on every device in turn, so load changes on a shared
    machine hit all devices alike; the fastest run (``stat="min"``, like ``timeit``: the run least
    disturbed by other processes) or the median (``stat="median"``) is kept, minus the same
    statistic of an empty call on that device (the fixed cost of a ``tf.function`` call, which
    would otherwise dilute the differences). With ``absolute=True`` returns GFLOP/s instead.

    Example:
        >>> with slowdowns({"/CPU:1": 2.0}):                                   # doctest: +SKIP
        ...     relative_capacities(["/CPU:0", "/CPU:1"])
        [1.0, 0.5]
    """
    _check_stat(stat, devices)
    kinds = ["matmul", "conv"] if kind == "both" else [kind]
    gflops = [1.0] * len(devices)
    for k in kinds:
        for i, g in enumerate(_bench_gflops(k, devices, size, repeats, warmup, dtype, stat)):
            gflops[i] *= g
    gflops = [g ** (1.0 / len(kinds)) for g in gflops]
    return gflops if absolute else _relative(gflops, devices, reference)


def measure_roofline(
    device: str = "/CPU:0", size: int = 1024, mbytes: int = 64, repeats: int = 5, backward_factor: float = 2.0
) -> Roofline:
    """A :class:`Roofline` of ``device``: matmul GFLOP/s and GB/s of ``a + b`` on ``mbytes`` MB tensors.

    Example:
        >>> r = measure_roofline("/CPU:0", size=512, mbytes=16)                 # doctest: +SKIP
        >>> from_keras_model(model, roofline=r)                                 # doctest: +SKIP
    """
    peak = device_capacity(device, "matmul", size, repeats)
    n = int(mbytes * 1e6 / 4)
    rng = tf.random.Generator.from_seed(2)
    with tf.device(device):
        a, b = rng.normal([n]), rng.normal([n])
        add = compiled(lambda x, y: sync(x + y), get_slowdown(device))
        t = statistics.median(time_fn(add, [a, b], repeats, 1)) / 1e3
    return Roofline(peak_gflops=peak, mem_gbps=3 * n * 4 / t / 1e9, backward_factor=backward_factor)
