"""The simulated grouped-hybrid speed-up against real runs on emulated devices, on 3 configurations.

Logical CPUs (intra-op 1 thread each) emulate capacities with :mod:`tf_commopt.tf.slowdown` (a device of
capacity c sleeps ``4 / c - 1`` times its shortest measured compute: stateless ops, so the emulated
devices overlap, see tests/tf/test_hybrid_slowdown.py), an MLP of 6 Dense(512) layers, global batch 256.
Each run measures data parallel (equal split), capacity-proportional data parallel and the grouped
hybrid with the same ``GroupedHybridTrainer``, interleaved, medians; the simulator gets the strategy's
own groups, plans and batch split and per-layer costs measured on /CPU:0. The real runs need their own
TensorFlow threading, so each runs in a child process (``python -m experiments.hybrid_bench --real_only``).

Asserted (a ``bench``: it runs only when asked for, ``pytest -m bench -s``): for every configuration,
the measured hybrid / data-parallel ratio is within TOLERANCE (relative) of the simulated one. Measured on this machine (2 cores shared with other jobs):
docs/results/hybrid_real.jsonl and docs/results/hybrid.md.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOLERANCE = 0.40


CONFIGS = [("1,0.25", 1, 2), ("1,0.5,0.5", 1, 3), ("1,1,0.5,0.5", 2, 2)]  # capacities, groups, micro-batches


@pytest.mark.bench  # minutes of timed runs, meaningless on a loaded machine: pytest -m bench -s
@pytest.mark.parametrize("caps,groups,microbatches", CONFIGS)
def test_simulated_ratio_matches_emulated_devices(caps, groups, microbatches):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    cmd = [
        sys.executable,
        "-m",
        "experiments.hybrid_bench",
        "--real_only",
        "--json",
        "--real_repeats=6",
        f"--real_capacities={caps}",
        f"--real_groups={groups}",
        f"--real_microbatches={microbatches}",
        "--real_width=512",
        "--real_batch=256",
        "--real_base_slowdown=4",
        "--real_sim_costs=measured",
    ]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    row = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    n = len(caps.split(","))
    from tf_commopt.core.schedule.hybrid import split_batch

    assert row["group_batch_sizes"]["data_parallel"] == split_batch(256, [1.0] * n)
    assert len(row["group_batch_sizes"]["hybrid"]) == groups
    sim, real = row["sim_ratio_hybrid"], row["real_ratio_hybrid"]
    print(
        f"\n[hybrid {caps} G={groups} M={microbatches}] real/simulated hybrid-vs-DP ratio: {real:.3f} / {sim:.3f}"
        f" = {real / sim:.2f}; DP prop.: {row['real_ratio_data_parallel_proportional']:.3f} / "
        f"{row['sim_ratio_data_parallel_proportional']:.3f}"
    )
    assert abs(real / sim - 1) <= TOLERANCE, row


def test_exclusive_devices_changes_order_not_results():
    import numpy as np
    import tf_keras as keras

    from tf_commopt.distribute.hybrid import GroupedHybridTrainer

    def build():
        keras.utils.set_random_seed(3)
        x = keras.Input((6,))
        h = keras.layers.Dense(8, activation="tanh", name="a")(x)
        h = keras.layers.Dense(8, activation="tanh", name="b")(h)
        return keras.Model(x, keras.layers.Dense(3, name="c")(h))

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(10, 6)).astype("float32"), rng.integers(0, 3, 10).astype("int32")
    import tensorflow as tf

    weights, controls = [], []
    for exclusive in (False, True):
        s = GroupedHybridTrainer(
            devices=["/CPU:0", "/CPU:1", "/CPU:2"],
            capacities=[1, 0.5, 1],
            groups=[[0, 1], [2]],
            group_weights=[1, 1],
            microbatches=2,
            method="balanced",
            exclusive_devices=exclusive,
        )
        with s.scope():
            model = build()
            s.compile(
                model,
                optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        for _ in range(2):
            s.train_step(x, y)
        s.sync_model()
        weights.append([w.numpy() for w in model.weights])
        graph = tf.function(s._step).get_concrete_function(tf.constant(x), tf.constant(y)).graph
        controls.append(sum(len(op.control_inputs) for op in graph.get_operations()))
    assert controls[1] > controls[0]  # the device order is enforced by control dependencies
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
