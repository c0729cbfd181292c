"""tf_commopt._compat: every TensorFlow internal the package relies on exists in this TensorFlow, and an
unsupported version is refused with a one-line error naming the supported range."""

import os

import pytest

from tf_commopt import _compat

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_internal_exists():
    assert _compat.check_internals() == []
    assert len(_compat.INTERNALS) >= 15


def test_ps_cluster_spec_reads_the_strategys_resolver_and_names_a_missing_one():
    import types

    import tensorflow as tf

    cluster = {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]}
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec(cluster))
    assert _compat.ps_cluster_spec(types.SimpleNamespace(_cluster_resolver=resolver)) == cluster
    for call in (
        lambda: _compat.ps_cluster_spec(object()),
        lambda: _compat.unblock_coordinator_exit(object()),
    ):
        try:
            call()
        except _compat.TfCommoptError as e:
            assert "\n" not in str(e) and "_cluster" in str(e), str(e)
        else:
            raise AssertionError("a missing TensorFlow internal must be an error")


def test_a_missing_internal_is_named():
    class Fake:
        pass

    _compat.INTERNALS.append((Fake, "_gone"))
    try:
        assert _compat.check_internals() == ["Fake._gone"]
    finally:
        _compat.INTERNALS.pop()


def test_an_instance_attribute_is_checked_in_the_method_that_sets_it():
    class Fake:
        def __init__(self):
            self._here = 1

    _compat.INTERNALS.append((_compat._SetBy(Fake.__init__), "_here"))
    _compat.INTERNALS.append((_compat._SetBy(Fake.__init__), "_gone"))
    try:
        missing = _compat.check_internals()
        assert len(missing) == 1 and missing[0].endswith("Fake.__init__() sets self._gone"), missing
    finally:
        del _compat.INTERNALS[-2:]


def test_unsupported_version_is_a_one_line_error(monkeypatch):
    import tensorflow as tf

    from tests.inprocess import fresh_imports

    monkeypatch.setattr(tf, "__version__", "2.99.0")
    with pytest.raises(Exception) as e:  # tf_commopt imported afresh: its errors are new classes
        with fresh_imports(block=()):
            import tf_commopt._compat  # noqa: F401
    msg = str(e.value)
    assert type(e.value).__name__ == "TfCommoptError" and "\n" not in msg, msg
    assert "2.21" in msg and "2.99.0" in msg, msg


def test_a_missing_internal_stops_a_strategy_at_start_up():
    from tf_commopt.distribute import SkipCorrectStrategy
    from tf_commopt.errors import TfCommoptError

    class Fake:
        pass

    _compat.INTERNALS.append((Fake, "_gone"))
    try:
        try:
            SkipCorrectStrategy(interval=2, devices=["/cpu:0", "/cpu:1"])
        except TfCommoptError as e:
            msg = str(e)
        else:
            raise AssertionError("no error")
    finally:
        _compat.INTERNALS.pop()
    assert msg.startswith("SkipCorrectStrategy: ") and "Fake._gone" in msg and "\n" not in msg


def test_worker_count_index_and_resolver_of_one_process_strategies():
    import tensorflow as tf

    from tf_commopt.distribute import SkipCorrectStrategy

    mirrored = _compat.fresh_mirrored_strategy(["/cpu:0", "/cpu:1"])
    sc = SkipCorrectStrategy(interval=2, devices=["/cpu:0", "/cpu:1"])
    for s in (mirrored, sc, tf.distribute.get_strategy()):
        assert _compat.num_workers(s) == _compat.num_workers(s.extended) == 1
        assert _compat.worker_index(s) == 0 and _compat.strategy_cluster_resolver(s) is None
    assert _compat.container_strategy(sc.extended) is sc


def test_worker_count_of_a_collective_strategy_is_its_cluster_size():
    import tensorflow as tf

    # a two-worker TF_CONFIG cluster resolver (nothing is contacted until a collective runs)
    spec = tf.train.ClusterSpec({"worker": ["localhost:1", "localhost:2"]})
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type="worker", task_id=1, rpc_layer="grpc"
    )
    ext = _compat.collective_all_reduce_strategy.CollectiveAllReduceExtended.__new__(
        _compat.collective_all_reduce_strategy.CollectiveAllReduceExtended
    )
    ext._num_workers, ext._id_in_cluster, ext._cluster_resolver = 2, 1, resolver
    assert _compat.num_workers(ext) == 2 and _compat.worker_index(ext) == 1
    assert _compat.strategy_cluster_resolver(ext) is resolver


def test_track_child_puts_the_child_in_the_parents_checkpoint(tmp_path):
    import tensorflow as tf

    parent, child = tf.Module(), tf.Module()
    child.v = tf.Variable(3.0)
    _compat.track_child(parent, child, "kid")
    path = tf.train.Checkpoint(root=parent).write(str(tmp_path / "ck"))
    names = [n for n, _ in tf.train.list_variables(path)]
    assert any("kid/v" in n for n in names), names


def test_keras_accessors_read_what_tf_keras_set(tmp_path):
    import tf_keras

    tk = _compat.tf_keras_internals()
    model = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(2,))])
    assert _compat.keras_model_strategy(model) is None  # built outside every strategy's scope
    assert _compat.optimizer_mesh(tf_keras.optimizers.SGD(0.1)) is None
    assert _compat.optimizer_mesh(tf_keras.optimizers.legacy.SGD(0.1)) is None
    cb = tf_keras.callbacks.BackupAndRestore(str(tmp_path))
    before = _compat.backup_supported_strategies(cb)
    _compat.set_backup_supported_strategies(cb, before + (int,))
    assert _compat.backup_supported_strategies(cb) == before + (int,)
    state = tk.worker_training_state.WorkerTrainingState(model, str(tmp_path))
    assert _compat.training_state_model(state) is model


# TensorFlow / tf-keras private attributes the package reads through _compat's accessors
_ACCESSED_INTERNALS = {
    "_num_workers": "num_workers",
    "_id_in_cluster": "worker_index",
    "_cluster_resolver": "strategy_cluster_resolver",
    "_container_strategy": "container_strategy",
    "_track_trackable": "track_child",
    "_distribution_strategy": "keras_model_strategy",
    "_mesh": "optimizer_mesh",
    "_supported_strategies": "backup_supported_strategies",
    "_training_state": "backup_training_state",
}


# files that still read such internals directly (shrinks to nothing; a clean file must leave it)
_NOT_YET: set = set()


def test_internals_are_read_only_in_compat():
    """No module outside tf_commopt/_compat imports tensorflow.python or reads one of the internals that
    have an accessor (as an attribute or a getattr string)."""
    import ast
    import pathlib

    package = pathlib.Path(ROOT) / "tf_commopt"
    hits = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        if rel == "tf_commopt/_compat.py" or rel.startswith("tf_commopt/_compat/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = (
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                )
                hits += [
                    f"{rel}:{node.lineno} imports {n}" for n in names if n.startswith("tensorflow.python")
                ]
            name = node.attr if isinstance(node, ast.Attribute) else None
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                name = node.value
            if name in _ACCESSED_INTERNALS:
                hits.append(f"{rel}:{node.lineno} reads {name} (use _compat.{_ACCESSED_INTERNALS[name]})")
    dirty = {h.split(":")[0] for h in hits}
    assert not [h for h in hits if h.split(":")[0] not in _NOT_YET], hits
    clean = {f for f in _NOT_YET - dirty if (package.parent / f).exists()}  # a moved file just drops out
    assert not clean, f"reads through _compat now, remove from _NOT_YET: {sorted(clean)}"
