"""The end-of-fit teardown stall (docs/results/overlap.md): deleting a tf.data iterator whose autotune thread
misses its cancellation wake-up blocks until that thread's next scheduled optimization (up to 60 s in
TF 2.21). tf_commopt.tf.input_teardown turns autotuning off where nothing is tuned: the per-device datasets
of tf.distribute's MultiDeviceIterator (device_iterators_without_autotune, which tests/tf/conftest.py
applies to the whole tier) and, per dataset, no_autotune."""

import time

import pytest
import tensorflow as tf
from tensorflow.python.data.ops import multi_device_iterator_ops

from tf_commopt.tf import input_teardown


def test_per_device_datasets_are_built_without_autotune_once():
    input_teardown.device_iterators_without_autotune()
    wrapper = multi_device_iterator_ops._create_device_dataset
    input_teardown.device_iterators_without_autotune()  # idempotent: not wrapped twice
    assert multi_device_iterator_ops._create_device_dataset is wrapper
    assert not getattr(wrapper.__wrapped__, "_tf_commopt_no_autotune", False)

    it = multi_device_iterator_ops.OwnedMultiDeviceIterator(tf.data.Dataset.range(5), ["/cpu:0"])
    (device_iterator,) = it._device_iterators
    assert device_iterator._dataset.options().autotune.enabled is False
    assert [int(next(it)[0]) for _ in range(5)] == [0, 1, 2, 3, 4]  # same elements


def test_no_autotune_keeps_the_elements_and_other_options():
    opts = tf.data.Options()
    opts.deterministic = True
    ds = input_teardown.no_autotune(tf.data.Dataset.range(4).with_options(opts).prefetch(2))
    assert ds.options().autotune.enabled is False and ds.options().deterministic is True
    assert [int(x) for x in ds] == [0, 1, 2, 3]


def _worst_deletion_s(ds, repeats: int) -> float:
    worst = 0.0
    for _ in range(repeats):
        it = iter(ds)
        start = time.perf_counter()
        while time.perf_counter() - start < 0.3:
            next(it)
        start = time.perf_counter()
        del it
        worst = max(worst, time.perf_counter() - start)
    return worst


@pytest.mark.bench
def test_bench_deleting_an_iterator_with_and_without_autotune():
    """Timing, printed side by side (``pytest -m bench -s``), never asserted: with autotuning on a deletion
    can wait for the autotune thread's next scheduled optimization; without it there is nothing to wait for."""
    data = tf.data.Dataset.range(10**9).batch(4).prefetch(2)
    rows = []
    for _ in range(3):  # alternated, so both see the same machine load
        rows.append((_worst_deletion_s(data, 5), _worst_deletion_s(input_teardown.no_autotune(data), 5)))
    print(
        "\nworst iterator deletion, s (autotune on / off):", ", ".join(f"{a:.3f} / {b:.3f}" for a, b in rows)
    )
