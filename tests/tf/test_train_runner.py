"""The training runner ``experiments.train``: strategies, the JSON line, bad flags.

In-process runs use the 4 logical CPUs that tests/tf/conftest.py configures.
"""

import json

import numpy as np
import pytest

from experiments import train
from experiments.models import build_model, param_bytes
from tests.inprocess import run_module
from tf_commopt.errors import InputError

REQUIRED = {"strategy", "replicas", "steps", "wall_s", "train_loss", "test_accuracy"}


def _run(**kw):
    import io

    buf = io.StringIO()
    res = train.run(train.Config(**kw), out=buf)
    last = buf.getvalue().strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(res.record))  # the last printed line is the record
    return res


def test_ssgd_on_4_replicas_equals_single_device_training():
    """Synchronous data parallelism = one device with the same global batch (plain SGD, no dropout)."""
    kw = dict(model="mlp", steps=4, batch_size=64, learning_rate=0.1, momentum=0.0, seed=3)
    single = _run(strategy="single", **kw)
    ssgd = _run(strategy="ssgd", replicas=4, **kw)
    assert single.record["replicas"] == 1 and ssgd.record["replicas"] == 4
    assert single.record["steps"] == ssgd.record["steps"] == 4
    w1, w4 = single.model.get_weights(), ssgd.model.get_weights()
    init = build_model("mlp", (28, 28, 1), 10)
    assert any(np.abs(a - b).max() > 1e-3 for a, b in zip(w1, init.get_weights()))  # it did train
    for a, b in zip(w1, w4):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert single.record["train_loss"] == pytest.approx(ssgd.record["train_loss"], rel=1e-4)
    assert single.record["test_accuracy"] == pytest.approx(ssgd.record["test_accuracy"], abs=1e-3)


def test_record_fields_test_accuracy_recomputed_in_numpy_and_allreduce_bench():
    res = _run(
        strategy="ssgd",
        replicas=2,
        model="cnn",
        steps=30,
        batch_size=64,
        learning_rate=0.02,
        bench_allreduce_mb=1.0,
        bench_repeats=1,
    )
    rec = res.record
    assert REQUIRED <= set(rec)
    assert rec["strategy"] == "ssgd" and rec["replicas"] == 2 and rec["steps"] == 30 and rec["wall_s"] > 0
    assert rec["params"] == res.model.count_params() == 56714 and rec["param_bytes"] == 4 * 56714
    from tf_commopt.datasets import load_dataset

    d = load_dataset("mnist", seed=0)
    logits = res.model.predict(d.x_test, batch_size=500, verbose=0)
    assert rec["test_accuracy"] == pytest.approx(float(np.mean(logits.argmax(1) == d.y_test)), abs=1e-6)
    assert rec["test_accuracy"] > 0.3  # 30 steps of a CNN beat chance (0.1)
    # the benchmark checks the reduced value itself (1 + 2 = 3 on every element it reads)
    assert (
        rec["allreduce_mb"] == pytest.approx(1.0)
        and rec["allreduce_s"] > 0
        and rec["allreduce_busbw_mbit"] > 0
    )


def test_models():
    assert build_model("mlp", (28, 28, 1), 10).count_params() == 784 * 128 + 128 + 128 * 10 + 10
    big = build_model("big_mlp", (28, 28, 1), 10)
    assert 30e6 < param_bytes(big) < 60e6  # tens of MB for comm benchmarks
    with pytest.raises(InputError, match="--model"):
        build_model("resnet9000", (28, 28, 1), 10)


