"""Profiles: PipeDream graph.txt and our JSON, bundled files, errors naming file:line."""

import re

import pytest

from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.core.profiles import (
    bundled_profile_path,
    bundled_profiles,
    load_profile,
    read_json,
    read_pipedream,
    write_json,
    write_pipedream,
)
from tf_commopt.errors import GraphError, InputError


def _num(t):
    return sum(float(x) for x in t.strip("[]").split(";")) if t.startswith("[") else float(t)


def _raw_nodes(path):
    """Independent parse: node name -> (fwd, bwd, act, param) with a regex, list sizes summed."""
    out = {}
    for line in open(path):
        if line.startswith("node"):
            name = line.split(" -- ")[0]
            vals = dict(re.findall(r"(\w+)=(\[[^\]]*\]|[-0-9.e]+)", line.rsplit(" -- ", 1)[1]))
            out[name] = tuple(
                _num(vals[k])
                for k in (
                    "forward_compute_time",
                    "backward_compute_time",
                    "activation_size",
                    "parameter_size",
                )
            )
    return out


@pytest.mark.parametrize("name", ["pipedream/gnmt", "pipedream/inception_v3", "h200/densenet121.bf16"])
def test_read_pipedream_matches_an_independent_parse(name):
    path = bundled_profile_path(name)
    g = read_pipedream(path)
    raw = _raw_nodes(path)
    assert set(g.nodes) == set(raw)
    for n, (f, b, a, p) in raw.items():
        assert (g[n].forward_ms, g[n].backward_ms, g[n].activation_bytes, g[n].param_bytes) == (f, b, a, p)
    edges = {tuple(line.strip().split(" -- ")) for line in open(path) if line.startswith("\t")}
    assert set(g.edges) == edges


def test_list_activation_sizes_are_summed():
    g = load_profile("pipedream/gnmt")
    lists = [line for line in open(bundled_profile_path("pipedream/gnmt")) if "activation_size=[" in line]
    assert lists
    name = lists[0].split(" -- ")[0]
    sizes = re.search(r"activation_size=\[([^\]]*)\]", lists[0]).group(1).split(";")
    assert g[name].activation_bytes == sum(float(s) for s in sizes)


def test_bundled_names_and_h200_kinds():
    names = bundled_profiles()
    assert "pipedream/resnet50" in names and "h200/resnet50.bf16" in names
    g = load_profile("h200/resnet50")
    assert sorted(g.kinds) == ["bf16", "fp32", "tf32"]
    bf = read_pipedream(bundled_profile_path("h200/resnet50.bf16"))
    for n in g.nodes:
        assert g.forward_ms(n, "bf16") == bf[n].forward_ms
        assert g.backward_ms(n, "bf16") == bf[n].backward_ms
        assert g.forward_ms(n) == g.forward_ms(n, "fp32")
    assert g.total_ms("bf16") < g.total_ms("fp32")
    with pytest.raises(InputError, match="unknown bundled profile 'pipedream/nope'"):
        bundled_profile_path("pipedream/nope")


def _same(g1, g2, kinds=True):
    assert list(g1.nodes) == list(g2.nodes)
    assert list(g1.edges) == list(g2.edges)
    for n in g1.nodes:
        assert g1[n] == g2[n]
    if kinds:
        assert g1.kinds == g2.kinds
        for k in g1.kinds:
            for n in g1.nodes:
                assert (g1.forward_ms(n, k), g1.backward_ms(n, k)) == (
                    g2.forward_ms(n, k),
                    g2.backward_ms(n, k),
                )


def test_json_round_trip_is_lossless_with_kinds(tmp_path):
    g = load_profile("h200/inception_v3")
    p = str(tmp_path / "g.json")
    write_json(g, p)
    h = load_profile(p)  # auto-detected as JSON
    _same(g, h)
    assert h.name == g.name
    p2 = str(tmp_path / "g2.json")
    write_json(h, p2)
    assert open(p).read() == open(p2).read()


