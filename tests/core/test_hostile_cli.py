"""Hostile input to TF_CONFIG, ``--capacities``, links and the flags of the partition, sim and cluster CLIs
(called in process: exit code 2, one line on stderr, no traceback; every runner's flags:
test_entry_points.py), and no parser unpickles or evaluates its input. Profiles and plans:
test_hostile_input.py.
"""

import ast
import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.hostile import FUZZ, GOOD_PD, mutations, one_line_error, write_file
from tf_commopt.cluster import main as cluster_main
from tf_commopt.core.devices import Link, parse_capacities
from tf_commopt.core.tfconfig import TASK_TYPES, parse_tf_config
from tf_commopt.errors import InputError
from tf_commopt.partition.__main__ import main as partition_main
from tf_commopt.sim.cli import main as sim_main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --------------------------------------------------------------------------------------------- TF_CONFIG
def _cfg(**task):
    return {
        "cluster": {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]},
        "task": task or {"type": "worker", "index": 1},
    }


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda d: d.pop("task"), "missing 'task'"),
        (lambda d: d["task"].update(index=2), "task.index 2 out of range: cluster.worker has 2 task(s)"),
        (lambda d: d["task"].update(index=-1), "out of range"),
        (lambda d: d["task"].update(index="one"), "task.index 'one' is not an integer"),
        (lambda d: d["task"].update(index="²"), "is not an integer"),
        (lambda d: d["task"].update(index=1.0), "is not an integer"),
        (lambda d: d["task"].update(index=True), "is not an integer"),
        (lambda d: d["task"].update(type="master"), "task.type 'master' is not one of"),
        (lambda d: d["task"].update(type="evaluator"), "task.type 'evaluator' has no entry in cluster"),
        (lambda d: d["cluster"].update(trainer=["h:9"]), "unknown task type 'trainer'"),
        (lambda d: d["cluster"]["worker"].append("h:1"), "duplicate address 'h:1'"),
        (lambda d: d["cluster"].update(worker=["h:2", "h"]), "is not 'host:port'"),
        (lambda d: d["cluster"].update(worker=["h:2", "h:70000"]), "has no valid port"),
        (lambda d: d["cluster"].update(worker=["h:2", "h:²"]), "has no valid port"),
        (lambda d: d["cluster"].update(worker=[]), "non-empty list"),
        (lambda d: d["cluster"].update(worker={"0": "h:2", "2": "h:3"}), "task indices must be 0..1"),
        (lambda d: d["cluster"].update(chief=["h:1", "h:7"]), "exactly one task"),
        (lambda d: d.pop("cluster"), "missing or empty 'cluster'"),
        (lambda d: d.update(rpc_layer="http"), "rpc_layer 'http'"),
        (lambda d: d.update(extra=1), "unknown key"),
    ],
)
def test_tf_config_bad(mutate, match):
    d = _cfg()
    mutate(d)
    with pytest.raises(InputError) as e:
        parse_tf_config(json.dumps(d))
    assert match in str(e.value) and str(e.value).startswith("TF_CONFIG: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("text", ["", "not json", "[]", "null", "{" * 50000, '{"cluster": ' + "[" * 100000])
def test_tf_config_not_json(text):
    with pytest.raises(InputError):
        parse_tf_config(text)


@FUZZ
@given(mutations(_cfg()))
def test_fuzz_tf_config(d):
    c = one_line_error(parse_tf_config, json.dumps(d))
    if c is None:
        return
    addrs = [a for job in c.cluster.values() for a in job]
    assert len(addrs) == len(set(addrs)) and set(c.cluster) <= set(TASK_TYPES)
    assert c.task_type in c.cluster and 0 <= c.task_index < len(c.cluster[c.task_type])
    for a in addrs:
        port = a.rpartition(":")[2]
        assert port.isascii() and port.isdigit() and 0 < int(port) < 65536
    assert c.address == c.cluster[c.task_type][c.task_index]


@FUZZ
@given(st.text(max_size=60))
def test_fuzz_tf_config_text(text):
    one_line_error(parse_tf_config, text)


# ---------------------------------------------------------------------------------- capacities, bandwidths
@FUZZ
@given(
    st.one_of(
        st.text(max_size=30),
        st.lists(
            st.one_of(st.floats().map(repr), st.sampled_from(["", " ", "x", "1e999", "-0", "0"])), max_size=5
        ).map(",".join),
    )
)
def test_fuzz_capacities(text):
    caps = one_line_error(parse_capacities, text)
    if caps is None:
        return
    items = text.split(",")
    assert caps == [float(t) for t in items]  # independent reading
    assert all(math.isfinite(c) and c > 0 for c in caps)


@pytest.mark.parametrize("bw,lat", [(0, 0), (-1, 0), (math.nan, 0), (math.inf, 0), (1, -1), (1, math.nan)])
def test_link_rejects_bad_bandwidth_and_latency(bw, lat):
    with pytest.raises(InputError):
        Link(bw, lat)


# ------------------------------------------------------------------------------------------------ CLIs
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    prof = write_file(d, "g.graph.txt", GOOD_PD)
    plan = str(d / "plan.json")
    assert (
        partition_main(["--profile", prof, "--stages", "2", "--method", "balanced", "--out", plan, "--quiet"])
        == 0
    )
    other = write_file(d, "other.graph.txt", GOOD_PD.replace("n2", "m2"))
    return {
        "profile": prof,
        "plan": plan,
        "other": other,
        "junk": write_file(d, "junk.bin", os.urandom(512)),
        "dir": str(d),
    }


def _one_line_exit2(main, argv, capsys):
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, (argv, err)
    assert err.count("\n") == 1 and err.strip() and "Traceback" not in err, (argv, err)
    return err


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--stages", "0"], "--stages"),
        (["--stages", "2.5"], "--stages"),
        (["--stages", "99"], "--stages"),
        (["--stages", "2", "--method", "magic"], "--method"),
        (["--stages", "2", "--bandwidth-gbps", "nan"], "--bandwidth-gbps"),
        (["--stages", "2", "--bandwidth-gbps", "-10"], "--bandwidth-gbps"),
        (["--stages", "2", "--bandwidth-gbps", "1e999"], "--bandwidth-gbps"),
        (["--stages", "2", "--latency-ms", "-1"], "--latency-ms"),
        (["--stages", "2", "--capacities", "1,,1"], "--capacities"),
        (["--stages", "2", "--capacities", "1,0"], "--capacities"),
        (["--stages", "2", "--kinds", "bf16"], "--kinds"),
        (["--stages", "2", "--memory-gb", "0"], "--memory-gb"),
        (["--stages", "2", "--seed", "-3"], "--seed"),
        (["--stages", "2", "--out", "/nonexistent-dir/plan.json"], "--out"),
        (["--stages", "2", "--bogus"], "unrecognized arguments"),
    ],
)
def test_partition_cli_bad_flags(files, capsys, argv, match):
    err = _one_line_exit2(partition_main, ["--profile", files["profile"], "--quiet"] + argv, capsys)
    assert match in err


@pytest.mark.parametrize("key", ["dir", "missing"])  # random bytes: tests/tf/test_entry_points_tf.py
def test_partition_cli_bad_profile(files, capsys, key):
    _one_line_exit2(partition_main, ["--profile", files.get(key, "/no/such.txt"), "--stages", "2"], capsys)


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--microbatches", "0"], "--microbatches"),
        (["--microbatches", "x"], "--microbatches"),
        (["--microbatches", "2", "--bandwidth-gbps", "0"], "--bandwidth-gbps"),
        (["--microbatches", "2", "--bandwidth-gbps", "inf"], "--bandwidth-gbps"),
        (["--microbatches", "2", "--latency-ms", "-1"], "--latency-ms"),
        (["--microbatches", "2", "--capacities", "a,b"], "--capacities"),
        (["--microbatches", "2", "--kinds", "fp8"], "--kinds"),
        (["--microbatches", "2", "--split", "-1"], "--split"),
    ],
)
def test_sim_cli_bad_flags(files, capsys, extra, match):
    err = _one_line_exit2(
        sim_main,
        ["--profile", files["profile"], "--plan", files["plan"], "--schedule", "gpipe"] + extra,
        capsys,
    )
    assert match in err


