"""Restart-and-resume without processes: the failure policies and their flags, the launcher/script
protocol (environment variables, exit code 143), the backup resume point, the ledger's lost time and the
chaos hooks."""

import io
import json
import os
import signal
import time

import pytest

from experiments import backup, resume
from tf_commopt.cluster.policy import (
    DEFAULT_WORKER_RESTARTS,
    PREEMPT_GRACE_S,
    PS_REPORT_GRACE_S,
    Action,
    ClusterView,
    FailFast,
    RestartGroup,
    TolerateWorkers,
    failure_policy,
)
from tf_commopt.core.restart import PREEMPTED_EXIT_CODE, launcher_backup_dir, restart_count
from tf_commopt.errors import InputError

TASKS = frozenset({"worker:0", "worker:1", "worker:2"})


def _view(running=TASKS, restarts=0, tasks=TASKS):
    return ClusterView(frozenset(running), restarts, frozenset(tasks))


def test_the_flags_pick_the_policy_per_cluster_kind():
    assert isinstance(failure_policy(ps=0, chief=False), FailFast)  # collective: no restarts unless asked
    assert isinstance(failure_policy(ps=0, chief=True), FailFast)
    group = failure_policy(ps=0, chief=False, max_restarts=2)
    assert isinstance(group, RestartGroup) and group.max_restarts == 2
    ps = failure_policy(ps=1, chief=True)  # parameter-server clusters tolerate by default, bounded
    assert isinstance(ps, TolerateWorkers) and ps.max_restarts == DEFAULT_WORKER_RESTARTS == 3
    assert failure_policy(ps=2, chief=True, restart_workers=5).max_restarts == 5
    assert failure_policy(ps=1, chief=True, tolerate_worker_failures=True).max_restarts == 0
    assert isinstance(failure_policy(ps=1, chief=True, fail_fast=True), FailFast)  # the old default
    assert isinstance(failure_policy(ps=1, chief=False), FailFast)  # no chief: not a ps training cluster


@pytest.mark.parametrize(
    "kw, where",
    [
        (dict(ps=1, chief=True, max_restarts=2), "--max-restarts: restarts a collective cluster whole"),
        (dict(ps=1, chief=True, fail_fast=True, restart_workers=1), "--fail-fast: cannot be combined"),
        (dict(ps=1, chief=True, fail_fast=True, tolerate_worker_failures=True), "--fail-fast: cannot be"),
        (dict(ps=0, chief=False, fail_fast=True, max_restarts=1), "--fail-fast: cannot be combined"),
        (dict(ps=0, chief=False, max_restarts=-1), "--max-restarts: must be an integer >= 0"),
        (dict(ps=0, chief=False, max_restarts=True), "--max-restarts: must be an integer >= 0"),
        (dict(ps=1, chief=True, restart_workers=-2), "--restart-workers: must be an integer >= 0"),
        (dict(ps=0, chief=False, restart_workers=1), "--restart-workers: only for parameter-server"),
        (dict(ps=0, chief=False, tolerate_worker_failures=True), "--tolerate-worker-failures: only for"),
    ],
)
def test_flags_that_do_not_fit_are_one_line_naming_the_flag(kw, where):
    with pytest.raises(InputError) as e:
        failure_policy(**kw)
    assert str(e.value).startswith(where) and "\n" not in str(e.value)


def test_restart_group_restarts_every_task_until_the_budget_is_spent():
    p = RestartGroup(2)
    d = p.on_failure("worker:1", 137, _view(TASKS - {"worker:1"}, 0))
    assert d.action is Action.RESTART and d.restart == ("worker:0", "worker:1", "worker:2")
    assert d.grace_s == 0.0  # a crash: the others cannot save without their peer, killed at once
    assert d.note == "worker:1 exited with code 137; restarting every task (1/2)"
    d = p.on_failure("worker:0", 1, _view(restarts=1))
    assert d.action is Action.RESTART and d.note.endswith("(2/2)")
    d = p.on_failure("worker:2", 137, _view(restarts=2))
    assert d.action is Action.FAIL and d.note == "worker:2 exited with code 137; no restart left (2/2)"


