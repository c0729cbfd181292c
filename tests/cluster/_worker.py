"""The program every worker of the skip-and-correct and hybrid cluster tests runs (through
``tests/cluster/conftest.py``, which starts it on each task of a ``tf_commopt.cluster`` cluster).

Usage: python tests/cluster/_worker.py OUT_DIR SCENARIO [SCENARIO ...]

Runs the scenarios in order in this one process (each builds its own strategy; the package gives each
strategy its own collective keys, the same on every worker since they build them in the same order)
and prints ``RESULT <scenario> <json>`` after each. A scenario is a name and ``:``-separated arguments:

* ``sc``: softmax regression, custom loop, H = 3, vrl, this worker's own data: its copy of the variables
  and its Δ after every step; a checkpoint (the chief's holds every worker's Δ); then model.fit/evaluate.
* ``overlap``: the same with ``overlap=True`` for 8 steps, then ``strategy.sync()``; model.fit + evaluate.
* ``overlap_race``: ``overlap=True`` for 9 steps with an eager all-reduce of a payload-sized buffer right
  after each step, worker 1's background call 0.3 s late and worker 0's main thread 0.3 s late (each draws
  its collective keys in the other order); the sums, then the model after ``strategy.sync()``.
* ``compressed[:CODEC[:overlap]]``: the ``sc`` steps with ``compression=CODEC`` (bf16; overlapped), the
  residual of w too; fit.
* ``mixed[:POLICY]``: model.fit under mixed_float16 (dynamic loss scaling), H = 3, vrl, 7 steps.
* ``restore:first`` / ``restore:resume``: save after step 4 (mid-interval) and go on to step 10 / a new
  cluster restores the chief's checkpoint and takes steps 5-10.
* ``backup:MODE:OPTIMIZER`` (MODE whole, interrupt or resume): tf.keras.callbacks.BackupAndRestore; an
  ``interrupt`` job is preempted at the start of epoch 2, ``resume`` is a new cluster and a zero model.
* ``hybrid``: GroupedHybridTrainer, one group of 2 logical CPUs per host, against single-device training.
* ``collectives``: the collective ops TensorFlow's debugger saw execute inside the step functions of
  model.fit and of a custom loop, per stage (enables the debugger: run it last).
* ``auto``: model.fit with ``interval="auto"``; the strategy's stats.
* ``timeperiod``: ``period="time"``: model.fit of softmax regression with fixed step times (counts 4
  and 2, H = 4, this worker's own data): the model and Δ after 12 steps; then a larger model with
  worker 1 slowed 4x (``experiments.slow``) and measured step times: the counts and real steps.

Numpy references live in the tests; the workers only record what TensorFlow did.
"""

import faulthandler
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# two logical CPUs for the hybrid's pipelines (set before any op); SkipCorrectStrategy on a TF_CONFIG
# cluster uses one CPU device per worker whatever their number
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
)

from tests.tf.sc_reference import make_batches, softmax_step  # noqa: E402
from tf_commopt.distribute import SkipCorrectStrategy  # noqa: E402

R, B, F, C, LR, H = 2, 5, 3, 4, 0.2, 3
TF_CONFIG = json.loads(os.environ["TF_CONFIG"])
TASK = TF_CONFIG["task"]["index"]
_BARRIERS = {"dir": "", "n": 0}


def _barrier() -> None:
    """Wait until every worker got here (a file per worker in OUT_DIR: the tasks share this machine)."""
    _BARRIERS["n"] += 1
    run = TF_CONFIG["cluster"]["worker"][0].replace(":", "_")  # this cluster's (its ports are new)
    path = os.path.join(_BARRIERS["dir"], "barriers", run, str(_BARRIERS["n"]))
    os.makedirs(path, exist_ok=True)
    open(os.path.join(path, str(TASK)), "w").close()
    while len(os.listdir(path)) < len(TF_CONFIG["cluster"]["worker"]):
        time.sleep(0.02)


def new_strategy(make, *args, **kwargs):
    """``make(*args, **kwargs)`` with every worker past its previous strategy's last collective before,
    and past the new one's creation after: a new multi-worker strategy restarts this process's collective
    service, and a peer's collective reaching it meanwhile is lost (both workers then hang)."""
    _barrier()
    strategy = make(*args, **kwargs)
    _barrier()
    return strategy


