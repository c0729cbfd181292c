"""Bad input to SkipCorrectStrategy: one-line InputErrors at construction."""
import pytest

from tf_commopt.distribute import SkipCorrectStrategy
from tf_commopt.errors import InputError


@pytest.mark.parametrize("kwargs, text", [
    (dict(interval=0), "interval=...): must be >= 1, got 0"),
    (dict(interval=-3), "must be >= 1"),
    (dict(interval=2.5), "must be a positive integer or 'auto', got 2.5"),
    (dict(interval="often"), "must be a positive integer or 'auto', got 'often'"),
    (dict(interval=True), "must be a positive integer or 'auto'"),
    (dict(correction="scaffold"), "correction=...): unknown correction 'scaffold'; expected one of vrl, none"),
    (dict(warmup_steps=-1), "warmup_steps=...): must be a non-negative integer"),
])
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
