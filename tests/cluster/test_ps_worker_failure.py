"""Failures on a parameter-server cluster run by the launcher: real processes, real SIGKILL.

* a worker SIGKILLed mid-run under ``run_cluster(..., restart_workers=1)``: the run goes on, the launcher
  restarts the worker, TensorFlow's coordinator takes it back, and every round still equals the numpy
  reference (the killed worker's closure was re-run from the ps state: same shard, same batch, same slot);
* ``experiments.train`` with a worker SIGKILLed mid-run under ``tolerate_worker_failures``: it finishes
  with the test accuracy of the uninterrupted run (within 1 point; the rule says: equal);
* the ps task SIGKILLed under the default policy: the chief stops with one line naming the ps task
  before the launcher ends the cluster, and the same command on a fresh cluster resumes from the last
  checkpoint and continues exactly as the reference.
"""

import json
import os
import signal
import sys
import threading
import time

from tf_commopt.cluster import run_cluster, task_pid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JOB = os.path.join(HERE, "_ps_job.py")
sys.path.insert(0, HERE)
import numpy as np  # noqa: E402
from test_parameter_server import _check_rounds, _records, reference  # noqa: E402


class _Lines:
    """A stream for ``run_cluster(echo=True, stream=...)`` that keeps the prefixed lines as they come."""

    def __init__(self):
        self.lines = []

    def write(self, text):
        self.lines.extend(text.splitlines())

    def flush(self):
        pass

    def wait_for(self, prefix, timeout, done=None):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(line.startswith(prefix) for line in list(self.lines)):
                return
            if done is not None and not done.is_alive():
                break
            time.sleep(0.1)
        raise AssertionError(
            f"no line {prefix!r} within {timeout} s; last lines:\n" + "\n".join(self.lines[-20:])
        )


def _pid(token, task_type, index):
    """The python process of task ``task_type:index`` of the cluster whose tasks have ``I19_TOKEN=token``."""
    pid = task_pid(f"I19_TOKEN={token}", task_type, index)
    if pid is None:
        raise AssertionError(f"no process of {task_type}:{index}")
    return pid


def _start(cmd, token, **kwargs):
    lines, box = _Lines(), {}

    def run():
        box["r"] = run_cluster(
            cmd,
            workers=2,
            ps=1,
            chief=True,
            timeout=240,
            echo=True,
            stream=lines,
            cwd=ROOT,
            env={"TF_CPP_MIN_LOG_LEVEL": "2", "I19_TOKEN": token},
            **kwargs,
        )

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, lines, box


def test_killed_worker_is_restarted_rejoins_and_rounds_stay_exact():
    th, lines, box = _start([sys.executable, JOB, "kill", "90", "60"], "restart", restart_workers=1)
    lines.wait_for("[chief:0] ROUND 3 ", 150, th)
    os.kill(_pid("restart", "worker", 1), signal.SIGKILL)
    th.join(200)
    r = box["r"]
    assert r.ok, f"{r.message}\n" + "\n".join(lines.lines[-20:])
    assert (r.worker_failures, r.restarts) == (["worker:1 exit 137"], 1)
    assert "tf_commopt.cluster: worker:1 exited with code 137; restarting it (1/1)" in lines.lines
    rec = _records(r.outputs["chief:0"], "RESULT")[0]
    workers = [q["workers"] for q in rec["rounds"]]
    lost = [k for k, w in enumerate(workers) if k > 3 and w == [0, 0]]
    assert lost, workers  # rounds ran on worker 0 alone while worker 1 was down ...
    assert any(1 in w for w in workers[lost[-1] :]), (
        workers
    )  # ... and the restarted worker 1 ran shards again
    assert any("are back and ran shards again" in line for line in r.outputs["chief:0"])
    _check_rounds(rec)  # every round, before, during and after the loss, equals the numpy reference


