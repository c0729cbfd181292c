"""``--max-restarts N`` on a collective cluster, with plain Python tasks (no TensorFlow): after a task
fails, every task is stopped and started again with the same TF_CONFIG, ``TF_COMMOPT_RESTART`` counts the
starts, tasks without a backup directory get a temporary one (removed after success, kept after a
failure), the budget is bounded, and a preempted task (exit 143) gives the others time to save."""

import io
import json
import os
import sys

from tf_commopt.cluster import main, run_cluster

PY = sys.executable

# every task prints its start (TF_COMMOPT_RESTART), TF_CONFIG and backup dir; worker:1 fails on its first
# start (or always with ALWAYS set) with CODE; on SIGTERM a task says it saved and exits 143
TASK = """
import json, os, signal, sys, time
task = json.loads(os.environ["TF_CONFIG"])["task"]
n = os.environ.get("TF_COMMOPT_RESTART")
def term(signum, frame):
    print("saved on SIGTERM", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
print("start", n, json.dumps(task), os.environ.get("TF_COMMOPT_BACKUP_DIR"), flush=True)
if task["index"] == 1 and (n == "0" or os.environ.get("ALWAYS")):
    time.sleep(0.5)
    sys.exit(int(os.environ.get("CODE", "3")))
time.sleep(1.5 if task["index"] != 1 else 0.2)
print("done", flush=True)
"""


def _starts(r, task):
    return [line.split()[1] for line in r.outputs[task] if line.startswith("start")]


def test_a_failed_task_restarts_every_task_with_the_same_tf_config_and_a_temporary_backup_dir():
    buf = io.StringIO()
    r = run_cluster([PY, "-c", TASK], workers=3, max_restarts=2, stream=buf, timeout=60)
    assert r.returncode == 0, r.message
    assert (r.restarts, r.worker_failures) == (1, ["worker:1 exit 3"])
    assert r.message == "all 3 task(s) finished (1 worker failure(s) tolerated, 1 restart(s))"
    assert [e["task"] for e in r.restart_log] == ["worker:1"] and r.restart_log[0]["code"] == 3
    for t in ("worker:0", "worker:1", "worker:2"):
        assert _starts(r, t) == ["0", "1"], r.outputs[t]  # every task started again, and told so
        configs = {
            line.split(" ", 2)[2].rsplit(" ", 1)[0] for line in r.outputs[t] if line.startswith("start")
        }
        assert configs == {json.dumps(r.tf_configs[t]["task"])}  # the same TF_CONFIG both times
    dirs = {line.rsplit(" ", 1)[1] for t in r.outputs for line in r.outputs[t] if line.startswith("start")}
    assert dirs == {r.backup_dir} and r.backup_dir.startswith("/tmp")  # one directory, said on stderr
    assert not os.path.exists(r.backup_dir)  # removed after a successful run
    log = buf.getvalue()
    assert f"tf_commopt.cluster: restarts asked for: TF_COMMOPT_BACKUP_DIR={r.backup_dir}" in log
    assert "tf_commopt.cluster: worker:1 exited with code 3; restarting every task (1/2)" in log


def test_the_budget_is_bounded_and_the_backups_are_kept_after_a_failure():
    r = run_cluster([PY, "-c", TASK], workers=2, max_restarts=2, env={"ALWAYS": "1"}, echo=False, timeout=60)
    assert (r.returncode, r.failed_task, r.restarts) == (3, "worker:1", 2)
    assert _starts(r, "worker:1") == ["0", "1", "2"]  # it prints before it fails
    assert r.message == f"task worker:1 failed with exit code 3; backups kept in {r.backup_dir}"
    assert os.path.isdir(r.backup_dir)
    os.rmdir(r.backup_dir)


def test_a_backup_dir_of_the_callers_own_is_not_replaced(tmp_path):
    env = {"TF_COMMOPT_BACKUP_DIR": str(tmp_path)}
    r = run_cluster([PY, "-c", TASK], workers=2, max_restarts=1, env=env, echo=False, timeout=60)
    assert r.returncode == 0 and r.backup_dir is None
    assert {line.rsplit(" ", 1)[1] for line in r.outputs["worker:0"] if line.startswith("start")} == {
        str(tmp_path)
    }


def test_a_preempted_task_lets_the_others_save_before_the_restart():
    r = run_cluster([PY, "-c", TASK], workers=2, max_restarts=1, env={"CODE": "143"}, echo=False, timeout=60)
    assert r.returncode == 0 and r.worker_failures == ["worker:1 exit 143"], r.message
    assert r.outputs["worker:0"][:2] == [r.outputs["worker:0"][0], "saved on SIGTERM"]  # SIGTERM, not SIGKILL
    assert _starts(r, "worker:0") == ["0", "1"]


def test_the_command_line_restarts_and_without_the_flag_fails_fast(capsys):
    assert main(["--workers", "2", "--max-restarts", "1", "--quiet", "--", PY, "-c", TASK]) == 0
    assert main(["--workers", "2", "--quiet", "--", PY, "-c", TASK]) == 3
    err = capsys.readouterr().err
    assert "task worker:1 failed with exit code 3" in err
    assert main(["--workers", "2", "--ps", "1", "--chief", "--max-restarts", "1", "--", "true"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("tf_commopt.cluster: error: --max-restarts: restarts a collective cluster whole")
