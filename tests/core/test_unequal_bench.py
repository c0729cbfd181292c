"""experiments.unequal_bench's tta sweep as data: its settings are checked before anything runs, and its
launches are the runner flags the page describes (in process, nothing started)."""

import pytest

from tests.inprocess import run_module


@pytest.mark.parametrize(
    "setting,message",
    [
        ("100:iid", "--settings: '100:iid': expected MBIT:iid|skew:SLOWED"),
        ("100:noniid:2", "--settings: '100:noniid:2': expected MBIT >= 0, iid or skew, SLOWED 0, 1 or 2"),
        ("100:iid:3", "--settings: '100:iid:3': expected MBIT >= 0, iid or skew, SLOWED 0, 1 or 2"),
    ],
)
def test_bad_settings_are_one_line(setting, message):
    r = run_module("experiments.unequal_bench", ["--sweep=tta", f"--settings={setting}"])
    assert r.code == 2 and r.err.count("\n") == 1 and message in r.err, r.err


def test_the_sweep_launches_each_variant_at_the_same_interval():
    from absl import flags

    from experiments import unequal_bench

    fv = flags.FlagValues()
    unequal_bench.define(fv)
    fv(["bench", "--sweep=tta", "--settings=10:skew:2", "--interval=8", "--model=mlp"])
    sweep = unequal_bench.tta_sweep(fv)
    argv = {v: sweep.launch("10:skew:2", v).argv for v in sweep.variants}
    assert set(argv) == {"ssgd", "sc_steps", "sc_time"}
    for a in argv.values():
        assert "--interval=8" in a and "--non_iid_classes=2" in a and "--slow_workers=1:2.0,3:2.0" in a
    assert "--period=time" in argv["sc_time"] and "--period=steps" in argv["sc_steps"]
    fv(["bench", "--sweep=tta", "--settings=10:skew:2", "--tta_variants=sc_steps,sc_time_max"])
    sweep = unequal_bench.tta_sweep(fv)
    assert sweep.variants == ["sc_steps", "sc_time_max"]
    assert "--tau_eff=max" in sweep.launch("10:skew:2", "sc_time_max").argv
    r = run_module("experiments.unequal_bench", ["--sweep=tta", "--tta_variants=sc_time,fast"])
    assert r.code == 2 and "--tta_variants: unknown fast" in r.err, r.err
    assert sweep.launch("10:skew:2", "ssgd").workers == 4 and sweep.launch("10:skew:2", "ssgd").mbit == 10.0


def test_evaluations_by_steps_replace_those_by_seconds_and_are_recorded():
    from absl import flags

    from experiments import unequal_bench

    fv = flags.FlagValues()
    unequal_bench.define(fv)
    fv(["bench", "--sweep=tta", "--settings=100:iid:0", "--eval_every_s=0.5"])
    sweep = unequal_bench.tta_sweep(fv)
    argv = sweep.launch("100:iid:0", "sc_steps").argv
    assert "--eval_every_s=0.5" in argv and not any(a.startswith("--eval_every=") for a in argv)
    assert sweep.extra["eval_every_s"] == 0.5 and "eval_every" not in sweep.extra
    fv(["bench", "--sweep=tta", "--settings=100:iid:0", "--eval_every=16"])
    sweep = unequal_bench.tta_sweep(fv)
    argv = sweep.launch("100:iid:0", "sc_steps").argv
    assert "--eval_every=16" in argv and not any(a.startswith("--eval_every_s") for a in argv)
    assert sweep.extra["eval_every"] == 16 and "eval_every_s" not in sweep.extra
    r = run_module("experiments.unequal_bench", ["--sweep=tta", "--interval=16", "--eval_every=24"])
    assert r.code == 2 and "--eval_every: must be a multiple of --interval=16, got 24" in r.err, r.err


@pytest.mark.parametrize(
    "setting,workers,ok", [("100:iid:1", 2, True), ("100:iid:2", 2, False), ("100:iid:2", 4, True)]
)
def test_the_workers_must_hold_the_slowed_ones(setting, workers, ok):
    from absl import flags

    from experiments import _cli, unequal_bench

    fv = flags.FlagValues()
    unequal_bench.define(fv)
    fv(["bench", "--sweep=tta", f"--settings={setting}", f"--workers={workers}"])
    if ok:
        assert unequal_bench.tta_sweep(fv).launch(setting, "sc_time").workers == workers
    else:
        with pytest.raises(
            _cli.UsageError, match=f"--workers: setting {setting} slows workers 1 and 3 first"
        ):
            unequal_bench.tta_sweep(fv)


