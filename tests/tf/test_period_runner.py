"""The runner's ``--period=steps|time`` (in process, logical CPUs)."""

import io

import pytest

from experiments import train


def test_time_period_runs_and_records_its_counts():
    buf = io.StringIO()
    cfg = train.Config(
        strategy="skip_correct", model="mlp", seed=1, replicas=2, steps=8, interval=4, period="time"
    )
    rec = train.run(cfg, out=buf).record
    # one process: every replica has the same measured step time, so every count is H
    assert rec["period"] == "time" and rec["period_steps"] == [4, 4] and rec["real_steps"] == 8
    assert rec["steps"] == 8


def test_tau_eff_reaches_the_strategy():
    cfg = train.Config(
        strategy="skip_correct",
        model="mlp",
        seed=1,
        replicas=2,
        steps=4,
        interval=4,
        period="time",
        tau_eff="max",
    )
    rec = train.run(cfg, out=io.StringIO()).record
    assert rec["period"] == "time" and rec["tau_eff"] == "max"


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--period=wall"], "--period: unknown period 'wall'"),
        (["--period=time", "--strategy=ssgd"], "--period: --strategy=ssgd has no local steps"),
        (["--period=time", "--interval=auto"], "--period: --period=time needs an integer --interval"),
        (["--period=time", "--overlap"], "--period: --period=time needs no --overlap"),
        (
            ["--period=time", "--tau_eff=median"],
            "--tau_eff: unknown tau_eff 'median'; choose one of mean, max",
        ),
        (["--tau_eff=max"], "--tau_eff: needs --period=time"),
        (["--batch_shares=1,0"], "--batch_shares: item '0': a share must be a finite number > 0"),
        (["--batch_shares=1,x"], "--batch_shares: item 'x': a share must be a finite number > 0"),
        (
            ["--batch_shares=1,1", "--strategy=ssgd"],
            "--batch_shares: needs --strategy=skip_correct or local_sgd, without --backup_dir",
        ),
    ],
)
def test_bad_period_flags_are_one_line(flags, message, capsys):
    argv = ["train", "--strategy=skip_correct", "--model=mlp", "--steps=2", *flags]
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"experiments.train: error: {message}"), err


def test_batch_shares_size_each_workers_batches():
    """Worker i of 4 reads per-worker-batch x share_i / max share examples per step, from its own shard."""
    import numpy as np
    import tensorflow as tf

    from experiments.data import train_dataset_fn
    from tf_commopt.errors import InputError

    x, y = np.arange(400, dtype=np.float32).reshape(400, 1), np.arange(400) % 10
    fn = train_dataset_fn(x, y, global_batch=32, seed=0, shares=(1.0, 0.5, 1.0, 0.25))
    for worker, want in enumerate([8, 4, 8, 2]):
        xb, _ = next(iter(fn(tf.distribute.InputContext(4, worker, 4))))
        assert xb.shape[0] == want
        assert np.all(xb.numpy()[:, 0] % 4 == worker)  # element i is shard i mod 4's
    with pytest.raises(InputError, match="names 4 shares for 2 worker"):
        fn(tf.distribute.InputContext(2, 0, 2))
