"""Importers to CostGraph: Keras layer graphs (tf-keras and Keras 3), concrete functions, GraphDef files.

References are independent of the importer: edges from the models' serialized configs
(``get_config()["layers"][i]["inbound_nodes"]``), FLOPs and bytes from closed forms, and the
GraphDef files written by ``tf.io.write_graph``.
"""

import warnings

import keras as keras3
import pytest
import tensorflow as tf
import tf_keras
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from tf_commopt.errors import InputError
from tf_commopt.tf.graph_import import (
    CostEstimateWarning,
    Roofline,
    from_concrete_function,
    from_graph_def,
    from_graphdef_file,
    from_keras_model,
)

pytestmark = pytest.mark.filterwarnings("ignore::tf_commopt.tf.op_costs.CostEstimateWarning")

KERAS = {"tf_keras": tf_keras, "keras3": keras3}
# time = FLOPs / 1e6 ms, memory term negligible: forward_ms * 1e6 == FLOPs
FLOPS_ONLY = Roofline(peak_gflops=1.0, mem_gbps=1e15)


def config_edges(model):
    """(producer, consumer) layer names from the model's serialized config (tf-keras and Keras 3 formats)."""
    edges = set()

    def histories(obj):
        if isinstance(obj, dict):
            if "keras_history" in obj:
                yield obj["keras_history"][0]
            for v in obj.values():
                yield from histories(v)
        elif isinstance(obj, (list, tuple)):
            if (
                len(obj) >= 3
                and isinstance(obj[0], str)
                and isinstance(obj[1], int)
                and isinstance(obj[2], int)
            ):
                yield obj[0]
            else:
                for v in obj:
                    yield from histories(v)

    for layer in model.get_config()["layers"]:
        for src in histories(layer.get("inbound_nodes", [])):
            edges.add((src, layer["config"]["name"]))
    return edges


def residual_block(K, name="res"):
    L = K.layers
    x = L.Input((8, 8, 4), name="x")
    a = L.Conv2D(4, 3, padding="same", name="conv_a")(x)
    b = L.ReLU(name="relu_a")(L.BatchNormalization(name="bn_a")(a))
    c = L.Conv2D(4, 3, padding="same", name="conv_b")(b)
    y = L.Add(name="add")([x, c])
    out = L.Dense(3, name="head")(L.GlobalAveragePooling2D(name="gap")(L.ReLU(name="relu_out")(y)))
    return K.Model(x, out, name=name)


@pytest.mark.parametrize("kname", ["tf_keras", "keras3"])
def test_residual_block_skip_edge(kname):
    m = residual_block(KERAS[kname])
    g = from_keras_model(m, batch_size=2)
    assert sorted(g.predecessors("add")) == ["conv_b", "x"]  # the skip edge x -> add
    assert set(g.edges) == config_edges(m)
    assert g.topological_order() == [
        "x",
        "conv_a",
        "bn_a",
        "relu_a",
        "conv_b",
        "add",
        "relu_out",
        "gap",
        "head",
    ]
    assert g["x"].activation_bytes == 2 * 8 * 8 * 4 * 4
    assert g.total_param_bytes() == 4 * sum(int(tf.size(w)) for w in m.trainable_weights)


@pytest.mark.parametrize("kname", ["tf_keras", "keras3"])
def test_resnet50_skip_edges_and_layer_graph(kname):
    m = KERAS[kname].applications.ResNet50(weights=None)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        g = from_keras_model(m, batch_size=8)
    assert len([x for x in w if issubclass(x.category, CostEstimateWarning)]) == 1
    assert len(g) == len(m.layers)
    assert set(g.edges) == config_edges(m)
    assert sorted(g.predecessors("conv2_block1_add")) == [
        "conv2_block1_0_bn",
        "conv2_block1_3_bn",
    ]  # projection
    assert sorted(g.predecessors("conv2_block2_add")) == [
        "conv2_block1_out",
        "conv2_block2_3_bn",
    ]  # identity skip
    assert g.total_param_bytes() == 4 * 25_583_592  # ResNet-50's trainable parameters, fp32
    # the memory-bound layers get time from the roofline although they have few FLOPs
    bn = sum(g.compute_ms(n) for n in g if g[n].label in ("BatchNormalization", "Activation"))
    assert 0.1 < bn / g.total_ms() < 0.9