def emit(scenario: str, **values) -> None:
    """One ``RESULT`` line: numpy arrays and scalars as (nested) lists and numbers."""
    plain = json.dumps(values, default=lambda v: v.tolist() if hasattr(v, "tolist") else float(v))
    print(f"RESULT {scenario} {plain}", flush=True)


def _initial_weights():
    rng = np.random.RandomState(7)
    return rng.randn(F, C).astype(np.float32) * 0.3, rng.randn(C).astype(np.float32) * 0.1


def _softmax_setup(steps: int, zeros: bool = False, **strategy_kwargs):
    strategy = new_strategy(SkipCorrectStrategy, interval=H, correction="vrl", **strategy_kwargs)
    assert strategy.num_replicas_in_sync == R, strategy.num_replicas_in_sync
    w0, b0 = _initial_weights()
    with strategy.scope():
        w = tf.Variable(np.zeros_like(w0) if zeros else w0)
        b = tf.Variable(np.zeros_like(b0) if zeros else b0)
        opt = tf.keras.optimizers.SGD(LR)
    return strategy, w, b, opt, make_batches(steps, R, B, F, C, seed=17)


def _run_steps(strategy, w, b, opt, rows, trace):
    """Step through ``rows``; append this worker's w, b and Δ of w after each step to ``trace``."""
    step = softmax_step(strategy, w, b, opt, R * B)
    for row in rows:
        step(row)
        _record(strategy, w, b, opt, trace)


def _record(strategy, w, b, opt, trace):
    trace["w"].append(w.values[0].numpy())
    trace["b"].append(b.values[0].numpy())
    trace["d"].append(strategy.extended.correction_state(opt).delta_numpy()[0][0])


def _fit_and_evaluate(strategy, batches, steps, drain=False):
    """model.fit for ``steps`` steps on the concatenated batches, then evaluate (which averages first)."""
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(C, input_shape=(F,))])
        model.compile(
            tf.keras.optimizers.SGD(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    x = np.concatenate([r[0] for row in batches for r in row])
    y = np.concatenate([r[1] for row in batches for r in row])
    model.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(R * B).repeat(),
        epochs=1,
        steps_per_epoch=steps,
        verbose=0,
    )
    out = {"pending": strategy.extended.drain()} if drain else {}
    out["loss"] = model.evaluate(tf.data.Dataset.from_tensor_slices((x, y)).batch(R * B), verbose=0)
    out["kernel_after_eval"] = model.layers[0].kernel.values[0].numpy()
    return out


def sc(out_dir: str) -> None:
    strategy, w, b, opt, batches = _softmax_setup(7)
    trace = {"w": [], "b": [], "d": []}
    _run_steps(strategy, w, b, opt, batches, trace)
    stats = strategy.stats()
    # every worker writes (the chief's copy is the real one): Δ of both workers is gathered into it
    tf.train.Checkpoint(optimizer=opt).write(os.path.join(out_dir, f"ckpt{TASK}", "ckpt"))
    after = _fit_and_evaluate(strategy, batches, 4)
    emit("sc", **trace, syncs=stats["syncs"], bytes=stats["bytes_communicated"], **after)


def overlap(out_dir: str) -> None:
    strategy, w, b, opt, batches = _softmax_setup(8, overlap=True)
    trace = {"w": [], "b": [], "d": []}
    _run_steps(strategy, w, b, opt, batches, trace)
    strategy.sync()  # applies the mean in flight since step 6, then averages
    _record(strategy, w, b, opt, trace)
    stats = strategy.stats()
    after = _fit_and_evaluate(strategy, batches, 7, drain=True)  # drain: 0, fit's end applied the last mean
    emit(
        "overlap",
        **trace,
        syncs=stats["syncs"],
        bytes=stats["bytes_communicated"],
        background=stats["background_comm_s"],
        **after,
    )


def overlap_race(out_dir: str) -> None:
    strategy, w, b, opt, batches = _softmax_setup(9, overlap=True)
    step = softmax_step(strategy, w, b, opt, R * B)
    step(batches[0])  # the first trace builds the averager
    avg = next(iter(strategy.extended._sc_overlappers.values()))
    call = avg._fn_ref[0]

    def late():
        time.sleep(0.3)
        return call()

    if TASK == 1:
        avg._fn_ref[0] = late
    mine = tf.fill([F * C + C], float(TASK + 1))  # the size of the background's payload (w and b)
    sums = []
    for row in batches[1:]:
        step(row)  # at a sync: launches the background all-reduce
        if TASK == 0:
            time.sleep(0.3)  # worker 0's background call draws its keys before this reduce
        value = strategy.run(lambda: tf.identity(mine))
        sums.append(strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None).numpy())
    strategy.sync()
    emit("overlap_race", sums=np.array(sums), w=w.values[0].numpy(), b=b.values[0].numpy())


