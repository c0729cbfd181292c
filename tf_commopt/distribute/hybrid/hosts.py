"""Host discovery for the grouped hybrid: one group per TF_CONFIG worker host, and the collectives
between the hosts (weights broadcast from host 0, group throughputs exchanged, gradients summed).

Example:
    >>> from tf_commopt.distribute.hybrid.hosts import groups_from_tf_config
    >>> groups_from_tf_config('{"cluster": {"worker": ["h0:1", "h1:1"]}, "task": {"type": "worker", "index": 1}}')
    (['h0:1', 'h1:1'], 1)
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple

from tf_commopt import use_tf_keras

use_tf_keras()  # before TensorFlow loads: tf.keras is tf-keras
import tensorflow as tf

from tf_commopt.core.tfconfig import parse_tf_config
from tf_commopt.errors import InputError

__all__ = ["groups_from_tf_config", "local_devices", "Hosts", "discover_hosts"]


def groups_from_tf_config(tf_config: Optional[str] = None) -> Tuple[List[str], int]:
    """(worker host addresses, this task's index) from TF_CONFIG (default: the environment's)."""
    text = tf_config if tf_config is not None else os.environ.get("TF_CONFIG", "")
    cfg = parse_tf_config(text)  # one-line InputError: bad JSON, index out of range, duplicate addresses...
    workers = list(cfg.cluster.get("worker", []))
    index = cfg.task_index if cfg.task_type == "worker" else -1
    if not workers:
        raise InputError("cluster.worker is empty", where="TF_CONFIG")
    return workers, index


def local_devices(task: Optional[int]) -> List[str]:
    """This process's logical GPUs, else CPUs (with TF_CONFIG the remote devices are listed too)."""
    out = []
    for kind in ("GPU", "CPU"):
        for d in tf.config.list_logical_devices(kind):
            spec = tf.DeviceSpec.from_string(d.name)
            if task is None or spec.task is None or spec.task == task:
                out.append(f"/{kind}:{spec.device_index}")
        if out:
            return out
    return out


class Hosts:
    """This process's place among the worker hosts, and one collective sum per exchange between them.

    Creating it starts this host's server and the collective runtime (a
    ``tf.distribute.MultiWorkerMirroredStrategy``): create it before any other TensorFlow op.
    """

    _made = 0

    def __init__(self, hosts: Sequence[str], task: int):
        self.hosts, self.task = list(hosts), int(task)
        self._mw = tf.distribute.MultiWorkerMirroredStrategy()
        Hosts._made += 1  # the same sequence on every host: the same keys
        self._group_key = 7_000_000 + 1_000 * Hosts._made

    def __len__(self) -> int:
        return len(self.hosts)

    def collective_sum(self, flat: tf.Tensor, instance: int) -> tf.Tensor:
        """Sum of ``flat`` over all hosts (one CollectiveReduceV2 on this host's first CPU)."""
        with tf.device("/CPU:0"):
            return tf.raw_ops.CollectiveReduceV2(
                input=tf.identity(flat),
                group_size=len(self.hosts),
                group_key=self._group_key,
                instance_key=self._group_key + instance,
                ordering_token=[],
                merge_op="Add",
                final_op="Id",
            )

    def broadcast_weights(self, model: Any) -> None:
        """Every host starts from host 0's weights (sum of host 0's values and zeros elsewhere: exact)."""
        ws = model.weights
        flat = tf.concat([tf.reshape(tf.cast(w, tf.float32), [-1]) for w in ws], 0)
        got = tf.function(lambda f: self.collective_sum(f, 1))(flat * (1.0 if self.task == 0 else 0.0))
        off = 0
        for w in ws:
            n = int(tf.size(w))
            w.assign(tf.cast(tf.reshape(got[off : off + n], w.shape), w.dtype))
            off += n

    def exchange(self, local: float) -> List[float]:
        """Every host's ``local`` value (e.g. its group's throughput), in host order."""
        vec = [0.0] * len(self.hosts)
        vec[self.task] = float(local)
        return [float(v) for v in tf.function(lambda f: self.collective_sum(f, 2))(tf.constant(vec)).numpy()]

    def all_reduce(
        self, loss: tf.Tensor, grads: List[tf.Tensor], variables: Sequence[tf.Variable]
    ) -> Tuple[tf.Tensor, List[tf.Tensor]]:
        """Sum this host's gradients (and loss) with the other hosts' in one collective."""
        with tf.device("/CPU:0"):
            flat = tf.concat([tf.reshape(t, [-1]) for t in grads] + [tf.reshape(loss, [1])], 0)
        tot = self.collective_sum(flat, 3)
        out, off = [], 0
        for t, v in zip(grads, variables):
            n = t.shape.num_elements()
            with tf.device(v.device):
                out.append(tf.reshape(tot[off : off + n], t.shape))
            off += n
        return tot[off], out


def discover_hosts(
    tf_config: Optional[bool], groups: Optional[Sequence[Sequence[int]]], num_groups: Optional[int]
) -> Optional[Hosts]:
    """The worker hosts when running one group per host (``tf_config``; default: TF_CONFIG lists more
    than one worker), else None. One-line InputError if this task is not a worker or groups are given."""
    if tf_config is None:  # like TensorFlow's own strategies: a multi-worker TF_CONFIG means multi-host
        tf_config = bool(os.environ.get("TF_CONFIG")) and len(groups_from_tf_config()[0]) > 1
    if not tf_config:
        return None
    hosts, task = groups_from_tf_config()
    if task < 0:
        raise InputError("this task is not a worker; every worker host runs one group", where="TF_CONFIG")
    if groups is not None or num_groups not in (None, len(hosts)):
        raise InputError(
            f"with TF_CONFIG there is one group per worker host ({len(hosts)}); do not pass groups/num_groups",
            where="GroupedHybridTrainer",
        )
    return Hosts(hosts, task)
