"""Hostile input to every pure parser and CLI flag: a valid object or our own one-line error, nothing else.

Covered: PipeDream ``graph.txt`` and our JSON profiles (tf_commopt.core.profiles), PartitionPlan JSON,
TF_CONFIG (tf_commopt.core.tfconfig), ``--capacities``, bandwidths, and the flags of the partition,
sim and cluster CLIs, called in process (exit code 2, one line on stderr, no traceback; every runner's
flags: test_entry_points.py). Hand-written cases say
what the error must name (file:line, node, flag); hypothesis fuzzes each parser (modest
``max_examples``), and whatever a parser accepts is checked against an independent reading of the
input (no silent wrong value). GraphDef files are in tests/tf/test_hostile_graphdef.py.
"""

import ast
import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tf_commopt.cluster import main as cluster_main
from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.core.devices import Link, parse_capacities
from tf_commopt.core.partition.plan import PartitionPlan
from tf_commopt.core.profiles import load_profile, read_json, read_pipedream, write_json, write_pipedream
from tf_commopt.core.simulate import simulate_pipeline
from tf_commopt.core.tfconfig import TASK_TYPES, parse_tf_config
from tf_commopt.errors import GraphError, InputError, PlanError, TfCommoptError
from tf_commopt.partition.__main__ import main as partition_main
from tf_commopt.sim.cli import main as sim_main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
KEYS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")


def one_line_error(fn, *args, **kwargs):
    """Call fn; return its value, or None after checking a raised error is ours and one line."""
    try:
        return fn(*args, **kwargs)
    except TfCommoptError as e:
        msg = str(e)
        assert msg and "\n" not in msg and "\r" not in msg, repr(msg)
        return None


def _write(tmp_path, name, data):
    p = tmp_path / name
    (p.write_bytes if isinstance(data, bytes) else p.write_text)(data)
    return str(p)


def _node_line(name, f="1.0", b="2.0", a="8.0", p="4.0", label="Linear(4)"):
    return (
        f"{name} -- {label} -- forward_compute_time={f}, backward_compute_time={b}, "
        f"activation_size={a}, parameter_size={p}"
    )


GOOD_PD = "\n".join([_node_line("n0"), _node_line("n1"), _node_line("n2"), "\tn0 -- n1", "\tn1 -- n2"]) + "\n"


# ------------------------------------------------------------------------------------- PipeDream graph.txt
@pytest.mark.parametrize(
    "text,line,match",
    [
        ("", None, "empty graph"),
        ("\n\n   \n", None, "empty graph"),
        (_node_line("a", f="abc"), 1, "not a number: 'abc'"),
        (_node_line("a", f="nan"), 1, "forward_ms is not finite"),
        (_node_line("a", b="inf"), 1, "backward_ms is not finite"),
        (_node_line("a", a="-5"), 1, "activation_bytes is negative"),
        (_node_line("a", p="1e999"), 1, "param_bytes is not finite"),
        (_node_line("a", a="[1; nan]"), 1, "not finite"),
        (_node_line("a", a="[1; x]"), 1, "not a number: 'x'"),
        (_node_line("a") + "\n" + _node_line("a"), 2, "duplicate node name 'a'"),
        (_node_line("a") + "\n\ta -- ghost", 2, "unknown node 'ghost'"),
        (_node_line("a") + "\n" + _node_line("b") + "\n\ta -- b\n\tb -- a", 2, "cycle: b -> a -> b"),
        (_node_line("a") + "\n\ta -- a", 2, "self loop"),
        (_node_line("a") + "\n\ta -- b -- c", 2, "edge line must be"),
        ("a -- b", 1, "node line must be"),
        (
            "a -- Linear -- forward_compute_time=1, backward_compute_time=1",
            1,
            "lacks activation_size, parameter_size",
        ),
        (
            "a -- L -- forward_compute_time=1, forward_compute_time=2, backward_compute_time=1, activation_size=1, "
            "parameter_size=1",
            1,
            "duplicate key 'forward_compute_time'",
        ),
        ("a -- L -- junk, backward_compute_time=1", 1, "expected key=value, got 'junk'"),
    ],
)
def test_pipedream_bad_files_name_file_and_line(tmp_path, text, line, match):
    path = _write(tmp_path, "g.graph.txt", text)
    with pytest.raises(GraphError) as e:
        read_pipedream(path)
    msg = str(e.value)
    assert "\n" not in msg and match in msg, msg
    assert msg.startswith(f"{path}:{line}:" if line else f"{path}:"), msg


