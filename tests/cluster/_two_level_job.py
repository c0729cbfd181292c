"""Two-level averaging on 4 workers as 2 hosts x 2 (``run_cluster(workers=4, tasks_per_host=2)``).

For each codec (none, bf16, int8): softmax regression, custom loop, H = 4, h = 2, vrl, a global sync pipelined in
3 chunks, this worker's own data
(row[TASK] of ``make_batches(9, 4, ...)``): its w, b and Δ of w after every step and the strategy's stats;
then model.fit for 8 steps and evaluate. The numpy reference lives in the test.
"""

import sys

from tests.cluster._worker import _BARRIERS, TASK, emit, new_strategy, tf
from tests.tf.sc_reference import make_batches, softmax_step
from tests.tf.test_two_level import LR, B, C, F, _start
from tf_commopt.distribute import SkipCorrectStrategy

R, H, HOST_H, STEPS = 4, 4, 2, 9


def run(codec: str) -> None:
    strategy = new_strategy(
        SkipCorrectStrategy, interval=H, host_interval=HOST_H, correction="vrl", compression=codec or None
    )
    assert strategy.num_replicas_in_sync == R, strategy.num_replicas_in_sync
    strategy.extended.two_level.chunk_elements = 5  # a global sync in 3 chunks (6, 6, 4 of 16 values)
    w0, b0 = _start()
    with strategy.scope():
        w, b = tf.Variable(w0), tf.Variable(b0)
        opt = tf.keras.optimizers.SGD(LR)
    step = softmax_step(strategy, w, b, opt, R * B)
    trace = {"w": [], "b": [], "d": []}
    batches = make_batches(STEPS, R, B, F, C, seed=3)
    for row in batches:
        step(row)
        trace["w"].append(w.values[0].numpy())
        trace["b"].append(b.values[0].numpy())
        trace["d"].append(strategy.extended.correction_state(opt).delta_numpy()[0][0])
    stats = {k: v for k, v in strategy.stats().items() if isinstance(v, (int, float))}
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(C, input_shape=(F,))])
        model.compile(
            tf.keras.optimizers.SGD(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    x = tf.concat([r[TASK][0] for r in batches], 0)
    y = tf.concat([r[TASK][1] for r in batches], 0)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(R * B).repeat()
    model.fit(data, epochs=1, steps_per_epoch=8, verbose=0)
    fit_stats = strategy.stats()
    loss = model.evaluate(tf.data.Dataset.from_tensor_slices((x, y)).batch(R * B), verbose=0)
    emit(f"twolevel:{codec}", **trace, **stats, fit_host_syncs=fit_stats["host_syncs"], loss=loss)


if __name__ == "__main__":
    _BARRIERS["dir"] = sys.argv[1]
    for codec in sys.argv[2:]:
        run("" if codec == "none" else codec)
