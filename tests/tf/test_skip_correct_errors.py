"""Bad input to SkipCorrectStrategy: one-line InputErrors at construction."""

import pytest

from tf_commopt.distribute import SkipCorrectStrategy
from tf_commopt.errors import InputError


@pytest.mark.parametrize(
    "kwargs, text",
    [
        (dict(interval=0), "interval=...): must be >= 1, got 0"),
        (dict(interval=-3), "must be >= 1"),
        (dict(interval=2.5), "must be a positive integer or 'auto', got 2.5"),
        (dict(interval="often"), "must be a positive integer or 'auto', got 'often'"),
        (dict(interval=True), "must be a positive integer or 'auto'"),
        (
            dict(correction="scaffold"),
            "correction=...): unknown correction 'scaffold'; expected one of auto, gradient, vrl, none",
        ),
        (dict(warmup_steps=-1), "warmup_steps=...): must be a non-negative integer"),
        (
            dict(correction_lr="adaptive"),
            "correction_lr=...): must be 'optimizer' or 'effective', got 'adaptive'",
        ),
    ],
)
def test_bad_arguments_are_one_line_errors(kwargs, text):
    with pytest.raises(InputError) as info:
        SkipCorrectStrategy(devices=["/cpu:0", "/cpu:1"], **kwargs)
    assert text in str(info.value)
    assert "\n" not in str(info.value)


def test_auto_interval_and_set_interval():
    s = SkipCorrectStrategy(interval="auto", devices=["/cpu:0", "/cpu:1"])
    assert s.auto_interval and s.interval == 1
    s.set_interval(6)
    assert s.interval == 6 and s.stats()["interval"] == 6
    with pytest.raises(InputError, match="must be >= 1"):
        s.set_interval(0)
    import tensorflow as tf

    assert isinstance(s, tf.distribute.Strategy) and s.num_replicas_in_sync == 2


def test_keras3_as_tf_keras_is_a_clear_error_pointing_to_tf_keras(keras3_jobs):
    line = keras3_jobs["early"]["constructor"]  # tests/tf/_keras3_job.py: Keras 3 is the active tf.keras
    assert line.startswith("ERROR InputError SkipCorrectStrategy: Keras 3 is the active tf.keras"), line
    assert "TF_USE_LEGACY_KERAS=1" in line