def test_skip_correct_strategies_run_or_say_what_is_missing():
    try:
        import tf_commopt.distribute.skip_correct  # noqa: F401
    except ImportError:
        with pytest.raises(InputError, match="skip_correct"):
            train.run(train.Config(strategy="skip_correct", model="mlp", steps=2))
        return
    rec = _run(strategy="local_sgd", replicas=2, model="mlp", steps=4, interval=2).record
    assert {"interval", "syncs", "comm_s", "compute_s", "bytes_communicated"} <= set(rec)
    assert rec["interval"] == 2 and rec["strategy"] == "local_sgd"
    assert rec["compression"] == "" and rec["sync_payload_bytes"] == rec["params"] * 4
    rec = _run(
        strategy="skip_correct",
        replicas=2,
        model="mlp",
        steps=5,
        interval=2,
        compression="bf16",
        correction="vrl",
    ).record
    assert rec["compression"] == "bf16" and rec["sync_payload_bytes"] == rec["params"] * 2
    # two scheduled syncs in bf16, the final out-of-rhythm average (evaluation, step 5) in float32
    assert rec["bytes_communicated"] == 2 * rec["params"] * 2 + rec["params"] * 4
    # --average_optimizer_state: the momentum slots (the runner's default momentum 0.9) travel too
    rec = _run(
        strategy="local_sgd", replicas=2, model="mlp", steps=4, interval=2, average_optimizer_state=True
    )
    assert rec.record["average_optimizer_state"] is True
    assert rec.record["sync_payload_bytes"] == rec.record["params"] * 4 * 2


def test_cli_prints_progress_summary_and_json_last(tmp_path):
    argv = ["--strategy=single", "--model=mlp", "--steps=5", f"--model_dir={tmp_path}"]
    p = run_module("experiments.train", argv, pure=False)  # python -m experiments.train, in process
    assert p.code == 0, p.err[-2000:]
    lines = p.out.strip().splitlines()
    rec = json.loads(lines[-1])
    assert REQUIRED <= set(rec) and rec["steps"] == 5 and rec["strategy"] == "single"
    assert "5/5 [====" in p.out  # the Keras progress bar
    assert "test accuracy" in lines[-2]
    assert json.load(open(tmp_path / "result.json")) == rec
    assert (tmp_path / "model.weights.h5").exists()


@pytest.mark.parametrize(
    "flag,needle",
    [
        ("--strategy=fastest", "--strategy"),
        ("--replicas=0", "--replicas"),
        ("--replicas=many", "replicas"),
        ("--dataset=imagenet", "--dataset"),
        ("--model=resnet9000", "--model"),
        ("--interval=sometimes", "--interval"),
        ("--batch_size=0", "--batch_size"),
        ("--no_such_flag=1", "no_such_flag"),
    ],
)
def test_bad_flags_one_line_exit_2(flag, needle):
    p = run_module("experiments.train", [flag])  # in process, TensorFlow blocked meanwhile
    assert p.code == 2, p.err
    assert len(p.err.strip().splitlines()) == 1 and needle in p.err, p.err
    assert "Traceback" not in p.err


def test_batch_not_divisible_by_replicas():
    with pytest.raises(InputError, match="--batch_size"):
        train.run(train.Config(strategy="ssgd", replicas=4, batch_size=66, model="mlp", steps=1))


def test_non_iid_local_replicas_each_read_their_own_label_skewed_shard():
    """With one input pipeline feeding 4 local replicas, replica i's batches come from shard i of
    split_non_iid (checked by label sets: the shards of one label each are nearly disjoint)."""
    import tensorflow as tf

    from experiments.data import train_dataset_fn
    from tf_commopt._compat import fresh_mirrored_strategy
    from tf_commopt.datasets import load_dataset, split_non_iid

    d = load_dataset("mnist", seed=0)
    strategy = fresh_mirrored_strategy(train.configure_local_cpus(4))
    shards = split_non_iid(d.y_train, 4, 1, seed=0)
    ds = strategy.distribute_datasets_from_function(train_dataset_fn(d.x_train, d.y_train, 64, 0, 1))
    it = iter(ds)
    for _ in range(3):
        _, ys = next(it)
        for i, y in enumerate(strategy.experimental_local_results(ys)):
            assert set(np.asarray(y).tolist()) <= set(d.y_train[shards[i]].tolist()), i
    assert tf.distribute.has_strategy() is False


def test_main_in_process_returns_the_exit_code(capsys):
    assert train.main(["train", "--strategy=fastest"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("experiments.train: error: --strategy: "), err
    assert train.main(["train", "--help"]) == 0
    assert "--steps_per_epoch" in capsys.readouterr().out
    assert train.main(["train", "--steps=5", "--strategy=single", "--model=mlp", "--eval_every=0", "x"]) == 2