def test_pipedream_binary_junk_and_non_utf8(tmp_path):
    for data in (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", os.urandom(4096), b"\x00" * 100):
        path = _write(tmp_path, "junk.txt", data)
        assert one_line_error(read_pipedream, path) is None
        assert one_line_error(load_profile, path) is None


def test_load_profile_odd_paths(tmp_path):
    for p in (str(tmp_path), str(tmp_path / "missing.txt"), "pipedream/no_such_model", "h200/nothing.bf16"):
        with pytest.raises(InputError):
            load_profile(p)


_num_text = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10**30), 10**30).map(str),
    st.sampled_from(
        [
            "",
            "abc",
            "nan",
            "-inf",
            "1e400",
            "[1; 2]",
            "[]",
            "[1; nan]",
            "[-1]",
            "1_0",
            "0x10",
            "--",
            "=",
            ",",
            "9" * 400,
        ]
    ),
)
_names = st.sampled_from(["n0", "n1", "n2", "n3", "a b", "x--y"])
_pd_line = st.one_of(
    st.builds(
        _node_line,
        _names,
        _num_text,
        _num_text,
        _num_text,
        _num_text,
        st.text(alphabet="ab -=,()[]", max_size=12),
    ),
    st.builds(lambda a, b: f"\t{a} -- {b}", _names, _names),
    st.text(max_size=40),
)


def _reference_pipedream(lines):
    """Independent reading of a file the parser accepted: node name -> 4 numbers, edge set."""
    nodes, edges = {}, set()
    for raw in lines:
        if not raw.strip():
            continue
        if raw[0] in "\t ":
            a, b = (s.strip() for s in raw.strip().split(" -- "))
            edges.add((a, b))
            continue
        name, _, attrs = raw.split(" -- ", 1)[0].strip(), None, raw.rsplit(" -- ", 1)[1]
        vals = {}
        for item in attrs.split(", "):
            k, v = item.split("=", 1)
            v = v.strip()
            vals[k.strip()] = (
                sum(float(x) for x in v[1:-1].split(";") if x.strip()) if v.startswith("[") else float(v)
            )
        nodes[name] = tuple(vals[k] for k in KEYS)
    return nodes, edges


@FUZZ
@given(st.lists(_pd_line, max_size=12))
def test_fuzz_pipedream_valid_graph_or_one_line_error(tmp_path_factory, lines):
    text = "\n".join(lines)
    path = _write(tmp_path_factory.mktemp("pd"), "g.txt", text)
    g = one_line_error(read_pipedream, path)
    if g is None:
        return
    nodes, edges = _reference_pipedream(text.splitlines())
    assert set(g.nodes) == set(nodes) and set(g.edges) == edges
    for n, (f, b, a, p) in nodes.items():
        assert (g[n].forward_ms, g[n].backward_ms, g[n].activation_bytes, g[n].param_bytes) == (f, b, a, p)
        assert all(math.isfinite(x) and x >= 0 for x in (f, b, a, p))
    pos = {n: i for i, n in enumerate(g.topological_order())}
    assert all(pos[a] < pos[b] for a, b in g.edges)  # really a DAG
    again = str(path) + ".rt"
    write_pipedream(g, again)
    h = read_pipedream(again)
    assert set(h.nodes) == set(g.nodes) and set(h.edges) == set(g.edges)


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_pipedream_random_bytes(tmp_path_factory, data):
    path = _write(tmp_path_factory.mktemp("pdb"), "g.txt", data)
    one_line_error(load_profile, path)


