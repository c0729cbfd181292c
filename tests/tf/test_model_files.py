"""What TensorFlow users export: SavedModel directories, .keras/.h5 files, TF2 GraphDefs, wrong files.

References: ``from_keras_model`` of the same in-memory model (an independent path: Keras layer
graph, each layer traced alone), the model's own weight counts, and the files TensorFlow writes.
One small tf-keras application (MobileNetV2, alpha 0.35, 64x64) is built and saved once per module.
"""

import json
import os

import keras as keras3
import pytest
import tensorflow as tf
import tf_keras
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from tf_commopt.errors import InputError
from tf_commopt.tf.file_kinds import sniff
from tf_commopt.tf.graph_import import (
    CostEstimateWarning,
    from_graphdef_file,
    from_keras_model,
)
from tf_commopt.tf.model_files import from_model_file, from_saved_model, load_graph

pytestmark = pytest.mark.filterwarnings("ignore::tf_commopt.tf.op_costs.CostEstimateWarning")
B = 4


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("exported")
    m = tf_keras.applications.MobileNetV2(weights=None, input_shape=(64, 64, 3), alpha=0.35, classes=10)
    sm = str(d / "sm")
    tf.saved_model.save(m, sm)
    m.save(str(d / "m.keras"))
    m.save(str(d / "m.h5"))
    cf = tf.function(lambda x: m(x, training=False)).get_concrete_function(tf.TensorSpec([B, 64, 64, 3]))
    tf.io.write_graph(cf.graph.as_graph_def(), str(d), "bare.pb", as_text=False)  # no variable shapes
    tf.io.write_graph(cf.graph.as_graph_def(add_shapes=True), str(d), "shapes.pb", as_text=False)
    tf.io.write_graph(convert_variables_to_constants_v2(cf).graph, str(d), "frozen.pb", as_text=False)
    mg = tf.compat.v1.train.export_meta_graph(graph_def=cf.graph.as_graph_def(), graph=cf.graph)
    (d / "m.meta").write_bytes(mg.SerializeToString())
    ckpt = tf.train.Checkpoint(model=m).write(str(d / "ckpt" / "c"))
    ref = from_keras_model(m, batch_size=B)
    all_weight_bytes = 4 * sum(int(tf.size(w)) for w in m.weights)
    return {"dir": d, "sm": sm, "model": m, "ref": ref, "ckpt": ckpt, "all_weight_bytes": all_weight_bytes}


def test_saved_model_imports_with_real_shapes(exported):
    ref = exported["ref"]
    g = from_saved_model(exported["sm"], batch_size=B)
    assert abs(g.total_ms() - ref.total_ms()) <= 0.25 * ref.total_ms(), (g.total_ms(), ref.total_ms())
    # op level reads every variable once: trainable + BatchNorm moving statistics
    assert g.total_param_bytes() == exported["all_weight_bytes"]
    conv = g["mobilenetv2_0.35_64/Conv1/Conv2D"]
    assert conv.activation_bytes == 4 * B * 32 * 32 * 16  # 64x64 stride 2, 16 filters (alpha 0.35)
    grouped = from_saved_model(
        os.path.join(exported["sm"], "saved_model.pb"), batch_size=B, group_by_scope=True
    )
    assert grouped.total_ms() == pytest.approx(g.total_ms())


def test_saved_model_errors(exported):
    with pytest.raises(InputError, match=r"no signature 'train'; signatures: serving_default"):
        from_saved_model(exported["sm"], "train", batch_size=B)
    with pytest.raises(InputError, match=r"input '\w+' has shape \(None, 64, 64, 3\): pass batch_size") as e:
        from_saved_model(exported["sm"])  # batch unknown, no batch_size
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match=r"m\.h5: not a SavedModel directory: this is an HDF5 file"):
        from_saved_model(exported["dir"] / "m.h5")
    with pytest.raises(InputError, match=r"not a SavedModel directory: this is a checkpoint directory"):
        from_saved_model(exported["dir"] / "ckpt")


@pytest.mark.parametrize("fname", ["m.keras", "m.h5"])
def test_keras_files_equal_the_in_memory_import(exported, fname):
    ref = exported["ref"]
    g = from_model_file(exported["dir"] / fname, batch_size=B)
    assert set(g.edges) == set(ref.edges) and len(g) == len(ref)
    assert g.total_ms() == pytest.approx(ref.total_ms()) and g.total_param_bytes() == ref.total_param_bytes()


def test_keras3_archive_is_loaded_with_keras3(tmp_path):
    L = keras3.layers
    x = keras3.Input((8, 8, 3))
    h = L.Conv2D(4, 3, padding="same", name="c")(x)
    m = keras3.Model(x, L.Dense(2, name="d")(L.GlobalAveragePooling2D(name="g")(L.Add(name="a")([h, h]))))
    m.save(str(tmp_path / "k3.keras"))
    assert (
        json.loads(__import__("zipfile").ZipFile(tmp_path / "k3.keras").read("metadata.json"))[
            "keras_version"
        ][0]
        == "3"
    )
    g = from_model_file(tmp_path / "k3.keras", batch_size=2)
    ref = from_keras_model(m, batch_size=2)
    assert set(g.edges) == set(ref.edges) and g.total_ms() == pytest.approx(ref.total_ms())


