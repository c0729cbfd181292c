"""GroupedHybridTrainer: one hybrid step equals single-device training on the same global batch."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_commopt.core.plan import PartitionPlan
from tf_commopt.core.planner import snake_groups
from tf_commopt.distribute.hybrid import GroupedHybridTrainer, split_batch
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
    assert snake_groups([1, 1, 1, 0.5], 2) == [[0, 3], [1, 2]]
    assert snake_groups([1, 0.5, 0.25, 1, 1, 0.5], 3) == [[0, 2], [3, 5], [1, 4]]
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
        PartitionPlan(
            "hand",
            {"x": 0, "a": 0, "b": 0, "c": 1, "res": 1, "out": 1},
            [1, 0],
            [0, 0],
            [0, 0],
            [0, 0],
            0.0,
            0.0,
        ),  # stage 0 on the group's second device
        PartitionPlan(
            "hand", {"a": 0, "b": 1, "c": 1, "res": 1, "out": 1}, [0, 1], [0, 0], [0, 0], [0, 0], 0.0, 0.0
        ),
    ]
    strategy = GroupedHybridTrainer(
        devices=CPUS, capacities=[1, 1, 1, 0.5], num_groups=2, microbatches=2, plans=plans, bandwidth_gbps=1e9
    )  # free links: the reference ignores them
    assert strategy.groups == [[0, 3], [1, 2]]
    with strategy.scope():
        strategy.compile(model, optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=LOSS)
    # the batch split: 1 / (each group's GPipe pipeline alone), from an independent recurrence
    times = [_gpipe_alone(strategy, g) for g in range(2)]
    assert strategy.group_batch_sizes(11) == split_batch(11, [1 / t for t in times])
    assert len(set(strategy.group_batch_sizes(11))) == 2  # uneven
    batches = [data(11, seed) for seed in (1, 2)]
    ref_grads, ref_w = single_device(model, batches)

    loss, reduced = tf.function(strategy.compute_gradients)(*batches[0])
    ref_loss = LOSS(batches[0][1], model(batches[0][0], training=True))
    assert abs(float(loss) - float(ref_loss)) < 1e-5
    for g in range(len(strategy.pipelines)):  # each group holds the all-reduced global gradient
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


def _gpipe_alone(strategy, g):
    """Group g's GPipe iteration alone on the whole batch (free communication), by a numpy recurrence."""
    plan, M = strategy.graph_plans[g], strategy.microbatches
    caps = [strategy.capacities[i] for i in strategy.groups[g]]
    P = plan.num_stages
    f = np.zeros(P)
    b = np.zeros(P)
    for v, st in plan.stage_of_node.items():
        c = caps[plan.device_of_stage[st]]
        f[st] += strategy.graph[v].forward_ms / c / M
        b[st] += strategy.graph[v].backward_ms / c / M
    fe, be = np.zeros((P, M)), np.zeros((P, M))
    for s in range(P):
        for i in range(M):
            fe[s, i] = max(fe[s - 1, i] if s else 0, fe[s, i - 1] if i else 0) + f[s]
    for s in reversed(range(P)):
        prev = fe[s, M - 1]
        for i in reversed(range(M)):
            be[s, i] = max(be[s + 1, i] if s < P - 1 else 0, prev) + b[s]
            prev = be[s, i]
    return be.max()


