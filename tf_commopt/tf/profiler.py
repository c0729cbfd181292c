"""Measured costs: per-layer forward/backward times, device capacity, and a measured roofline.

* :func:`profile_keras_model` times every layer call of a Keras model alone on a named device at
  a batch size, on random inputs of the real shapes, inside ``tf.function`` (traced once, then
  ``warmup`` untimed runs, then the median of ``repeats`` timed runs). Forward = the layer's call
  (``training=True`` where the layer takes it); backward = median over rounds of (forward +
  gradients w.r.t. its float inputs and trainable weights, given a random upstream gradient)
  minus the forward run of the same round, clamped at 0 (the two run alternately, so a load
  change on a shared machine hits both).
  The median cost of calling an empty ``tf.function`` on the device is subtracted from both
  (``subtract_overhead``), as a layer inside a whole model does not pay it.
* :func:`device_capacity` is a microbenchmark (matmul and/or conv2d) returning achieved GFLOP/s;
  :func:`relative_capacities` measures several devices *interleaved* (round-robin repeats, so a
  busy machine affects all alike) and divides by a reference: the ``capacities`` the partitioner
  takes. :func:`model_capacities` does the same with a real model or pipeline stage, and
  :func:`time_keras_model` times a whole model (or stage) on one device.
* :func:`measure_roofline` measures peak GFLOP/s (matmul) and memory GB/s (a large add) of a
  device: a :class:`~tf_commopt.tf.op_costs.Roofline` for estimates that match this machine.

Every timed call honours the device's slow-down factor (:mod:`tf_commopt.tf.slowdown`), so
heterogeneous clusters can be emulated on one CPU machine.

Example:
    >>> import tf_keras as keras                                               # doctest: +SKIP
    >>> from tf_commopt.tf.profiler import profile_keras_model, relative_capacities, set_slowdown
    >>> g = profile_keras_model(model, batch_size=32, device="/CPU:0", repeats=5)  # doctest: +SKIP
    >>> set_slowdown("/CPU:1", 2.0)                                             # doctest: +SKIP
    >>> relative_capacities(["/CPU:0", "/CPU:1"])                               # doctest: +SKIP
    [1.0, 0.5]
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.errors import InputError
from tf_commopt.tf.keras_walk import LayerCall, layer_calls
from tf_commopt.tf.op_costs import Roofline
from tf_commopt.tf.slowdown import (
    canonical_device,
    clear_slowdowns,
    get_slowdown,
    set_slowdown,
    slowdowns,
    slowed,
)

__all__ = [
    "profile_keras_model",
    "time_keras_model",
    "model_capacities",
    "device_capacity",
    "relative_capacities",
    "measure_roofline",
    "time_fn",
    "time_interleaved",
    "compiled",
    "set_slowdown",
    "get_slowdown",
    "clear_slowdowns",
    "slowdowns",
    "slowed",
]


def _check_device(device: str) -> str:
    canonical_device(device)
    names = {canonical_device(d.name) for d in tf.config.list_logical_devices()}
    spec = tf.DeviceSpec.from_string(canonical_device(device))
    local = tf.DeviceSpec(device_type=spec.device_type, device_index=spec.device_index).to_string()
    if spec.job is None and not any(n.endswith(local) for n in names):
        raise InputError(f"no such device here; logical devices: {sorted(names)}", where=f"device {device!r}")
    return device


def _sync(out: Any) -> Any:
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


def time_fn(fn: Callable[..., Any], args: Sequence[Any], repeats: int, warmup: int) -> List[float]:
    """Wall times (ms) of ``repeats`` calls of ``fn(*args)`` after ``warmup`` calls; outputs fetched."""
    for _ in range(max(warmup, 0)):
        tf.nest.map_structure(lambda t: t.numpy() if tf.is_tensor(t) else t, fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        tf.nest.map_structure(lambda t: t.numpy() if tf.is_tensor(t) else t, fn(*args))
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


def _random(shape: Tuple[int, ...], dtype: Any, rng: tf.random.Generator) -> tf.Tensor:
    d = tf.as_dtype(dtype)
    if d.is_floating:
        return tf.cast(rng.normal(shape), d)
    if d.is_integer or d == tf.bool:
        return tf.zeros(shape, d)  # valid indices for Embedding/Gather, a no-op mask
    raise InputError(f"cannot make a random input of dtype {d.name}", where="profile_keras_model")


def _layer_fns(call: LayerCall) -> Tuple[Callable, Callable]:
    def forward(*xs):
        return _sync(call.call_training(*xs))

    def forward_backward(*xs_and_dys):
        xs = xs_and_dys[: len(call.inputs)]
        dys = xs_and_dys[len(call.inputs) :]
        with tf.GradientTape() as tape:
            for x in xs:
                if x.dtype.is_floating:
                    tape.watch(x)
            outs = call.call_training(*xs)
        flat_out = [o for o in tf.nest.flatten(outs) if tf.is_tensor(o) and o.dtype.is_floating]
        sources = [x for x in xs if x.dtype.is_floating] + call.trainable_variables
        if not flat_out or not sources:
            return _sync(outs)
        grads = tape.gradient(
            flat_out, sources, output_gradients=[tf.cast(d, o.dtype) for d, o in zip(dys, flat_out)]
        )
        return _sync([outs, [g for g in grads if g is not None]])

    return forward, forward_backward


def profile_keras_model(
    model: Any,
    batch_size: int,
    device: str = "/CPU:0",
    repeats: int = 5,
    warmup: int = 1,
    seed: int = 0,
    subtract_overhead: bool = True,
    name: Optional[str] = None,
    calibrate: Union[bool, Tuple[float, float]] = False,
) -> CostGraph:
    """Measure every layer's forward and backward time (ms) on ``device`` at ``batch_size``.

    Example:
        >>> g = profile_keras_model(model, batch_size=32, device="/CPU:0", repeats=5)  # doctest: +SKIP
        >>> g["conv1"].forward_ms > 0                                               # doctest: +SKIP

    Args:
        model: a built Keras model (tf-keras or Keras 3), flattened as in
            :func:`tf_commopt.tf.graph_import.from_keras_model` (same node names and edges).
        batch_size: batch size of the random inputs.
        device: a local logical device (``/CPU:0``, ``/GPU:1``); its slow-down factor applies.
        repeats: timed runs per layer (median reported). warmup: untimed runs after tracing.
        seed: seed of the random inputs.
        subtract_overhead: subtract the median time of an empty tf.function call on the device.
        name: graph name (default: the model's).
        calibrate: scale the per-layer times so they add up to the whole model's: ``True`` measures
            the whole model (:func:`time_keras_model`), or pass ``(forward_ms, forward_backward_ms)``.
            Timed alone, layers pay costs (call overhead, no fusion, no overlap between layers)
            that they partly hide inside the whole model; on this 2-core CPU the per-layer sums of
            MobileNetV2 came out 3.7x the whole-model time (see docs/importing.md).

    Returns:
        A CostGraph with measured ``forward_ms``/``backward_ms``; bytes as in ``from_keras_model``.
        The model's non-trainable state (BatchNorm statistics, updated by the training-mode calls)
        is restored afterwards.
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"repeats must be a positive integer, got {repeats!r}", where="repeats")
    _check_device(device)
    calls = layer_calls(model, batch_size)
    rng = tf.random.Generator.from_seed(seed)
    if calibrate is not False and calibrate is not True:
        try:
            whole_f, whole_fb = (float(x) for x in calibrate)  # type: ignore[union-attr]
        except (TypeError, ValueError):
            raise InputError(
                f"calibrate must be True/False or (forward_ms, forward_backward_ms), got {calibrate!r}",
                where="calibrate",
            ) from None
        if not (0 < whole_f <= whole_fb):
            raise InputError(
                f"calibrate needs 0 < forward_ms <= forward_backward_ms, got {calibrate!r}", where="calibrate"
            )
    with _KeepState(model):  # training-mode calls update BatchNorm statistics: restore them
        g = _profile(model, calls, rng, batch_size, device, repeats, warmup, subtract_overhead, name)
    if calibrate is True:
        whole_f, whole_fb = time_keras_model(model, batch_size, device, repeats, warmup, seed)
    if calibrate is False:
        return g
    return _scaled(g, whole_f, max(whole_fb - whole_f, 0.0))


