"""Hostile GraphDef files (``.pb``, ``.pbtxt``) for tf_commopt.tf.graph_import.from_graphdef_file.

Truncated and bit-flipped binaries, random bytes, other protos, text of another message, unknown ops,
dangling inputs, duplicate names, cycles, huge and negative shapes; plus hypothesis fuzzing of the
bytes and of the GraphDef's structure. Every outcome is a valid CostGraph or one line of our
InputError — never another exception or a hang. Accepted graphs are checked: finite non-negative
costs, every node an op of the file, a DAG.
"""

import math
import warnings

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tf_commopt.errors import InputError, TfCommoptError
from tf_commopt.tf.graph_import import from_graph_def, from_graphdef_file, read_graphdef

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def _graph_def():
    w1 = tf.constant(np.random.default_rng(0).normal(size=(8, 16)).astype("float32"))
    w2 = tf.constant(np.random.default_rng(1).normal(size=(16, 4)).astype("float32"))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
    def f(x):
        with tf.name_scope("dense1"):
            h = tf.nn.relu(tf.matmul(x, w1))
        with tf.name_scope("dense2"):
            return tf.matmul(h, w2) + tf.reduce_sum(h)

    return f.get_concrete_function().graph.as_graph_def()


GD = _graph_def()
PB = GD.SerializeToString()


def _accepts_or_one_line(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            g = fn(*args, **kwargs)
        except TfCommoptError as e:
            assert isinstance(e, InputError) and str(e) and "\n" not in str(e), repr(str(e))
            return None
    for n in g.nodes.values():
        for x in (n.forward_ms, n.backward_ms, n.param_bytes, n.activation_bytes):
            assert math.isfinite(x) and x >= 0
    pos = {n: i for i, n in enumerate(g.topological_order())}
    assert all(pos[a] < pos[b] for a, b in g.edges)
    return g


def _file(tmp_path, name, data):
    p = tmp_path / name
    (p.write_bytes if isinstance(data, bytes) else p.write_text)(data)
    return str(p)


def test_the_valid_file_imports(tmp_path):
    g = _accepts_or_one_line(from_graphdef_file, _file(tmp_path, "m.pb", PB), batch_size=32)
    assert g is not None and any(n.endswith("MatMul") for n in g.nodes)
    t = _accepts_or_one_line(from_graphdef_file, _file(tmp_path, "m.pbtxt", str(GD)), batch_size=32)
    assert set(t.nodes) == set(g.nodes)


@pytest.mark.parametrize(
    "name,data,match",
    [
        ("empty.pb", b"", "no computational ops"),
        ("zeros.pb", b"\x00" * 64, "GraphDef"),
        ("junk.pb", bytes(range(256)) * 4, "not a binary GraphDef"),
        ("half.pb", PB[: len(PB) // 2], ""),
        ("text.pbtxt", "node { name: 'a' op: ", "invalid text GraphDef"),
        ("other.pbtxt", "intra_op_parallelism_threads: 2\n", "invalid text GraphDef"),
        ("binary.pbtxt", b"\xff\xfe\x00garbage", "not a text GraphDef"),
        (
            "profile.pb",
            "n0 -- Linear -- forward_compute_time=1\n",
            "not a GraphDef: this is a PipeDream graph.txt profile",
        ),
    ],
)
def test_broken_files_are_one_line_errors(tmp_path, name, data, match):
    path = _file(tmp_path, name, data)
    with pytest.raises(InputError) as e:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from_graphdef_file(path)
    assert match in str(e.value) and path in str(e.value) and "\n" not in str(e.value)


def test_missing_file_and_directory(tmp_path):
    for p in (str(tmp_path / "nope.pb"), str(tmp_path)):
        with pytest.raises(InputError, match="no such GraphDef file"):
            from_graphdef_file(p)


def test_another_proto_is_refused(tmp_path):
    """A serialized ConfigProto / RunMetadata is not a GraphDef: an error, not an empty graph."""
    for msg in (
        tf.compat.v1.ConfigProto(intra_op_parallelism_threads=3, allow_soft_placement=True),
        tf.compat.v1.RunMetadata(partition_graphs=[GD]),
    ):
        path = _file(tmp_path, "x.pb", msg.SerializeToString())
        assert _accepts_or_one_line(from_graphdef_file, path) is None


def _edit(fn):
    gd = tf.compat.v1.GraphDef()
    gd.CopyFrom(GD)
    fn(gd)
    return gd


def _node(gd, op):
    return next(n for n in gd.node if n.op == op)


def _set_placeholder_dims(gd, dims):
    shape = _node(gd, "Placeholder").attr["shape"].shape
    del shape.dim[:]
    for d in dims:
        shape.dim.add(size=d)


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda gd: setattr(_node(gd, "MatMul"), "op", "NoSuchOp"), "cannot import the GraphDef"),
        (lambda gd: _node(gd, "MatMul").input.append("ghost:0"), "cannot import the GraphDef"),
        (lambda gd: gd.node.add().CopyFrom(_node(gd, "MatMul")), "cannot import the GraphDef"),
        (lambda gd: _set_placeholder_dims(gd, [-7, 8]), "cannot import the GraphDef"),
        (lambda gd: _set_placeholder_dims(gd, [4, 9]), "cannot import the GraphDef"),  # 9 x 8 matmul
        (lambda gd: [gd.node.remove(n) for n in list(gd.node) if n.op != "Const"], "no computational"),
    ],
)
def test_bad_graph_structure(edit, match):
    with pytest.raises(InputError, match=match) as e:
        from_graph_def(_edit(edit), batch_size=4)
    assert "\n" not in str(e.value)