def test_a_preempted_task_gives_the_others_time_to_finish_the_same_backup():
    d = RestartGroup(1).on_failure("worker:2", PREEMPTED_EXIT_CODE, _view())
    assert d.action is Action.RESTART and d.grace_s == PREEMPT_GRACE_S > 0
    assert "was preempted (saved, exit code 143)" in d.note


def test_ps_clusters_restart_workers_while_the_chief_runs_then_drop_and_a_dead_ps_ends_the_run():
    p = TolerateWorkers(2)
    up = _view({"chief:0", "ps:0", "worker:0"}, 0, {"chief:0", "ps:0", "worker:0", "worker:1"})
    d = p.on_failure("worker:1", 137, up)
    assert (d.action, d.restart) == (Action.RESTART, ("worker:1",))  # only the dead worker
    assert p.on_failure("worker:1", 137, _view(up.running, 2, up.tasks)).action is Action.DROP
    assert p.on_failure("worker:1", 137, _view({"ps:0"}, 0, up.tasks)).action is Action.DROP  # no chief
    d = p.on_failure("ps:0", 137, up)
    assert d.action is Action.FAIL and d.grace_s == PS_REPORT_GRACE_S  # the chief says which ps it lost
    assert p.on_failure("chief:0", 1, up) == p.on_failure("chief:0", 1, up)
    assert p.on_failure("chief:0", 1, up).grace_s == 0.0


def test_the_launcher_help_states_the_bounded_default_and_the_flags(capsys):
    from tf_commopt.cluster.cli import main

    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default {DEFAULT_WORKER_RESTARTS};" in text and "--fail-fast" in text
    assert "--max-restarts N" in text and "TF_COMMOPT_BACKUP_DIR" in text


def test_the_restart_protocol_variables():
    assert restart_count({}) == 0 and restart_count({"TF_COMMOPT_RESTART": "3"}) == 3
    assert restart_count({"TF_COMMOPT_RESTART": "x"}) == 0
    assert launcher_backup_dir({}) is None and launcher_backup_dir({"TF_COMMOPT_BACKUP_DIR": ""}) is None
    err = io.StringIO()
    assert backup.resolve_backup_dir("/mine", {"TF_COMMOPT_BACKUP_DIR": "/tmp/b"}, err) == "/mine"
    assert err.getvalue() == ""
    assert backup.resolve_backup_dir("", {"TF_COMMOPT_BACKUP_DIR": "/tmp/b"}, err) == "/tmp/b"
    assert "no --backup_dir: backing up to /tmp/b" in err.getvalue()  # said on stderr
    assert backup.resolve_backup_dir("", {}, err) == ""


def _mkbackups(root, task, names):
    for n in names:
        os.makedirs(os.path.join(root, task, n, "ckpt"), exist_ok=True)


def test_resume_point_is_the_last_step_every_task_has_a_complete_backup_of(tmp_path):
    root = str(tmp_path)
    assert backup.resume_point(root, ["worker-0", "worker-1"], 60) == (0, None)
    _mkbackups(root, "worker-0", ["step-20", "step-40", "epoch-1", "step-80", ".tmp-step-100"])
    _mkbackups(root, "worker-1", ["step-20", "step-40", "epoch-1", ".tmp-step-80"])  # killed writing 80
    assert backup.resume_point(root, ["worker-0", "worker-1"], 60) == (60, "epoch-1")
    _mkbackups(root, "worker-1", ["step-80"])
    assert backup.resume_point(root, ["worker-0", "worker-1"], 60) == (80, "step-80")
    assert backup.resume_point(root, ["worker-0", "worker-2"], 60) == (0, None)  # a task with nothing
    assert [backup.backup_name(s, 60) for s in (20, 60, 120, 125)] == [
        "step-20",
        "epoch-1",
        "epoch-2",
        "step-125",
    ]
    assert backup.backup_step("ledger.jsonl", 60) is None and backup.backup_step("step-x", 60) is None