def compressed(out_dir: str, codec: str = "bf16", overlap: str = "") -> None:
    """The ``sc`` steps with ``compression=codec`` (``overlap``: overlapped too): w, b, Δ, the residual of
    w after every step; then fit."""
    strategy, w, b, opt, batches = _softmax_setup(7, compression=codec, overlap=bool(overlap))
    trace = {"w": [], "b": [], "d": [], "e": []}
    step = softmax_step(strategy, w, b, opt, R * B)
    for row in batches:
        step(row)
        _record(strategy, w, b, opt, trace)
        trace["e"].append(strategy.extended.correction_state(opt).residuals[0].values[0].numpy())
    if overlap:
        strategy.extended.drain()  # the mean launched at the last sync has run (its bytes are counted)
    stats = strategy.stats()
    after = _fit_and_evaluate(strategy, batches, 4)
    emit(
        "compressed" + ("_overlap" if overlap else ""),
        **trace,
        syncs=stats["syncs"],
        bytes=stats["bytes_communicated"],
        payload=stats["sync_payload_bytes"],
        fit_syncs=strategy.stats()["syncs"],
        **after,
    )


def _own_rows(batches, batch_size):
    """This worker's rows of ``batches`` as a dataset that is not sharded (each worker reads its own)."""
    x = np.concatenate([row[TASK][0] for row in batches])
    y = np.concatenate([row[TASK][1] for row in batches])
    opts = tf.data.Options()
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size).with_options(opts)


