"""Load: a 4-worker skip-and-correct job on loopback for ~1-2 minutes (bounded), nothing leaks.

``experiments.stress.run_stress`` runs the job through ``tf_commopt.cluster`` (each task reports its RSS,
threads and open file descriptors after every epoch, read from /proc) and then checks: RSS growth per
task after the warm-up epochs within a bound, no thread / descriptor growth beyond a small slack, no
process of the job alive afterwards, every cluster port released, no extra thread in the launcher.
The per-epoch table is printed in the test output (recorded in docs/reliability.md).
"""

import sys

import pytest

from experiments.stress import run_stress

WORKERS, EPOCHS, WARMUP, STEPS = 4, 30, 5, 25  # the full run (docs/reliability.md): --epochs=60
MAX_GROWTH_MB = 40.0


@pytest.mark.timeout(280)
def test_four_worker_stress_memory_flat_nothing_leaks(capsys):
    with capsys.disabled():
        print(
            f"\n[stress] python -m experiments.stress --workers={WORKERS} --epochs={EPOCHS} "
            f"--warmup_epochs={WARMUP} --steps_per_epoch={STEPS}"
        )
        res = run_stress(
            workers=WORKERS,
            epochs=EPOCHS,
            warmup_epochs=WARMUP,
            steps_per_epoch=STEPS,
            max_growth_mb=MAX_GROWTH_MB,
            timeout_s=240,
            out=sys.stdout,
        )
    failed = [name for name, ok in res["checks"].items() if not ok]
    assert failed == [], failed
    assert len(res["growth"]) == WORKERS and len(res["rows"]) == WORKERS * EPOCHS
    for task, g in res["growth"].items():  # flat: the last epoch within the bound of the warm-up baseline
        assert g["rss_mb"] <= MAX_GROWTH_MB, (task, g)