@pytest.mark.parametrize(
    "kname,app",
    [
        ("tf_keras", "InceptionV3"),
        ("keras3", "DenseNet121"),
        ("keras3", "MobileNetV2"),
        ("tf_keras", "NASNetMobile"),
    ],
)
def test_keras_applications_layer_graph(kname, app):
    """Branchy applications (NASNetMobile: 771 layers, 926 edges) keep every edge of their config."""
    m = getattr(KERAS[kname].applications, app)(weights=None)
    g = from_keras_model(m, batch_size=4)
    assert len(g) == len(m.layers)
    assert set(g.edges) == config_edges(m)
    assert g.total_param_bytes() == 4 * sum(int(tf.size(w)) for w in m.trainable_weights)
    assert all(g[n].forward_ms > 0 for n in g if g[n].label != "InputLayer")


@pytest.mark.parametrize("kname", ["tf_keras", "keras3"])
def test_sequential(kname):
    K = KERAS[kname]
    m = K.Sequential(
        [K.layers.Input((10,)), K.layers.Dense(7, name="d1"), K.layers.Dense(3, name="d2")], name="seq"
    )
    g = from_keras_model(m, batch_size=5)
    order = g.topological_order()
    assert order[1:] == ["d1", "d2"] and g[order[0]].label == "InputLayer"
    assert list(g.edges) == [(order[0], "d1"), ("d1", "d2")]
    assert g["d1"].param_bytes == 4 * (10 * 7 + 7) and g["d2"].activation_bytes == 4 * 5 * 3


@pytest.mark.parametrize("kname", ["tf_keras", "keras3"])
def test_nested_models_are_flattened(kname):
    K = KERAS[kname]
    L = K.layers
    i = L.Input((6,), name="i")
    inner = K.Model(i, L.Add(name="sum")([L.Dense(6, name="p")(i), i]), name="inner")
    seq = K.Sequential([L.Input((6,)), L.Dense(4, name="s1"), L.Dense(6, name="s2")], name="seq")
    shared = L.Dense(6, name="shared")
    x = L.Input((6,), name="x")
    h = shared(x)
    a = inner(h)
    b = seq(h)
    y = shared(L.Add(name="merge")([a, b]))
    m = K.Model(x, y, name="outer")
    g = from_keras_model(m, batch_size=3)
    assert set(g.nodes) == {"x", "shared", "inner/p", "inner/sum", "seq/s1", "seq/s2", "merge", "shared@1"}
    assert set(g.edges) == {
        ("x", "shared"),
        ("shared", "inner/p"),
        ("inner/p", "inner/sum"),
        ("shared", "inner/sum"),
        ("shared", "seq/s1"),
        ("seq/s1", "seq/s2"),
        ("inner/sum", "merge"),
        ("seq/s2", "merge"),
        ("merge", "shared@1"),
    }
    assert g["shared@1"].param_bytes == 0  # shared weights counted once
    assert g.total_param_bytes() == 4 * m.count_params()


def test_functional_ops_become_nodes():
    """tf-keras TFOpLambda layers and Keras 3 operations (keras.ops) are nodes like layers."""
    x = tf_keras.Input((8,), name="x")
    m = tf_keras.Model(x, tf.nn.relu(tf_keras.layers.Dense(6, name="d")(x))[:, :3] * 2.0)
    g = from_keras_model(m, batch_size=2)
    assert [g[n].label for n in g.topological_order()] == [
        "InputLayer",
        "Dense",
        "TFOpLambda",
        "SlicingOpLambda",
        "TFOpLambda",
    ]
    assert set(g.edges) == config_edges(m)
    x = keras3.Input((8,), name="x")
    m = keras3.Model(x, keras3.ops.relu(keras3.layers.Dense(6, name="d")(x))[:, :3] * 2.0)
    g = from_keras_model(m, batch_size=2, roofline=FLOPS_ONLY)
    assert [g[n].label for n in g.topological_order()] == [
        "InputLayer",
        "Dense",
        "Relu",
        "GetItem",
        "Multiply",
    ]
    assert len(g.edges) == 4 and g.total_param_bytes() == 4 * (8 * 6 + 6)
    assert g["multiply"].forward_ms * 1e6 == pytest.approx(2 * 3)  # Mul: one FLOP per element


def test_subclassed_and_unbuilt_models_are_input_errors():
    class Sub(tf_keras.Model):
        def __init__(self):
            super().__init__()
            self.d = tf_keras.layers.Dense(2)

        def call(self, x):
            return self.d(x)

    m = Sub()
    m(tf.zeros([1, 3]))
    with pytest.raises(InputError, match="subclassed"):
        from_keras_model(m)
    with pytest.raises(InputError, match="not built"):
        from_keras_model(keras3.Sequential([keras3.layers.Dense(2)]))
    with pytest.raises(InputError, match="batch_size"):
        from_keras_model(residual_block(tf_keras), batch_size=0)


