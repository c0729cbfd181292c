"""Bad input to the parameter-server variant: one-line errors before any cluster is contacted."""

import json

import numpy as np
import pytest

from tf_commopt.distribute import ps as psc
from tf_commopt.distribute.ps.checkpoints import saved_rounds
from tf_commopt.errors import InputError

CLUSTER = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"], "ps": ["127.0.0.1:4"]}


def _env(monkeypatch, task="chief", cluster=CLUSTER):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": task, "index": 0}}))


@pytest.mark.parametrize(
    "kwargs,where",
    [
        ({"interval": 0}, "interval"),
        ({"interval": 2.5}, "interval"),
        ({"interval": True}, "interval"),
        ({"correction": "scaffold"}, "correction"),
        ({"interval": "fast"}, "interval"),
        ({"interval": "auto", "probe_rounds": 1}, "probe_rounds"),
        ({"learning_rate": 0}, "learning_rate"),
        ({"momentum": 1.0}, "momentum"),
    ],
)
def test_bad_arguments(kwargs, where):
    with pytest.raises(InputError) as e:
        psc.ParameterServerSkipCorrect(**kwargs)
    assert str(e.value).startswith(where + ":") and "\n" not in str(e.value)


def test_needs_a_ps_cluster(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(InputError, match="^TF_CONFIG: .*chief"):
        psc.ParameterServerSkipCorrect()
    with pytest.raises(InputError, match="^TF_CONFIG: TF_CONFIG is not set"):
        psc.serve_unless_chief()
    _env(monkeypatch, "worker", {"worker": ["127.0.0.1:2", "127.0.0.1:3"]})
    with pytest.raises(InputError, match="needs 'ps' tasks and a 'chief'"):
        psc.serve_unless_chief()
    with pytest.raises(InputError, match="for worker and ps tasks, this task is chief"):
        _env(monkeypatch)
        psc.serve()


def test_array_batch_fn_checks_and_rows():
    with pytest.raises(InputError, match="x has 4 rows but y has 3"):
        psc.array_batch_fn(np.zeros((4, 1)), np.zeros(3), 2, 1)
    with pytest.raises(InputError, match="cannot fill 5 shards"):
        psc.array_batch_fn(np.zeros((4, 1)), np.zeros(4), 5, 1)
    fn = psc.array_batch_fn(np.arange(10.0)[:, None], np.arange(10), num_shards=2, batch_size=2)
    # shard 1 = rows 1, 3, 5, 7, 9; step 2 takes its rows 4, 0 (wrapping)
    bx, by = fn(1, 2)
    assert by.numpy().tolist() == [9, 1] and bx.numpy()[:, 0].tolist() == [9.0, 1.0]
    # explicit shards, cut to the shortest (3 rows): shard 0 = rows 8, 0, 4
    fn = psc.array_batch_fn(
        np.arange(10.0)[:, None], np.arange(10), 2, 2, shard_indices=[[8, 0, 4, 6], [1, 2, 3]]
    )
    assert fn(0, 1)[1].numpy().tolist() == [4, 8] and fn(1, 0)[1].numpy().tolist() == [1, 2]
    with pytest.raises(InputError, match="shard_indices has 1 shards, num_shards is 2"):
        psc.array_batch_fn(np.zeros((4, 1)), np.zeros(4), 2, 1, shard_indices=[[0, 1]])


@pytest.mark.parametrize(
    "flags,where",
    [
        ({"strategy": "single"}, "--strategy"),
        ({"strategy": "skip_correct", "warmup_steps": 3}, "--warmup_steps"),
        ({"strategy": "ssgd", "learning_rate": 0.0}, "--learning_rate"),
        ({"strategy": "ssgd", "batch_size": 63}, "--batch_size"),
        ({"strategy": "skip_correct", "overlap": True}, "--overlap"),
    ],
)
def test_runner_refuses_unsupported_flags_on_ps_cluster(monkeypatch, flags, where):
    from experiments.models import build_model
    from experiments.ps_train import run_training
    from experiments.train import Config, validate

    _env(monkeypatch)
    with pytest.raises(InputError) as e:
        run_training(validate(Config(**flags)), build_model)
    assert str(e.value).startswith(where + ":"), str(e.value)


def test_library_does_not_import_the_runner():
    """The runner lives in experiments/: the library module must not reach back into it."""
    from tests.inprocess import fresh_imports

    with fresh_imports(block=("experiments",)) as seen:  # BlockedImport if it tries (afresh, in process)
        import tf_commopt.distribute.ps as p

        assert not hasattr(p, "run_training")
    assert not [m for m in seen if m.endswith("ps_runner")], sorted(seen)


def test_save_restore_refuse_before_compile():
    t = object.__new__(psc.ParameterServerSkipCorrect)
    t._compiled = False
    with pytest.raises(InputError, match="^ParameterServerSkipCorrect: call compile"):
        t.save("/tmp/x")
    assert saved_rounds("/nonexistent/dir") == []