def test_runner_finishes_with_the_accuracy_of_an_uninterrupted_run_after_a_worker_kill():
    cmd = [
        sys.executable,
        "-m",
        "experiments.train",
        "--strategy=skip_correct",
        "--interval=4",
        "--correction=vrl",
        "--momentum=0",
        "--learning_rate=0.1",
        "--model=mlp",
        "--steps=400",
        "--batch_size=64",
    ]
    th, lines, box = _start(cmd, "fit-kill", tolerate_worker_failures=True)
    lines.wait_for("[chief:0] round 21/100", 150, th)
    os.kill(_pid("fit-kill", "worker", 1), signal.SIGKILL)
    th.join(200)
    killed = box["r"]
    assert killed.ok, f"{killed.message}\n" + "\n".join(lines.lines[-20:])
    assert killed.worker_failures == ["worker:1 exit 137"] and killed.restarts == 0
    rk = json.loads([line for line in killed.outputs["chief:0"] if line.startswith("{")][-1])
    assert rk["lost_workers"] == [1] and rk["steps"] == 400
    ref = run_cluster(
        cmd, workers=2, ps=1, chief=True, timeout=240, echo=False, cwd=ROOT, env={"TF_CPP_MIN_LOG_LEVEL": "2"}
    )
    assert ref.ok, ref.message
    rr = json.loads([line for line in ref.outputs["chief:0"] if line.startswith("{")][-1])
    assert rr["lost_workers"] == [] and rr["test_accuracy"] > 0.8
    print(
        "accuracy uninterrupted",
        rr["test_accuracy"],
        "killed",
        rk["test_accuracy"],
        "wall",
        rr["wall_s"],
        rk["wall_s"],
    )
    assert abs(rk["test_accuracy"] - rr["test_accuracy"]) <= 0.01
    assert abs(rk["train_loss"] - rr["train_loss"]) <= 0.01


def test_ps_killed_clear_error_then_resume_from_checkpoint(tmp_path):
    """Under the launcher's default policy a dead ps ends the cluster, but only after the chief has said
    why (its one line, shown by the launcher too); the same command then resumes."""
    backup = str(tmp_path / "ps_backup")
    cmd = [sys.executable, JOB, "resume", "12", backup]
    th, lines, box = _start(cmd, "pskill")
    lines.wait_for("[chief:0] ROUND 4 ", 150, th)
    os.kill(_pid("pskill", "ps", 0), signal.SIGKILL)
    th.join(200)
    r = box["r"]
    assert (r.returncode, r.failed_task, r.reporters) == (137, "ps:0", ["chief:0"]), r.message
    assert "tf_commopt.cluster: ps:0 exited with code 137; waiting for the chief to report it" in lines.lines
    err = [line for line in r.outputs["chief:0"] if line.startswith("ERROR ")]
    assert err and "parameter-server task ps 0" in err[0] and "is gone" in err[0], r.outputs["chief:0"][-10:]
    assert "resume from the last save()" in err[0]
    saved = sorted(int(n[6:]) for n in os.listdir(backup) if n.startswith("round-"))
    assert saved and saved[-1] >= 5, saved

    again = run_cluster(
        cmd, workers=2, ps=1, chief=True, timeout=240, echo=False, cwd=ROOT, env={"TF_CPP_MIN_LOG_LEVEL": "2"}
    )
    assert again.ok, again.message + "\n" + "\n".join(again.last_lines("chief:0"))
    rec = _records(again.outputs["chief:0"], "RESULT")[0]
    first = rec["first"]
    assert first == saved[-1] and len(rec["rounds"]) == 12 - first
    want, _ = reference(rec, 12)
    for j, got in enumerate(rec["rounds"]):  # the resumed rounds continue the uninterrupted reference exactly
        for g, e in zip(got["weights"], want[first + j]):
            np.testing.assert_allclose(np.array(g), e, atol=1e-5, rtol=0, err_msg=f"round {first + j}")