def mixed(out_dir: str, policy: str = "mixed_float16") -> None:
    tf.keras.mixed_precision.set_global_policy(policy)
    try:
        strategy = new_strategy(SkipCorrectStrategy, interval=H, correction="vrl")
        w0, b0 = _initial_weights()
        batches = make_batches(7, R, B, F, C, seed=17)
        # with sharding OFF each worker's dataset is batched with the GLOBAL batch size and reads B rows
        # per step: step t reads batches[t][TASK]
        data = _own_rows(batches, R * B).repeat()
        with strategy.scope():
            model = tf.keras.Sequential(
                [
                    tf.keras.layers.Dense(C, input_shape=(F,)),
                    tf.keras.layers.Activation("linear", dtype="float32"),
                ]
            )
            model.layers[0].set_weights([w0, b0])
            model.compile(
                tf.keras.optimizers.SGD(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
            )
        is_mixed = policy == "mixed_float16"
        opt = model.optimizer
        assert not is_mixed or (isinstance(opt, tf.keras.mixed_precision.LossScaleOptimizer) and opt.dynamic)
        model.fit(data, epochs=1, steps_per_epoch=7, verbose=0)
        state = strategy.extended.correction_state(opt.inner_optimizer if is_mixed else opt)
        st = strategy.stats()
        emit(
            "mixed",
            w=model.layers[0].kernel.values[0].numpy(),
            b=model.layers[0].bias.values[0].numpy(),
            d=state.delta_numpy()[0][0],
            syncs=st["syncs"],
            steps=st["steps"],
            bytes=st["bytes_communicated"],
            iterations=int(opt.iterations.numpy()),
            compute_dtype=model.layers[0].compute_dtype,
        )
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def restore(out_dir: str, mode: str) -> None:
    save_at, steps = 4, 10
    strategy, w, b, opt, batches = _softmax_setup(steps, zeros=(mode == "resume"))
    ckpt = tf.train.Checkpoint(optimizer=opt, w=w, b=b)
    saved, trace = {}, {"w": [], "b": [], "d": []}
    if mode == "first":
        _run_steps(strategy, w, b, opt, batches[:save_at], {"w": [], "b": [], "d": []})
        saved["d_saved"] = strategy.extended.correction_state(opt).delta_numpy()[0][0]
        strategy.sync()  # the model users see is the global model: average before the checkpoint
        ckpt.write(os.path.join(out_dir, "restore", f"ckpt{TASK}", "ckpt"))
    else:
        ckpt.restore(os.path.join(out_dir, "restore", "ckpt0", "ckpt"))  # Δ_i, k: deferred to the first step
    _run_steps(strategy, w, b, opt, batches[save_at:], trace)
    emit(
        f"restore:{mode}",
        **trace,
        iterations=int(opt.iterations.numpy()),
        syncs=strategy.stats()["syncs"],
        **saved,
    )


class Preempted(Exception):
    pass


def backup(out_dir: str, mode: str, optimizer: str) -> None:
    epochs, interrupt_at, steps_per_epoch = 4, 2, 5  # 5 steps per epoch: not a multiple of H

    class Interrupt(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == interrupt_at:
                raise Preempted(f"preempted at the start of epoch {epoch}")

    strategy = new_strategy(SkipCorrectStrategy, interval=H, average_optimizer_state=(optimizer == "adam"))
    assert strategy.num_replicas_in_sync == R, strategy.num_replicas_in_sync
    # worker i reads its own (skewed) rows, each step about B/R rows of this worker's stream
    data = _own_rows(make_batches(steps_per_epoch, R, B, F, C, seed=41), B)
    init = tf.keras.initializers.Constant(0.0 if mode == "resume" else 0.1)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(C, input_shape=(F,), kernel_initializer=init)])
        opt = tf.keras.optimizers.Adam(0.05) if optimizer == "adam" else tf.keras.optimizers.SGD(LR)
        model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    backup_dir = os.path.join(out_dir, f"backup_{optimizer}" + ("_whole" if mode == "whole" else ""))
    callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir)]
    if mode == "interrupt":
        callbacks.append(Interrupt())
    try:
        epochs_run = len(model.fit(data, epochs=epochs, verbose=0, callbacks=callbacks).history["loss"])
    except Preempted:
        epochs_run = interrupt_at
    state = strategy.extended.correction_state(model.optimizer)
    emit(
        f"backup:{mode}:{optimizer}",
        kernel=model.layers[0].kernel.values[0].numpy(),
        bias=model.layers[0].bias.values[0].numpy(),
        delta=state.delta_numpy()[0][0] if state.deltas is not None else np.zeros(0),
        iterations=int(model.optimizer.iterations.numpy()),
        local_steps=int(state.local_steps.numpy()),
        epochs_run=epochs_run,
        syncs=strategy.stats()["syncs"],
        rule=state.rule,
    )


def auto(out_dir: str) -> None:
    strategy = new_strategy(SkipCorrectStrategy, interval="auto", max_interval=1000)
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.layers.Dense(512, activation="relu", input_shape=(480,)), tf.keras.layers.Dense(10)]
        )
        model.compile(tf.keras.optimizers.SGD(0.01), "mse")
    rng = np.random.RandomState(TASK)
    x, y = rng.rand(64, 480).astype(np.float32), rng.rand(64, 10).astype(np.float32)
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat(), steps_per_epoch=52, verbose=0)
    emit("auto", **strategy.stats())


def _time_fit(strategy, model, data, steps):
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
    return strategy.stats()


