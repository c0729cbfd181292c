"""The grouped hybrid and data parallel run for real on emulated devices, next to their simulation
(``python -m experiments.hybrid_bench --real`` / ``--real_only``; docs/results/hybrid_real.md).

Devices ``/CPU:0..N-1`` (logical CPUs) of capacity ``c`` run ``base_slowdown / c`` times slower
(:mod:`tf_commopt.tf.slowdown`: stateless sleeps, so the devices overlap; a large ``base_slowdown`` makes
the sleeps dominate the CPU time the devices share). The model is an MLP of ``depth`` Dense(``width``)
layers. The same :class:`GroupedHybridTrainer` runs all three configurations: data parallel = one group
per device (``group_weights`` equal, or the capacities), hybrid = ``num_groups`` groups (its
capacity-aware plans, M micro-batches). The timed steps are interleaved (one step of each configuration
per round) and medians are reported, so slow drifts of the shared machine's load hit all configurations
alike. The simulation uses the strategy's own groups, plans and batch split, per-layer costs from
``sim_costs`` (``"roofline"``: :func:`tf_commopt.tf.graph_import.from_keras_model`; ``"measured"``:
:func:`tf_commopt.tf.profiler.profile_keras_model` on ``/CPU:0``) and free communication (in one process a
transfer is a memory copy); only ratios are compared (``sim_ms`` is in the cost graph's units times
``base_slowdown``).

Example:
    >>> row = real_vs_sim([1.0, 0.5], base_slowdown=4.0, width=64, depth=2, repeats=3)  # doctest: +SKIP
    >>> row["real_ratio_hybrid"], row["sim_ratio_hybrid"]                               # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from typing import Any, Callable, Dict, List, Sequence

from tf_commopt.core.devices import Cluster
from tf_commopt.core.planner import plan_hybrid
from tf_commopt.core.simulate.hybrid import ideal_iteration_ms, simulate_grouped_hybrid

__all__ = ["init_tf", "real_vs_sim"]


def init_tf(num_devices: int, inter_op_threads: int = 16, intra_op_threads: int = 1):
    """Import TensorFlow with ``num_devices`` logical CPUs (call before any other TensorFlow use)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    try:
        if inter_op_threads:
            tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
        if intra_op_threads:
            tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
        tf.config.set_logical_device_configuration(
            tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * num_devices
        )
    except RuntimeError:  # already initialised (e.g. under pytest's tf tier): use what exists
        pass
    return tf


def _mlp(width: int, depth: int) -> Any:
    import tf_keras as keras

    keras.utils.set_random_seed(0)
    x = keras.Input((width,), name="x")
    h = x
    for i in range(depth):
        h = keras.layers.Dense(width, activation="relu", name=f"d{i}")(h)
    return keras.Model(x, keras.layers.Dense(10, name="logits")(h))


def _strategies(
    capacities: Sequence[float],
    build: Callable[[], Any],
    data: tuple,
    num_groups: int,
    microbatches: int,
    **kw,
) -> Dict[str, Any]:
    """The three configurations of ``build()``'s model, compiled and stepped twice (tracing and warm-up
    out of the timings); ``kw`` goes to every GroupedHybridTrainer (slowdown, exclusive_devices)."""
    import tf_keras as keras

    from tf_commopt.distribute.hybrid import GroupedHybridTrainer

    n = len(capacities)
    devices = [f"/CPU:{i}" for i in range(n)]
    singles = [[i] for i in range(n)]
    configs = {
        "data_parallel": dict(groups=singles, group_weights=[1.0] * n, microbatches=1),
        "data_parallel_proportional": dict(groups=singles, group_weights=list(capacities), microbatches=1),
        "hybrid": dict(num_groups=num_groups, microbatches=microbatches, method="balanced"),
    }
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    out = {}
    for name, config in configs.items():
        s = GroupedHybridTrainer(devices=devices, capacities=list(capacities), **config, **kw)
        with s.scope():
            s.compile(build(), optimizer=keras.optimizers.SGD(0.01), loss=loss)
        s.train_step(*data)
        s.train_step(*data)
        out[name] = s
    return out