@pytest.mark.parametrize("overlap", [True, False])
def test_executor_runs_the_simulators_streams(overlap):
    """The executor's program is the simulator's (same streams, roles, buckets, batch split); one step
    executes every instruction once and equals single-device training."""
    from tf_commopt.core.devices import Cluster
    from tf_commopt.core.planner import plan_hybrid
    from tf_commopt.core.simulate.hybrid import grouped_hybrid_job

    model = small_model()
    caps = [1, 0.5, 1, 0.25]
    strategy = GroupedHybridTrainer(
        devices=CPUS,
        capacities=caps,
        groups=[[0, 1], [2, 3]],
        microbatches=3,
        method="balanced",
        overlap=overlap,
        bucket_bytes=300,
    )
    with strategy.scope():
        strategy.compile(model, optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    cluster = Cluster.from_capacities(caps, 10.0)
    hp = plan_hybrid(strategy.graph, cluster, strategy.groups, microbatches=3, plans=strategy.graph_plans)
    job, prog = grouped_hybrid_job(strategy.graph, cluster, hp, overlap=overlap, bucket_bytes=300)
    fr = hp.batch_fractions
    assert job.schedule == strategy.schedule and prog == strategy.program
    assert len(prog.buckets) >= 3  # several buckets (300-byte cap), so several all-reduces
    assert overlap == (len(prog.roles) > 4)  # piece ranks only with overlap
    w = strategy.group_weights
    np.testing.assert_allclose([x / sum(w) for x in w], fr, rtol=1e-12)
    x, y = data(12, seed=5)
    loss, reduced = tf.function(strategy.compute_gradients)(x, y)
    every = sorted(((r, repr(i)) for r, st in enumerate(prog.schedule.streams) for i in st))
    assert sorted((r, repr(i)) for r, i in strategy.executed) == every
    ref_grads, _ = single_device(model, [(x, y)])
    for g in range(2):
        for j, k in enumerate(strategy._index[g]):
            np.testing.assert_allclose(reduced[g][j].numpy(), ref_grads[k], atol=1e-5, rtol=0)


def test_capacity_aware_partition_and_model_fit():
    """Default path: Keras importer + partitioner per group; the slow device gets the smaller segment;
    model.fit runs the hybrid step and leaves the trained weights in the user's model."""
    model = small_model()
    strategy = GroupedHybridTrainer(
        devices=CPUS,
        capacities=[1, 0.25, 1, 0.25],
        groups=[[0, 1], [2, 3]],
        microbatches=2,
        method="balanced",
        emulate=True,
    )
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


def _fit_strategy(model, lr=0.05):
    strategy = GroupedHybridTrainer(
        devices=CPUS, capacities=[1, 0.5, 1, 0.5], groups=[[0, 1], [2, 3]], microbatches=2, method="balanced"
    )
    with strategy.scope():
        strategy.compile(model, optimizer=keras.optimizers.SGD(lr), loss=LOSS, metrics=["accuracy"])
    return strategy


def test_fit_reports_metrics_from_the_steps_predictions():
    model = small_model()
    x, y = data(32, seed=4)
    ref = keras.models.clone_model(model)
    ref.set_weights(model.get_weights())
    _fit_strategy(model)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
    hist = model.fit(ds, epochs=1, verbose=0).history
    assert set(hist) == {"loss", "accuracy"}
    # reference: the same two SGD steps on one device; metrics of each step's pre-update predictions
    opt = keras.optimizers.SGD(0.05)
    losses, correct = [], 0
    for i in range(2):
        xb, yb = x[16 * i : 16 * (i + 1)], y[16 * i : 16 * (i + 1)]
        with tf.GradientTape() as tape:
            pred = ref(xb, training=True)
            loss = LOSS(yb, pred)
        opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables))
        losses.append(float(loss))
        correct += int(np.sum(np.argmax(pred.numpy(), 1) == yb))
    assert hist["loss"][0] == pytest.approx(np.mean(losses), abs=1e-5)
    assert hist["accuracy"][0] == pytest.approx(correct / 32, abs=1e-6)


def test_load_weights_after_compile_is_the_starting_point(tmp_path):
    model = small_model()
    x, y = data(32, seed=6)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
    _fit_strategy(model)
    model.fit(ds, epochs=2, verbose=0)
    path = str(tmp_path / "w.weights.h5")
    model.save_weights(path)
    saved = [w.numpy() for w in model.weights]
    saved_loss = model.evaluate(x, y, verbose=0)[0]
    model.fit(ds, epochs=3, verbose=0)
    assert model.evaluate(x, y, verbose=0)[0] != pytest.approx(saved_loss, abs=1e-6)
    model.load_weights(path)
    for a, b in zip(model.weights, saved):
        np.testing.assert_array_equal(a.numpy(), b)
    ref = keras.models.clone_model(model)
    ref.set_weights(saved)
    _, ref_w = single_device(ref, [(x[:16], y[:16]), (x[16:], y[16:])], lr=0.05, momentum=0.0)
    model.fit(ds, epochs=1, verbose=0)  # continues from the loaded weights, not from the groups' copies
    for w, r in zip(model.trainable_weights, ref_w):
        np.testing.assert_allclose(w.numpy(), r, atol=1e-5, rtol=0)
    # a tf.train.Checkpoint restore too
    ckpt = tf.train.Checkpoint(model=model)
    model.set_weights(saved)
    p = ckpt.save(str(tmp_path / "ck"))
    model.fit(ds, epochs=1, verbose=0)
    ckpt.restore(p).assert_existing_objects_matched()
    model.fit(ds, epochs=1, verbose=0)
    for w, r in zip(model.trainable_weights, ref_w):
        np.testing.assert_allclose(w.numpy(), r, atol=1e-5, rtol=0)