def timeperiod(out_dir: str) -> None:
    from experiments.slow import slow_train_step
    from tf_commopt.core.period import TimeBudget

    h, steps = 4, 12
    strategy = new_strategy(SkipCorrectStrategy, interval=h, period=TimeBudget(step_times=(0.01, 0.02)))
    w0, b0 = _initial_weights()
    with strategy.scope():
        init = tf.keras.initializers.Constant
        dense = tf.keras.layers.Dense(
            C, input_shape=(F,), kernel_initializer=init(w0), bias_initializer=init(b0)
        )
        model = tf.keras.Sequential([dense])
        model.compile(
            tf.keras.optimizers.SGD(LR), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    # sharding OFF: each worker batches its rows with the GLOBAL batch size and reads B rows per step
    exact = _time_fit(
        strategy, model, _own_rows(make_batches(steps, R, B, F, C, seed=23), R * B).repeat(), steps
    )
    opt = model.optimizer
    exact.update(
        w=model.layers[0].kernel.values[0].numpy(),
        b=model.layers[0].bias.values[0].numpy(),
        d=strategy.extended.correction_state(opt).delta_numpy()[0][0],
        iterations=int(opt.iterations.numpy()),
    )
    h = 8
    strategy = new_strategy(SkipCorrectStrategy, interval=h, period="time")
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.layers.Dense(1024, activation="relu", input_shape=(512,)), tf.keras.layers.Dense(10)]
        )
        model.compile(tf.keras.optimizers.SGD(0.01), "mse")
    slow_train_step(model, 4.0 if TASK == 1 else 1.0)
    rng = np.random.RandomState(TASK)
    x, y = rng.rand(256, 512).astype(np.float32), rng.rand(256, 10).astype(np.float32)
    measured = _time_fit(
        strategy, model, tf.data.Dataset.from_tensor_slices((x, y)).batch(128).repeat(), 6 * h
    )
    measured["kernel"] = model.layers[1].kernel.values[0].numpy()[:4, 0]
    emit("timeperiod", exact=exact, measured=measured)


def collectives(out_dir: str) -> None:
    """Stages of model.fit and of a custom loop (H = 4; the local-step counter carries over from fit to
    the loop): the collective ops executed inside the step functions during each stage."""
    from tensorflow.python.debug.lib import debug_events_reader

    root = os.path.join(out_dir, f"dbg{TASK}")
    writer = tf.debugging.experimental.enable_dump_debug_info(
        root, tensor_debug_mode="NO_TENSOR", circular_buffer_size=-1
    )
    strategy, global_batch = new_strategy(SkipCorrectStrategy, interval=4, correction="vrl"), 16
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.layers.Dense(8, activation="relu", input_shape=(6,)), tf.keras.layers.Dense(3)]
        )
        loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(tf.keras.optimizers.SGD(0.1), loss, metrics=["accuracy"])
    rng = np.random.RandomState(TASK)
    x, y = rng.rand(256, 6).astype(np.float32), rng.randint(0, 3, 256)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch // 2).repeat()
    seen, stages = {"n": 0}, {}

    def executed(graph_marker: str):
        writer.FlushNonExecutionFiles()
        writer.FlushExecutionFiles()
        with debug_events_reader.DebugDataReader(root) as reader:
            reader.update()
            traces = reader.graph_execution_traces()
            new, seen["n"] = traces[seen["n"] :], len(traces)
            out = {}
            for t in (t for t in new if t.op_type.startswith("Collective")):
                g, chain = reader.graph_by_id(t.graph_id), []
                while g is not None:
                    chain.append(str(g.name))
                    g = reader.graph_by_id(g.outer_graph_id) if g.outer_graph_id else None
                if any(graph_marker in c for c in chain):
                    out[t.op_type] = out.get(t.op_type, 0) + 1
            return out

    def report(stage, marker, history=None):
        syncs = strategy.stats()["syncs"]
        stages[stage] = {"syncs": syncs, "collectives": executed(marker), "history": history}

    for stage, n in (("fit_local_1", 3), ("fit_sync", 1), ("fit_local_2", 3)):  # steps 1-3, 4 (sync), 5-7
        report(stage, "train_function", model.fit(ds, epochs=1, steps_per_epoch=n, verbose=0).history)
    with strategy.scope():
        opt, mean_loss = model.optimizer, tf.keras.metrics.Mean()
    per_example = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    it = iter(strategy.experimental_distribute_dataset(ds))

    @tf.function
    def custom_step(batch):
        def fn(xb, yb):
            with tf.GradientTape() as tape:
                lv = tf.nn.compute_average_loss(per_example(yb, model(xb, training=True)), global_batch)
            opt.apply_gradients(zip(tape.gradient(lv, model.trainable_variables), model.trainable_variables))
            mean_loss.update_state(lv)
            return mean_loss.result()

        return strategy.run(fn, args=batch)

    # custom loop: step 8 syncs, 9-11 local, 12 syncs, 13 local
    for stage, n in (
        ("custom_sync_1", 1),
        ("custom_local_1", 3),
        ("custom_sync_2", 1),
        ("custom_local_2", 1),
    ):
        for _ in range(n):
            custom_step(next(it))
        report(stage, "custom_step")
    emit("collectives", stages=stages)