def _scaled(g: CostGraph, forward_ms: float, backward_ms: float) -> CostGraph:
    """``g`` with forward (backward) times scaled to add up to ``forward_ms`` (``backward_ms``)."""
    sf = sum(n.forward_ms for n in g.nodes.values())
    sb = sum(n.backward_ms for n in g.nodes.values())
    kf = forward_ms / sf if sf > 0 else 0.0
    kb = backward_ms / sb if sb > 0 else 0.0
    nodes = [
        Node(n.name, n.forward_ms * kf, n.backward_ms * kb, n.param_bytes, n.activation_bytes, n.label)
        for n in g.nodes.values()
    ]
    return CostGraph(nodes, g.edges, name=g.name)


def _profile(
    model: Any,
    calls: List[LayerCall],
    rng: tf.random.Generator,
    batch_size: int,
    device: str,
    repeats: int,
    warmup: int,
    subtract_overhead: bool,
    name: Optional[str],
) -> CostGraph:
    factor = get_slowdown(device)
    with tf.device(device):
        probe = compiled(_sync, factor)
        tiny = tf.zeros([1])
        overhead = (
            statistics.median(time_fn(probe, [tiny], repeats, warmup + 1)) if subtract_overhead else 0.0
        )
        nodes, edges = [], []
        for c in calls:
            if c.is_input:
                nodes.append(Node(c.name, 0.0, 0.0, 0.0, c.activation_bytes(), c.label))
                continue
            xs = [_random(s, d, rng) for s, d in c.inputs]
            dys = [_random(s, d, rng) for s, d in c.outputs if tf.as_dtype(d).is_floating]
            fwd, fwdbwd = (compiled(f, factor) for f in _layer_fns(c))
            try:
                tf_, tfb = time_interleaved([(fwd, xs), (fwdbwd, xs + dys)], repeats, warmup + 1)
            except InputError:
                raise
            except Exception as e:  # noqa: BLE001 - say which layer failed, one line
                raise InputError(
                    f"cannot run the layer alone: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}",
                    where=f"layer {c.name!r}",
                ) from None
            f_ms = max(statistics.median(tf_) - overhead, 0.0)
            b_ms = max(statistics.median([b - a for a, b in zip(tf_, tfb)]), 0.0)
            nodes.append(Node(c.name, f_ms, b_ms, c.param_bytes(), c.activation_bytes(), c.label))
            edges.extend((p, c.name) for p in c.preds)
    gname = name if name is not None else f"{getattr(model, 'name', '')}@{device}"
    return CostGraph(nodes, edges, name=gname)