def test_a_device_factor_stretches_every_worker_and_the_slowed_ones_twice():
    from absl import flags

    from experiments import unequal_bench

    fv = flags.FlagValues()
    unequal_bench.define(fv)
    fv(["bench", "--sweep=tta", "--settings=100:iid:0,100:iid:2", "--device_factor=4"])
    sweep = unequal_bench.tta_sweep(fv)
    assert "--slow_workers=0:4,1:4,2:4,3:4" in sweep.launch("100:iid:0", "sc_time").argv
    assert "--slow_workers=0:4,1:8,2:4,3:8" in sweep.launch("100:iid:2", "sc_steps").argv
    assert sweep.extra["device_factor"] == 4.0
    r = run_module("experiments.unequal_bench", ["--sweep=tta", "--device_factor=0.5"])
    assert r.code == 2 and "--device_factor: must be >= 1, got 0.5" in r.err, r.err


def _device_run(fixed_s, per_example_s, calls):
    """A stand-in cluster for the calibration's launches: worker w's step takes fixed_s[w] +
    per_example_s[w] * its batch (global batch / workers), reported as tf_commopt's records are."""

    def run(launch):
        calls.append(launch)
        batch = int(next(a for a in launch.argv if a.startswith("--batch_size=")).split("=")[1])
        steps = int(next(a for a in launch.argv if a.startswith("--steps=")).split("=")[1])
        per = batch // launch.workers
        tasks = [
            {"task": f"worker:{w}", "steps": steps, "step_ms": 1e3 * (a + c * per)}
            for w, (a, c) in enumerate(zip(fixed_s, per_example_s))
        ]
        return {"tasks": tasks[::-1]}

    return run


def test_calibrated_shares_come_from_both_batches_of_every_worker():
    from experiments.batch_shares import calibrate_shares
    from tf_commopt.core.shares import equal_time_shares

    fixed, per_example = [0.02, 0.04, 0.02, 0.04], [4e-4, 8e-4, 4e-4, 8e-4]
    calls = []
    out = calibrate_shares(
        "cnn", 512, 4, "0:4,1:8,2:4,3:8", 100.0, run=_device_run(fixed, per_example, calls)
    )
    assert [c.argv[2] for c in calls] == ["--batch_size=512", "--batch_size=256"]
    assert all(c.all_tasks and c.workers == 4 and c.mbit == 100.0 for c in calls)
    assert all("--slow_workers=0:4,1:8,2:4,3:8" in c.argv and "--step_times" in c.argv for c in calls)
    full = [a + c * 128 for a, c in zip(fixed, per_example)]
    half = [a + c * 64 for a, c in zip(fixed, per_example)]
    want = equal_time_shares(full, half, 128)
    assert out["batch_shares"] == ",".join(f"{s:g}" for s in want) == "1,0.305,1,0.305"
    assert out["t_full_ms"] == pytest.approx([1e3 * t for t in full]) and out["per_worker_batch"] == 128


def test_measured_shares_are_calibrated_once_per_setting_and_recorded(monkeypatch):
    from absl import flags

    from experiments import unequal_bench

    seen = []

    def calibrate(model, batch, workers, slow, mbit):
        seen.append((model, batch, workers, slow, mbit))
        return {"batch_shares": "1,0.4,1,0.4"}

    monkeypatch.setattr(unequal_bench, "calibrate_shares", calibrate)
    fv = flags.FlagValues()
    unequal_bench.define(fv)
    argv = ["bench", "--sweep=tta", "--settings=100:iid:2", "--device_factor=4", "--share_rule=measured"]
    fv(argv + ["--tta_variants=sc_steps,sc_balanced,sc_balanced_speed", "--model=cnn", "--batch_size=512"])
    sweep = unequal_bench.tta_sweep(fv)
    assert "--batch_shares=1,0.5,1,0.5" in sweep.launch("100:iid:2", "sc_balanced_speed").argv
    for _ in range(2):
        assert "--batch_shares=1,0.4,1,0.4" in sweep.launch("100:iid:2", "sc_balanced").argv
    assert seen == [("cnn", 512, 4, "0:4,1:8,2:4,3:8", 100.0)]
    described = sweep.describe("100:iid:2")
    assert described["share_rule"] == "measured" and described["share_calibration"] == {
        "batch_shares": "1,0.4,1,0.4"
    }
