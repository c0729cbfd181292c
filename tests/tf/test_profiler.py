"""Measured costs: per-layer profile, device capacity, emulated slow devices (logical CPUs of conftest)."""

import time

import keras as keras3
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from tf_commopt.errors import InputError
from tf_commopt.tf.graph_import import from_keras_model
from tf_commopt.tf.profiler import (
    device_capacity,
    measure_roofline,
    model_capacities,
    profile_keras_model,
    relative_capacities,
    slowdowns,
    time_keras_model,
)
from tf_commopt.tf.slowdown import clear_slowdowns, get_slowdown, set_slowdown, sleep_log, slowed

pytestmark = pytest.mark.filterwarnings("ignore::tf_commopt.tf.op_costs.CostEstimateWarning")


def convnet(K):
    L = K.layers
    x = L.Input((32, 32, 16), name="img")
    h = L.Conv2D(64, 3, padding="same", name="conv")(x)
    r = L.ReLU(name="relu")(L.BatchNormalization(name="bn")(h))
    y = L.Add(name="skip")([h, r])
    return K.Model(x, L.Dense(10, name="fc")(L.GlobalAveragePooling2D(name="gap")(y)), name="convnet")


@pytest.mark.parametrize("K", [tf_keras, keras3], ids=["tf_keras", "keras3"])
def test_profile_has_the_layer_graph_and_positive_medians(K):
    m = convnet(K)
    before = [w.numpy().copy() for w in m.weights]
    raw = profile_keras_model(m, batch_size=16, device="/CPU:0", repeats=5, subtract_overhead=False)
    ref = from_keras_model(m, batch_size=16)
    assert set(raw.nodes) == set(ref.nodes) and set(raw.edges) == set(ref.edges)
    for n in raw:
        assert raw[n].param_bytes == ref[n].param_bytes and raw[n].activation_bytes == ref[n].activation_bytes
        assert raw[n].backward_ms >= 0
        assert (raw[n].forward_ms > 0) == (n != "img"), n  # wall-clock medians
    assert raw["conv"].backward_ms > 0  # gradients w.r.t. input and kernel: ~2x the forward work
    net = profile_keras_model(m, batch_size=16, device="/CPU:1", repeats=3)
    assert all(net[n].forward_ms >= 0 for n in net) and net.total_ms() > 0
    for a, w in zip(before, m.weights):  # BatchNorm moving statistics restored
        np.testing.assert_array_equal(a, w.numpy())


def test_calibrated_profile_adds_up_to_the_whole_model():
    m = convnet(tf_keras)
    g = profile_keras_model(m, batch_size=4, repeats=2, calibrate=(10.0, 35.0))
    assert sum(n.forward_ms for n in g.nodes.values()) == pytest.approx(10.0)
    assert sum(n.backward_ms for n in g.nodes.values()) == pytest.approx(25.0)
    with pytest.raises(InputError, match="calibrate"):
        profile_keras_model(m, batch_size=4, calibrate=(5.0, 1.0))


def test_profile_bad_arguments():
    m = convnet(tf_keras)
    with pytest.raises(InputError, match="GPU:7"):
        profile_keras_model(m, batch_size=2, device="/GPU:7")
    with pytest.raises(InputError, match="repeats"):
        profile_keras_model(m, batch_size=2, repeats=0)


def _sleepy(ms):
    """Work of a known, load-independent duration: ``ms`` of sleeping inside the graph."""

    def work(x):
        done = tf.py_function(lambda: time.sleep(ms / 1e3) or 0.0, [], tf.float32)
        with tf.control_dependencies([done]):
            return x * 2.0

    return work


@pytest.mark.parametrize("in_graph", [False, True])
def test_slowed_stretches_wall_time_by_the_factor(in_graph):
    """``slowed(fn, 3)`` releases the outputs ``t + 2 t_min`` after the inputs (the module's rule), checked
    against the sleep log rather than a wall-clock window, so a loaded machine cannot break it: the wrapped
    work holds a 60 ms sleep (every ``t`` >= 60 ms), so each call asks for >= 120 ms more and takes >= 180 ms
    in all; the delay asked for is 2 x the shortest work measured so far, hence never more than 2 x any
    call's own work (its wall time minus the delay), and it never grows."""
    fn = slowed(_sleepy(60), 3.0)
    if in_graph:
        fn = tf.function(fn)
    fn(tf.ones([3]))  # trace / warm up
    sleep_log(clear=True)
    x = tf.constant([1.0, 2.0, 3.0])
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        y = fn(x).numpy()
        walls.append(time.perf_counter() - t0)
        np.testing.assert_array_equal(y, [2.0, 4.0, 6.0])
    log = sleep_log(clear=True)
    assert len(log) == 3  # one emulated delay per call
    work = [wall - (end - start) for wall, (start, end, _) in zip(walls, log)]  # >= the wrapped work's t
    asked = [s for _, _, s in log]
    for k, (start, end, s) in enumerate(log):
        assert s >= 2 * 0.060  # (factor - 1) x a work time that holds a 60 ms sleep
        assert end - start >= s  # it slept at least what it asked
        assert s <= 2 * min(work[: k + 1]) + 1e-6  # (factor - 1) x the shortest work so far, never more
        assert walls[k] >= 0.060 + s  # work + delay: at least 3 x 60 ms
    assert asked == sorted(asked, reverse=True)  # the calibration is a running minimum