def _model_fns(
    model: Any, batch_size: int, device: str, seed: int
) -> Tuple[Callable, Callable, List[tf.Tensor]]:
    """Compiled whole-model forward and forward+backward functions on ``device`` and their inputs."""
    _check_device(device)
    factor = get_slowdown(device)
    specs = [c.outputs[0] for c in layer_calls(model, batch_size) if c.is_input]
    rng = tf.random.Generator.from_seed(seed)

    def run(xs):
        return model(xs if len(xs) > 1 else xs[0], training=True)

    def forward(*xs):
        return _sync(run(list(xs)))

    def forward_backward(*xs):
        with tf.GradientTape() as tape:
            outs = [o for o in tf.nest.flatten(run(list(xs))) if o.dtype.is_floating]
        variables = list(getattr(model, "trainable_variables", []))
        grads = tape.gradient(outs, variables, output_gradients=[tf.ones_like(o) for o in outs])
        return _sync([outs, [g for g in grads if g is not None]])

    with tf.device(device):
        xs = [_random(s, d, rng) for s, d in specs]
    return compiled(forward, factor), compiled(forward_backward, factor), xs


class _KeepState:
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


def time_keras_model(
    model: Any, batch_size: int, device: str = "/CPU:0", repeats: int = 5, warmup: int = 1, seed: int = 0
) -> Tuple[float, float]:
    """Median (forward_ms, forward+backward_ms) of the whole model on ``device`` (random inputs, tf.function).

    Works on any built Keras model, e.g. a pipeline stage's sub-model: per-stage timing.

    Example:
        >>> f, fb = time_keras_model(model, batch_size=32, device="/CPU:0")     # doctest: +SKIP
    """
    with _KeepState(model):
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
    if not devices:
        raise InputError("no devices given", where="devices")
    if stat not in ("min", "median"):
        raise InputError(f"stat must be 'min' or 'median', got {stat!r}", where="stat")
    with _KeepState(model):
        runs = []
        for d in devices:
            _, fwdbwd, xs = _model_fns(model, batch_size, d, seed)
            runs.append((d, fwdbwd, xs))
        for r in range(warmup + 1):
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
    speed = [1.0 / pick(s) for s in samples]
    if reference is not None:
        if reference not in devices:
            raise InputError(f"reference {reference!r} is not among the devices", where="reference")
        base = speed[list(devices).index(reference)]
    else:
        base = max(speed)
    return [v / base for v in speed]


