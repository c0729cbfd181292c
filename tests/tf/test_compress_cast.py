"""TensorFlow's casts round as tf_commopt.core.compress does, and its sync runs on tensors unchanged."""

import numpy as np
import tensorflow as tf

from tf_commopt.core import compress


def _values():
    rng = np.random.RandomState(0)
    x = (rng.randn(200000) * 10.0 ** rng.randint(-30, 30, 200000)).astype(np.float32)
    edges = [
        1.00390625,
        1.01171875,
        1.0 + 2**-8 + 2**-20,
        -1.00390625,
        3.3895314e38,
        3.4e38,
        1e-40,
        0.0,
        -0.0,
    ]
    return np.concatenate([x, np.array(edges, np.float32)])


def test_tf_cast_to_bfloat16_is_round_to_nearest_even_like_bf16_bits():
    x = _values()
    got = tf.bitcast(tf.cast(tf.constant(x), tf.bfloat16), tf.uint16).numpy()
    np.testing.assert_array_equal(got, compress.bf16_bits(x))


def test_tf_cast_to_float16_is_numpy_float16():
    x = _values()
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    np.testing.assert_array_equal(
        tf.cast(tf.constant(x), tf.float16).numpy().view(np.uint16), want.view(np.uint16)
    )


def test_the_sync_runs_on_tensors_with_tf_cast_as_the_rounding():
    rng = np.random.RandomState(1)
    x0 = rng.randn(64).astype(np.float32)
    xs = [x0 + (rng.randn(64) * 1e-2).astype(np.float32) for _ in range(4)]
    gs = [rng.randn(64).astype(np.float32) for _ in range(4)]
    for codec, wire in (("bf16", tf.bfloat16), ("fp16", tf.float16)):
        want = compress.compressed_sync(x0, xs, "gradient", 4, grad_sums=gs, codec=codec)
        got = compress.compressed_sync(
            tf.constant(x0),
            [tf.constant(x) for x in xs],
            "gradient",
            4,
            grad_sums=[tf.constant(g) for g in gs],
            codec=codec,
            round_fn=lambda v, wire=wire: tf.cast(tf.cast(v, wire), v.dtype),
        )
        np.testing.assert_array_equal(got.x.numpy(), want.x)
        for a, b in zip(got.deltas + got.residuals, want.deltas + want.residuals):
            np.testing.assert_array_equal(a.numpy(), b)