def test_json_round_trip_of_awkward_values(tmp_path):
    g = CostGraph(
        [Node("a b", 0.1 + 0.2, 1e-300, 3.0, 2.0**60, 'label "quoted"\nnewline'), Node("ü", 1 / 3, 0.0)],
        [("a b", "ü")],
        name="x",
    )
    p = str(tmp_path / "g.json")
    write_json(g, p)
    _same(g, read_json(p))


def test_pipedream_round_trip(tmp_path):
    g = load_profile("pipedream/resnet50")
    p = str(tmp_path / "r.graph.txt")
    write_pipedream(g, p)
    _same(g, read_pipedream(p), kinds=False)
    h = load_profile("h200/vgg16")
    write_pipedream(h, p, kind="bf16")
    assert read_pipedream(p).total_ms() == pytest.approx(h.total_ms("bf16"), rel=1e-12)


NODE = "node{i} -- L -- forward_compute_time=1, backward_compute_time=2, activation_size=3, parameter_size=4"


@pytest.mark.parametrize(
    "lines,match",
    [
        (
            [NODE.format(i=1), NODE.format(i=2).replace("=1,", "=x,")],
            r":2: forward_compute_time: not a number",
        ),
        ([NODE.format(i=1), "\tnode1 -- node7"], r":2: unknown node 'node7'"),
        ([NODE.format(i=1), NODE.format(i=1)], r":2: duplicate node name 'node1'"),
        ([NODE.format(i=1), "node2 no separators"], r":2: node line must be"),
        ([NODE.format(i=1).replace(", parameter_size=4", "")], r":1: node 'node1' lacks parameter_size"),
        ([NODE.format(i=1), NODE.format(i=2).replace("=2,", "=-2,")], r":2: backward_ms is negative"),
        (
            [NODE.format(i=1), NODE.format(i=2), "\tnode1 -- node2", "\tnode2 -- node1"],
            r"cycle: node\d -> node\d",
        ),
        ([], r"empty graph"),
    ],
)
def test_pipedream_errors_name_file_and_line(tmp_path, lines, match):
    p = tmp_path / "bad.graph.txt"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(GraphError, match=match) as e:
        load_profile(str(p))
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_cycle_error_names_a_line(tmp_path):
    p = tmp_path / "cyc.graph.txt"
    p.write_text(
        "\n".join([NODE.format(i=1), NODE.format(i=2), "\tnode1 -- node2", "\tnode2 -- node1"]) + "\n"
    )
    with pytest.raises(GraphError, match=rf"{re.escape(str(p))}:[12]: cycle"):
        read_pipedream(str(p))


def test_json_errors_name_file_and_line(tmp_path):
    g = CostGraph([Node("a", 1, 1), Node("b", 1, 1)], [("a", "b")])
    p = str(tmp_path / "g.json")
    write_json(g, p)
    text = open(p).read()
    lines = text.splitlines()
    bad = text.replace('"forward_ms": 1.0', '"forward_ms": -1.0', 1)
    open(p, "w").write(bad)
    line_a = next(i for i, line in enumerate(lines, 1) if '"name": "a"' in line)
    with pytest.raises(GraphError, match=rf"g.json:{line_a}: forward_ms is negative"):
        read_json(p)
    open(p, "w").write(text.replace('["a", "b"]', '["a", "zz"]'))
    line_e = next(i for i, line in enumerate(lines, 1) if '["a", "b"]' in line)
    with pytest.raises(GraphError, match=rf"g.json:{line_e}: unknown node 'zz'"):
        read_json(p)
    open(p, "w").write(text.replace('"edges": [', '"edges": [[', 1))
    with pytest.raises(GraphError, match=r"g.json:\d+: invalid JSON"):
        read_json(p)
    with pytest.raises(InputError, match="no such file"):
        load_profile(str(tmp_path / "missing.json"))
