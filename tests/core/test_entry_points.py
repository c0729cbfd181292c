"""Every runner, bench and CLI answers a bad flag value with exit code 2 and one line on stderr naming the
flag (or the program), never a traceback and never a silent success; each accepts the other flag spelling;
``--help`` shows the command form and the defaults.

Each command runs in this process as ``python -m MODULE`` would (``tests.inprocess.run_module``), with
TensorFlow blocked: a bad flag is answered before TensorFlow loads. What only a new interpreter shows
(TensorFlow's start-up logs, the cluster tasks' environment) is in tests/cluster/test_fresh_interpreters.py.
"""

import json

import pytest

from tests.inprocess import run_module

CASES = [  # (module, bad arguments, text the one line must contain)
    ("experiments.train", ["--steps=-1"], "--steps"),
    ("experiments.demo", ["--workers=1"], "--workers"),
    ("experiments.sc_speed_bench", ["--parts=bogus"], "--parts"),
    ("experiments.sc_speed_bench", ["--parts=table", "--table_variants=bogus"], "--table_variants"),
    ("experiments.torch_local_sgd", ["--model=cnn"], "--model"),
    ("experiments.torch_local_sgd", [], "TF_CONFIG"),
    ("experiments.correction_bench", ["--optimizers=sgdx"], "--optimizers"),
    ("experiments.partition_bench", ["--stages=abc"], "--stages"),
    ("experiments.partition_bench", ["--devices=foo"], "--devices"),
    ("experiments.pipeline_bench", ["--stages=0"], "--stages"),
    ("experiments.hybrid_bench", ["--clusters=1,x", "--profiles=pipedream/alexnet"], "--clusters"),
    ("experiments.skip_correct_bench", ["--workers=0"], "--workers"),
    ("experiments.comm_bench", ["--variants=foo"], "--variants"),
    ("experiments.comm_report", [], "comm_bench"),
    ("experiments.allreduce_bench", ["--workers=0"], "--workers"),
    ("experiments.overlap_bench", ["--settings=mlp:skewed"], "--settings"),
    ("experiments.batch_shares", ["--batch_size=4", "--workers=4"], "--batch_size"),
    ("experiments.batch_shares", ["--slow_workers=1:0.5"], "--slow_workers"),
    ("experiments.batch_shares", ["--steps=3"], "--steps"),
    ("experiments.batch_shares", ["--workers=0"], "--workers"),
    ("tf_commopt.cluster", ["--workers", "0", "--", "true"], "--workers"),
    ("tf_commopt.cluster", ["--workers", "-2", "--", "true"], "--workers"),
    ("tf_commopt.cluster", ["--topology", "switch", "--", "true"], "--bandwidth-mbit"),
    ("tf_commopt.partition", ["--profile", "pipedream/alexnet", "--stages", "x"], "--stages"),
    ("tf_commopt.partition", ["--profile", "/no/such", "--stages", "2"], "no such file"),
    ("tf_commopt.sim", ["--profile", "nope.txt", "--plan", "nope.json"], "nope"),
    (
        "tf_commopt.sim",
        [
            "--profile",
            "pipedream/vgg16",
            "--plan",
            "/no/plan.json",
            "--schedule",
            "gpipe",
            "--microbatches",
            "2",
        ],
        "cannot read plan",
    ),
    ("tf_commopt.tf.calibrate", ["--stages", "x"], "--stages"),
    ("experiments.sc_speed_report", ["nope.jsonl", "nope.md"], "RECORDS.jsonl"),
    ("experiments.train", ["--tf_log_level=7"], "--tf_log_level"),
    ("experiments.train", ["--strategy=magic"], "--strategy"),
    ("experiments.train", ["--replicas=0"], "--replicas"),
    ("experiments.train", ["--interval=0", "--strategy=skip_correct"], "--interval"),
    ("experiments.train", ["--learning_rate=nan"], "--learning_rate"),
    ("experiments.train", ["--batch_size=ten"], "batch_size"),
    ("experiments.train", ["--dataset=imagenet"], "--dataset"),
    ("experiments.train", ["--backup_dir=/etc/hostname"], "--backup_dir"),
    ("experiments.train", ["--optimizer=lamb"], "--optimizer"),
    ("experiments.train", ["--unknown_flag=1"], "unknown_flag"),
    ("experiments.train", ["--overlap", "--strategy=ssgd"], "--overlap"),
    ("experiments.train", ["--average_optimizer_state", "--strategy=ssgd"], "--average_optimizer_state"),
    ("experiments.train", ["--compression=int8", "--strategy=skip_correct"], "--compression"),
    ("experiments.train", ["--compression=bf16", "--strategy=ssgd"], "--compression"),
    ("experiments.train", ["--non_iid_classes=-1"], "--non_iid_classes"),
    ("tf_commopt.cluster", ["--hosts", "2", "--workers", "3", "--", "true"], "--hosts"),
]


def _one_line_exit_2(r, needle):
    assert r.code == 2, (r.code, r.err[-2000:])
    assert r.out == "" and "Traceback" not in r.err, (r.out[-500:], r.err[-2000:])
    assert r.err.count("\n") == 1 and needle in r.err, r.err


@pytest.mark.parametrize("module,args,needle", CASES, ids=[f"{m} {' '.join(a)}" for m, a, _ in CASES])
def test_bad_flag_is_one_line_exit_2(module, args, needle):
    _one_line_exit_2(run_module(module, args, env={"TF_CONFIG": None}), needle)


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
    _one_line_exit_2(run_module(module, args), needle)


def test_train_rejects_a_bad_tf_config_with_one_line():
    bad = json.dumps({"cluster": {"worker": ["h:1", "h:1"]}, "task": {"type": "worker", "index": 0}})
    _one_line_exit_2(
        run_module("experiments.train", ["--strategy=ssgd"], env={"TF_CONFIG": bad}),
        "duplicate address 'h:1'",
    )


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
    r = run_module(module, ["--help"])
    assert r.code == 0, r.err[-2000:]
    for n in needles:
        assert n in r.out, (n, r.out[-3000:])
