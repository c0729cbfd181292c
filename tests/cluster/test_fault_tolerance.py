"""Worker failure and checkpoint faults for a 2-worker skip-and-correct job under the launcher.

The job: ``experiments.train --strategy=skip_correct --interval=3`` (VRL correction, plain SGD) on 2
workers through ``tf_commopt.cluster``, 3 epochs of 125 steps, with ``--backup_dir``: every worker saves
weights + optimizer + the strategy's state (t, k, H, every Δ_i) at each epoch end (after averaging)
into ``.tmp-epoch-N`` and renames it to ``epoch-N``. 125 is not a multiple of H = 3, so every backup is
taken mid-interval (k = 2 local steps since the last scheduled sync) and a resumed run must restore it.

* A worker SIGKILLed during training: the launcher fails fast (no hang in the peer's collective), says
  which task failed; re-running the same command resumes after the last epoch every worker completed and
  ends with the same weights as an uninterrupted run (1e-5), with the full step count.
* A save interrupted on one worker (its ``epoch-N`` never renamed, a partial temp dir left): the resume
  falls back to epoch N-1 on every worker and still ends with the reference weights.
* A truncated or foreign checkpoint: exit code 2 and one clear line, no traceback.
* A process SIGKILLed while writing its backup leaves only a temp directory; the re-run ignores it.
* Without the launcher, the survivor of a killed peer is aborted by TensorFlow (bounded), not hung.
"""

import json
import os
import shutil
import signal
import sys
import threading
import time

import h5py
import numpy as np
import pytest

from tf_commopt.cluster import live_processes, run_cluster, task_pid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EPOCHS, STEPS_PER_EPOCH = 3, 125  # 4000 bundled MNIST training images / global batch 32
BASE = [
    sys.executable,
    "-m",
    "experiments.train",
    "--strategy=skip_correct",
    "--interval=3",
    "--correction=vrl",
    "--momentum=0",
    "--learning_rate=0.05",
    "--model=mlp",
    f"--epochs={EPOCHS}",
    "--batch_size=32",
]
KILL_BOUND_S = 60.0  # after the SIGKILL, the whole job must be over within this


def _cmd(backup, model_dir):
    return BASE + [f"--backup_dir={backup}", f"--model_dir={model_dir}"]


def _run(cmd, timeout=420, stream=None):
    return run_cluster(
        cmd,
        workers=2,
        timeout=timeout,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        cwd=ROOT,
        echo=stream is not None,
        stream=stream,
    )


def _tail(r, n=12):
    return "\n".join(f"[{t}] {line}" for t in r.outputs for line in r.last_lines(t, n))


def _record(r):
    recs = [json.loads(line) for line in r.outputs["worker:0"] if line.startswith("{")]
    assert len(recs) == 1, _tail(r)
    return recs[0]


def _weights(model_dir):
    out = []
    with h5py.File(os.path.join(model_dir, "model.weights.h5"), "r") as f:
        f.visititems(
            lambda name, obj: (
                out.append((name, np.array(obj)))
                if isinstance(obj, h5py.Dataset) and name.startswith("layers/")
                else None
            )
        )
    return dict(out)


def _assert_same_weights(a, b):
    assert sorted(a) == sorted(b) and len(a) == 4
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-5, err_msg=k)


def _epochs(task_dir):
    try:
        return sorted(int(n[6:]) for n in os.listdir(task_dir) if n.startswith("epoch-") and n[6:].isdigit())
    except FileNotFoundError:
        return []


def _pids_with(marker):
    """PIDs of live processes whose command line contains ``marker`` (a unique temp path)."""
    return [pid for pid, _ in live_processes(marker)]