# ------------------------------------------------------------------------------------- our JSON profiles
def _good_json_dict():
    return {
        "format": "tf_commopt.CostGraph/1",
        "name": "g",
        "nodes": [
            {
                "name": "a",
                "forward_ms": 1.0,
                "backward_ms": 2.0,
                "param_bytes": 3.0,
                "activation_bytes": 4.0,
                "label": "x",
            },
            {"name": "b", "forward_ms": 0.5, "backward_ms": 0.5},
        ],
        "edges": [["a", "b"]],
        "kinds": {"bf16": {"a": [0.5, 1.0], "b": [0.5, 0.5]}},
    }


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda d: d.pop("format"), "format must be"),
        (lambda d: d.update(format="tf_commopt.PartitionPlan/1"), "format must be"),
        (lambda d: d.update(nodes={"a": 1}), "'nodes' must be a list"),
        (lambda d: d.update(nodes=[]), "empty graph"),
        (lambda d: d["nodes"][0].pop("forward_ms"), "lacks 'forward_ms'"),
        (lambda d: d["nodes"][0].update(forward_ms="fast"), "not a number"),
        (lambda d: d["nodes"][0].update(forward_ms=True), "not a number"),
        (lambda d: d["nodes"][0].update(backward_ms=10**400), "not finite"),
        (lambda d: d["nodes"][0].update(param_bytes=-1), "negative"),
        (lambda d: d["nodes"][0].update(activation_bytes=[1]), "not a number"),
        (lambda d: d["nodes"][0].update(speed=1), "unknown field"),
        (lambda d: d["nodes"][1].update(name="a"), "duplicate node name 'a'"),
        (lambda d: d["nodes"][1].update(name=7), "string 'name'"),
        (lambda d: d.update(edges=[["a", "zz"]]), "unknown node 'zz'"),
        (lambda d: d.update(edges=[["a", "b", "c"]]), "edge must be [producer, consumer]"),
        (lambda d: d.update(edges=[["a", "b"], ["b", "a"]]), "cycle"),
        (lambda d: d.update(edges="a->b"), "'edges' must be a list"),
        (lambda d: d.update(kinds=[]), "'kinds' must be an object"),
        (lambda d: d["kinds"]["bf16"].pop("b"), "lacks costs"),
        (lambda d: d["kinds"]["bf16"].update(c=[1, 1]), "unknown node 'c'"),
        (lambda d: d["kinds"]["bf16"].update(a=[1]), "expected [forward_ms, backward_ms]"),
        (lambda d: d["kinds"]["bf16"].update(a=[float("nan"), 1]), "not finite"),
    ],
)
def test_json_profile_bad_fields(tmp_path, mutate, match):
    d = _good_json_dict()
    mutate(d)
    path = _write(tmp_path, "p.json", json.dumps(d, indent=1))
    with pytest.raises(GraphError) as e:
        read_json(path)
    msg = str(e.value)
    assert "\n" not in msg and match in msg and msg.startswith(path), msg


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[1, 2]",
        "null",
        '{"format": "tf_commopt.CostGraph/1"',
        '{"a": ' + "[" * 100000,
        "{" + "}" * 3,
    ],
)
def test_json_profile_not_json(tmp_path, text):
    path = _write(tmp_path, "p.json", text)
    with pytest.raises(GraphError):
        read_json(path)


_json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**400), st.floats(), st.text(max_size=6)
)
_json_any = st.recursive(
    _json_leaf,
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=5), c, max_size=3)),
    max_leaves=8,
)


def _mutations(d):
    """Hypothesis strategy: d with one value replaced (or deleted) at a random path."""
    paths = []

    def walk(x, p):
        paths.append(p)
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, p + (k,))
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, p + (i,))

    walk(d, ())

    def apply(path, value, delete):
        out = json.loads(json.dumps(d))
        if not path:
            return value
        parent = out
        for k in path[:-1]:
            parent = parent[k]
        if delete:
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
        return out

    return st.builds(apply, st.sampled_from(paths[1:] + [()]), _json_any, st.booleans())


@FUZZ
@given(_mutations(_good_json_dict()))
def test_fuzz_json_profile(tmp_path_factory, d):
    path = _write(tmp_path_factory.mktemp("js"), "p.json", json.dumps(d))
    g = one_line_error(read_json, path)
    if g is None:
        return
    nodes = {n["name"]: n for n in d["nodes"]}  # accepted: it says what the file says
    assert set(g.nodes) == set(nodes)
    for name, n in nodes.items():
        assert g[name].forward_ms == n["forward_ms"] and g[name].backward_ms == n["backward_ms"]
        for k in ("forward_ms", "backward_ms"):
            assert not isinstance(n[k], bool) and math.isfinite(float(n[k])) and n[k] >= 0
    assert set(g.edges) == {tuple(e) for e in d.get("edges", [])}
    again = path + ".rt"
    write_json(g, again)
    h = read_json(again)
    assert [h[n] for n in h.nodes] == [g[n] for n in g.nodes] and h.kinds == g.kinds