def _interleaved_ms(strategies: Dict[str, Any], data: tuple, repeats: int) -> Dict[str, List[float]]:
    """Step times in ms, one step of each configuration per round."""
    times: Dict[str, List[float]] = {k: [] for k in strategies}
    for _ in range(repeats):
        for name, s in strategies.items():
            t0 = time.perf_counter()
            s.train_step(*data)
            times[name].append((time.perf_counter() - t0) * 1e3)
    return times


def _simulated_ms(
    strategies: Dict[str, Any], graph: Any, cluster: Cluster, batch: int, base_slowdown: float
) -> Dict[str, float]:
    """Each configuration's simulated iteration (its own groups, plans and batch split), times the slowdown."""
    sim = {}
    for name, s in strategies.items():
        hp = plan_hybrid(
            graph,
            cluster,
            s.groups,
            microbatches=s.microbatches,
            plans=s.graph_plans,
            weights=s.group_batch_sizes(batch),
        )
        r = simulate_grouped_hybrid(graph, cluster, hp, overlap=s.overlap, bucket_bytes=s.bucket_bytes)
        sim[name] = r.iteration_ms * base_slowdown
    return sim


def real_vs_sim(
    capacities: Sequence[float],
    base_slowdown: float = 1.0,
    width: int = 1024,
    depth: int = 6,
    batch: int = 512,
    microbatches: int = 4,
    repeats: int = 15,
    num_groups: int = 1,
    profile_repeats: int = 5,
    inter_op_threads: int = 16,
    intra_op_threads: int = 1,
    exclusive: bool = True,
    sim_costs: str = "roofline",
) -> dict:
    """Measure grouped hybrid and data parallel (equal and proportional split) on emulated devices and
    simulate the same configurations (module docstring). Returns one JSON-able row: medians and quartiles
    of the measured step times, the simulated ones, and both sets of ratios to equal-split data parallel."""
    import numpy as np

    tf = init_tf(len(capacities), inter_op_threads, intra_op_threads)
    from tf_commopt.tf.graph_import import from_keras_model
    from tf_commopt.tf.profiler import profile_keras_model

    slow = {f"/CPU:{i}": base_slowdown / c for i, c in enumerate(capacities) if base_slowdown / c > 1.0}
    rng = np.random.default_rng(0)
    data = (
        tf.constant(rng.normal(size=(batch, width)).astype("float32")),
        tf.constant(rng.integers(0, 10, batch).astype("int32")),
    )
    build = functools.partial(_mlp, width, depth)
    strategies = _strategies(
        capacities, build, data, num_groups, microbatches, slowdown=slow, exclusive_devices=exclusive
    )
    times = _interleaved_ms(strategies, data, repeats)
    real = {k: statistics.median(v) for k, v in times.items()}
    hyb = strategies["hybrid"]
    if sim_costs == "measured":
        graph = profile_keras_model(hyb.model, batch_size=batch, device="/CPU:0", repeats=profile_repeats)
    else:
        graph = from_keras_model(hyb.model, batch_size=batch)
    cluster = Cluster.from_capacities(list(capacities), bandwidth_gbps=1e9)
    sim = _simulated_ms(strategies, graph, cluster, batch, base_slowdown)
    out = dict(profile=f"mlp{depth}x{width}", capacities=list(capacities), base_slowdown=base_slowdown)
    out.update(batch=batch, microbatches=microbatches, repeats=repeats, exclusive_devices=exclusive)
    out.update(sim_costs=sim_costs, groups=hyb.groups, stage_layers=hyb.stats()["stage_layers"])
    out["group_batch_sizes"] = {k: s.group_batch_sizes(batch) for k, s in strategies.items()}
    out["real_ms"] = real
    out["real_iqr_ms"] = {
        k: [float(np.percentile(v, 25)), float(np.percentile(v, 75))] for k, v in times.items()
    }
    out.update(sim_ms=sim, profile_total_ms=graph.total_ms())
    out.update(hybrid_iteration_ms=real["hybrid"], data_parallel_iteration_ms=real["data_parallel"])
    out["ideal_iteration_ms"] = ideal_iteration_ms(graph, cluster) * base_slowdown
    for k in ("hybrid", "data_parallel_proportional"):
        out[f"real_ratio_{k}"] = real[k] / real["data_parallel"]
        out[f"sim_ratio_{k}"] = sim[k] / sim["data_parallel"]
    return out
