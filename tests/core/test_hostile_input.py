"""Hostile input to every pure parser: a valid object or our own one-line error, nothing else.

Covered here: PipeDream ``graph.txt`` and our JSON profiles (tf_commopt.core.profiles) and PartitionPlan
JSON; TF_CONFIG, ``--capacities``, bandwidths and the CLI flags are in test_hostile_cli.py. Hand-written
cases say what the error must name (file:line, node); hypothesis fuzzes each parser (modest
``max_examples``), and whatever a parser accepts is checked against an independent reading of the input
(no silent wrong value). GraphDef files are in tests/tf/test_hostile_graphdef.py.
"""

import json
import math
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.core.hostile import FUZZ, mutations, node_line, one_line_error, write_file
from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.core.plan import PartitionPlan
from tf_commopt.core.profiles import load_profile, read_json, read_pipedream, write_json, write_pipedream
from tf_commopt.core.simulate import simulate_pipeline
from tf_commopt.errors import GraphError, InputError, PlanError

KEYS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")


# ------------------------------------------------------------------------------------- PipeDream graph.txt
@pytest.mark.parametrize(
    "text,line,match",
    [
        ("", None, "empty graph"),
        ("\n\n   \n", None, "empty graph"),
        (node_line("a", f="abc"), 1, "not a number: 'abc'"),
        (node_line("a", f="nan"), 1, "forward_ms is not finite"),
        (node_line("a", b="inf"), 1, "backward_ms is not finite"),
        (node_line("a", a="-5"), 1, "activation_bytes is negative"),
        (node_line("a", p="1e999"), 1, "param_bytes is not finite"),
        (node_line("a", a="[1; nan]"), 1, "not finite"),
        (node_line("a", a="[1; x]"), 1, "not a number: 'x'"),
        (node_line("a") + "\n" + node_line("a"), 2, "duplicate node name 'a'"),
        (node_line("a") + "\n\ta -- ghost", 2, "unknown node 'ghost'"),
        (node_line("a") + "\n" + node_line("b") + "\n\ta -- b\n\tb -- a", 2, "cycle: b -> a -> b"),
        (node_line("a") + "\n\ta -- a", 2, "self loop"),
        (node_line("a") + "\n\ta -- b -- c", 2, "edge line must be"),
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
    path = write_file(tmp_path, "g.graph.txt", text)
    with pytest.raises(GraphError) as e:
        read_pipedream(path)
    msg = str(e.value)
    assert "\n" not in msg and match in msg, msg
    assert msg.startswith(f"{path}:{line}:" if line else f"{path}:"), msg


def test_pipedream_binary_junk_and_non_utf8(tmp_path):
    for data in (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", os.urandom(4096), b"\x00" * 100):
        path = write_file(tmp_path, "junk.txt", data)
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
        node_line,
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
    path = write_file(tmp_path_factory.mktemp("pd"), "g.txt", text)
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
    path = write_file(tmp_path_factory.mktemp("pdb"), "g.txt", data)
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
    path = write_file(tmp_path, "p.json", json.dumps(d, indent=1))
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
    path = write_file(tmp_path, "p.json", text)
    with pytest.raises(GraphError):
        read_json(path)


@FUZZ
@given(mutations(_good_json_dict()))
def test_fuzz_json_profile(tmp_path_factory, d):
    path = write_file(tmp_path_factory.mktemp("js"), "p.json", json.dumps(d))
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
    path = write_file(tmp_path, "plan.json", json.dumps(d))
    with pytest.raises(PlanError) as e:
        PartitionPlan.load(path)
    assert match in str(e.value) and str(e.value).startswith(path) and "\n" not in str(e.value)


@FUZZ
@given(mutations(_plan_dict()))
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