def _check_backup_state(ckpt, epoch):
    """The backup holds the strategy's state: t, H, k (mid-interval), 2 replicas, Δ_i non-zero and summing to 0."""
    import tensorflow as tf

    r = tf.train.load_checkpoint(ckpt)
    key = "optimizer/skip_correct_state/.ATTRIBUTES/"
    t = int(r.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"))
    assert t == epoch * STEPS_PER_EPOCH
    assert int(r.get_tensor(key + "interval")) == 3 and int(r.get_tensor(key + "num_replicas")) == 2
    assert int(r.get_tensor(key + "local_steps")) == t % 3 != 0  # saved mid-interval
    deltas = [r.get_tensor(key + f"delta_{j}") for j in range(4)]
    assert all(d.shape[0] == 2 and np.abs(d).max() > 1e-4 for d in deltas)
    # VRL: Σ_i Δ_i = 0 (float32 rounding accumulated over the syncs: relative 1e-3)
    assert all(np.abs(d.sum(axis=0)).max() < 1e-3 * np.abs(d).max() for d in deltas)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run: its record, final weights and backup directory."""
    d = tmp_path_factory.mktemp("ref")
    r = _run(_cmd(str(d / "backup"), str(d / "model")))
    assert r.returncode == 0, f"{r.message}\n{_tail(r)}"
    rec = _record(r)
    assert rec["steps"] == EPOCHS * STEPS_PER_EPOCH and rec["resumed_after_epoch"] == 0
    assert rec["interval"] == 3 and rec["syncs"] > 0
    for t in ("worker-0", "worker-1"):  # the last two epochs are kept per worker
        assert _epochs(str(d / "backup" / t)) == [EPOCHS - 1, EPOCHS]
        _check_backup_state(str(d / "backup" / t / f"epoch-{EPOCHS - 1}" / "ckpt"), EPOCHS - 1)
    return {
        "record": rec,
        "weights": _weights(str(d / "model")),
        "backup": str(d / "backup"),
        "wall_s": r.wall_s,
    }


def test_sigkill_worker_fails_fast_then_resume_matches_uninterrupted(reference, tmp_path, capsys):
    backup, model_dir = str(tmp_path / "backup"), str(tmp_path / "model")
    box = {}
    job = threading.Thread(target=lambda: box.setdefault("r", _run(_cmd(backup, model_dir))), daemon=True)
    job.start()
    # wait until both workers completed epoch 1, then kill worker 1 while it trains epoch 2
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and job.is_alive():
        if all(_epochs(os.path.join(backup, t)) for t in ("worker-0", "worker-1")):
            break
        time.sleep(0.05)
    assert job.is_alive(), f"the job ended before epoch 1 was backed up: {box.get('r') and _tail(box['r'])}"
    pid = task_pid(backup, "worker", 1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    job.join(KILL_BOUND_S + 30)
    assert not job.is_alive(), "the launcher hung after a worker was SIGKILLed"
    stop_s = time.monotonic() - killed_at
    r = box["r"]
    assert r.returncode == 128 + signal.SIGKILL and r.failed_task == "worker:1", r.message
    assert r.message == f"task worker:1 failed with exit code {128 + signal.SIGKILL}"
    assert stop_s < KILL_BOUND_S
    assert _pids_with(backup) == [], "processes of the killed job are still alive"
    done = min(max(_epochs(os.path.join(backup, t)), default=0) for t in ("worker-0", "worker-1"))
    assert 1 <= done < EPOCHS
    assert not os.path.exists(os.path.join(model_dir, "result.json"))
    for t in ("worker-0", "worker-1"):
        _check_backup_state(os.path.join(backup, t, f"epoch-{done}", "ckpt"), done)

    r2 = _run(_cmd(backup, model_dir))  # the very same command
    assert r2.returncode == 0, f"{r2.message}\n{_tail(r2)}"
    rec = _record(r2)
    assert rec["resumed_after_epoch"] == done  # no completed epoch lost
    assert any(
        line == f"resuming after epoch {done} from {os.path.join(backup, 'worker-0')}"
        for line in r2.outputs["worker:0"]
    )
    assert rec["steps"] == EPOCHS * STEPS_PER_EPOCH  # the step counter t was restored
    assert rec["interval"] == 3
    _assert_same_weights(_weights(model_dir), reference["weights"])
    with capsys.disabled():
        print(
            f"\n[fault] worker:1 SIGKILLed in epoch {done + 1}: job over {stop_s:.1f} s later "
            f"({r.message}); resumed after epoch {done}; final weights equal the uninterrupted run "
            f"(reference {reference['wall_s']:.0f} s, killed {r.wall_s:.0f} s, resumed {r2.wall_s:.0f} s)"
        )


def test_save_interrupted_on_one_worker_falls_back_to_previous_epoch(reference, tmp_path):
    backup, model_dir = str(tmp_path / "backup"), str(tmp_path / "model")
    shutil.copytree(reference["backup"], backup)
    w1 = os.path.join(backup, "worker-1")
    # worker 1 died while saving epoch 3: the rename never happened, a partial temp dir is left
    os.rename(os.path.join(w1, f"epoch-{EPOCHS}"), os.path.join(w1, f".tmp-epoch-{EPOCHS}"))
    data = [f for f in os.listdir(os.path.join(w1, f".tmp-epoch-{EPOCHS}")) if ".data-" in f][0]
    with open(os.path.join(w1, f".tmp-epoch-{EPOCHS}", data), "r+b") as f:
        f.truncate(100)
    r = _run(_cmd(backup, model_dir))
    assert r.returncode == 0, f"{r.message}\n{_tail(r)}"
    rec = _record(r)
    assert rec["resumed_after_epoch"] == EPOCHS - 1 and rec["steps"] == EPOCHS * STEPS_PER_EPOCH
    _assert_same_weights(_weights(model_dir), reference["weights"])
    assert _epochs(w1) == [EPOCHS - 1, EPOCHS] and not os.path.exists(
        os.path.join(w1, f".tmp-epoch-{EPOCHS}")
    )


def test_truncated_and_foreign_checkpoints_are_one_line_errors(reference, tmp_path):
    backup = str(tmp_path / "backup")
    shutil.copytree(reference["backup"], backup)
    for t in ("worker-0", "worker-1"):  # resume after epoch 2 (epoch 3 dropped)
        shutil.rmtree(os.path.join(backup, t, f"epoch-{EPOCHS}"))
    ck0 = os.path.join(backup, "worker-0", f"epoch-{EPOCHS - 1}")
    data = [f for f in os.listdir(ck0) if ".data-" in f][0]
    size = os.path.getsize(os.path.join(ck0, data))
    with open(os.path.join(ck0, data), "r+b") as f:  # worker 0: data file cut in half
        f.truncate(size // 2)
    # worker 1: its index file overwritten with random bytes
    ck1 = os.path.join(backup, "worker-1", f"epoch-{EPOCHS - 1}")
    idx = [f for f in os.listdir(ck1) if f.endswith(".index")][0]
    with open(os.path.join(ck1, idx), "wb") as f:
        f.write(np.random.default_rng(0).bytes(4096))
    r = _run(_cmd(backup, str(tmp_path / "model")), timeout=300)
    assert r.returncode == 2, f"{r.message}\n{_tail(r)}"
    errors = [
        line for t in r.outputs for line in r.outputs[t] if line.startswith("experiments.train: error:")
    ]
    assert errors, _tail(r)
    first = r.outputs[r.failed_task]
    err = [line for line in first if line.startswith("experiments.train: error:")]
    assert len(err) == 1 and "cannot restore this backup" in err[0] and f"epoch-{EPOCHS - 1}" in err[0], (
        _tail(r)
    )
    assert not any("Traceback" in line for line in first)


def test_checkpoint_of_another_model_is_a_one_line_error(reference, tmp_path):
    cmd = [a if a != "--model=mlp" else "--model=cnn" for a in _cmd(reference["backup"], str(tmp_path / "m"))]
    before = {t: sorted(os.listdir(os.path.join(reference["backup"], t))) for t in ("worker-0", "worker-1")}
    r = _run(cmd, timeout=300)
    assert r.returncode == 2, f"{r.message}\n{_tail(r)}"
    err = [line for line in r.outputs[r.failed_task] if line.startswith("experiments.train: error:")]
    assert len(err) == 1 and "cannot restore this backup" in err[0] and "another model" in err[0], _tail(r)
    after = {t: sorted(os.listdir(os.path.join(reference["backup"], t))) for t in ("worker-0", "worker-1")}
    assert after == before  # a failed restore never touches the backups


def test_without_the_launcher_the_survivor_is_aborted_not_hung(tmp_path, capsys):
    """Two bare processes (no launcher to kill the peer): after worker 1 is SIGKILLed, worker 0 must not
    block forever in its collective: its gRPC call fails ("Connection reset by peer") or TensorFlow's
    collective health check aborts it. The bound asserted is 150 s; the tail of its log is printed."""
    import subprocess

    from tf_commopt.cluster.layout import pick_ports

    ports = pick_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    backup = str(tmp_path / "backup")
    cmd = BASE[:]
    cmd[cmd.index(f"--epochs={EPOCHS}")] = "--epochs=50"
    procs = []
    try:
        for i in range(2):
            env = dict(
                os.environ,
                TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
                TF_CPP_MIN_LOG_LEVEL="2",
                PYTHONUNBUFFERED="1",
            )
            procs.append(
                subprocess.Popen(
                    cmd + [f"--backup_dir={backup}"],
                    env=env,
                    cwd=ROOT,
                    stdout=open(tmp_path / f"w{i}.log", "w"),
                    stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + 300
        while not os.path.isdir(os.path.join(backup, "worker-1", "epoch-1")):
            assert time.monotonic() < deadline and procs[0].poll() is None and procs[1].poll() is None
            time.sleep(0.05)
        os.kill(procs[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        rc = procs[0].wait(timeout=150)
        waited = time.monotonic() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert rc != 0
    why = [line.strip() for line in open(tmp_path / "w0.log") if "aborted" in line or "crashed" in line]
    with capsys.disabled():
        print(
            f"\n[fault] no launcher: worker:0 ended {waited:.1f} s after its peer was SIGKILLed (exit code {rc}): "
            f"{why[-1][:120] if why else '?'}"
        )


def test_crash_while_saving_leaves_no_checkpoint_that_restores_wrongly(tmp_path, capsys):
    """SIGKILL a local run (2 replicas, the 40 MB big_mlp) the moment its first backup starts being written:
    no ``epoch-1`` may exist half-written; the re-run starts afresh (or resumes a complete backup) and
    ends with the weights of an uninterrupted run."""
    import subprocess

    base = [
        sys.executable,
        "-m",
        "experiments.train",
        "--strategy=skip_correct",
        "--replicas=2",
        "--interval=3",
        "--momentum=0",
        "--model=big_mlp",
        "--steps=4",
        "--batch_size=32",
        "--learning_rate=0.01",
    ]
    env = dict(os.environ, TF_CONFIG="", TF_CPP_MIN_LOG_LEVEL="2")

    def cmd(name):
        return base + [
            f"--backup_dir={tmp_path / name / 'backup'}",
            f"--model_dir={tmp_path / name / 'model'}",
        ]

    task_dir = tmp_path / "crash" / "backup" / "local"
    p = subprocess.Popen(
        cmd("crash"), env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 300
        while not (task_dir / ".tmp-epoch-1").exists() and p.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        p.send_signal(signal.SIGKILL)
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    left = sorted(os.listdir(task_dir)) if task_dir.exists() else []
    during_save = ".tmp-epoch-1" in left and "epoch-1" not in left
    assert during_save, left  # the kill hit the save: a temp directory, no epoch-1
    runs = {}
    for name in ("crash", "clean"):
        r = subprocess.run(cmd(name), env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        runs[name] = json.loads(r.stdout.strip().splitlines()[-1])
    assert runs["crash"]["steps"] == runs["clean"]["steps"] == 4
    assert runs["crash"]["resumed_after_epoch"] == 0  # nothing complete to resume: a fresh start, no error
    a, b = _weights(str(tmp_path / "crash" / "model")), _weights(str(tmp_path / "clean" / "model"))
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-5, err_msg=k)
    with capsys.disabled():
        print(
            f"\n[fault] SIGKILL during the first save (left: {left}); "
            f"re-run resumed after epoch {runs['crash']['resumed_after_epoch']} and matched the clean run"
        )
