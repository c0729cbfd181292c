"""The strategies (TensorFlow). Import loads TensorFlow.

Example:
    >>> from tf_commopt.distribute import SkipCorrectStrategy   # doctest: +SKIP
    >>> strategy = SkipCorrectStrategy(interval=4, correction="vrl")   # doctest: +SKIP
    >>> with strategy.scope():                                        # doctest: +SKIP
    ...     model = make_model(); model.compile("sgd", "sparse_categorical_crossentropy")
    >>> model.fit(x, y, epochs=1)                                      # doctest: +SKIP

Names (loaded on first use): ``SkipCorrectStrategy``, its interval policies ``AutoInterval`` and
``TwoLevelInterval`` (two-level averaging's ``host_interval``) and the options of its time-based period
``TimeBudget`` (docs/skip_correct.md), ``GroupedHybridTrainer`` (a trainer with a strategy's surface) and ``Pipeline``
(docs/hybrid.md), ``ParameterServerSkipCorrect`` and ``serve_unless_chief``
(docs/parameter_server.md).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "SkipCorrectStrategy": "tf_commopt.distribute.skip_correct",
    "AutoInterval": "tf_commopt.distribute.interval_policy",
    "TimeBudget": "tf_commopt.core.period",
    "TwoLevelInterval": "tf_commopt.core.levels",
    "GroupedHybridTrainer": "tf_commopt.distribute.hybrid",
    "Pipeline": "tf_commopt.distribute.pipeline",
    "ParameterServerSkipCorrect": "tf_commopt.distribute.ps",
    "serve_unless_chief": "tf_commopt.distribute.ps",
    "slurm_cluster_resolver": "tf_commopt.distribute.slurm",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tf_commopt.distribute' has no attribute {name!r}")
