"""Run one grouped hybrid iteration's instruction streams on the groups' pipelines.

Example:
    >>> ex = ProgramExecutor(program, pipelines, index, bucket_vars)     # doctest: +SKIP
    >>> sums, executed = ex.run(runs)                                     # doctest: +SKIP

The streams of :func:`tf_commopt.core.schedule.hybrid.hybrid_program` are issued in one global order
(:func:`tf_commopt.core.schedule.order.execution_order`). ``Forward`` / ``Backward`` run on the group's
:class:`~tf_commopt.distribute.pipeline.MiniBatchRun`; a piece rank's ``Backward`` is a part of its
stage's last backward, which the stage rank runs as one gradient call. Each ``AllReduce("grads<i>")``
sums bucket i's gradients over the groups as one fused vector (concatenated, summed, split back):
every holder adds all groups' vectors in group order on its own device (bit-identical copies). Its
ops depend only on that bucket's gradients, so TensorFlow starts them while other gradients are still
being computed. ``OptimizerStep`` belongs to the caller.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from tf_commopt import use_tf_keras

use_tf_keras()  # before TensorFlow loads: tf.keras is tf-keras
import tensorflow as tf

from tf_commopt.core.schedule import AllReduce, OptimizerStep, execution_order
from tf_commopt.core.schedule.hybrid import HybridProgram

__all__ = ["ProgramExecutor"]


class ProgramExecutor:
    """The program of one iteration bound to the groups' pipelines.

    Args:
        program: the hybrid program.
        pipelines: one :class:`~tf_commopt.distribute.pipeline.Pipeline` per group this process runs.
        index: per group, for each of the pipeline's trainable variables its index in the user's model.
        bucket_vars: bucket key -> model variable indices (:func:`program.bucket_variables`).
        exclusive: run each device's instructions one after another (control dependencies), as a GPU
            stream does; otherwise only data dependencies order them.
    """

    def __init__(
        self,
        program: HybridProgram,
        pipelines: Sequence[Any],
        index: Sequence[Sequence[int]],
        bucket_vars: Dict[str, List[int]],
        exclusive: bool = False,
    ):
        self.program, self.pipelines, self.index = program, list(pipelines), [list(i) for i in index]
        self.bucket_vars, self.exclusive = bucket_vars, bool(exclusive)
        self.order = execution_order(program.schedule)

    def run(self, runs: Sequence[Any]) -> Tuple[Dict[int, List[tf.Tensor]], List[Tuple[int, Any]]]:
        """Issue every instruction on ``runs`` (one MiniBatchRun per group); returns the reduced gradients
        (model variable index -> one tensor per group) and the instructions in the order issued."""
        sums: Dict[int, List[tf.Tensor]] = {}
        done: Dict[str, Any] = {}
        executed = []
        for r, ins in self.order:
            role = self.program.roles[r]
            g, s = role.group, role.stage
            executed.append((r, ins))
            if isinstance(ins, AllReduce):
                if ins.key not in self._reduced_keys(sums):
                    sums.update(self._all_reduce_bucket(ins.key, runs))
            elif isinstance(ins, OptimizerStep) or role.piece > 0:
                continue  # the caller steps; a piece is a part of its stage's last backward
            elif self.exclusive and not tf.executing_eagerly():
                self._execute_exclusive(runs[g], s, ins, self.pipelines[g].layout.devices[s], done)
            else:
                runs[g].execute(s, ins)
        return sums, executed

    def _reduced_keys(self, sums: Dict[int, List[tf.Tensor]]) -> set:
        return {key for key, ks in self.bucket_vars.items() if ks and all(k in sums for k in ks)}

    def _all_reduce_bucket(self, key: str, runs: Sequence[Any]) -> Dict[int, List[tf.Tensor]]:
        """Bucket ``key`` as one fused all-reduce (see the module docstring)."""
        ks = self.bucket_vars[key]
        if not ks:
            return {}
        flats, holders = [], []
        for g, (pipe, run) in enumerate(zip(self.pipelines, runs)):
            vs = [pipe.trainable_variables[self.index[g].index(k)] for k in ks]
            holders.append(vs)
            parts = [run.acc.get(v.ref()) for v in vs]
            parts = [p if p is not None else tf.zeros_like(v) for p, v in zip(parts, vs)]
            with tf.device(vs[0].device):
                flats.append(tf.concat([tf.reshape(p, [-1]) for p in parts], 0))
        out: Dict[int, List[tf.Tensor]] = {k: [] for k in ks}
        for vs in holders:
            with tf.device(vs[0].device):
                fl = [tf.identity(f) for f in flats]
                tot = tf.add_n(fl) if len(fl) > 1 else fl[0]
                pieces = tf.split(tot, [int(v.shape.num_elements()) for v in vs])
                for k, v, piece in zip(ks, vs, pieces):
                    out[k].append(tf.reshape(piece, v.shape))
        return out

    @staticmethod
    def _execute_exclusive(run: Any, s: int, ins: Any, device: str, done: Dict[str, Any]) -> None:
        """``run.execute(s, ins)`` after everything the device did before (see ``exclusive``)."""
        graph = tf.compat.v1.get_default_graph()
        before = len(graph.get_operations())
        with tf.control_dependencies([done[device]] if device in done else []):
            run.execute(s, ins)
        new = graph.get_operations()[before:]
        if new:
            done[device] = tf.group(*new)
