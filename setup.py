"""Install tf_commopt: ``pip install .`` (``pip install ".[test]"`` for the test suite)."""
from setuptools import find_packages, setup

setup(
    name="tf_commopt",
    version="0.1.0",
    description=(
        "Communication-optimised distributed training for TensorFlow: skip-and-correct data "
        "parallelism, graph-aware pipeline partitioning and device-aware hybrid parallelism."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["tf_commopt", "tf_commopt.*"]),
    package_data={"tf_commopt": ["data/*.npz", "data/*.txt", "data/profiles/*/*", "data/LICENSE*"]},
    install_requires=[
        "tensorflow==2.21.*",
        "tf-keras==2.21.*",
        "tensorboard==2.21.*",  # tf.keras.callbacks.TensorBoard needs it; TensorFlow 2.21 does not install it
        "numpy",
        # 0.7.0 costs ~1.2 CPU s per import (its ufunc loops registered one by one): every task pays it
        "ml_dtypes>=0.5.1,<0.7",
        "networkx",
        "deap",
        "absl-py",
        "matplotlib",
    ],
    extras_require={
        "test": [
            "pytest",
            "pytest-timeout",
            "pytest-xdist",
            "hypothesis",
            "pyyaml",
            "ruff==0.17.6",  # pinned: ruff format's output changes between releases
            "pdoc>=16,<17",  # the API reference (docs/build_api.py)
        ],
    },
)
