"""What only a new process shows: TensorFlow's C++ start-up logs of a runner, and the environment and
exit of the tasks ``python -m tf_commopt.cluster`` starts. (Flag errors, aliases and ``--help`` of every
entry point are checked in process: tests/core/test_entry_points.py.)"""

import os
import subprocess
import sys

from tests.inprocess import run_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tensorflow_is_quiet_by_default_and_the_flag_raises_it():
    """No C++ INFO lines, absl banner or cuInit error on a CPU machine; --tf_log_level=0 shows them."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    args = [sys.executable, "-m", "experiments.train", "--strategy=single", "--model=mlp", "--steps=2"]
    runs = [  # both at once: each is mostly TensorFlow's import
        subprocess.Popen(
            args + extra, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for extra in (["--batch_size=32"], ["--batch_size=32", "--tf_log_level=0"])
    ]
    (_, quiet), (_, loud) = (p.communicate(timeout=300) for p in runs)
    assert runs[0].returncode == 0, quiet[-2000:]
    noise = [
        x for x in quiet.splitlines() if x.startswith(("I0000", "W0000", "WARNING: All log")) or "cuInit" in x
    ]
    assert noise == [], noise
    assert runs[1].returncode == 0 and "I0000" in loud, loud[-2000:]


def _level_seen_by_a_task(flags):
    show = [sys.executable, "-c", "import os; print('level', os.environ['TF_CPP_MIN_LOG_LEVEL'])"]
    r = run_module(
        "tf_commopt.cluster", ["--workers", "1", *flags, "--", *show], env={"TF_CPP_MIN_LOG_LEVEL": None}
    )
    assert r.code == 0, r.out + r.err
    return r.out


def test_cluster_tasks_inherit_the_tf_log_level_and_underscore_flags_run():
    assert "[worker:0] level 2" in _level_seen_by_a_task([])
    assert "[worker:0] level 0" in _level_seen_by_a_task(["--tf_log_level", "0", "--threads_per_task", "1"])
    r = run_module(
        "tf_commopt.cluster", ["--workers", "1", "--threads_per_task", "1", "--quiet", "--", "true"]
    )
    assert r.code == 0 and r.out == "", r.err


def test_cluster_cli_a_task_that_cannot_start_is_one_line_exit_2():
    r = run_module("tf_commopt.cluster", ["--workers", "1", "--", "/no/such/binary"])
    assert r.code == 2 and r.err.count("\n") == 1 and "cannot start task" in r.err, r.err