@pytest.mark.parametrize(
    "profile,plan,match",
    [
        ("other", "plan", "no stage"),  # a plan made for another graph
        ("profile", "junk", "cannot read plan"),  # a plan file of random bytes
        ("profile", "profile", "invalid JSON"),  # a profile given as the plan
        ("profile", "dir", "cannot read plan"),
    ],
)
def test_sim_cli_bad_files(files, capsys, profile, plan, match):
    err = _one_line_exit2(
        sim_main,
        ["--profile", files[profile], "--plan", files[plan], "--schedule", "1f1b", "--microbatches", "2"],
        capsys,
    )
    assert match in err


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--workers", "0", "--", "true"], "--workers"),
        (["--workers", "x", "--", "true"], "--workers"),
        (["--ps", "-1", "--", "true"], "--ps"),
        (["--bandwidth-mbit", "nan", "--", "true"], "--bandwidth-mbit"),
        (["--bandwidth-mbit", "-5", "--", "true"], "--bandwidth-mbit"),
        (["--bandwidth-mbit", "fast", "--", "true"], "--bandwidth-mbit"),
        (["--timeout", "0", "--", "true"], "--timeout"),
        (["--topology", "ring", "--", "true"], "--topology"),
        (["--workers", "2"], "missing COMMAND"),
    ],
)
def test_cluster_cli_bad_flags(capsys, argv, match):
    err = _one_line_exit2(cluster_main, argv, capsys)
    assert match in err


