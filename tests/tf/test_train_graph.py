"""Training-step graphs: gradient ops are the backward of the forward op they differentiate, optimizer
updates land on the variable's node, nothing is counted twice.

References: closed-form FLOPs of a dense network's backward (dW = X^T dY, dX = dY W^T) and of a
hand-written SGD update; the same model's forward-only graph; the model's own parameter count.
"""

import pytest
import tensorflow as tf
import tf_keras

from tf_commopt.tf.graph_import import Roofline, from_concrete_function
from tf_commopt.tf.train_graph import classify

pytestmark = pytest.mark.filterwarnings("ignore::tf_commopt.tf.op_costs.CostEstimateWarning")
FLOPS_ONLY = Roofline(peak_gflops=1.0, mem_gbps=1e15)  # forward_ms * 1e6 == FLOPs
B = 4


def mlp():
    L = tf_keras.layers
    x = L.Input((6,), name="inp")
    h = L.Dense(5, name="fc1")(x)
    return tf_keras.Model(x, L.Dense(3, name="fc2")(L.ReLU(name="act")(h)), name="m")


def _flops(g, n):
    return round(g[n].forward_ms * 1e6), round(g[n].backward_ms * 1e6)


@pytest.mark.parametrize("tape", [True, False])
def test_dense_step_backward_is_the_closed_form(tape):
    """x[4,6] -> fc1 (6x5) -> relu -> fc2 (5x3); loss = mean((y - t)^2); w -= 0.1 * dw by hand."""
    m = mlp()

    @tf.function
    def step(x, t):
        if tape:
            with tf.GradientTape() as tp:
                loss = tf.reduce_mean(tf.square(m(x) - t))
            grads = tp.gradient(loss, m.trainable_variables)
        else:  # TF1-style: the "gradients" name scope
            loss = tf.reduce_mean(tf.square(m(x) - t))
            grads = tf.gradients(loss, m.trainable_variables)
        with tf.name_scope("sgd"):
            for v, g in zip(m.trainable_variables, grads):
                v.assign_sub(0.1 * g)
        return loss

    cf = step.get_concrete_function(tf.TensorSpec([B, 6]), tf.TensorSpec([B, 3]))
    g = from_concrete_function(cf, roofline=FLOPS_ONLY, unknown_flops="zero")
    fwd = from_concrete_function(
        tf.function(lambda x, t: tf.reduce_mean(tf.square(m(x) - t))).get_concrete_function(
            tf.TensorSpec([B, 6]), tf.TensorSpec([B, 3])
        ),
        roofline=FLOPS_ONLY,
        unknown_flops="zero",
    )
    assert set(g.nodes) == set(fwd.nodes) and set(g.edges) == set(
        fwd.edges
    )  # gradient/optimizer ops are not nodes
    # fc1: dW = X^T dY (2*6*4*5); no dX (the input needs none); update: 0.1 * dW (30 multiplies)
    assert _flops(g, "m/fc1/MatMul") == (2 * B * 6 * 5, 2 * 6 * B * 5 + 6 * 5)
    # fc2: dW (2*5*4*3) + dX (2*4*3*5) + update (15)
    assert _flops(g, "m/fc2/MatMul") == (2 * B * 5 * 3, 2 * 5 * B * 3 + 2 * B * 3 * 5 + 5 * 3)
    assert g["m/fc2/BiasAdd"].backward_ms * 1e6 == pytest.approx(
        fwd["m/fc2/BiasAdd"].forward_ms * 1e6 / (B * 3) * (B - 1) * 3 + 3, abs=3
    )  # BiasAddGrad + update
    assert g.total_param_bytes() == fwd.total_param_bytes() == 4 * m.count_params()


def test_keras_optimizer_ops_are_attributed_to_their_variables():
    m = mlp()
    opt = tf_keras.optimizers.Adam(1e-3)

    @tf.function
    def step(x, t):
        with tf.GradientTape() as tp:
            loss = tf.reduce_mean(tf.square(m(x) - t))
        opt.apply_gradients(zip(tp.gradient(loss, m.trainable_variables), m.trainable_variables))
        return loss

    cf = step.get_concrete_function(tf.TensorSpec([B, 6]), tf.TensorSpec([B, 3]))
    kinds = classify(cf.graph.get_operations())
    tape_ops = [o for o in cf.graph.get_operations() if o.name.startswith("gradient_tape/")]
    assert {kinds[o.name] for o in tape_ops} <= {"gradient", "dead"}
    assert [kinds[o.name] for o in tape_ops if o.type == "MatMul"] == ["gradient"] * 3  # dW1, dW2, dX2
    assert {
        kinds[o.name] for o in cf.graph.get_operations() if o.name.startswith("Adam/") and o.type == "Sqrt"
    } == {"optimizer"}
    g = from_concrete_function(cf, roofline=FLOPS_ONLY, unknown_flops="zero")
    # Adam touches every element of a variable a fixed number of times: the kernels' shares scale with size
    opt1 = g["m/fc1/MatMul"].backward_ms * 1e6 - (2 * 6 * B * 5)
    opt2 = g["m/fc2/MatMul"].backward_ms * 1e6 - (2 * 5 * B * 3 + 2 * B * 3 * 5)
    assert 5 * 30 < opt1 < 30 * 30 and opt1 / opt2 == pytest.approx(
        30 / 15, rel=0.05
    )  # a few FLOPs per element
    assert g.total_param_bytes() == 4 * m.count_params()


def test_mobilenet_training_step_vs_forward():
    """A training step imports at forward x (1 + backward factor) within 20%, with the
    model's parameter bytes, and no gradient op is a node."""
    m = tf_keras.applications.MobileNetV2(weights=None, input_shape=(64, 64, 3), alpha=0.35, classes=10)
    opt = tf_keras.optimizers.SGD(0.01, momentum=0.9)
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy()
    specs = (tf.TensorSpec([8, 64, 64, 3]), tf.TensorSpec([8], tf.int32))

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tp:
            loss = loss_fn(y, m(x, training=True))
        opt.apply_gradients(zip(tp.gradient(loss, m.trainable_variables), m.trainable_variables))
        return loss

    fwd_fn = tf.function(lambda x, y: loss_fn(y, m(x, training=True)))
    train = from_concrete_function(step.get_concrete_function(*specs))
    fwd = from_concrete_function(fwd_fn.get_concrete_function(*specs))
    factor = Roofline().backward_factor
    assert set(train.nodes) == set(fwd.nodes)
    assert abs(train.total_ms() - fwd.total_ms()) <= 0.2 * fwd.total_ms(), (train.total_ms(), fwd.total_ms())
    assert fwd.total_ms() == pytest.approx(sum(n.forward_ms for n in fwd.nodes.values()) * (1 + factor))
    assert train.total_param_bytes() == fwd.total_param_bytes() == 4 * m.count_params()
    # forward costs are the forward graph's; backward is attributed, not a factor
    conv = "mobilenetv2_0.35_64/Conv1/Conv2D"
    assert train[conv].forward_ms == pytest.approx(fwd[conv].forward_ms)
    assert train[conv].backward_ms != pytest.approx(factor * train[conv].forward_ms)
