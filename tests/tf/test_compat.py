"""tf_commopt._compat: every TensorFlow internal the package relies on exists in this TensorFlow, and an
unsupported version is refused with a one-line error naming the supported range."""

import pytest

from tf_commopt import _compat


def test_every_internal_exists():
    assert _compat.check_internals() == []
    assert len(_compat.INTERNALS) >= 15


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
