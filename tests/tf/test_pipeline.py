"""Pipeline execution of a PartitionPlan: GPipe gradients and updates equal plain training to 1e-5."""

import warnings

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tf_commopt.core.plan import PartitionPlan
from tf_commopt.core.schedule import Backward, Forward, execution_order, gpipe, short
from tf_commopt.distribute.pipeline import Pipeline, split_sizes
from tf_commopt.errors import PlanError

CPUS = ["/CPU:0", "/CPU:1", "/CPU:2", "/CPU:3"]


def make_plan(stage_of_node, num_stages, devices=None):
    return PartitionPlan(
        method="hand",
        stage_of_node=dict(stage_of_node),
        device_of_stage=list(devices if devices is not None else range(num_stages)),
        stage_compute_ms=[0.0] * num_stages,
        stage_comm_ms=[0.0] * num_stages,
        stage_memory_bytes=[0.0] * num_stages,
        objective=0.0,
        comm_bytes=0.0,
    )


def residual_model():
    """A skip from stage 0 into stage 2 (crosses stage 1), and one from the input into stage 3."""
    keras.utils.set_random_seed(1)
    x = keras.Input((6,), name="x")
    a = keras.layers.Dense(8, activation="tanh", name="a")(x)
    b = keras.layers.Dense(8, activation="tanh", name="b")(a)
    c = keras.layers.Dense(8, name="c")(b)
    r = keras.layers.Add(name="res")([a, c])
    xr = keras.layers.Dense(8, name="xproj")(x)
    o = keras.layers.Dense(3, name="out")(keras.layers.Concatenate(name="cat")([r, xr]))
    model = keras.Model(x, o, name="residual")
    plan = {"a": 0, "b": 1, "c": 2, "res": 2, "xproj": 3, "cat": 3, "out": 3}
    return model, make_plan(plan, 4), keras.losses.SparseCategoricalCrossentropy(from_logits=True), "cls"


def branchy_model():
    """Inception-like branches split over stages, two inputs, a shared layer called twice, two outputs."""
    keras.utils.set_random_seed(2)
    x = keras.Input((5,), name="x")
    z = keras.Input((3,), name="z")
    stem = keras.layers.Dense(6, activation="relu", name="stem")(x)
    b1 = keras.layers.Dense(4, name="b1")(stem)
    shared = keras.layers.Dense(4, activation="tanh", name="shared")
    b2 = shared(keras.layers.Dense(4, name="b2a")(stem))
    b3 = shared(keras.layers.Dense(4, name="b3a")(z))
    cat = keras.layers.Concatenate(name="cat")([b1, b2, b3])
    o1 = keras.layers.Dense(2, name="o1")(cat)
    o2 = keras.layers.Dense(1, name="o2")(keras.layers.Multiply(name="mul")([b1, b2]))
    model = keras.Model([x, z], [o1, o2], name="branchy")
    # the shared layer's two calls ("shared", "shared@1" as the Keras importer names them) in two stages
    plan = {
        "stem": 0,
        "b1": 0,
        "b2a": 1,
        "b3a": 1,
        "shared": 1,
        "shared@1": 2,
        "cat": 2,
        "mul": 2,
        "o1": 2,
        "o2": 2,
    }
    mse = keras.losses.MeanSquaredError()

    def loss(y, preds):
        return mse(y[0], preds[0]) + 0.5 * mse(y[1], preds[1])

    return model, make_plan(plan, 3, devices=[2, 0, 3]), loss, "branchy"


def sequential_model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [
            keras.layers.Dense(7, activation="relu", input_shape=(4,), name="s0"),
            keras.layers.Dense(7, activation="tanh", name="s1"),
            keras.layers.Dense(1, name="s2"),
        ],
        name="seq",
    )
    return model, make_plan({"s0": 0, "s1": 1, "s2": 1}, 2), keras.losses.MeanSquaredError(), "reg"


def batch(kind, n=10, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "cls":
        return rng.normal(size=(n, 6)).astype("float32"), rng.integers(0, 3, size=(n,)).astype("int32")
    if kind == "reg":
        return rng.normal(size=(n, 4)).astype("float32"), rng.normal(size=(n, 1)).astype("float32")
    x = (rng.normal(size=(n, 5)).astype("float32"), rng.normal(size=(n, 3)).astype("float32"))
    return x, (rng.normal(size=(n, 2)).astype("float32"), rng.normal(size=(n, 1)).astype("float32"))


def reference_step(model, loss_fn, x, y, lr, steps=2):
    """Plain (non-pipelined) training of a copy of ``model``: first gradients, weights after ``steps``."""
    ref = keras.models.clone_model(model)
    ref.set_weights(model.get_weights())
    opt = keras.optimizers.SGD(lr, momentum=0.9)
    first = None
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, ref(x, training=True))
        grads = tape.gradient(loss, ref.trainable_variables)
        if first is None:
            first = float(loss), {v.name: g.numpy() for v, g in zip(ref.trainable_variables, grads)}
        opt.apply_gradients(zip(grads, ref.trainable_variables))  # two steps exercise momentum
    return first[0], first[1], {v.name: v.numpy() for v in ref.trainable_variables}


