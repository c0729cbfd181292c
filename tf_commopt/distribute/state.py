"""Per-optimizer skip-and-correct state: the Δ_i of every replica and the local-step counter k.

The state is a checkpointable child of the optimizer (``skip_correct_state``), so
``tf.train.Checkpoint(optimizer=...)``, ``model.save_weights`` and ``model.save`` keep it: the step
counter t is the optimizer's own ``iterations``; here we add k (local steps since the last scheduled
sync), H (with an ``AutoInterval`` also whether H was chosen and the t_comm/t_comp it was chosen from,
so a restored run keeps it), and Δ_i (and G_i) stacked over all replicas into one ``[R, ...]`` tensor
per variable (gathered across workers on a cluster). With ``compression`` also the error-feedback
residuals e_i (and r_i) stacked the same way, and the anchor x₀ (the last global model, one copy). Restoring into a strategy with a different number
of replicas is an InputError.

Example:
    >>> state = strategy.extended.correction_state(optimizer)   # doctest: +SKIP
    >>> state.delta_numpy()[0].shape                            # doctest: +SKIP
    (4, 3, 2)
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tf_commopt._compat import num_workers, resource_variable_ops, save_context, worker_index
from tf_commopt._compat import trackable_base as _trackable
from tf_commopt._compat import values as _values
from tf_commopt.errors import InputError

__all__ = ["SkipCorrectState"]


def _pass_through(error: Exception) -> Exception:
    """Let the one-line error surface unchanged through tf.function tracing (autograph)."""
    error.ag_pass_through = True  # type: ignore[attr-defined]
    return error


class SkipCorrectState(_trackable.Trackable):
    """Δ_i per trainable variable (one component per replica) and the local-step counter k."""

    def __init__(
        self,
        strategy: Any,
        variables: Sequence[Any],
        rule: str,
        optimizer: Any = None,
        compression: Optional[str] = None,
        two_level: bool = False,
    ):
        self._strategy = strategy
        self.compression = compression  # None, "bf16" or "fp16" (distribute/compressed_sync.py)
        self.rule = rule  # the resolved correction: "vrl", "gradient" or "none"
        self.variables = list(variables)
        self._optimizer_ref = weakref.ref(optimizer) if optimizer is not None else (lambda: None)
        with tf.device("/CPU:0"):
            self.local_steps = resource_variable_ops.ResourceVariable(
                tf.constant(0, tf.int64), name="skip_correct/local_steps", trainable=False
            )
        self._gathers: Dict[Any, Any] = {}  # traced all-gathers of the checkpoint, one per dtype layout
        self.deltas: Optional[List[Any]] = None
        self.grad_sums: Optional[List[Any]] = None  # "gradient": G_i, the raw gradients summed this period
        if rule != "none":
            self.deltas = self._per_replica_zeros("delta")
        if rule == "gradient":
            self.grad_sums = self._per_replica_zeros("grad_sum")
        # two-level averaging with "gradient" (distribute/two_level_sync.py): S_c and β_c, per replica
        self.host_sums: Optional[List[Any]] = None
        self.host_deltas: Optional[List[Any]] = None
        if two_level and rule == "gradient":
            self.host_sums = self._per_replica_zeros("host_sum")
            self.host_deltas = self._per_replica_zeros("host_delta")
        self.residuals: Optional[List[Any]] = None  # compression: e_i, what rounding dropped (per replica)
        self.grad_residuals: Optional[List[Any]] = None  # compression + "gradient": r_i
        self.anchors: Optional[List[Any]] = None  # compression: x₀, the model after the last averaging
        if compression is not None:
            self.residuals = self._per_replica_zeros("residual")
            self.anchors = self._per_replica_zeros("anchor")
            if rule == "gradient":
                self.grad_residuals = self._per_replica_zeros("grad_residual")
            with tf.device("/CPU:0"):  # 1: take x₀ from the model at the next local step
                self.anchor_stale = resource_variable_ops.ResourceVariable(
                    tf.constant(1, tf.int64), name="skip_correct/anchor_stale", trainable=False
                )

    def _per_replica_zeros(self, what: str) -> List[Any]:
        with self._strategy.scope():
            return [
                tf.Variable(
                    tf.zeros(v.shape, v.dtype),
                    trainable=False,
                    name=f"skip_correct/{what}_{j}",
                    synchronization=tf.VariableSynchronization.ON_WRITE,
                    aggregation=tf.VariableAggregation.NONE,
                )
                for j, v in enumerate(self.variables)
            ]

    @property
    def optimizer(self) -> Any:
        return self._optimizer_ref()

    def delta_components(self) -> Optional[List[List[Any]]]:
        """deltas[j][i]: Δ of variable j on local replica i (None for correction "none")."""
        if self.deltas is None:
            return None
        return [list(d.values) for d in self.deltas]

    def restart_corrections(self) -> tf.Tensor:
        """Zero every replica's Δ (and two-level β_c): the correction starts over, estimated anew at the
        next syncs (Σ_i Δ_i stays 0). Returns a tensor to depend on."""
        rows = (self.components(self.deltas) or []) + (self.components(self.host_deltas) or [])
        ops = [c.assign(tf.zeros_like(c)) for row in rows for c in row]
        with tf.control_dependencies(ops):
            return tf.constant(0, tf.int64)

    def grad_sum_components(self) -> Optional[List[List[Any]]]:
        """grad_sums[j][i]: G of variable j on local replica i (None unless the rule is "gradient")."""
        if self.grad_sums is None:
            return None
        return [list(d.values) for d in self.grad_sums]

    @staticmethod
    def components(per_replica: Optional[List[Any]]) -> Optional[List[List[Any]]]:
        """rows[j][i]: component i (local replica) of per-replica state variable j (None stays None)."""
        return None if per_replica is None else [list(d.values) for d in per_replica]

    def delta_numpy(self) -> List[np.ndarray]:
        """Δ of every variable as a numpy array [local replicas, *shape] (eager)."""
        if self.deltas is None:
            return [
                np.zeros((len(v.values),) + tuple(v.shape), v.dtype.as_numpy_dtype) for v in self.variables
            ]
        return [np.stack([c.numpy() for c in d.values]) for d in self.deltas]

    # ---- checkpointing ----------------------------------------------------------------------------
    def _global_offset(self) -> int:
        return worker_index(self._strategy) * len(self._strategy.extended.worker_devices)

    def _stacked_all(self, per_replica: List[Any]) -> List[tf.Tensor]:
        """Δ of every variable stacked over all replicas of the cluster: [R, *shape] per variable.

        On a cluster the Δs of one dtype travel in one flat all-gather (a fixed shape, so the gather
        is traced once, not once per variable shape at every checkpoint)."""
        if num_workers(self._strategy) <= 1:
            with tf.device("/CPU:0"):
                return [tf.stack([c.read_value() for c in d.values]) for d in per_replica]
        out: List[Any] = [None] * len(per_replica)
        by_dtype: Dict[Any, List[int]] = {}
        for j, d in enumerate(per_replica):
            by_dtype.setdefault(d.dtype, []).append(j)
        n_local = len(per_replica[0].values)
        for idx in by_dtype.values():
            sizes = [int(per_replica[j].shape.num_elements()) for j in idx]
            bufs = []
            for i in range(n_local):
                comps = [per_replica[j].values[i] for j in idx]
                with tf.device(comps[0].device):
                    bufs.append(
                        tf.expand_dims(tf.concat([tf.reshape(c.read_value(), [-1]) for c in comps], 0), 0)
                    )
            rows = self._gather_fn(per_replica[idx[0]].dtype.name, tuple(sizes))(*bufs)  # [R, sum(sizes)]
            for j, piece in zip(idx, tf.split(rows, sizes, axis=1)):
                out[j] = tf.reshape(piece, [-1] + per_replica[j].shape.as_list())
        return out

    def _gather_fn(self, dtype_name: str, sizes: Tuple[int, ...]) -> Any:
        """The all-gather of one dtype's flat rows ([R, sum(sizes)]), traced once per layout: TensorFlow's
        eager ``strategy.gather`` traces a new function at every call (every backup)."""
        key = (dtype_name, sizes)
        fn = self._gathers.get(key)
        if fn is None:
            strategy = self._strategy

            def gather(*bufs: tf.Tensor) -> tf.Tensor:
                with strategy.scope():
                    return strategy.gather(_values.PerReplica(tuple(bufs)), axis=0)

            fn = self._gathers[key] = tf.function(gather, autograph=False)
        return fn

    def _serialize_to_tensors(self) -> Dict[str, Any]:
        if save_context.in_save_context():
            # SavedModel export: the exported model is the global model; resuming training exactly
            # needs a checkpoint (save_weights / tf.train.Checkpoint), which holds this state
            return {}
        ext = self._strategy.extended
        out: Dict[str, Any] = {
            "local_steps": self.local_steps.read_value(),
            "num_replicas": tf.constant(self._strategy.num_replicas_in_sync, tf.int64),
        }
        # H; with an AutoInterval also whether it was chosen and the agreed timings it was chosen from
        out.update(ext.interval_state.checkpoint_tensors())
        if ext.time_period is not None:  # period="time": x₀ and the count table
            out.update(ext.time_period.checkpoint_tensors(self))
        if self.deltas is not None:
            for j, rows in enumerate(self._stacked_all(self.deltas)):
                out["delta_%d" % j] = rows
        if self.grad_sums is not None:
            for j, rows in enumerate(self._stacked_all(self.grad_sums)):
                out["grad_sum_%d" % j] = rows
        for prefix, per_replica in self._optional_rows():
            if per_replica is not None:
                for j, rows in enumerate(self._stacked_all(per_replica)):
                    out["%s_%d" % (prefix, j)] = rows
        for j, a in enumerate(self.anchors or []):  # x₀ is the same on every replica: one copy
            out["anchor_%d" % j] = a.values[0].read_value()
        if self.anchors is not None:
            out["anchor_stale"] = self.anchor_stale.read_value()
        return out

    def _restore_from_tensors(self, restored_tensors: Dict[str, Any]) -> Any:
        if "num_replicas" not in restored_tensors:
            return tf.no_op()
        ext = self._strategy.extended
        here = self._strategy.num_replicas_in_sync
        saved = restored_tensors["num_replicas"]
        ops = []
        if isinstance(saved, tf.Tensor) and not hasattr(saved, "numpy"):  # traced (SavedModel restore fn)
            ops.append(
                tf.debugging.assert_equal(
                    tf.cast(saved, tf.int64),
                    tf.constant(here, tf.int64),
                    message=(
                        "SkipCorrectStrategy restore: the checkpoint's replica count differs from this strategy's"
                    ),
                )
            )
        elif int(saved) != here:
            raise _pass_through(
                InputError(
                    f"the checkpoint was written with {int(saved)} replicas but this SkipCorrectStrategy has {here}; "
                    "the per-replica corrections cannot be mapped",
                    where="SkipCorrectStrategy restore",
                )
            )
        ops.append(self.local_steps.assign(restored_tensors["local_steps"]))
        # a restored "auto" run keeps the H it chose (no new measurement); a checkpoint written before H
        # was chosen (or without the flag) measures again
        ops.extend(ext.interval_state.restore_ops(restored_tensors))
        if ext.time_period is not None:
            ops.extend(ext.time_period.restore_ops(self, restored_tensors))
        off = self._global_offset()
        for prefix, per_replica, hint in (
            ("delta", self.deltas, "written with correction 'none'?"),
            (
                "grad_sum",
                self.grad_sums,
                "written with another correction than 'gradient' (or 'auto' with another optimizer)?",
            ),
        ):
            for j, d in enumerate(per_replica or []):
                key = "%s_%d" % (prefix, j)
                if key not in restored_tensors:
                    raise _pass_through(
                        InputError(f"checkpoint has no {key} ({hint})", where="SkipCorrectStrategy restore")
                    )
                rows = restored_tensors[key]
                for i, c in enumerate(d.values):
                    with tf.device(c.device):
                        ops.append(c.assign(rows[off + i]))
        ops.extend(self._restore_compression(restored_tensors, off))
        ops.extend(self._restore_optional(restored_tensors, off))
        return tf.group(ops)

    def _residual_rows(self) -> List[Tuple[str, Optional[List[Any]]]]:
        return [("residual", self.residuals), ("grad_residual", self.grad_residuals)]

    def _two_level_rows(self) -> List[Tuple[str, Optional[List[Any]]]]:
        return [("host_sum", self.host_sums), ("host_delta", self.host_deltas)]

    def _optional_rows(self) -> List[Tuple[str, Optional[List[Any]]]]:
        """The per-replica state a checkpoint may lack (restored as zeros): residuals, two-level terms."""
        return self._residual_rows() + self._two_level_rows()

    @staticmethod
    def _rows_or_zeros(
        named: List[Tuple[str, Optional[List[Any]]]], restored: Dict[str, Any], off: int
    ) -> Tuple[List[Any], bool]:
        """Assign each per-replica variable its checkpoint rows, or zeros when the checkpoint has none;
        returns the ops and whether every one was in the checkpoint."""
        ops, complete = [], True
        for prefix, per_replica in named:
            for j, d in enumerate(per_replica or []):
                rows = restored.get("%s_%d" % (prefix, j))
                complete = complete and rows is not None
                for i, c in enumerate(d.values):
                    with tf.device(c.device):
                        ops.append(c.assign(rows[off + i] if rows is not None else tf.zeros_like(c)))
        return ops, complete

    def _restore_optional(self, restored: Dict[str, Any], off: int) -> List[Any]:
        """The two-level terms S_c and β_c (zeros when the checkpoint has none)."""
        return self._rows_or_zeros(self._two_level_rows(), restored, off)[0]

    def _restore_compression(self, restored: Dict[str, Any], off: int) -> List[Any]:
        """The residuals and x₀ of a compressed run. A checkpoint without them (written uncompressed)
        restores zero residuals and takes x₀ from the model at the next local step."""
        if self.anchors is None:
            return []
        ops, rows_found = self._rows_or_zeros(self._residual_rows(), restored, off)
        complete = rows_found and all("anchor_%d" % j in restored for j in range(len(self.anchors)))
        for j, a in enumerate(self.anchors):
            if "anchor_%d" % j in restored:
                for c in a.values:
                    with tf.device(c.device):
                        ops.append(c.assign(restored["anchor_%d" % j]))
        stale = restored.get("anchor_stale") if complete else None
        ops.append(self.anchor_stale.assign(stale if stale is not None else tf.constant(1, tf.int64)))
        return ops