def test_cycle_is_refused():
    def close_loop(gd):
        relu = _node(gd, "Relu")
        relu.input[0] = relu.name  # Relu feeds itself

    g = _accepts_or_one_line(from_graph_def, _edit(close_loop), batch_size=4)
    assert g is None


def test_huge_shapes_give_finite_costs():
    g = _accepts_or_one_line(from_graph_def, _edit(lambda gd: _set_placeholder_dims(gd, [2**40, 8])))
    assert g is not None
    assert max(n.activation_bytes for n in g.nodes.values()) >= 2**40 * 16 * 4


@pytest.mark.parametrize("bs", [0, -1, 2.5, "32", True])
def test_bad_batch_size(bs):
    with pytest.raises(InputError, match="batch_size"):
        from_graph_def(GD, batch_size=bs)


@FUZZ
@given(
    st.integers(0, len(PB)),
    st.lists(st.tuples(st.integers(0, len(PB) - 1), st.integers(0, 255)), max_size=4),
    st.booleans(),
)
def test_fuzz_pb_bytes(tmp_path_factory, cut, flips, as_text_name):
    data = bytearray(PB[:cut] if cut < len(PB) else PB)
    for i, v in flips:
        if i < len(data):
            data[i] = v
    path = _file(tmp_path_factory.mktemp("pb"), "m.pbtxt" if as_text_name else "m.pb", bytes(data))
    _accepts_or_one_line(from_graphdef_file, path, batch_size=2)


_mut = st.sampled_from(["drop", "op", "input", "dims", "dtype", "rename"])