@pytest.mark.parametrize("builder", [residual_model, branchy_model, sequential_model])
@pytest.mark.parametrize("m", [1, 2, 4])
def test_gpipe_equals_plain_training(builder, m):
    model, plan, loss_fn, kind = builder()
    x, y = batch(kind)
    ref_loss, ref_g, ref_w = reference_step(model, loss_fn, x, y, lr=0.1)

    pipe = Pipeline(
        model,
        plan,
        devices=CPUS,
        microbatches=m,
        loss=loss_fn,
        optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
    )
    loss, grads = tf.function(pipe.compute_gradients)(x, y)
    assert abs(float(loss) - ref_loss) < 1e-5
    assert len(grads) == len(ref_g)
    for v, g in zip(pipe.trainable_variables, grads):
        np.testing.assert_allclose(g.numpy(), ref_g[v.name], atol=1e-5, rtol=0)
    pipe.train_step(x, y)
    pipe.train_step(x, y)
    for v in pipe.trainable_variables:
        np.testing.assert_allclose(v.numpy(), ref_w[v.name], atol=1e-5, rtol=0)


def test_plan_from_the_keras_importer_and_partitioner():
    """End to end: from_keras_model -> partition(ga) -> Pipeline; gradients equal plain training."""
    from tf_commopt.partition import partition
    from tf_commopt.tf.graph_import import from_keras_model

    model, _, loss_fn, kind = branchy_model()
    with warnings.catch_warnings():  # the importer may warn about estimated FLOPs (tanh)
        warnings.simplefilter("ignore")
        graph = from_keras_model(model, batch_size=10)
    plan = partition(graph, 3, method="ga", capacities=[1.0, 0.5, 1.0], seed=0)
    x, y = batch(kind)
    _, ref_g, _ = reference_step(model, loss_fn, x, y, lr=0.1, steps=1)
    pipe = Pipeline(model, plan, devices=CPUS[:3], microbatches=2, loss=loss_fn)
    _, grads = tf.function(pipe.compute_gradients)(x, y)
    for v, g in zip(pipe.trainable_variables, grads):
        np.testing.assert_allclose(g.numpy(), ref_g[v.name], atol=1e-5, rtol=0)


def test_stage_variables_placed_on_their_devices_and_forward_matches():
    model, plan, loss_fn, kind = residual_model()
    x, _ = batch(kind)
    pipe = Pipeline(model, plan, devices=CPUS, microbatches=2, loss=loss_fn, place=True)
    for s, vs in enumerate(pipe.layout.variables_of_stage):
        assert vs, f"stage {s} has no variables"
        for v in vs:
            assert v.device.endswith(f"CPU:{plan.device_of_stage[s]}"), (s, v.name, v.device)
    np.testing.assert_allclose(pipe.predict_step(x).numpy(), model(x).numpy(), atol=1e-6)
    assert pipe.model is not model  # the placed clone is trained, the original untouched


def test_cross_stage_tensors_are_sent_to_their_consumers():
    model, plan, _, _ = residual_model()
    lay = Pipeline(model, plan, devices=CPUS).layout
    a_out = str(id(model.get_layer("a").output))
    x_in = str(id(model.inputs[0]))
    assert a_out in lay.stage_outputs[0]
    assert a_out in lay.stage_inputs[1] and a_out in lay.stage_inputs[2]  # the skip goes to stage 2 directly
    assert x_in in lay.stage_inputs[0] and x_in in lay.stage_inputs[3]
    assert lay.layers_of_stage(3) == ["xproj", "cat", "out"]


def test_execution_order_follows_the_shared_gpipe_schedule():
    order = [(r, short(i)) for r, i in execution_order(gpipe(3, 2)) if isinstance(i, (Forward, Backward))]
    fwd = [(r, s) for r, s in order if s.startswith("F")]
    bwd = [(r, s) for r, s in order if s.startswith("B")]
    assert len(fwd) == len(bwd) == 6
    # every stage runs F0 F1 then B1 B0; stage r's F_i after stage r-1's, B_i after stage r+1's
    for r in range(3):
        assert [s for q, s in order if q == r] == ["F0", "F1", "B1", "B0"]
    for i in range(2):
        f = [order.index((r, f"F{i}")) for r in range(3)]
        b = [order.index((r, f"B{i}")) for r in range(3)]
        assert f == sorted(f) and b == sorted(b, reverse=True) and max(f) < min(b)
    assert split_sizes(10, 4) == [3, 3, 2, 2] and split_sizes(2, 4) == [1, 1]


def _one_line_plan_error(model, plan, *needles):
    with pytest.raises(PlanError) as e:
        Pipeline(model, plan, devices=CPUS)
    msg = str(e.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, msg
    return msg


def test_plan_errors_name_the_layer():
    model, plan, _, _ = residual_model()
    son = dict(plan.stage_of_node)
    _one_line_plan_error(model, make_plan(dict(son, ghost=1), 4), "'ghost'", "not a layer")
    missing = dict(son)
    del missing["cat"]
    _one_line_plan_error(model, make_plan(missing, 4), "'cat'", "no stage")
    backwards = dict(son, b=2, c=1)  # c (stage 1) consumes b (stage 2)
    _one_line_plan_error(model, make_plan(backwards, 4), "'c'", "'b'", "data flow")
    _one_line_plan_error(model, make_plan(son, 4, devices=[0, 1, 2, 7]), "device 7")
