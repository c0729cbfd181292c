"""The JSON record every training runner prints as its last line (and writes to ``--model_dir``).

Shared by :mod:`experiments.train` (collective and single-device runs) and :mod:`experiments.ps_train`
(parameter-server clusters), so both print the same keys in the same order.

Example:
    >>> rec = build_record(strategy="single", model="mlp", dataset="mnist", replicas=1, workers=1,
    ...                    global_batch_size=128, steps=10, epochs=1, wall_s=2.0, train_loss=0.5,
    ...                    train_accuracy=0.9, test_loss=0.6, test_accuracy=0.88, seed=0, learning_rate=0.05,
    ...                    params=100, param_bytes=400)
    >>> rec["steps_per_s"], list(rec)[:3]
    (5.0, ['strategy', 'model', 'dataset'])
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

__all__ = ["build_record", "save_result"]


def build_record(
    *,
    strategy: str,
    model: str,
    dataset: str,
    replicas: int,
    workers: int,
    global_batch_size: int,
    steps: int,
    epochs: int,
    wall_s: float,
    train_loss: float,
    train_accuracy: float,
    test_loss: float,
    test_accuracy: float,
    seed: int,
    learning_rate: float,
    params: int,
    param_bytes: int,
    extra: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The common keys (in this order), then ``extra`` (strategy-specific keys, in its order)."""
    record: Dict[str, Any] = {
        "strategy": strategy,
        "model": model,
        "dataset": dataset,
        "replicas": replicas,
        "workers": workers,
        "global_batch_size": global_batch_size,
        "steps": steps,
        "epochs": epochs,
        "wall_s": round(wall_s, 3),
        "steps_per_s": round(steps / wall_s, 3) if wall_s > 0 else None,
        "train_loss": float(train_loss),
        "train_accuracy": float(train_accuracy),
        "test_loss": float(test_loss),
        "test_accuracy": float(test_accuracy),
        "seed": seed,
        "learning_rate": learning_rate,
        "params": int(params),
        "param_bytes": int(param_bytes),
    }
    record.update(extra or {})
    return record


def save_result(model_dir: str, record: Dict[str, Any], plain_model: Any = None) -> None:
    """Write ``model_dir/result.json`` (and ``model.weights.h5`` of ``plain_model``); nothing if ``model_dir`` is empty."""
    if not model_dir:
        return
    os.makedirs(model_dir, exist_ok=True)
    if plain_model is not None:
        plain_model.save_weights(os.path.join(model_dir, "model.weights.h5"))
    with open(os.path.join(model_dir, "result.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
