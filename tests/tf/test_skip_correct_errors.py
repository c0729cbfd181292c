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


def test_keras3_as_tf_keras_is_a_clear_error_pointing_to_tf_keras():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    code = (
        "from tf_commopt.distribute import SkipCorrectStrategy\n"
        "from tf_commopt.errors import InputError\n"
        "try:\n    SkipCorrectStrategy(devices=['/cpu:0'])\n"
        "except InputError as e:\n    print('ERR', e)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    try:
        import keras

        keras3 = int(keras.__version__.split(".")[0]) >= 3
    except ImportError:
        keras3 = False
    if keras3:
        assert "ERR SkipCorrectStrategy: Keras 3 is the active tf.keras" in proc.stdout, proc.stderr[-2000:]
        assert "TF_USE_LEGACY_KERAS=1" in proc.stdout
    else:
        assert "ERR" not in proc.stdout
