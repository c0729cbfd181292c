"""Shared test set-up: tier markers by folder; the TensorFlow tiers get 4 logical CPU devices."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = str(item.fspath)
        for tier in ("core", "tf", "cluster"):
            if f"{os.sep}tests{os.sep}{tier}{os.sep}" in path:
                item.add_marker(getattr(pytest.mark, tier))
