"""tf_commopt._compat: every TensorFlow internal the package relies on exists in this TensorFlow, and an
unsupported version is refused with a one-line error naming the supported range."""

import os
import subprocess
import sys

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


def test_unsupported_version_is_a_one_line_error():
    code = (
        "import tensorflow as tf; tf.__version__ = '2.99.0'\n"
        "try:\n    import tf_commopt._compat\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
    )
    out = (
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        )
        .stdout.strip()
        .splitlines()
    )
    assert (
        len(out) == 1 and out[0].startswith("TfCommoptError") and "2.21" in out[0] and "2.99.0" in out[0]
    ), out