def _hybrid_model(seed):
    keras = tf.keras
    keras.utils.set_random_seed(seed)
    x = keras.Input((6,), name="x")
    a = keras.layers.Dense(8, activation="tanh", name="a")(x)
    b = keras.layers.Dense(8, activation="tanh", name="b")(a)
    r = keras.layers.Add(name="res")([a, keras.layers.Dense(8, name="c")(b)])
    return keras.Model(x, keras.layers.Dense(3, name="out")(r))


def hybrid(out_dir: str) -> None:
    """Host 0: capacities 1, 0.5; host 1: 1, 1 (it gets the larger share of the global batch of 10).
    Host 1 builds its model from another seed: the strategy must broadcast host 0's weights."""
    from tf_commopt.core.plan import PartitionPlan
    from tf_commopt.core.schedule.hybrid import split_batch
    from tf_commopt.distribute.hybrid import GroupedHybridTrainer

    caps = [1.0, 0.5] if TASK == 0 else [1.0, 1.0]
    stage_of = {"a": 0, "b": 0, "c": 1, "res": 1, "out": 1}
    plan = PartitionPlan("hand", stage_of, [1, 0] if TASK == 0 else [0, 1], [0, 0], [0, 0], [0, 0], 0.0, 0.0)
    strategy = new_strategy(
        GroupedHybridTrainer, capacities=caps, microbatches=2, plans=[plan], bandwidth_gbps=1e9
    )
    assert strategy.num_groups == 2 and strategy.devices == ["/CPU:0", "/CPU:1"], strategy.devices
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with strategy.scope():
        model = _hybrid_model(seed=100 + TASK)
        strategy.compile(model, optimizer=tf.keras.optimizers.SGD(0.1, momentum=0.9), loss=loss)
    sizes = strategy.group_batch_sizes(10)  # 1 / t_g of each host's pipeline, exchanged between the hosts
    assert sizes == split_batch(10, strategy.group_weights) and sizes[0] < sizes[1], sizes
    w0 = [w.numpy() for w in strategy.pipelines[0].model.trainable_weights]
    rng = np.random.default_rng(5)
    batches = [
        (rng.normal(size=(10, 6)).astype("float32"), rng.integers(0, 3, 10).astype("int32")) for _ in "ab"
    ]
    losses = [strategy.train_step(x, y) for x, y in batches]
    strategy.sync_model()
    ref, opt, ref_losses = _hybrid_model(seed=100), tf.keras.optimizers.SGD(0.1, momentum=0.9), []
    for x, y in batches:  # host 0's initial weights, single device, the global batches
        with tf.GradientTape() as tape:
            lv = loss(y, ref(x, training=True))
        opt.apply_gradients(zip(tape.gradient(lv, ref.trainable_variables), ref.trainable_variables))
        ref_losses.append(float(lv))
    flat = lambda ws: np.concatenate([np.asarray(w).ravel() for w in ws])  # noqa: E731
    emit(
        "hybrid",
        losses=np.array(losses, dtype=np.float64),
        ref_losses=ref_losses,
        w0=flat(w0),
        ref_w0=flat(w.numpy() for w in _hybrid_model(seed=100).trainable_weights),
        w=flat(w.numpy() for w in model.trainable_weights),
        ref_w=flat(w.numpy() for w in ref.trainable_weights),
    )


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 PID: every thread's stack (a hung cluster)
    _BARRIERS["dir"] = sys.argv[1]
    scenarios = {
        f.__name__: f
        for f in (
            sc,
            overlap,
            overlap_race,
            compressed,
            mixed,
            restore,
            backup,
            auto,
            timeperiod,
            collectives,
            hybrid,
        )
    }
    for arg in sys.argv[2:]:
        name, *params = arg.split(":")
        print(f"SCENARIO {arg} starts", flush=True)
        scenarios[name](sys.argv[1], *params)
