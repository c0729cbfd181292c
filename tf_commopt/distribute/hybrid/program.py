"""The grouped hybrid's program bound to a tf-keras model: each cost-graph node's stage as the pipelines
placed it, and each gradient bucket's model variables.

Example:
    >>> from tf_commopt.distribute.hybrid.program import bucket_variables   # doctest: +SKIP
    >>> bucket_variables(program, model)          # {"grads0": [3, 2], "grads1": [1, 0]}  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from tf_commopt.core.schedule.hybrid import HybridProgram
from tf_commopt.errors import PlanError

__all__ = ["stage_maps", "bucket_variables"]


def stage_maps(order: Sequence[str], layouts: Sequence[Any]) -> List[Dict[str, int]]:
    """Per group: every cost-graph node (``order``) -> its stage in that group's
    :class:`~tf_commopt.distribute.stages.StageLayout` (model inputs, which plans may omit: stage 0)."""
    out = []
    for lay in layouts:
        by_call = {name: s for s in range(lay.num_stages) for name in lay.layers_of_stage(s)}
        son = {}
        for v in order:
            top = v.split("/")[0]
            son[v] = by_call.get(v, by_call.get(top, lay.stage_of_layer.get(top, 0)))
        out.append(son)
    return out


def _layers_by_name(model: Any) -> Dict[str, Any]:
    layer_of = {}
    for layer in model.layers:
        layer_of[layer.name] = layer
        for sub in getattr(layer, "layers", []) or []:
            layer_of[f"{layer.name}/{sub.name}"] = sub
    return layer_of


def bucket_variables(prog: HybridProgram, model: Any) -> Dict[str, List[int]]:
    """Bucket key -> indices in ``model.trainable_weights`` of the variables whose gradients it reduces.

    A PlanError names the variables no bucket holds (their layer has no parameters in the cost graph).
    """
    pos = {v.ref(): k for k, v in enumerate(model.trainable_weights)}
    layer_of = _layers_by_name(model)
    out: Dict[str, List[int]] = {}
    owned = set()
    for b in prog.buckets:
        ks = []
        for v in b.nodes:
            layer = layer_of.get(v, layer_of.get(v.split("@")[0]))
            for w in layer.trainable_weights if layer is not None else []:
                k = pos.get(w.ref())
                if k is not None and k not in owned:
                    owned.add(k)
                    ks.append(k)
        out[b.key] = ks
    if prog.buckets and len(owned) != len(model.trainable_weights):
        missing = [w.name for k, w in enumerate(model.trainable_weights) if k not in owned]
        raise PlanError(
            f"variables {missing[:3]} belong to no gradient bucket (their layer has no parameters in the "
            "cost graph)",
            where="GroupedHybridTrainer",
        )
    return out
