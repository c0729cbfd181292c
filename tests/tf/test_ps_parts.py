"""The parameter-server package's parts that need no cluster: docstring examples, the byte count of each
kind of round against its closed form, and the failure policy with a stand-in coordinator."""

import doctest
import importlib
import time

import pytest

from tf_commopt.distribute.ps.failures import FailureWatch
from tf_commopt.distribute.ps.plan import RoundPlan
from tf_commopt.errors import ClusterError

MODULES = [
    "probe",
    "data",
    "plan",
    "auto_interval",
    "telemetry",
    "checkpoints",
    "failures",
    "metrics",
    "forward",
]
DOWN = "127.0.0.1:1"  # nothing listens on port 1


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    mod = importlib.import_module(f"tf_commopt.distribute.ps.{name}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize("interval", [1, 4])
@pytest.mark.parametrize("correction", ["none", "vrl", "gradient"])
@pytest.mark.parametrize("ps_finish", [True, False])
@pytest.mark.parametrize("slots", [0, 2])
def test_bytes_per_round_closed_form(interval, correction, ps_finish, slots):
    plan = RoundPlan(interval, correction, ps_finish and correction != "gradient", slots)
    k, p = 3, 1000
    pushes_gradient = interval == 1 and (plan.ps_finish or correction == "none")
    if pushes_gradient:  # pull x, push g_i
        want = k * 2 * p
    else:  # pull x, push s_i, pull D_i, push G_i, pull + push each slot
        want = k * (2 + (correction != "none") + (correction == "gradient") + 2 * slots) * p
    assert plan.bytes_per_round(k, p) == want
    assert plan.local == (not pushes_gradient)


class _Coordinator:
    def __init__(self, hang_s=0.0, error=None):
        self.hang_s, self.error = hang_s, error

    def join(self):
        time.sleep(self.hang_s)
        if self.error:
            raise self.error


def test_a_round_that_hangs_is_a_one_line_error_naming_the_silent_tasks():
    watch = FailureWatch({"worker": [DOWN], "ps": []}, round_timeout_s=0.2, num_workers=1)
    with pytest.raises(ClusterError) as e:
        watch.join(_Coordinator(hang_s=5), "round 8", rounds_done=8)
    msg = str(e.value)
    assert "\n" not in msg and "round 8 did not finish within 0.2 s" in msg and f"worker 0 ({DOWN})" in msg


def test_a_lost_ps_stops_training_with_the_last_completed_round():
    watch = FailureWatch({"worker": [], "ps": [DOWN]}, round_timeout_s=5, num_workers=0)
    with pytest.raises(ClusterError) as e:
        watch.join(_Coordinator(error=RuntimeError("boom")), "round 5", rounds_done=5)
    msg = str(e.value)
    assert "\n" not in msg and f"ps 0 ({DOWN}) is gone" in msg and "last completed round: 5" in msg


def test_a_failed_round_names_the_error_and_a_clean_one_passes():
    watch = FailureWatch({"worker": [], "ps": []}, round_timeout_s=5, num_workers=0)
    with pytest.raises(ClusterError, match=r"^round 3 failed: RuntimeError: boom second line$"):
        watch.join(_Coordinator(error=RuntimeError("boom\nsecond line")), "round 3", rounds_done=3)
    watch.join(_Coordinator(), "round 4", rounds_done=4)


def test_a_lost_worker_is_reported_once_and_its_return_noted(capsys):
    watch = FailureWatch({"worker": ["127.0.0.1:9", DOWN], "ps": []}, round_timeout_s=5, num_workers=2)
    for r in (6, 7):  # worker 1 ran nothing (unreachable); worker 0 (also unreachable) ran both shards
        rec = {"round": r, "workers": [0, 0]}
        watch.after_round(rec, num_shards=2)
        assert rec["idle_workers"] == [1] and rec["lost_workers"] == [1]
    rec = {"round": 8, "workers": [0, 1]}
    watch.after_round(rec, num_shards=2)
    assert watch.lost_workers == set() and watch.rejoined_workers == [1] and "idle_workers" not in rec
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "round 6: worker 1" in err[0] and "round 8: worker(s) [1] are back" in err[1]