@pytest.mark.parametrize("kname", ["tf_keras", "keras3"])
def test_dense_and_conv_flops_match_closed_form(kname):
    K = KERAS[kname]
    L = K.layers
    B, H, W, C, F, k, s = 3, 11, 9, 5, 7, 3, 2
    x = L.Input((H, W, C))
    v = L.Conv2D(F, k, padding="valid", name="conv_valid")(x)
    sm = L.Conv2D(F, k, strides=s, padding="same", name="conv_same")(v)
    d = L.Dense(6, name="dense")(L.Flatten(name="flat")(sm))
    g = from_keras_model(K.Model(x, d), batch_size=B, roofline=FLOPS_ONLY)
    Ho, Wo = H - k + 1, W - k + 1  # valid
    conv_valid = 2 * B * Ho * Wo * F * k * k * C + B * Ho * Wo * F  # multiply-adds + bias
    Hs, Ws = -(-Ho // s), -(-Wo // s)  # same, stride 2
    conv_same = 2 * B * Hs * Ws * F * k * k * F + B * Hs * Ws * F
    n_in = Hs * Ws * F
    dense = 2 * B * n_in * 6 + B * 6
    assert g["conv_valid"].forward_ms * 1e6 == pytest.approx(conv_valid, rel=1e-9)
    assert g["conv_same"].forward_ms * 1e6 == pytest.approx(conv_same, rel=1e-9)
    assert g["dense"].forward_ms * 1e6 == pytest.approx(dense, rel=1e-9)
    assert g["dense"].backward_ms == pytest.approx(2 * g["dense"].forward_ms)
    assert g["conv_same"].activation_bytes == 4 * B * Hs * Ws * F
    assert g["conv_valid"].param_bytes == 4 * (k * k * C * F + F)
    assert g["flat"].forward_ms == 0.0  # a reshape: no FLOPs


def test_roofline_makes_batchnorm_memory_bound():
    L = tf_keras.layers
    x = L.Input((16, 16, 8))
    m = tf_keras.Model(x, L.BatchNormalization(name="bn")(x))
    r = Roofline(peak_gflops=1e9, mem_gbps=2.0)  # memory term dominates
    g = from_keras_model(m, batch_size=4, roofline=r)
    moved = 2 * 4 * 16 * 16 * 8 * 4 + 4 * 8 * 4  # input + output + gamma, beta, mean, variance
    assert g["bn"].forward_ms == pytest.approx(moved / 2e9 * 1e3)
    assert g["bn"].param_bytes == 2 * 8 * 4  # trainable: gamma and beta


# ----------------------------------------------------------------- exported graphs
def small_model():
    L = tf_keras.layers
    x = L.Input((6,), name="inp")
    h = L.Dense(5, name="fc1")(x)
    r = L.ReLU(name="act")(h)
    y = L.Add(name="skip")([h, L.Dense(5, name="fc2")(r)])
    return tf_keras.Model(x, L.Dense(2, name="out")(y), name="m")


def concrete(model, batch=4):
    return tf.function(lambda inp: model(inp)).get_concrete_function(tf.TensorSpec([batch, 6], tf.float32))


def _same(g1, g2):
    assert set(g1.nodes) == set(g2.nodes)
    assert set(g1.edges) == set(g2.edges)
    for n in g1.nodes:
        a, b = g1[n], g2[n]
        assert (a.label, a.param_bytes, a.activation_bytes) == (b.label, b.param_bytes, b.activation_bytes), n
        assert a.forward_ms == pytest.approx(b.forward_ms), n


def test_concrete_function_op_graph_and_flops():
    cf = concrete(small_model())
    g = from_concrete_function(cf, roofline=FLOPS_ONLY, unknown_flops="zero")
    mm = "m/fc1/MatMul"
    assert g[mm].forward_ms * 1e6 == pytest.approx(2 * 4 * 6 * 5)
    assert g[mm].param_bytes == 4 * 6 * 5 and g["m/fc1/BiasAdd"].param_bytes == 4 * 5
    assert sorted(g.predecessors("m/skip/add")) == ["m/fc1/BiasAdd", "m/fc2/BiasAdd"]  # skip edge
    assert not any(g[n].label in ("Const", "Identity", "ReadVariableOp", "NoOp") for n in g)
    assert g.total_param_bytes() == 4 * (6 * 5 + 5 + 5 * 5 + 5 + 5 * 2 + 2)


@pytest.mark.parametrize("as_text,fname", [(False, "m.pb"), (True, "m.pbtxt")])
def test_graphdef_round_trip(tmp_path, as_text, fname):
    cf = concrete(small_model())
    ref = from_concrete_function(cf)
    path = tf.io.write_graph(cf.graph.as_graph_def(add_shapes=True), str(tmp_path), fname, as_text=as_text)
    _same(ref, from_graphdef_file(path))
    # a frozen graph (variables -> constants), the usual exported form: same DAG, same costs
    frozen = convert_variables_to_constants_v2(cf)
    path2 = tf.io.write_graph(frozen.graph, str(tmp_path), "frozen_" + fname, as_text=as_text)
    _same(ref, from_graphdef_file(path2))
    # written from the Graph itself: no variable shapes. An error naming the variable, unless the caller
    # opts into estimates: then the same DAG, FLOPs of the ops reading the variables unknown
    path3 = tf.io.write_graph(cf.graph, str(tmp_path), "plain_" + fname, as_text=as_text)
    with pytest.raises(InputError, match=r"m/fc1/MatMul.*reads variable .*does not carry.*add_shapes") as e:
        from_graphdef_file(path3)
    assert path3 in str(e.value) and "\n" not in str(e.value)
    with pytest.warns(CostEstimateWarning, match="MatMul"):
        plain = from_graphdef_file(path3, unknown_shapes="estimate")
    assert set(plain.edges) == set(ref.edges) and set(plain.nodes) == set(ref.nodes)


def test_unknown_batch_is_filled_in():
    model = small_model()
    cf = tf.function(lambda inp: model(inp)).get_concrete_function(tf.TensorSpec([None, 6], tf.float32))
    g = from_concrete_function(cf, batch_size=7, roofline=FLOPS_ONLY)
    assert g["m/fc1/MatMul"].forward_ms * 1e6 == pytest.approx(2 * 7 * 6 * 5)
    assert g["m/out/BiasAdd"].activation_bytes == 4 * 7 * 2


def test_unknown_input_dimensions_need_input_shapes():
    """An input with unknown spatial dimensions: an error naming it, then exact FLOPs with input_shapes."""
    import numpy as np

    w = tf.constant(np.ones([3, 3, 3, 4], "float32"))

    @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.float32, name="img")])
    def f(img):
        return tf.nn.relu(tf.nn.conv2d(img, w, 1, "SAME"))

    gd = f.get_concrete_function().graph.as_graph_def()
    with pytest.raises(
        InputError, match=r"input 'img' has shape \(2, None, None, 3\): pass input_shapes="
    ) as e:
        from_graph_def(gd, batch_size=2)
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match=r"input 'img' has shape \(None, 5, 7, 3\): pass batch_size"):
        from_graph_def(_fixed(gd, "img", [-1, 5, 7, 3]))
    g = from_graph_def(gd, input_shapes={"img": [2, 5, 7, 3]}, roofline=FLOPS_ONLY, unknown_flops="zero")
    conv = next(n for n in g if g[n].label == "Conv2D")
    assert g[conv].forward_ms * 1e6 == pytest.approx(2 * 2 * 5 * 7 * 4 * 3 * 3 * 3)
    with pytest.raises(
        InputError, match=r"input_shapes: no Placeholder 'image' in the graph; its inputs: img"
    ):
        from_graph_def(gd, input_shapes={"image": [2, 5, 7, 3]})
    with pytest.raises(InputError, match=r"input_shapes: 'img' has rank 4"):
        from_graph_def(gd, input_shapes={"img": [2, 5, 7]})


