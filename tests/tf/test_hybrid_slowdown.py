"""Emulated slow devices overlap: two slowed computations on two devices inside one tf.function sleep
at the same time (the emulation is made of stateless ops, so TensorFlow does not order them)."""

import time

import numpy as np
import tensorflow as tf

from tf_commopt.tf.slowdown import sleep_log, slowed


def _work(x):
    for _ in range(20):
        x = tf.tanh(tf.matmul(x, x) * 0.01)
    return x


def test_two_slowed_devices_overlap():
    x = tf.constant(np.random.default_rng(0).normal(size=(64, 64)).astype("float32"))

    @tf.function
    def step(x):
        outs = []
        for dev in ("/CPU:0", "/CPU:1"):
            with tf.device(dev):
                outs.append(slowed(_work, 400.0)(x))  # ~1 ms of work -> ~400 ms of sleep each
        return outs

    step(x)  # trace
    sleep_log(clear=True)
    t0 = time.perf_counter()
    a, b = step(x)
    wall = time.perf_counter() - t0
    np.testing.assert_allclose(a.numpy(), _work(x).numpy(), rtol=1e-5, atol=1e-6)
    log = sleep_log(clear=True)
    assert len(log) == 2, log
    (s0, e0, d0), (s1, e1, d1) = sorted(log)
    overlap = min(e0, e1) - max(s0, s1)
    assert overlap > 0.5 * min(d0, d1), log  # they sleep at the same time, not one after the other
    assert wall < e0 - s0 + e1 - s1, (wall, log)  # the step is shorter than the two sleeps in sequence


def test_slowed_inside_a_tf_function_keeps_program_semantics():
    v = tf.Variable(1.0)

    @tf.function
    def f(x):
        y = slowed(lambda t: t * v, 3.0)(x)
        v.assign_add(1.0)
        return y

    assert float(f(tf.constant(2.0))) == 2.0
    assert float(v) == 2.0