def test_tf2_forward_graphdef_costs_match_the_keras_import(exported):
    """MobileNetV2's forward get_concrete_function(...).graph.as_graph_def(): without variable shapes it is
    an error naming the variable (estimates would be near zero); with them (add_shapes, or frozen) the
    totals agree with from_keras_model's within 25%."""
    ref = exported["ref"]
    d = exported["dir"]
    with pytest.raises(InputError, match=r"bare\.pb: op .*Conv1/Conv2D.*reads variable .*does not carry"):
        from_graphdef_file(d / "bare.pb")
    with pytest.warns(CostEstimateWarning, match="unknown shape"):
        est = from_graphdef_file(d / "bare.pb", unknown_shapes="estimate")
    assert est.total_ms() < 0.1 * ref.total_ms()  # what estimates without shapes are worth
    for name in ("shapes.pb", "frozen.pb"):
        g = from_graphdef_file(d / name)
        assert abs(g.total_ms() - ref.total_ms()) <= 0.25 * ref.total_ms(), (
            name,
            g.total_ms(),
            ref.total_ms(),
        )


@pytest.mark.parametrize(
    "fname,kind,match",
    [
        ("sm", "savedmodel", "this is a SavedModel directory; use from_saved_model"),
        ("sm/saved_model.pb", "savedmodel_pb", "this is a SavedModel's saved_model.pb"),
        ("m.meta", "metagraph", "this is a MetaGraphDef"),
        ("m.h5", "h5", "this is an HDF5 file"),
        ("m.keras", "keras", "this is a Keras .keras archive"),
        ("ckpt", "checkpoint_dir", "this is a checkpoint directory"),
        ("ckpt/c.index", "checkpoint", "this is a TensorFlow checkpoint"),
    ],
)
def test_graphdef_reader_names_what_a_file_is(exported, fname, kind, match):
    path = str(exported["dir"] / fname)
    assert sniff(path)[0] == kind
    with pytest.raises(InputError) as e:
        from_graphdef_file(path)
    assert match in str(e.value) and path in str(e.value) and "\n" not in str(e.value)


def test_graphdefs_are_still_graphdefs(exported):
    assert sniff(exported["dir"] / "shapes.pb")[0] == "graphdef"
    assert sniff(exported["dir"] / "frozen.pb")[0] == "graphdef"


def test_load_graph_dispatch(exported):
    g, info = load_graph(str(exported["sm"]), batch_size=B, device="h200-bf16")
    assert info["device"] == "h200-bf16" and info["peak_gflops"] == 989_000.0
    assert "h200-bf16" in info["summary"] and "989000 GFLOP/s" in info["summary"]
    with pytest.raises(InputError, match=r"--device: .*bundled profile name.*fixed"):
        load_graph("h200/resnet50.fp32", device="h200")
    with pytest.raises(InputError, match="unknown device preset 'tpu'"):
        load_graph(str(exported["dir"] / "m.keras"), device="tpu")
    with pytest.raises(InputError, match="this is a MetaGraphDef"):
        load_graph(str(exported["dir"] / "m.meta"))
    p, _ = load_graph("h200/resnet50.fp32")
    assert len(p) > 100


def test_partition_cli_takes_a_saved_model(exported, capsys):
    from tf_commopt.partition.__main__ import main

    rc = main(
        [
            "--profile",
            exported["sm"],
            "--stages",
            "2",
            "--method",
            "balanced",
            "--batch-size",
            str(B),
            "--device",
            "h200",
            "--bandwidth-gbps",
            "1000",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0, err
    plan = json.loads(out)
    assert plan["extra"]["cost_model"]["device"] == "h200" and plan["extra"]["cost_model"]["batch_size"] == B
    assert "roofline h200 = 67000 GFLOP/s, 4800 GB/s" in err
    rc = main(["--profile", str(exported["dir"] / "ckpt"), "--stages", "2"])
    assert rc == 2 and "checkpoint directory" in capsys.readouterr().err


def test_sim_cli_takes_a_keras_file(exported, tmp_path, capsys):
    from tf_commopt.partition.__main__ import main as part
    from tf_commopt.sim.cli import main as sim

    keras_file = str(exported["dir"] / "m.keras")
    assert (
        part(
            [
                "--profile",
                keras_file,
                "--stages",
                "2",
                "--method",
                "balanced",
                "--batch-size",
                str(B),
                "--bandwidth-gbps",
                "1000",
                "--out",
                str(tmp_path / "p.json"),
                "--quiet",
            ]
        )
        == 0
    )
    capsys.readouterr()
    # the plan carries its schedule and micro-batches (gpipe, 4 x stages); sim uses them
    assert sim(["--profile", keras_file, "--plan", str(tmp_path / "p.json"), "--batch-size", str(B)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["cost_model"]["batch_size"] == B and res["iteration_ms"] > 0