def _fixed(gd, name, dims):
    out = tf.compat.v1.GraphDef()
    out.CopyFrom(gd)
    nd = next(n for n in out.node if n.name == name)
    del nd.attr["shape"].shape.dim[:]
    for d in dims:
        nd.attr["shape"].shape.dim.add(size=d)
    return out


def test_group_by_scope_gives_the_layer_graph():
    model = small_model()
    layers = from_keras_model(model, batch_size=4)
    grouped = from_concrete_function(concrete(model), group_by_scope=True)
    rename = {n: n.split("/", 1)[1] if n.startswith("m/") else "inp" for n in grouped.nodes}
    assert set(rename.values()) == set(layers.nodes)
    assert {(rename[a], rename[b]) for a, b in grouped.edges} == set(layers.edges)
    assert grouped["m/fc1"].label == "MatMul+BiasAdd"
    assert grouped["m/fc1"].param_bytes == layers["fc1"].param_bytes
    assert grouped["m/fc2"].activation_bytes == layers["fc2"].activation_bytes
    depth1 = from_concrete_function(concrete(model), group_by_scope=True, scope_depth=1)
    assert set(depth1.nodes) == {"inp", "m"}


PBTXT_CYCLE = """\
node { name: "x" op: "Placeholder" attr { key: "dtype" value { type: DT_FLOAT } }
       attr { key: "shape" value { shape { dim { size: 2 } dim { size: 3 } } } } }
node { name: "a/m1" op: "Neg" input: "x" attr { key: "T" value { type: DT_FLOAT } } }
node { name: "b/p" op: "Square" input: "a/m1" attr { key: "T" value { type: DT_FLOAT } } }
node { name: "a/m2" op: "Neg" input: "b/p" attr { key: "T" value { type: DT_FLOAT } } }
node { name: "a/m3" op: "Add" input: "a/m1" input: "a/m2" attr { key: "T" value { type: DT_FLOAT } } }
"""


