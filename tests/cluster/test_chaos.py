"""Chaos on a 2-worker skip-and-correct run (H = 8, momentum 0.9) under ``tf_commopt.cluster
--max-restarts 3``: workers SIGKILLed at moments the test controls (inside a backup write, inside a sync)
and at a random one (seeded; the seed is in the failure message), and a SIGTERM to one worker. Each run
must end with the uninterrupted run's final weights (deterministic data order, backups at the same
steps). The heavier measured runs are on docs/results/chaos.md (``experiments.chaos_bench``).
"""

import json
import os
import random
import shutil
import tempfile

import pytest

from experiments.chaos_bench import Kill, chaos_plan, final_weights, max_weight_diff, run_with_faults

WORKERS, H, EVERY, STEPS_PER_EPOCH, EPOCHS = 2, 8, 16, 40, 3
ARGV = [
    "--strategy=skip_correct",
    f"--interval={H}",
    "--model=mlp",
    f"--epochs={EPOCHS}",
    f"--steps_per_epoch={STEPS_PER_EPOCH}",
    "--batch_size=32",
    f"--backup_every={EVERY}",
]
SEED = int(os.environ.get("CHAOS_SEED", random.randrange(1 << 16)))


def _run(tmp, kills):
    argv = ARGV + [f"--model_dir={tmp}/model", f"--backup_dir={tmp}/backup"]
    r, done, _ = run_with_faults(argv, WORKERS, kills, max_restarts=3, timeout=900)
    tail = "\n".join(f"[{t}] {x}" for t in r.outputs for x in r.last_lines(t, 6))
    assert r.returncode == 0, f"seed {SEED}: {r.message}\n{tail}"
    recs = [json.loads(x) for x in r.outputs["worker:0"] if x.startswith("{")]
    return r, done, recs[-1], final_weights(f"{tmp}/model")


@pytest.fixture(scope="module")
def reference():
    tmp = tempfile.mkdtemp(prefix="chaos-ref-")
    try:
        r, _, rec, weights = _run(tmp, [])
        assert (r.restarts, rec["restarts"], rec["steps"]) == (0, 0, EPOCHS * STEPS_PER_EPOCH)
        yield weights
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_three_kills_end_with_the_uninterrupted_weights(reference, tmp_path):
    kills = chaos_plan(SEED, WORKERS, EVERY, H, by_step=True)  # the random kill before the run ends
    r, done, rec, weights = _run(tmp_path, kills)
    where = f"seed {SEED}, kills {kills}"
    assert [k["phase"] for k in done] == ["backup", "sync", "step"], where
    assert r.restarts == 3 and len(r.restart_log) == 3 and r.restart_log[0]["code"] == 137, where
    steps = [x["step"] for x in rec["resumes"]]
    # held in the backup at 2·EVERY: resume at EVERY; killed in the sync after 2·EVERY: resume at 2·EVERY;
    # killed in the backup period after that: resume from the last backup before the kill (an epoch's end
    # may come first)
    assert steps[:2] == [EVERY, 2 * EVERY] and len(steps) == 3, (steps, where)
    assert 2 * EVERY <= steps[2] <= 3 * EVERY, (steps, where)
    assert rec["restarts"] == 3 and rec["steps"] == EPOCHS * STEPS_PER_EPOCH, where
    assert all(x["lost_s"] > 0 for x in rec["resumes"]) and rec["lost_s"] > 0, where
    assert max_weight_diff(weights, reference) <= 1e-5, where


def test_sigterm_to_one_worker_saves_at_one_step_and_resumes_there(reference, tmp_path):
    rng = random.Random(SEED)
    kill = Kill("term", 0, rng.randrange(WORKERS), step=rng.randrange(20, 90))
    r, done, rec, weights = _run(tmp_path, [kill])
    where = f"seed {SEED}, {kill}"
    assert r.restarts == 1 and 143 in [e["code"] for e in r.restart_log], where  # saved and exited 143
    step = rec["resumed_at_step"]
    # the first step after the SIGTERM that follows a sync; not a periodic backup's step
    assert kill.step <= step < kill.step + 2 * H and step % H == 0, where
    for task in range(WORKERS):  # every worker backed up that step before it exited
        with open(tmp_path / "backup" / f"worker-{task}" / "ledger.jsonl") as f:
            events = [json.loads(x) for x in f if x.strip()]
        assert {"event": "backup", "step": step, "attempt": 0} in [
            {k: e.get(k) for k in ("event", "step", "attempt")} for e in events
        ], where
    assert max_weight_diff(weights, reference) <= 1e-5, where
