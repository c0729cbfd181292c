"""Stage layout of a tf-keras model under a PartitionPlan: which layer call runs in which stage, which
tensors cross stage boundaries, and a clone of the model with each stage's variables on its device.

Example:
    >>> from tf_commopt.distribute.stages import StageLayout, split_sizes   # doctest: +SKIP
    >>> lay = StageLayout(model, plan, ["/GPU:0", "/GPU:1"])                 # doctest: +SKIP
    >>> lay.layers_of_stage(1), lay.stage_inputs[1]                          # doctest: +SKIP
    >>> split_sizes(10, 4)
    [3, 3, 2, 2]

Used by :mod:`tf_commopt.distribute.pipeline` (see its docstring and docs/hybrid.md for the rules).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from tf_commopt import use_tf_keras

use_tf_keras()  # before TensorFlow loads: tf.keras is tf-keras
import tensorflow as tf

from tf_commopt._compat import keras_nodes_by_depth
from tf_commopt.core.plan import PartitionPlan
from tf_commopt.errors import InputError, PlanError

__all__ = ["StageLayout", "split_sizes", "place_model", "default_devices"]


# ----------------------------------------------------------------------------- helpers
def split_sizes(batch: int, parts: int) -> List[int]:
    """Micro-batch sizes: ``batch`` split into ``min(parts, batch)`` sizes differing by at most one.

    >>> split_sizes(10, 4)
    [3, 3, 2, 2]
    """
    if batch < 1:
        raise InputError(f"cannot split a batch of {batch} samples")
    parts = max(1, min(int(parts), int(batch)))
    q, r = divmod(int(batch), parts)
    return [q + 1 if i < r else q for i in range(parts)]


def default_devices() -> List[str]:
    """Logical GPUs if any, else logical CPUs (names usable in ``tf.device``)."""
    devs = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
    return [d.name for d in devs]


class _Keep:
    """A tensor_dict entry whose pop() never empties (tf-keras Node.map_arguments pops)."""

    __slots__ = ("v",)

    def __init__(self, v):
        self.v = v

    def pop(self):
        return self.v


def _is_float(t: Any) -> bool:
    return hasattr(t, "dtype") and tf.as_dtype(t.dtype).is_floating


# ----------------------------------------------------------------------------- layout
class StageLayout:
    """Which keras Node (layer call) runs in which stage, and which tensors cross stage boundaries.

    Args:
        model: a functional or Sequential tf-keras model (a graph network).
        plan: layer name (or call name ``name@k`` as the Keras importer writes it; nested models'
            ``outer/inner`` names) -> stage (InputLayers may be omitted); device_of_stage indexes ``devices``.
            A shared layer may be called in several stages: its variables live on its first call's stage
            and the stages' gradients for them are summed.
        devices: device names; stage s runs on ``devices[plan.device_of_stage[s]]``.

    Raises:
        PlanError: a plan layer that is not in the model, a model layer missing from the plan, a stage
            index out of range, or a tensor flowing from a later stage to an earlier one.
    """

    def __init__(self, model: Any, plan: PartitionPlan, devices: Sequence[str]):
        if not getattr(model, "_is_graph_network", False):
            raise InputError(
                f"model {getattr(model, 'name', model)!r} is not a functional or built Sequential "
                "tf-keras model; pipelines need the layer graph",
                where="Pipeline",
            )
        self.model = model
        self.plan = plan
        self._where = f"plan {plan.method!r}" + (f" of {plan.graph_name!r}" if plan.graph_name else "")
        for s, d in enumerate(plan.device_of_stage):
            if not 0 <= d < len(devices):
                raise PlanError(
                    f"stage {s} is placed on device {d} but only {len(devices)} devices are given",
                    where=self._where,
                )
        self.devices = [devices[d] for d in plan.device_of_stage]
        nodes, input_layer_names = self._nodes(model)
        stage_of_call = self._stage_of_calls(nodes, input_layer_names)
        # where each layer's variables live: the stage of its first call
        self.stage_of_layer: Dict[str, int] = {}
        for n in nodes:
            self.stage_of_layer.setdefault(n.layer.name, stage_of_call[id(n)])
        self._wire(model, nodes, stage_of_call, plan.num_stages)
        # the variables each stage differentiates: a layer called in several stages (shared weights) has
        # its variables in each of them, and their gradients are summed across stages
        self.variables_of_stage: List[List[tf.Variable]] = []
        for s in range(plan.num_stages):
            vs: List[tf.Variable] = []
            seen = set()
            for n in self.nodes_of_stage[s]:
                for v in n.layer.trainable_weights:
                    if v.ref() not in seen:
                        seen.add(v.ref())
                        vs.append(v)
            self.variables_of_stage.append(vs)

    def _nodes(self, model: Any):
        """Non-input keras Nodes in a topological order (deepest first), their call names, input layers."""
        nodes: List[Any] = []
        input_layer_names = set()
        by_depth = keras_nodes_by_depth(model)
        for depth in sorted(by_depth.keys(), reverse=True):
            for node in by_depth[depth]:
                if node.is_input:
                    input_layer_names.add(node.layer.name)
                else:
                    nodes.append(node)
        # call names as the Keras importer makes them: a layer's k-th call (k > 0) is "name@k"
        self.call_name: Dict[int, str] = {}
        times: Dict[int, int] = {}
        for n in nodes:
            k = times.get(id(n.layer), 0)
            times[id(n.layer)] = k + 1
            self.call_name[id(n)] = n.layer.name + (f"@{k}" if k else "")
        return nodes, input_layer_names

    def _plan_names(self, nodes: Sequence[Any]) -> Dict[str, int]:
        """The plan's layer -> stage, a nested model (``outer/inner`` names) folded into one unit."""
        stage_of = dict(self.plan.stage_of_node)
        for n in nodes:
            name = n.layer.name
            if name in stage_of or not hasattr(n.layer, "layers"):
                continue
            inner = {k: v for k, v in stage_of.items() if k.startswith(name + "/")}
            if len(set(inner.values())) > 1:
                raise PlanError(
                    f"nested model {name!r} is split across stages {sorted(set(inner.values()))}; "
                    "a nested model must stay in one stage",
                    where=self._where,
                )
            if inner:
                for k in inner:
                    del stage_of[k]
                stage_of[name] = next(iter(inner.values()))
        return stage_of

    def _stage_of_calls(self, nodes: Sequence[Any], input_layer_names: set) -> Dict[int, int]:
        """id(node) -> stage; PlanError for an unknown layer, a stage out of range or a missing layer."""
        P, where = self.plan.num_stages, self._where
        known = set(self.call_name.values()) | {n.layer.name for n in nodes} | input_layer_names
        stage_of = self._plan_names(nodes)
        for name, s in stage_of.items():
            if name not in known:
                raise PlanError(f"layer {name!r} is not a layer of model {self.model.name!r}", where=where)
            if not 0 <= s < P:
                raise PlanError(f"layer {name!r}: stage {s} is outside 0..{P - 1}", where=where)
        out: Dict[int, int] = {}
        for n in nodes:
            cn = self.call_name[id(n)]
            if cn in stage_of:
                out[id(n)] = stage_of[cn]
            elif n.layer.name in stage_of:  # a plan that names layers, not calls
                out[id(n)] = stage_of[n.layer.name]
            else:
                raise PlanError(
                    f"layer {cn!r} of model {self.model.name!r} has no stage in the plan", where=where
                )
        return out

    def _wire(self, model: Any, nodes: Sequence[Any], stage_of_call: Dict[int, int], P: int) -> None:
        """Each stage's nodes, and the tensors crossing stage boundaries (inputs and outputs per stage)."""
        where = self._where
        self.input_ids = [str(id(t)) for t in model.inputs]
        self.output_ids = [str(id(t)) for t in model.outputs]
        producer: Dict[str, int] = {tid: -1 for tid in self.input_ids}
        producer_layer: Dict[str, str] = {}
        self.nodes_of_stage: List[List[Any]] = [[] for _ in range(P)]
        consumers: Dict[str, set] = {}
        for n in nodes:
            s = stage_of_call[id(n)]
            cn = self.call_name[id(n)]
            for tid in n.flat_input_ids:
                ps = producer.get(tid)
                if ps is None:
                    raise PlanError(
                        f"layer {cn!r} consumes a tensor the model does not produce before it", where=where
                    )
                if ps > s:
                    raise PlanError(
                        f"layer {cn!r} (stage {s}) consumes the output of layer "
                        f"{producer_layer[tid]!r} (stage {ps}): stages must follow the data flow "
                        "(non-convex or out-of-order plan)",
                        where=where,
                    )
                if ps != s:
                    consumers.setdefault(tid, set()).add(s)
            for tid in n.flat_output_ids:
                producer[tid] = s
                producer_layer[tid] = cn
            self.nodes_of_stage[s].append(n)
        for tid in self.output_ids:
            consumers.setdefault(tid, set()).add(P)  # the loss, on the last stage's device
        self.producer = producer
        # stage_inputs[s]: tensors produced outside s (earlier stages or model inputs) that s consumes
        self.stage_inputs: List[List[str]] = [
            sorted(t for t, cs in consumers.items() if s in cs) for s in range(P)
        ]
        # stage_outputs[s]: tensors produced in s and needed by a later stage or by the loss
        self.stage_outputs: List[List[str]] = [
            sorted(t for t, cs in consumers.items() if producer[t] == s) for s in range(P)
        ]
        for tid in self.output_ids:  # a model output that is also a model input (identity model)
            if producer[tid] == -1:
                raise PlanError("a model output is a model input; nothing to pipeline", where=where)

    @property
    def num_stages(self) -> int:
        return len(self.nodes_of_stage)

    def layers_of_stage(self, s: int) -> List[str]:
        """Layer call names of stage ``s`` in execution order (``name@k`` for a layer's k-th call)."""
        return [self.call_name[id(n)] for n in self.nodes_of_stage[s]]

    def run_stage(self, s: int, inputs: Mapping[str, tf.Tensor], training: bool) -> Dict[str, tf.Tensor]:
        """Run stage ``s``'s layer calls on ``inputs`` (tensor id -> value); return its boundary outputs."""
        td: Dict[str, _Keep] = {k: _Keep(v) for k, v in inputs.items()}
        for n in self.nodes_of_stage[s]:
            args, kwargs = n.map_arguments(td)
            if getattr(n.layer, "_expects_training_arg", False) and "training" not in kwargs:
                kwargs = dict(kwargs, training=training)
            outs = n.layer(*args, **kwargs)
            for tid, y in zip(n.flat_output_ids, tf.nest.flatten(outs)):
                td[tid] = _Keep(y)
        return {t: td[t].v for t in self.stage_outputs[s]}


# ----------------------------------------------------------------------------- placement
def place_model(model: Any, device_of_layer: Mapping[str, str], default_device: str) -> Any:
    """A clone of ``model`` whose layers' variables live on ``device_of_layer[name]``; weights copied.

    >>> placed = place_model(model, {"dense": "/GPU:1"}, "/GPU:0")   # doctest: +SKIP
    """
    import tf_keras as keras

    def clone_fn(layer):
        dev = device_of_layer.get(layer.name, default_device)
        with tf.device(dev):
            new = layer.__class__.from_config(layer.get_config())
        build = new.build

        def placed_build(*a, **k):
            with tf.device(dev):
                return build(*a, **k)

        new.build = placed_build
        return new

    with tf.device(default_device):
        clone = keras.models.clone_model(model, clone_function=clone_fn)
    clone.set_weights(model.get_weights())
    return clone