def test_scope_contraction_that_would_cycle_is_split(tmp_path):
    p = tmp_path / "cycle.pbtxt"
    p.write_text(PBTXT_CYCLE)
    ops = from_graphdef_file(p, roofline=FLOPS_ONLY)
    assert [ops[n].forward_ms * 1e6 for n in ["a/m1", "b/p", "a/m2", "a/m3"]] == [6, 6, 6, 6]
    with pytest.warns(UserWarning, match="split"):
        g = from_graphdef_file(p, group_by_scope=True, roofline=FLOPS_ONLY)
    assert set(g.edges) == {("x", "a"), ("a", "b"), ("b", "a#2"), ("a", "a#2")}
    assert g["a"].forward_ms * 1e6 == 6 and g["a#2"].forward_ms * 1e6 == 12


def test_bad_files(tmp_path):
    missing = tmp_path / "nope.pb"
    with pytest.raises(InputError, match="nope.pb"):
        from_graphdef_file(missing)
    good = tf.io.write_graph(concrete(small_model()).graph, str(tmp_path), "g.pb", as_text=False)
    data = open(good, "rb").read()
    for cut in (len(data) // 2, len(data) // 3, 7):
        bad = tmp_path / f"cut{cut}.pb"
        bad.write_bytes(data[:cut])
        with pytest.raises(InputError) as e:
            from_graphdef_file(bad)
        assert str(bad) in str(e.value) and "\n" not in str(e.value)
    gd = tf.compat.v1.GraphDef()
    gd.ParseFromString(data)
    prefix = tf.compat.v1.GraphDef()
    prefix.node.extend(gd.node[:2])  # what a cut at a node boundary leaves: valid, but no versions
    (tmp_path / "prefix.pb").write_bytes(data[: len(prefix.SerializeToString())])
    with pytest.warns(UserWarning, match="truncated"):
        from_graphdef_file(tmp_path / "prefix.pb")
    txt = tmp_path / "bad.pbtxt"
    txt.write_text(PBTXT_CYCLE.replace('op: "Square"', 'op: "Square" bogus_field: 1'))
    with pytest.raises(InputError, match=rf"{txt}:4"):
        from_graphdef_file(txt)
    dangling = tmp_path / "dangling.pbtxt"
    dangling.write_text(PBTXT_CYCLE.replace('input: "b/p"', 'input: "nowhere"'))
    with pytest.raises(InputError, match=r"dangling\.pbtxt.*nowhere"):
        from_graphdef_file(dangling)


def test_one_warning_lists_ops_without_statistics():
    L = tf_keras.layers
    x = L.Input((4,))
    m = tf_keras.Model(x, L.ReLU(name="r1")(L.Dense(4, name="d")(L.ReLU(name="r0")(x))))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        g = from_keras_model(m, batch_size=2, roofline=FLOPS_ONLY)
        gz = from_keras_model(m, batch_size=2, roofline=FLOPS_ONLY, unknown_flops="zero")
    msgs = [str(x.message) for x in w if issubclass(x.category, CostEstimateWarning)]
    assert len(msgs) == 2 and "Relu (2)" in msgs[0] and "counted as 0" in msgs[1]
    assert g["r0"].forward_ms * 1e6 == pytest.approx(2 * 4) and gz["r0"].forward_ms * 1e6 == pytest.approx(
        0, abs=1e-9
    )
    with pytest.raises(InputError, match="unknown_flops"):
        from_keras_model(m, unknown_flops="guess")