def test_partial_last_batch_is_a_one_line_error_naming_drop_remainder():
    model = small_model()
    _fit_strategy(model)
    x, y = data(20, seed=1)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)  # 8, 8, 4: unknown static batch size
    with pytest.raises(InputError, match="drop_remainder=True") as e:
        model.fit(ds, epochs=1, verbose=0)
    assert "\n" not in str(e.value)


def test_strategy_surface():
    model = small_model()
    strategy = _fit_strategy(model)
    assert strategy.num_replicas_in_sync == 2
    x, y = data(16, seed=2)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)
    assert strategy.experimental_distribute_dataset(ds) is ds
    with pytest.raises(InputError, match="drop_remainder"):
        strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(8))
    losses = [strategy.run(strategy.train_step, args=(xb, yb)) for xb, yb in ds]
    assert len(losses) == 2 and all(np.isfinite(losses))
    v = tf.constant([[1.0, 2.0], [3.0, 5.0]])
    assert strategy.reduce(tf.distribute.ReduceOp.SUM, v) is v
    np.testing.assert_allclose(strategy.reduce(tf.distribute.ReduceOp.MEAN, v, axis=0).numpy(), [2.0, 3.5])
    np.testing.assert_allclose(strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=1).numpy(), [3.0, 8.0])


def _last_layer_grad(strategy, got):
    def grads(x, y):
        _, reduced = strategy.compute_gradients(x, y)
        run = strategy.last_runs[0]
        vs = strategy.pipelines[0].trainable_variables
        got["first"] = run.acc[vs[0].ref()]  # layer "a"'s kernel gradient in group 0
        return reduced[0][len(vs) - 2]  # layer "out"'s kernel, reduced

    return grads


def test_executor_bucket_allreduce_does_not_wait_for_earlier_layers():
    """Overlap in the executor, structurally: with one bucket per layer, the reduced gradient of the last
    layer does not depend on the first layer's gradient (TensorFlow can run its all-reduce while the
    backward continues); with one bucket for the whole model it does."""

    def ancestors(t):
        seen, todo = set(), [t.op]
        while todo:
            op = todo.pop()
            if op in seen:
                continue
            seen.add(op)
            todo += [i.op for i in op.inputs] + list(op.control_inputs)
        return seen

    x, y = data(8, seed=3)
    for bucket_bytes, independent in ((1.0, True), (None, False)):
        model = small_model()
        strategy = GroupedHybridTrainer(
            devices=CPUS[:2], groups=[[0], [1]], microbatches=1, method="balanced", bucket_bytes=bucket_bytes
        )
        with strategy.scope():
            strategy.compile(model, optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
        got = {}
        grads = _last_layer_grad(strategy, got)
        fn = tf.function(grads).get_concrete_function(tf.constant(x), tf.constant(y))
        out = fn.graph.outputs[0]
        first_op = [o for o in fn.graph.get_operations() if o.name == got["first"].op.name][0]
        assert (first_op not in ancestors(out)) == independent, bucket_bytes
        assert len(strategy.program.buckets) == (4 if bucket_bytes else 1)


def test_trainer_and_simulator_run_the_planners_identical_plan():
    """The trainer takes its plan from the planner (same function, same defaults as the simulator's
    callers): for the same cluster and profile the plans, batch split and program are identical."""
    from tf_commopt.core.devices import Cluster
    from tf_commopt.core.planner import plan_hybrid
    from tf_commopt.core.simulate.hybrid import grouped_hybrid_job
    from tf_commopt.tf.graph_import import from_keras_model

    model = small_model()
    caps = [1, 0.5, 1, 0.25]
    strategy = GroupedHybridTrainer(devices=CPUS, capacities=caps, num_groups=2, microbatches=2)
    with strategy.scope():
        strategy.compile(model, optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    graph = from_keras_model(model, batch_size=32)
    cluster = Cluster.from_capacities(caps, 10.0)
    planned = plan_hybrid(graph, cluster, num_groups=2, microbatches=2)

    def what_runs(hp):
        return (hp.groups, hp.microbatches, hp.group_ms, hp.batch_fractions, hp.grouping,
                [(p.method, p.stage_of_node, p.device_of_stage) for p in hp.plans])  # fmt: skip

    assert what_runs(strategy.hybrid_plan) == what_runs(planned)
    assert [p.method for p in planned.plans] == ["ga", "ga"]
    assert strategy.group_batch_sizes(10) == split_batch(10, planned.batch_fractions)
    job, prog = grouped_hybrid_job(graph, cluster, planned)
    assert prog == strategy.program and job.schedule == strategy.schedule
