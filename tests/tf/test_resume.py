"""Resume of the runner in one process (4 local replicas, skip-and-correct H = 4): from a
mid-epoch step backup, and after a SIGTERM (graceful preemption). Each resumed run must end with the
uninterrupted run's weights: the data order is deterministic and the backups are taken at the same steps.
"""

import io
import json
import os
import shutil

import numpy as np
import pytest

from experiments import train
from experiments.models import build_model
from experiments.resume import CHAOS_ENV, Preempted
from tf_commopt.core.restart import RESTART_ENV

KW = dict(
    strategy="skip_correct",
    interval=4,
    model="mlp",
    epochs=2,
    steps_per_epoch=24,
    batch_size=32,
    learning_rate=0.05,
    momentum=0.0,  # local replicas share one momentum slot in a backup (a cluster task backs up its own)
    replicas=4,
    seed=5,
    backup_every=8,
)


def _run(backup, **kw):
    buf = io.StringIO()
    res = train.run(train.Config(backup_dir=str(backup), **dict(KW, **kw)), out=buf)
    return res, buf.getvalue()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    res, _ = _run(d / "backup")
    return res.model.get_weights(), res.record, d / "backup"


def _same_weights(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)
    init = build_model("mlp", (28, 28, 1), 10).get_weights()
    assert any(np.abs(a - b).max() > 1e-3 for a, b in zip(want, init))  # it did train: not trivially equal


def test_the_uninterrupted_run_backs_up_at_steps_and_epochs_and_keeps_two(reference):
    _, rec, backup = reference
    assert sorted(os.listdir(backup / "local")) == ["epoch-2", "ledger.jsonl", "step-40"]
    events = [json.loads(x) for x in open(backup / "local" / "ledger.jsonl")]
    assert [e["step"] for e in events if e["event"] == "backup"] == [8, 16, 24, 32, 40, 48]
    assert (rec["resumed_at_step"], rec["restarts"], rec["resumes"], rec["lost_s"]) == (0, 0, [], 0)


def test_resume_from_a_mid_epoch_step_backup_ends_with_the_uninterrupted_weights(reference, tmp_path):
    want, _, backup = reference
    shutil.copytree(backup, tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "local" / "epoch-2")  # as if killed after the backup at step 40
    res, out = _run(tmp_path / "b")
    assert "resuming at step 40 (epoch 2)" in out
    assert res.record["resumed_at_step"] == 40 and res.record["steps"] == 48
    _same_weights(res.model.get_weights(), want)


def test_sigterm_saves_at_the_next_sync_and_the_restarted_run_resumes_there(reference, tmp_path, monkeypatch):
    want, _, _ = reference
    monkeypatch.setenv(CHAOS_ENV, "term:local:11:0")  # SIGTERM to itself before step 11 (k = 2 of H = 4)
    with pytest.raises(Preempted) as e:
        _run(tmp_path / "b")
    assert e.value.step == 12  # the next step boundary every replica shares: the sync after step 12
    assert "step-12" in os.listdir(tmp_path / "b" / "local")
    monkeypatch.delenv(CHAOS_ENV)
    monkeypatch.setenv(RESTART_ENV, "1")
    res, out = _run(tmp_path / "b")
    assert "resuming at step 12 (epoch 1)" in out
    rec = res.record
    assert (rec["resumed_at_step"], rec["restarts"], rec["steps"]) == (12, 1, 48)
    assert len(rec["resumes"]) == 1 and rec["resumes"][0]["step"] == 12 and rec["lost_s"] > 0
    _same_weights(res.model.get_weights(), want)


def test_main_exits_143_when_preempted(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CHAOS_ENV, "term:local:3:0")
    argv = ["train"] + [f"--{k}={v}" for k, v in KW.items()] + [f"--backup_dir={tmp_path}", "--epochs=1"]
    assert train.main(argv) == 143
    err = capsys.readouterr().err
    assert "preempted: stopped at step 4" in err and "exiting with 143 to be restarted" in err


def test_a_run_resumed_twice_ends_with_the_uninterrupted_weights(reference, tmp_path, monkeypatch):
    """The second resume reads a backup written by a resumed process: it must hold the skip-and-correct
    state too (a tf-keras optimizer restored before training lists its checkpoint children
    without them unless refreshed)."""
    import tensorflow as tf

    want, _, _ = reference
    for attempt, spec in enumerate(["term:local:10:0", "term:local:26:1"]):
        monkeypatch.setenv(RESTART_ENV, str(attempt))
        monkeypatch.setenv(CHAOS_ENV, spec)
        with pytest.raises(Preempted) as e:
            _run(tmp_path / "b")
        assert e.value.step == (12, 32)[attempt]
    keys = tf.train.load_checkpoint(
        str(tmp_path / "b" / "local" / "step-32" / "ckpt")
    ).get_variable_to_shape_map()
    assert {"delta_0", "local_steps", "interval"} <= {
        k.rsplit("/", 1)[-1] for k in keys if "skip_correct" in k
    }
    monkeypatch.delenv(CHAOS_ENV)
    monkeypatch.setenv(RESTART_ENV, "2")
    res, _ = _run(tmp_path / "b")
    assert res.record["resumed_at_step"] == 32 and [r["step"] for r in res.record["resumes"]] == [12, 32]
    _same_weights(res.model.get_weights(), want)


def test_backup_every_without_a_backup_directory_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv("TF_COMMOPT_BACKUP_DIR", raising=False)
    assert train.main(["train", "--backup_every=5", "--steps=2", "--model=mlp", "--strategy=single"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "experiments.train: error: --backup_every: needs a backup"
    ), err
    assert train.main(["train", "--backup_every=-1"]) == 2
    assert "--backup_every" in capsys.readouterr().err