_flag_value = st.one_of(st.text(max_size=8), st.floats().map(repr), st.integers(-(10**20), 10**20).map(str))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    st.sampled_from(
        ["--stages", "--bandwidth-gbps", "--latency-ms", "--capacities", "--seed", "--memory-gb", "--kinds"]
    ),
    _flag_value,
)
def test_fuzz_partition_cli_flag(files, capsys, flag, value):
    argv = ["--profile", files["profile"], "--method", "balanced", "--quiet", "--stages", "2", flag, value]
    capsys.readouterr()
    try:
        rc = partition_main(argv)
    except SystemExit as e:  # argparse's own errors (e.g. a value that looks like a flag)
        rc = e.code
    out = capsys.readouterr()
    assert rc in (0, 2)
    if rc == 2:
        assert out.err.count("\n") == 1 and out.out == ""
    else:
        assert json.loads(out.out)["stages"] >= 1


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    st.sampled_from(
        [
            "--microbatches",
            "--split",
            "--bandwidth-gbps",
            "--latency-ms",
            "--capacities",
            "--optimizer-ms",
            "--schedule",
            "--kinds",
        ]
    ),
    _flag_value,
)
def test_fuzz_sim_cli_flag(files, capsys, flag, value):
    argv = [
        "--profile",
        files["profile"],
        "--plan",
        files["plan"],
        "--schedule",
        "gpipe",
        "--microbatches",
        "2",
        flag,
        value,
    ]
    capsys.readouterr()
    try:
        rc = sim_main(argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    assert rc in (0, 2)
    if rc == 2:
        assert out.err.count("\n") == 1 and out.out == ""
    else:
        d = json.loads(out.out)
        assert math.isfinite(d["iteration_ms"]) and d["iteration_ms"] > 0


# ------------------------------------------------------------------------------- no pickle, no eval
def _sources():
    for top in ("tf_commopt", "experiments"):
        for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
            for n in names:
                if n.endswith(".py"):
                    yield os.path.join(dirpath, n)


def test_no_parser_unpickles_or_evaluates_input():
    bad = []
    for path in _sources():
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        for node in ast.walk(tree):
            where = f"{os.path.relpath(path, ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] + (
                    [node.module] if isinstance(node, ast.ImportFrom) else []
                )
                if any(
                    m and m.split(".")[0] in ("pickle", "cPickle", "dill", "marshal", "shelve", "cloudpickle")
                    for m in mods
                ):
                    bad.append(f"{where}: imports {mods}")
            elif isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if isinstance(f, ast.Name) and name in ("eval", "exec", "compile", "__import__"):
                    bad.append(f"{where}: calls {name}()")
                if name in ("literal_eval", "unsafe_load", "full_load") or (
                    name == "load" and isinstance(f, ast.Attribute) and getattr(f.value, "id", "") == "yaml"
                ):
                    bad.append(f"{where}: calls {name}()")
                for kw in node.keywords:
                    if kw.arg == "allow_pickle" and not (
                        isinstance(kw.value, ast.Constant) and kw.value.value is False
                    ):
                        bad.append(f"{where}: allow_pickle")
    assert bad == []