def test_the_ledger_measures_the_time_from_the_backup_resumed_from_to_the_first_step(tmp_path):
    led = resume.Ledger(str(tmp_path))
    assert led.first_step(resumed_at=0, attempt=0, step=1) is None  # a fresh start costs nothing
    t_backup = time.time() - 12.5
    led.add("backup", step=40, t=t_backup)
    led.add("backup", step=60, t=t_backup + 5)
    r = led.first_step(resumed_at=40, attempt=1, step=41)
    assert (r["attempt"], r["step"], r["from_t"]) == (1, 40, t_backup)
    assert r["lost_s"] == pytest.approx(r["first_t"] - t_backup, abs=1e-3) and 12.5 <= r["lost_s"] < 20
    with open(led.path, "a") as f:
        f.write('{"event": "backup", "st')  # a line cut by a SIGKILL
    first_t = r["first_t"]
    r2 = led.first_step(resumed_at=0, attempt=2, step=1)  # no common backup: afresh after the last start
    assert r2["from_t"] == first_t and r2["step"] == 0
    assert [x["attempt"] for x in led.resumes()][:2] == [1, 2]
    r3 = led.first_step(resumed_at=40, attempt=3, step=41)  # killed again before a newer backup
    assert r3["from_t"] == r["first_t"]  # from the last time the run was at step 40, not its old backup
    assert all(set(x) == {"attempt", "step", "lost_s", "from_t", "first_t"} for x in led.resumes())


def test_chaos_hold_matches_phase_task_step_and_attempt(monkeypatch):
    monkeypatch.setattr(resume, "CHAOS_HOLD_S", 0.0)
    env = {resume.CHAOS_ENV: "backup:worker-1:40:0, sync:worker-0:49:1,junk,term:worker-2:7:0"}
    out = io.StringIO()
    resume.chaos_hold("backup", "worker-1", 40, 1, out, env)  # another attempt
    resume.chaos_hold("sync", "worker-0", 48, 1, out, env)  # another step
    assert out.getvalue() == ""
    resume.chaos_hold("backup", "worker-0", 40, 0, out, env)  # a bystander only says where it is
    resume.chaos_hold("backup", "worker-1", 40, 0, out, env)
    assert out.getvalue().splitlines() == [
        "CHAOS at backup 40 (worker-0)",
        "CHAOS at backup 40 (worker-1)",
        "CHAOS holding worker-1 in backup 40",
    ]
    got = []
    old = signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    try:
        resume.chaos_hold("term", "worker-2", 7, 0, io.StringIO(), env)
    finally:
        signal.signal(signal.SIGTERM, old)
    assert got == [signal.SIGTERM]
    assert resume.chaos_hold("sync", "worker-0", 49, 1, io.StringIO(), {}) is None  # unset: nothing


def test_the_record_of_a_resumed_run(tmp_path):
    r = resume.Resume(str(tmp_path), str(tmp_path / "worker-0"), step=80, steps_per_epoch=60, attempt=2)
    assert (r.epoch, r.skip) == (1, 20)
    r.ledger = resume.Ledger(str(tmp_path / "worker-0"))
    r.ledger.add("resume", attempt=1, step=40, lost_s=3.5, from_t=1.0, first_t=4.5)
    r.ledger.add("resume", attempt=2, step=80, lost_s=None, from_t=None, first_t=9.0)
    rec = r.record()
    assert (rec["resumed_at_step"], rec["resumed_after_epoch"], rec["restarts"], rec["lost_s"]) == (
        80,
        1,
        2,
        3.5,
    )
    assert json.loads(json.dumps(rec)) == rec
