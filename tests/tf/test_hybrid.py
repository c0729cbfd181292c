"""GroupedHybridStrategy: one hybrid step equals single-device training on the same global batch."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_commopt.core.partition.plan import PartitionPlan
from tf_commopt.distribute.hybrid import GroupedHybridStrategy, form_groups, split_batch
from tf_commopt.errors import InputError

CPUS = ["/CPU:0", "/CPU:1", "/CPU:2", "/CPU:3"]


def small_model():
    """Four dense layers with a skip from the first to the last block."""
    keras.utils.set_random_seed(7)
    x = keras.Input((6,), name="x")
    a = keras.layers.Dense(8, activation="tanh", name="a")(x)
    b = keras.layers.Dense(8, activation="tanh", name="b")(a)
    c = keras.layers.Dense(8, name="c")(b)
    r = keras.layers.Add(name="res")([a, c])
    return keras.Model(x, keras.layers.Dense(3, name="out")(r), name="small")


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 6)).astype("float32"), rng.integers(0, 3, size=(n,)).astype("int32")


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def single_device(model, batches, lr=0.1, momentum=0.9):
    ref = keras.models.clone_model(model)
    ref.set_weights(model.get_weights())
    opt = keras.optimizers.SGD(lr, momentum=momentum)
    first_grads = None
    for x, y in batches:
        with tf.GradientTape() as tape:
            loss = LOSS(y, ref(x, training=True))
        grads = tape.gradient(loss, ref.trainable_variables)
        first_grads = first_grads or [g.numpy() for g in grads]
        opt.apply_gradients(zip(grads, ref.trainable_variables))
    return first_grads, [v.numpy() for v in ref.trainable_variables]


def test_pure_rules():
    assert form_groups([1, 1, 1, 0.5], 2) == [[0, 3], [1, 2]]
    assert form_groups([1, 0.5, 0.25, 1, 1, 0.5], 3) == [[0, 2], [3, 5], [1, 4]]
    assert split_batch(10, [1.5, 2.0]) == [4, 6]
    assert split_batch(3, [100, 1, 1]) == [1, 1, 1]
    for b, w in [(17, [1, 2, 3]), (64, [0.3, 0.3, 0.4]), (5, [1, 1])]:
        s = split_batch(b, w)
        assert sum(s) == b and all(abs(si - b * wi / sum(w)) < 1 for si, wi in zip(s, w))
    with pytest.raises(InputError, match="cannot feed 3 groups"):
        split_batch(2, [1, 1, 1])


def test_hybrid_step_equals_single_device_with_uneven_group_batches():
    """2 groups x 2 logical CPUs, hand-made plans, groups get 4 and 6 samples of a batch of 10."""
    model = small_model()
    plans = [
        PartitionPlan("hand", {"x": 0, "a": 0, "b": 0, "c": 1, "res": 1, "out": 1}, [1, 0], [0, 0], [0, 0],
                      [0, 0], 0.0, 0.0),  # stage 0 on the group's second device
        PartitionPlan("hand", {"a": 0, "b": 1, "c": 1, "res": 1, "out": 1}, [0, 1], [0, 0], [0, 0], [0, 0], 0.0, 0.0),
    ]
    strategy = GroupedHybridStrategy(devices=CPUS, capacities=[1, 1, 1, 0.5], num_groups=2, microbatches=2,
                                     plans=plans)
    assert strategy.groups == [[0, 3], [1, 2]]
    with strategy.scope():
        strategy.compile(model, optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=LOSS)
    assert strategy.group_batch_sizes(10) == [4, 6]  # capacities 1.5 : 2
    batches = [data(10, seed) for seed in (1, 2)]
    ref_grads, ref_w = single_device(model, batches)

    loss, reduced = tf.function(strategy.compute_gradients)(*batches[0])
    with tf.GradientTape() as tape:
        ref_loss = LOSS(batches[0][1], model(batches[0][0], training=True))
    assert abs(float(loss) - float(ref_loss)) < 1e-5
    for g, pipe in enumerate(strategy.pipelines):  # each group holds the all-reduced global gradient
        for j, k in enumerate(strategy._index[g]):
            np.testing.assert_allclose(reduced[g][j].numpy(), ref_grads[k], atol=1e-5, rtol=0)
    for x, y in batches:
        strategy.train_step(x, y)
    for pipe in strategy.pipelines:
        for w, r in zip(pipe.model.trainable_weights, ref_w):
            np.testing.assert_allclose(w.numpy(), r, atol=1e-5, rtol=0)
    strategy.sync_model()
    for w, r in zip(model.trainable_weights, ref_w):
        np.testing.assert_allclose(w.numpy(), r, atol=1e-5, rtol=0)
    assert strategy.pipelines[0].stage_devices[0].endswith("CPU:3")


def test_capacity_aware_partition_and_model_fit():
    """Default path: Keras importer + partitioner per group; the slow device gets the smaller segment;
    model.fit runs the hybrid step and leaves the trained weights in the user's model."""
    model = small_model()
    strategy = GroupedHybridStrategy(devices=CPUS, capacities=[1, 0.25, 1, 0.25], groups=[[0, 1], [2, 3]],
                                     microbatches=2, method="balanced", emulate=True)
    with strategy.scope():
        strategy.compile(model, optimizer=keras.optimizers.SGD(0.05), loss=LOSS)
    for plan in strategy.plans:
        slow_stage = plan.device_of_stage.index(1)
        compute = [sum(1 for _ in plan.nodes_of_stage(s)) for s in range(plan.num_stages)]
        assert compute[slow_stage] < compute[1 - slow_stage], plan
    assert strategy.slowdown == {"/device:CPU:1": 4.0, "/device:CPU:3": 4.0}
    x, y = data(16, seed=3)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)
    _, ref_w = single_device(model, [(x[:8], y[:8]), (x[8:], y[8:])], lr=0.05, momentum=0.0)
    model.fit(ds, epochs=1, verbose=0)
    for w, r in zip(model.trainable_weights, ref_w):
        np.testing.assert_allclose(w.numpy(), r, atol=1e-5, rtol=0)
