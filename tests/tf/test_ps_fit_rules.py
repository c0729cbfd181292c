"""Each parameter-server update rule (distribute/ps/rules.py) equals tf-keras's own optimizer, to 1e-6.

The same gradient sequence is applied to a tf.Variable by the tf-keras optimizer (``apply_gradients``)
and to a tensor by the rule (``UpdateRule.apply`` with the rule's slots, lr at the step count before
the step and t = step + 1), for 6 steps, starting at a non-zero ``iterations`` (schedules and Adam's
bias correction see the global step).
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from tf_commopt.distribute.ps.rules import SUPPORTED_OPTIMIZERS, update_rule
from tf_commopt.errors import InputError

SCHEDULE = tf_keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=2, decay_rate=0.5)

CASES = [
    ("sgd", lambda: tf_keras.optimizers.SGD(0.1)),
    ("sgd-momentum", lambda: tf_keras.optimizers.SGD(0.1, momentum=0.9)),
    ("sgd-nesterov", lambda: tf_keras.optimizers.SGD(0.1, momentum=0.5, nesterov=True)),
    ("sgd-schedule", lambda: tf_keras.optimizers.SGD(SCHEDULE, momentum=0.5)),
    ("adam", lambda: tf_keras.optimizers.Adam(0.01)),
    ("adam-amsgrad", lambda: tf_keras.optimizers.Adam(0.01, beta_1=0.8, amsgrad=True)),
    ("adam-schedule", lambda: tf_keras.optimizers.Adam(SCHEDULE)),
    ("rmsprop", lambda: tf_keras.optimizers.RMSprop(0.01)),
    ("rmsprop-centered-momentum", lambda: tf_keras.optimizers.RMSprop(0.01, momentum=0.7, centered=True)),
    ("adagrad", lambda: tf_keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.3)),
    ("adagrad-string", lambda: "adagrad"),
]


@pytest.mark.parametrize("label,make", CASES, ids=[c[0] for c in CASES])
def test_rule_equals_tf_keras_optimizer(label, make):
    rng = np.random.RandomState(3)
    x0 = rng.randn(3, 2).astype(np.float32)
    grads = [rng.randn(3, 2).astype(np.float32) for _ in range(6)]
    opt = make()
    opt = tf_keras.optimizers.get(opt) if isinstance(opt, str) else opt
    var = tf.Variable(x0)
    opt.build([var])
    start = 5  # steps already done: the schedule and Adam's t start here
    opt.iterations.assign(start)
    rule = update_rule(make())
    x, slots = tf.constant(x0), rule.initial_slots(tf.constant(x0))
    for j, g in enumerate(grads):
        opt.apply_gradients([(tf.constant(g), var)])
        step = tf.constant(start + j, tf.int64)
        x, slots = rule.apply(x, tf.constant(g), slots, rule.lr(step), step + 1)
        np.testing.assert_allclose(x.numpy(), var.numpy(), rtol=0, atol=1e-6, err_msg=f"{label} step {j}")
    assert not np.allclose(var.numpy(), x0)
    if rule.schedule is None:
        assert rule.lr_sum(0, 4) == pytest.approx(4 * rule.constant_lr)
    else:
        assert rule.lr_sum(start, 2) == pytest.approx(float(SCHEDULE(start)) + float(SCHEDULE(start + 1)))


def test_rule_names_and_slots():
    assert SUPPORTED_OPTIMIZERS == ("SGD", "Adam", "RMSprop", "Adagrad")
    assert update_rule(tf_keras.optimizers.SGD(0.1)).slots == ()
    assert update_rule(tf_keras.optimizers.Adam()).slots == ("m", "v")
    assert update_rule(tf_keras.optimizers.RMSprop(momentum=0.5, centered=True)).slots == (
        "velocity",
        "momentum",
        "average_gradient",
    )
    r = update_rule(tf_keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True))
    assert (r.momentum, r.nesterov, r.constant_lr) == (0.9, True, pytest.approx(0.1))


@pytest.mark.parametrize(
    "make,words",
    [
        (lambda: tf_keras.optimizers.Adamax(0.01), "Adamax"),
        (lambda: tf_keras.optimizers.legacy.Adam(0.01), "legacy"),
        (lambda: tf_keras.optimizers.SGD(0.1, clipnorm=1.0), "clipnorm"),
        (lambda: tf_keras.optimizers.Adam(0.01, weight_decay=0.1), "weight_decay"),
        (lambda: tf_keras.optimizers.Adam(0.01, use_ema=True), "use_ema"),
    ],
)
def test_unsupported_optimizer_is_one_line_error(make, words):
    with pytest.raises(InputError) as e:
        update_rule(make())
    msg = str(e.value)
    assert "\n" not in msg and words in msg and "optimizer" in msg and "Adagrad" in msg


def test_fit_and_wrap_refuse_bad_input_in_one_line():
    """Before any cluster is needed: what fit and wrap refuse, each with one line naming the argument
    (the cluster-side checks are in tests/cluster/test_ps_fit.py)."""
    from tf_commopt.distribute import ps

    plain = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(2,))])
    cases = [
        (lambda: ps.fit(plain, np.zeros((4, 2)), np.zeros(4), sample_weight=None), "sample_weight"),
        (lambda: ps.fit(plain, np.zeros((4, 2)), np.zeros(4)), "model"),  # not built in a trainer's scope
        (lambda: ps.fit(object(), np.zeros((4, 2)), np.zeros(4)), "model"),
        (lambda: ps.wrap(plain), "model"),
    ]
    for call, where in cases:
        with pytest.raises(InputError) as e:
            call()
        assert str(e.value).startswith(where + ":") and "\n" not in str(e.value), str(e.value)
    assert type(plain).fit is tf_keras.Model.fit and "fit" not in vars(plain)  # nothing was bound
