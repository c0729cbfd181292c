"""Every runner, bench and CLI answers a bad flag value with exit code 2 and one line on stderr naming the
flag (or the program), never a traceback and never a silent success (issue 17)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CASES = [  # (module, bad arguments, text the one line must contain)
    ("experiments.train", ["--steps=-1"], "--steps"),
    ("experiments.demo", ["--workers=1"], "--workers"),
    ("experiments.sc_speed_bench", ["--parts=bogus"], "--parts"),
    ("experiments.correction_bench", ["--optimizers=sgdx"], "--optimizers"),
    ("experiments.partition_bench", ["--stages=abc"], "--stages"),
    ("experiments.partition_bench", ["--devices=foo"], "--devices"),
    ("experiments.pipeline_bench", ["--stages=0"], "--stages"),
    ("experiments.hybrid_bench", ["--clusters=1,x", "--profiles=pipedream/alexnet"], "--clusters"),
    ("experiments.skip_correct_bench", ["--workers=0"], "--workers"),
    ("experiments.comm_bench", ["--variants=foo"], "--variants"),
    ("experiments.comm_report", [], "comm_bench"),
    ("experiments.allreduce_bench", ["--workers=0"], "--workers"),
    ("tf_commopt.cluster", ["--workers", "0", "--", "true"], "--workers"),
    ("tf_commopt.partition", ["--profile", "pipedream/alexnet", "--stages", "x"], "--stages"),
    ("tf_commopt.sim", ["--profile", "nope.txt", "--plan", "nope.json"], "nope"),
]


@pytest.mark.parametrize("module,args,needle", CASES, ids=[f"{m} {' '.join(a)}" for m, a, _ in CASES])
def test_bad_flag_is_one_line_exit_2(module, args, needle):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=env)
    lines = [x for x in r.stderr.splitlines() if x.strip() and not x.startswith(("WARNING: All log", "I0000",
                                                                                   "E0000", "W0000"))]
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, lines