def test_slowed_keeps_gradients():
    w = tf.Variable([[1.0, 2.0], [3.0, 4.0]])
    x = tf.constant([[0.5, -1.0]])

    def f(v):
        return tf.reduce_sum(tf.tanh(tf.matmul(v, w)))

    with tf.GradientTape() as t1:
        a = f(x)
    with tf.GradientTape() as t2:
        b = slowed(f, 2.0)(x)
    np.testing.assert_allclose(t1.gradient(a, w).numpy(), t2.gradient(b, w).numpy())
    assert float(a) == float(b)


def test_slowdown_registry():
    with slowdowns({}):  # restores the process-wide registry afterwards
        _registry_checks()


def _registry_checks():
    clear_slowdowns()
    set_slowdown("/CPU:2", 2.5)
    assert (
        get_slowdown("/device:CPU:2") == 2.5
        and get_slowdown("cpu:2") == 2.5
        and get_slowdown("/CPU:0") == 1.0
    )
    with slowdowns({"/CPU:0": 4.0}):
        assert get_slowdown("/CPU:0") == 4.0 and get_slowdown("/CPU:2") == 2.5
    assert get_slowdown("/CPU:0") == 1.0
    set_slowdown("/CPU:2", 1.0)
    assert get_slowdown("/CPU:2") == 1.0
    for bad in (0.5, float("nan"), "fast"):
        with pytest.raises(InputError, match="slow-down factor"):
            set_slowdown("/CPU:1", bad)


def test_slowed_device_measures_slower_by_its_factor():
    """Matmul benchmark, interleaved across devices; bounds are loose: the 2 cores are shared."""
    with slowdowns({"/CPU:1": 2.0, "/CPU:2": 4.0}):
        caps = relative_capacities(["/CPU:0", "/CPU:1", "/CPU:2"], size=512, repeats=80)
    assert caps[0] == 1.0
    assert 1.3 < 1 / caps[1] < 3.5, caps
    assert 2.5 < 1 / caps[2] < 7.0, caps
    assert caps[2] < caps[1]


def sleepy_model(ms):
    """A model whose forward takes ``ms`` of sleep on top of a Dense: work that ignores CPU load."""
    L = tf_keras.layers
    x = L.Input((4,))
    h = L.Dense(4, name="d")(x)
    return tf_keras.Model(x, L.Lambda(_sleepy(ms), name="sleep")(h))


def test_model_capacities_see_the_slowdown():
    m = sleepy_model(15)
    with slowdowns({"/CPU:2": 2.0, "/CPU:3": 3.0}):
        caps = model_capacities(m, 4, ["/CPU:3", "/CPU:0", "/CPU:2"], reference="/CPU:0", repeats=8)
    assert caps[1] == 1.0
    assert 1.6 < 1 / caps[2] < 2.6 and 2.4 < 1 / caps[0] < 3.8, caps
    f, fb = time_keras_model(m, 4, device="/CPU:0", repeats=3)
    assert 15 <= f <= fb


def test_capacity_and_roofline_are_positive():
    gf = device_capacity("/CPU:3", kind="both", size=256, repeats=3)
    assert 0.1 < gf < 1e5
    r = measure_roofline("/CPU:3", size=256, mbytes=8, repeats=3)
    assert r.peak_gflops > 0.1 and r.mem_gbps > 0.05
    with pytest.raises(InputError, match="kind"):
        device_capacity("/CPU:0", kind="fft")
    with pytest.raises(InputError, match="no such device"):
        device_capacity("/GPU:0")


def test_calibration_with_every_layer_measured_zero_splits_by_activation_bytes():
    from tf_commopt.core.costgraph import CostGraph, Node
    from tf_commopt.tf.op_costs import CostEstimateWarning
    from tf_commopt.tf.profiler import _scaled

    g = CostGraph([Node("a", 0.0, 0.0, 0, 100), Node("b", 0.0, 0.0, 0, 300)], [("a", "b")], name="m")
    with pytest.warns(CostEstimateWarning, match="every per-layer time measured 0 ms"):
        s = _scaled(g, 8.0, 4.0)
    assert [(n.forward_ms, n.backward_ms) for n in s.nodes.values()] == [(2.0, 1.0), (6.0, 3.0)]
    measured = CostGraph([Node("a", 1.0, 3.0, 0, 100), Node("b", 3.0, 1.0, 0, 300)], [("a", "b")], name="m")
    s = _scaled(measured, 8.0, 4.0)  # measured times: their proportions
    assert [(n.forward_ms, n.backward_ms) for n in s.nodes.values()] == [(2.0, 3.0), (6.0, 1.0)]