# ----------------------------------------------------------------------------------------- plans
def _graph():
    return CostGraph(
        [Node("a", 1, 1, 0, 10), Node("b", 2, 2, 0, 10), Node("c", 1, 1)],
        [("a", "b"), ("b", "c")],
        name="abc",
    )


def _plan_dict():
    return PartitionPlan(
        method="balanced",
        stage_of_node={"a": 0, "b": 1, "c": 1},
        device_of_stage=[0, 1],
        stage_compute_ms=[2.0, 6.0],
        stage_comm_ms=[0.1, 0.1],
        stage_memory_bytes=[0.0, 0.0],
        objective=6.1,
        comm_bytes=20.0,
        graph_name="abc",
    ).to_dict()


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda d: d.pop("stage_of_node"), "missing field 'stage_of_node'"),
        (lambda d: d.update(format="tf_commopt.CostGraph/1"), "unknown plan format"),
        (lambda d: d.update(stage_of_node={"a": "0"}), "is not an integer"),
        (lambda d: d.update(stage_of_node={"a": True}), "is not an integer"),
        (lambda d: d.update(stage_of_node={"a": 5}), "is not an integer in [0, 2)"),
        (lambda d: d.update(stage_of_node={}), "non-empty"),
        (lambda d: d.update(device_of_stage=[0, 0]), "two stages on one device"),
        (lambda d: d.update(device_of_stage=[0, -1]), "non-negative integer"),
        (lambda d: d.update(stage_compute_ms=[1.0]), "list of 2 numbers"),
        (lambda d: d.update(stage_comm_ms=[1.0, None]), "not a finite number"),
        (lambda d: d.update(objective=float("nan")), "not a finite number"),
        (lambda d: d.update(objective=10**400), "not a finite number"),
        (lambda d: d.update(comm_bytes="big"), "not a finite number"),
        (lambda d: d.update(method=3), "method must be a string"),
        (lambda d: d.update(extra=[1]), "extra must be an object"),
    ],
)
def test_plan_bad_fields(tmp_path, mutate, match):
    d = _plan_dict()
    mutate(d)
    path = _write(tmp_path, "plan.json", json.dumps(d))
    with pytest.raises(PlanError) as e:
        PartitionPlan.load(path)
    assert match in str(e.value) and str(e.value).startswith(path) and "\n" not in str(e.value)


@FUZZ
@given(_mutations(_plan_dict()))
def test_fuzz_plan_json(d):
    p = one_line_error(PartitionPlan.from_json, json.dumps(d))
    if p is None:
        return
    k = len(d["device_of_stage"])
    assert (
        p.num_stages == k
        and p.stage_of_node == d["stage_of_node"]
        and p.device_of_stage == d["device_of_stage"]
    )
    assert all(0 <= s < k for s in p.stage_of_node.values()) and len(set(p.device_of_stage)) == k
    assert PartitionPlan.from_json(p.to_json()) == p
    one_line_error(simulate_pipeline, _graph(), p, "gpipe", 2)  # fits the graph, or says why not


@FUZZ
@given(st.text(max_size=80))
def test_fuzz_plan_text(text):
    one_line_error(PartitionPlan.from_json, text)


@pytest.mark.parametrize(
    "son,match",
    [
        ({"a": 0, "b": 1}, "node 'c' of graph 'abc' has no stage"),
        ({"a": 0, "b": 1, "c": 1, "zz": 0}, "plan names node 'zz'"),
        ({"a": 1, "b": 0, "c": 1}, "goes back from stage 1 to stage 0"),
    ],
)
def test_plan_for_another_graph(son, match):
    d = _plan_dict()
    d["stage_of_node"] = son
    with pytest.raises(PlanError, match=match):
        simulate_pipeline(_graph(), PartitionPlan.from_dict(d), "gpipe", 2)


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
@given(_mutations(_cfg()))
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
    prof = _write(d, "g.graph.txt", GOOD_PD)
    plan = str(d / "plan.json")
    assert (
        partition_main(["--profile", prof, "--stages", "2", "--method", "balanced", "--out", plan, "--quiet"])
        == 0
    )
    other = _write(d, "other.graph.txt", GOOD_PD.replace("n2", "m2"))
    return {
        "profile": prof,
        "plan": plan,
        "other": other,
        "junk": _write(d, "junk.bin", os.urandom(512)),
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
