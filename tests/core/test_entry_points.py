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
    ("tf_commopt.tf.calibrate", ["--stages", "x"], "--stages"),
    ("experiments.sc_speed_report", ["nope.jsonl", "nope.md"], "RECORDS.jsonl"),
    ("experiments.train", ["--tf_log_level=7"], "--tf_log_level"),
]


@pytest.mark.parametrize("module,args,needle", CASES, ids=[f"{m} {' '.join(a)}" for m, a, _ in CASES])
def test_bad_flag_is_one_line_exit_2(module, args, needle):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    r = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )
    lines = [
        x
        for x in r.stderr.splitlines()
        if x.strip() and not x.startswith(("WARNING: All log", "I0000", "E0000", "W0000"))
    ]
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, lines


def _run(module, args, timeout=300):
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


# one flag style per kind of entry point, the other spelling accepted: an alias reaches the same check
ALIASES = [  # (module, arguments in the other spelling, text the one-line error must contain)
    ("experiments.train", ["--batch-size=0"], "batch_size"),
    ("experiments.partition_bench", ["--bandwidths-gbps=x"], "--bandwidths_gbps"),
    ("experiments.partition_bench", ["--bandwidths=x"], "--bandwidths_gbps"),  # the old name
    ("experiments.sc_speed_bench", ["--parts=bogus", "--tf-log-level=2"], "--parts"),
    ("tf_commopt.cluster", ["--bandwidth_mbit", "fast", "--", "true"], "--bandwidth-mbit"),
    (
        "tf_commopt.partition",
        ["--profile", "pipedream/alexnet", "--stages", "2", "--bandwidth_gbps", "x"],
        "--bandwidth-gbps",
    ),
    (
        "tf_commopt.sim",
        ["--profile", "pipedream/alexnet", "--plan", "p.json", "--optimizer_ms", "-1"],
        "--optimizer-ms",
    ),
]


@pytest.mark.parametrize("module,args,needle", ALIASES, ids=[f"{m} {' '.join(a)}" for m, a, _ in ALIASES])
def test_other_spelling_is_an_alias(module, args, needle):
    r = _run(module, args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines


def test_cluster_alias_runs_and_topology_needs_a_bandwidth():
    r = _run(
        "tf_commopt.cluster", ["--workers", "1", "--threads_per_task", "1", "--quiet", "--", "true"], 120
    )
    assert r.returncode == 0, r.stderr
    r = _run("tf_commopt.cluster", ["--topology", "switch", "--", "true"], 120)
    assert r.returncode == 2 and "--topology" in r.stderr and "--bandwidth-mbit" in r.stderr


HELP = [  # (module, texts --help must show: the command form and defaults)
    ("tf_commopt.cluster", ["-- COMMAND [ARG ...]", "(default: 2)", "--tf-log-level", "underscores"]),
    ("tf_commopt.partition", ["--profile PROFILE --stages K", "(default: ga)", "(default: json)"]),
    ("tf_commopt.sim", ["--plan", "(default: 0.0)", "underscores"]),
    ("experiments.train", ["--steps", "(default: '0')", "--tf_log_level"]),
    ("experiments.partition_bench", ["python -m experiments.partition_bench", "--stages", "(default: "]),
    ("experiments.sc_speed_report", ["RECORDS.jsonl PAGE.md"]),
]


@pytest.mark.parametrize("module,needles", HELP, ids=[m for m, _ in HELP])
def test_help_shows_command_form_and_defaults(module, needles):
    r = _run(module, ["--help"])
    assert r.returncode == 0, r.stderr[-2000:]
    for n in needles:
        assert n in r.stdout, (n, r.stdout[-3000:])


def test_tensorflow_is_quiet_by_default_and_the_flag_raises_it():
    """No C++ INFO lines, absl banner or cuInit error on a CPU machine; --tf_log_level=0 shows them."""
    args = ["--strategy=single", "--model=mlp", "--steps=2", "--batch_size=32"]
    r = _run("experiments.train", args)
    assert r.returncode == 0, r.stderr[-2000:]
    noise = [
        x
        for x in r.stderr.splitlines()
        if x.startswith(("I0000", "W0000", "WARNING: All log")) or "cuInit" in x
    ]
    assert noise == [], noise
    r = _run("experiments.train", args + ["--tf_log_level=0"])
    assert r.returncode == 0 and "I0000" in r.stderr, r.stderr[-2000:]


def test_cluster_tasks_inherit_the_tf_log_level():
    show = [sys.executable, "-c", "import os; print('level', os.environ['TF_CPP_MIN_LOG_LEVEL'])"]
    r = _run("tf_commopt.cluster", ["--workers", "1", "--", *show], 120)
    assert r.returncode == 0 and "[worker:0] level 2" in r.stdout + r.stderr, r.stdout + r.stderr
    r = _run("tf_commopt.cluster", ["--workers", "1", "--tf_log_level", "0", "--", *show], 120)
    assert r.returncode == 0 and "[worker:0] level 0" in r.stdout + r.stderr, r.stdout + r.stderr
