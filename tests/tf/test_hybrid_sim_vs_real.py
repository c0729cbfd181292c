"""The simulated grouped-hybrid speed-up against real runs on emulated devices.

Two logical CPUs (intra-op 1 thread each, so on this 2-core machine they do not take cores from each
other), capacities 1 and 0.25 emulated with :mod:`tf_commopt.tf.slowdown` (the slow device sleeps 3x
its measured compute), an MLP of 6 Dense(1024) layers, global batch 512. One run measures data
parallel (equal split) and the grouped hybrid (one 2-stage GPipe group, M = 4) with the same
``GroupedHybridStrategy``, interleaved, medians; the simulator gets the strategy's own plans and
batch split. The real run needs its own TensorFlow threading, so it runs in a child process
(``python -m experiments.hybrid_bench --real_only``).

What is asserted: the real run works with the planned batch splits, the simulated ratio is well below 1
from first principles, and the measured hybrid is faster than data parallel (ratio < 0.9: a wide margin,
since speed is measured in benchmarks, not asserted in timed tests). The agreement between measured and
simulated ratios is printed and recorded in docs/results/hybrid.md; the bench's stated tolerance is 40%.
With this set-up, 6 runs on this machine (2 cores shared with other jobs, load average 2-10) gave measured/simulated = 0.72, 0.79, 0.83, 0.95, 0.96 and 1.04 (the last with 4 devices); all set-ups
tried during development ranged from 0.66 to 1.30 (docs/results/hybrid.md explains the spread and the
bias). The simulated ratio is about 0.5, so the band still excludes "no speed-up".
"""
import json
import os
import subprocess
import sys

import pytest

from tf_commopt.core.simulate.hybrid import snake_groups
from tf_commopt.distribute.hybrid import form_groups

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOLERANCE = 0.40


def test_snake_groups_match_the_strategy():
    for caps in ([1, 1, 1, 0.5], [1, 0.5, 0.25, 1, 1, 0.5], [1, 1, 1, 1, 0.5, 0.5, 0.25, 0.25], [0.3, 2, 1]):
        for g in range(1, len(caps) + 1):
            assert snake_groups(caps, g) == form_groups(caps, g)


def test_simulated_ratio_matches_emulated_devices():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "experiments.hybrid_bench", "--real_only", "--json", "--real_repeats=10",
           "--real_capacities=1,0.25", "--real_width=1024", "--real_batch=512", "--real_microbatches=4"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    row = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    assert row["group_batch_sizes"]["data_parallel"] == [256, 256]
    assert row["group_batch_sizes"]["hybrid"] == [512]
    sim, real = row["sim_ratio_hybrid"], row["real_ratio_hybrid"]
    # the simulated speed-up itself, from first principles: DP = 0.5 T / 0.25; the hybrid's plan is the
    # strategy's (checked against the simulator in tests/core); both well below 1
    assert 0.3 < sim < 0.8
    print(f"\n[hybrid] real/simulated hybrid-vs-data-parallel ratio: {real:.3f} / {sim:.3f} = {real / sim:.2f} "
          f"(bench tolerance {TOLERANCE:.0%})")
    assert real < 0.9, row


def test_exclusive_devices_changes_order_not_results():
    import numpy as np
    import tf_keras as keras

    from tf_commopt.distribute.hybrid import GroupedHybridStrategy

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
        s = GroupedHybridStrategy(devices=["/CPU:0", "/CPU:1", "/CPU:2"], capacities=[1, 0.5, 1],
                                  groups=[[0, 1], [2]], group_weights=[1, 1], microbatches=2, method="balanced",
                                  exclusive_devices=exclusive)
        with s.scope():
            model = build()
            s.compile(model, optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        for _ in range(2):
            s.train_step(x, y)
        s.sync_model()
        weights.append([w.numpy() for w in model.weights])
        graph = tf.function(s._step).get_concrete_function(tf.constant(x), tf.constant(y)).graph
        controls.append(sum(len(op.control_inputs) for op in graph.get_operations()))
    assert controls[1] > controls[0]  # the device order is enforced by control dependencies
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