def test_failure_options_only_for_ps_clusters_and_the_ps_default_restarts_bounded():
    import subprocess

    import pytest

    from tf_commopt.errors import InputError

    with pytest.raises(InputError, match="^--tolerate-worker-failures: only for parameter-server clusters"):
        run_cluster(["true"], workers=2, tolerate_worker_failures=True, echo=False)
    with pytest.raises(InputError, match="^--restart-workers: only for parameter-server clusters"):
        run_cluster(["true"], workers=2, ps=1, restart_workers=1, echo=False)  # no chief
    with pytest.raises(InputError, match="^--restart-workers: must be an integer >= 0"):
        run_cluster(["true"], workers=2, ps=1, chief=True, restart_workers=-1, echo=False)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "tf_commopt.cluster",
            "--workers",
            "2",
            "--restart-workers",
            "2",
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith(
        "tf_commopt.cluster: error: --restart-workers: only for parameter-server clusters"
    ), p.stderr
    # --fail-fast (the old default): a worker failing ends a ps cluster with its exit code, nothing restarted
    always_fails = ["sh", "-c", 'case "$TF_CONFIG" in *\'"worker", "index": 1\'*) exit 5;; esac; sleep 2']
    r = run_cluster(always_fails, workers=2, ps=1, chief=True, echo=False, timeout=30, fail_fast=True)
    assert (r.returncode, r.failed_task, r.worker_failures, r.restarts) == (5, "worker:1", [], 0)
    # the default: the dead worker is started again while the chief runs, at most 3 times, then dropped
    r = run_cluster(always_fails, workers=2, ps=1, chief=True, echo=False, timeout=30)
    assert r.returncode == 0 and 1 <= r.restarts <= 3, r.message
    assert set(r.worker_failures) == {"worker:1 exit 5"} and len(r.worker_failures) in (
        r.restarts,
        r.restarts + 1,
    )
    # tolerated without restarts: the failure is recorded and the run ends when the chief and worker 0 are done
    r = run_cluster(
        always_fails, workers=2, ps=1, chief=True, echo=False, timeout=30, tolerate_worker_failures=True
    )
    assert (r.returncode, r.worker_failures, r.restarts) == (0, ["worker:1 exit 5"], 0), r.message


def test_runner_backup_dir_saves_and_a_rerun_resumes(tmp_path):
    """``experiments.train --backup_dir`` on a ps cluster: checkpoints appear; the same command resumes."""
    backup = str(tmp_path / "b")
    cmd = [
        sys.executable,
        "-m",
        "experiments.train",
        "--strategy=skip_correct",
        "--interval=2",
        "--model=mlp",
        "--steps=8",
        "--batch_size=64",
        "--momentum=0.5",
        f"--backup_dir={backup}",
    ]
    first = run_cluster(
        cmd, workers=2, ps=1, chief=True, timeout=200, echo=False, cwd=ROOT, env={"TF_CPP_MIN_LOG_LEVEL": "2"}
    )
    assert first.ok, first.message + "\n" + "\n".join(first.last_lines("chief:0"))
    assert sorted(os.listdir(backup)) == ["round-3", "round-4"]  # a save per round (4 rounds), last two kept
    r1 = json.loads([line for line in first.outputs["chief:0"] if line.startswith("{")][-1])
    assert r1["resumed_after_round"] == 0 and r1["correction"] == "gradient"  # auto, SGD with momentum
    again = run_cluster(
        cmd, workers=2, ps=1, chief=True, timeout=200, echo=False, cwd=ROOT, env={"TF_CPP_MIN_LOG_LEVEL": "2"}
    )
    assert again.ok, again.message
    assert any(line.startswith("resuming after round 4 from ") for line in again.outputs["chief:0"])
    r2 = json.loads([line for line in again.outputs["chief:0"] if line.startswith("{")][-1])
    assert (r2["resumed_after_round"], r2["steps"], r2["syncs"]) == (4, 8, 4)
    assert r2["test_accuracy"] == r1["test_accuracy"]  # nothing trained after the resume: the saved model


def test_ps_cluster_tasks_get_at_least_two_inter_op_threads(monkeypatch):
    """One inter-op thread deadlocks ParameterServerStrategy (round 0 never finished); the launcher gives
    every task at least 2 inter-op threads (collective clusters too: any blocking op needs a spare)."""
    from tf_commopt.threads import THREAD_VARS

    for v in THREAD_VARS:
        monkeypatch.delenv(v, raising=False)
    show = [
        sys.executable,
        "-c",
        "import os; print(os.environ['TF_NUM_INTEROP_THREADS'], os.environ['TF_NUM_INTRAOP_THREADS'])",
    ]
    r = run_cluster(show, workers=2, ps=1, chief=True, threads_per_task=1, echo=False, timeout=30)
    assert r.ok and {r.outputs[t][-1] for t in ("chief:0", "worker:0", "worker:1")} == {"2 1"}, r.outputs
    r = run_cluster(show, workers=2, threads_per_task=1, echo=False, timeout=30)  # collective: the same rule
    assert r.ok and {r.outputs[t][-1] for t in ("worker:0", "worker:1")} == {"2 1"}, r.outputs