def _bench_ops(kind: str, size: int, device: str, dtype: Any) -> Tuple[Callable, List[tf.Tensor], float]:
    rng = tf.random.Generator.from_seed(1)
    with tf.device(device):
        if kind == "matmul":
            a = tf.cast(rng.normal([size, size]), dtype)
            b = tf.cast(rng.normal([size, size]), dtype)
            return lambda x, y: _sync(tf.matmul(x, y)), [a, b], 2.0 * size**3
        if kind == "conv":
            hw, c, n = max(size // 16, 4), 64, 4
            x = tf.cast(rng.normal([n, hw, hw, c]), dtype)
            w = tf.cast(rng.normal([3, 3, c, c]), dtype)
            return lambda x, w: _sync(tf.nn.conv2d(x, w, 1, "SAME")), [x, w], 2.0 * n * hw * hw * c * 9 * c
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
        [device],
        kind=kind,
        size=size,
        repeats=repeats,
        warmup=warmup,
        dtype=dtype,
        reference=None,
        absolute=True,
        stat=stat,
    )[0]


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
    if not devices:
        raise InputError("no devices given", where="devices")
    if stat not in ("min", "median"):
        raise InputError(f"stat must be 'min' or 'median', got {stat!r}", where="stat")
    kinds = ["matmul", "conv"] if kind == "both" else [kind]
    gflops = [1.0] * len(devices)
    for k in kinds:
        benches = []
        for d in devices:
            _check_device(d)
            fn, args, flops = _bench_ops(k, size, d, dtype)
            factor = get_slowdown(d)
            with tf.device(d):
                tiny = tf.zeros([1])
            benches.append((d, compiled(fn, factor), args, flops, compiled(_sync, factor), [tiny]))
        samples: Dict[str, List[float]] = {d: [] for d in devices}
        probes: Dict[str, List[float]] = {d: [] for d in devices}
        for r in range(warmup + repeats):
            for d, fn, args, flops, probe, probe_args in benches:
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
        for i, (d, _, _, flops, _, _) in enumerate(benches):
            t = max(pick(samples[d]) - pick(probes[d]), 1e-9)
            gflops[i] *= flops / t / 1e9
    gflops = [g ** (1.0 / len(kinds)) for g in gflops]
    if absolute:
        return gflops
    if reference is not None:
        if reference not in devices:
            raise InputError(f"reference {reference!r} is not among the devices", where="reference")
        base = gflops[list(devices).index(reference)]
    else:
        base = max(gflops)
    return [g / base for g in gflops]


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
        add = compiled(lambda x, y: _sync(x + y), get_slowdown(device))
        t = statistics.median(time_fn(add, [a, b], repeats, 1)) / 1e3
    return Roofline(peak_gflops=peak, mem_gbps=3 * n * 4 / t / 1e9, backward_factor=backward_factor)
