"""The runner's time to accuracy (``--eval_every_s``, ``--target_accuracy``) and emulated slow workers
(``--slow_workers``), in process on one device."""

import io
import json

import pytest

from experiments import train
from tf_commopt.tf.slowdown import sleep_log


def _run(**kw):
    buf = io.StringIO()
    res = train.run(train.Config(strategy="single", model="mlp", seed=1, **kw), out=buf)
    assert json.loads(buf.getvalue().strip().splitlines()[-1]) == json.loads(json.dumps(res.record))
    return res.record


def test_time_to_target_is_the_first_curve_point_reaching_it():
    rec = _run(steps=30, eval_every=10, target_accuracy=0.5)
    curve = rec["curve"]
    assert [p["step"] for p in curve] == [0, 10, 20, 30]
    first = next(p for p in curve if p["test_accuracy"] >= 0.5)  # recomputed from the curve
    assert rec["steps_to_target"] == first["step"] and rec["time_to_target_s"] == first["wall_s"]
    assert rec["target_accuracy"] == 0.5
    assert rec["train_s"] < rec["wall_s"] and rec["eval_s"] > 0
    # both clocks without the evaluations; train_s also holds fit's return after the last one
    assert 0 <= rec["train_s"] - curve[-1]["wall_s"] < 1.0


def test_a_target_never_reached_is_null():
    rec = _run(steps=4, eval_every=2, target_accuracy=1.0)
    assert rec["time_to_target_s"] is None and rec["steps_to_target"] is None


def test_evaluations_by_training_seconds():
    every_step = _run(steps=5, eval_every_s=1e-9)
    assert [p["step"] for p in every_step["curve"]] == [0, 1, 2, 3, 4, 5]
    never = _run(steps=5, eval_every_s=1e6, target_accuracy=0.05)
    assert [p["step"] for p in never["curve"]] == [0, 5]  # before training and after the last step
    assert never["steps_to_target"] in (0, 5)


def test_a_slowed_worker_computes_the_same_numbers_and_sleeps_every_step():
    plain = _run(steps=12)
    sleep_log(clear=True)
    slowed = _run(steps=12, slow_workers="0:3")
    sleeps = sleep_log(clear=True)
    assert slowed["slow_factor"] == 3.0 and slowed["slow_workers"] == "0:3"
    assert slowed["test_accuracy"] == plain["test_accuracy"] and slowed["train_loss"] == plain["train_loss"]
    assert len(sleeps) == 12 and all(s > 0 for _, _, s in sleeps)
    requested = [s for _, _, s in sleeps]
    assert requested == sorted(requested, reverse=True)  # 2 x the shortest forward+backward so far


@pytest.mark.parametrize(
    "flag,message",
    [
        ("--slow_workers=1", "--slow_workers: item '1': expected WORKER:FACTOR"),
        ("--slow_workers=a:2", "--slow_workers: item 'a:2': expected WORKER:FACTOR"),
        ("--slow_workers=1:0.5", "--slow_workers: item '1:0.5': the factor must be a finite number >= 1"),
        ("--slow_workers=1:x", "--slow_workers: item '1:x': the factor"),
        ("--slow_workers=1:2,1:3", "--slow_workers: item '1:3': worker 1 is named twice"),
        ("--slow_workers=1:2", "--slow_workers: worker 1 does not exist: the run has 1 worker(s)"),
        ("--target_accuracy=1.5", "--target_accuracy: must be a test accuracy in (0, 1]"),
        ("--target_accuracy=0.9", "--target_accuracy: needs evaluations to be reached at"),
        ("--eval_every_s=-1", "--eval_every_s: must be a number >= 0"),
    ],
)
def test_bad_flags_are_one_line(flag, message, capsys):
    assert train.main(["train", "--strategy=single", "--model=mlp", "--steps=2", flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"experiments.train: error: {message}"), err