@FUZZ
@given(st.lists(st.tuples(_mut, st.integers(0, 50), st.integers(-(2**62), 2**62)), min_size=1, max_size=3))
def test_fuzz_graphdef_structure(edits):
    gd = tf.compat.v1.GraphDef()
    gd.CopyFrom(GD)
    for kind, i, v in edits:
        if not gd.node:
            break
        n = gd.node[i % len(gd.node)]
        if kind == "drop":
            gd.node.remove(n)
        elif kind == "op":
            n.op = ["Relu", "MatMul", "Const", "Identity", "AddV2", "Bogus", ""][v % 7]
        elif kind == "input":
            names = [m.name for m in gd.node] + ["ghost"]
            if n.input:
                n.input[v % len(n.input)] = names[v % len(names)]
            else:
                n.input.append(names[v % len(names)])
        elif kind == "dims" and n.op == "Placeholder":
            _set_placeholder_dims(gd, [v, 8])
        elif kind == "dtype" and "T" in n.attr:
            n.attr["T"].type = abs(v) % 30
        elif kind == "rename":
            n.name = ["a", "", "dense1", "x/y", n.name + "_"][v % 5]
    _accepts_or_one_line(from_graph_def, gd, batch_size=2, group_by_scope=bool(edits[0][1] % 2))


def test_read_graphdef_never_unpickles(tmp_path):
    """A pickle is just bytes that are not a GraphDef."""
    import pickle

    path = _file(tmp_path, "m.pb", pickle.dumps({"node": [1, 2, 3]}))
    assert _accepts_or_one_line(from_graphdef_file, path) is None
    with pytest.raises(InputError):
        read_graphdef(str(tmp_path / "missing.pb"))


# ------------------------------------------------------ the other TF-tier reader of input: hybrid's TF_CONFIG
@pytest.mark.parametrize(
    "text,match",
    [
        (
            '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 5}}',
            "task.index 5 out of range",
        ),
        (
            '{"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}}',
            "duplicate address",
        ),
        ('{"cluster": {"worker": ["a:1"]}, "task": 5}', "missing 'task'"),
        ('{"cluster": {"worker": "ab"}, "task": {"type": "worker", "index": 0}}', "non-empty list"),
        ('{"cluster": {"chief": ["c:1"]}, "task": {"type": "chief", "index": 0}}', "cluster.worker is empty"),
        ('{"a": ' + "[" * 100000, "nested too deeply"),
        ("", "not valid JSON"),
    ],
)
def test_grouped_hybrid_reads_tf_config_strictly(text, match):
    from tf_commopt.distribute.hybrid import groups_from_tf_config

    with pytest.raises(InputError, match=match) as e:
        groups_from_tf_config(text)
    assert str(e.value).startswith("TF_CONFIG: ") and "\n" not in str(e.value)
    ok = '{"cluster": {"worker": ["a:1", "b:1"], "ps": ["p:1"]}, "task": {"type": "ps", "index": 0}}'
    assert groups_from_tf_config(ok) == (["a:1", "b:1"], -1)


@pytest.mark.parametrize(
    "text,match",
    [
        ("{not json", "not valid JSON"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}', "out of range"),
        ('{"cluster": {"trainer": ["a:1"]}, "task": {"type": "trainer", "index": 0}}', "unknown task type"),
    ],
)
def test_skip_correct_strategy_refuses_a_malformed_tf_config(monkeypatch, text, match):
    from tf_commopt.distribute import SkipCorrectStrategy

    monkeypatch.setenv("TF_CONFIG", text)
    with pytest.raises(InputError, match=match) as e:
        SkipCorrectStrategy(interval=2)
    assert "\n" not in str(e.value)


@FUZZ
@given(
    st.binary(max_size=2048),
    st.sampled_from(["x.pb", "x.pbtxt", "saved_model.pb", "x.index", "x.keras", "x"]),
)
def test_fuzz_file_kind_sniffing(tmp_path_factory, data, name):
    """sniff() names any bytes without raising; the loaders turn anything not a model into one line."""
    from tf_commopt.tf.file_kinds import KINDS, sniff
    from tf_commopt.tf.model_files import load_graph

    path = _file(tmp_path_factory.mktemp("sniff"), name, data)
    kind, what = sniff(path)
    assert kind in KINDS and what
    if kind not in ("graphdef", "graphdef_text", "profile_json", "pipedream"):
        with pytest.raises(InputError) as e:
            load_graph(path)
        assert "\n" not in str(e.value)
