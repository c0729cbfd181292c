"""The ``tf`` tier: one process with 4 logical CPU devices (configured before any op runs), and the fresh
interpreters several tests read (started once per session)."""

import os
import subprocess
import sys

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NUM_LOGICAL_CPUS = 4
_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS
    )
except RuntimeError:  # already initialised by an earlier import in this process
    pass

# as the runner: without it, deleting an old per-device iterator (when Python collects it, e.g. in the
# middle of a later test's tracing) can block for up to 60 s on its tf.data autotune thread
from tf_commopt.tf.input_teardown import device_iterators_without_autotune  # noqa: E402

device_iterators_without_autotune()


@pytest.fixture(scope="session")
def keras3_jobs():
    """What tests/tf/_keras3_job.py printed in its ``early`` and ``late`` interpreters (run once, side by
    side): ``{mode: {case: "ERROR <type> <message>" | "TRAINED <steps> <syncs>"}}``."""
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    job = os.path.join(ROOT, "tests", "tf", "_keras3_job.py")
    procs = {
        mode: subprocess.Popen(
            [sys.executable, job, mode],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode in ("early", "late")
    }
    out = {}
    for mode, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stdout + stderr[-3000:]
        out[mode] = dict(line.split(" ", 1) for line in stdout.splitlines() if line.strip())
    return out
