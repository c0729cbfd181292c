"""A SLURM cluster resolver that also works on nodes without GPUs.

TensorFlow 2.21's ``SlurmClusterResolver`` pairs each task of a node with a GPU offset
(``zip(range(tasks), range(0, gpus_per_node, gpus_per_task))``): with ``gpus_per_node=0`` it fails
(``range() arg 3 must not be zero``) or yields no task at all, and without ``gpus_per_node`` it calls
``nvidia-smi``. :func:`slurm_cluster_resolver` returns TensorFlow's resolver when the step has GPUs and
:class:`CpuSlurmClusterResolver` otherwise: the same cluster (one worker per task, ``node:port_base +
local index``, tasks packed in sorted-host order), no GPU, CUDA_VISIBLE_DEVICES untouched. Neither
calls ``scontrol``: the node list is expanded in Python.

Example:
    >>> from tf_commopt.distribute.slurm import slurm_cluster_resolver          # doctest: +SKIP
    >>> strategy = SkipCorrectStrategy(cluster_resolver=slurm_cluster_resolver())  # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

import tensorflow as tf

from tf_commopt._compat import slurm_cluster_resolver as _scr
from tf_commopt.errors import InputError

__all__ = ["slurm_cluster_resolver", "CpuSlurmClusterResolver"]

_Slurm = _scr.SlurmClusterResolver  # private attributes used: see INTERNALS in tf_commopt/_compat/_gate.py


class CpuSlurmClusterResolver(_Slurm):
    """``SlurmClusterResolver`` for a step without GPUs (reads the same ``SLURM_*`` variables).

    Example:
        >>> r = CpuSlurmClusterResolver(port_base=8888)   # doctest: +SKIP  (inside an srun step)
        >>> r.cluster_spec().as_dict()                    # doctest: +SKIP
        {'worker': ['node01:8888', 'node02:8888']}
    """

    def __init__(
        self,
        jobs: Optional[Dict[str, int]] = None,
        port_base: int = 8888,
        tasks_per_node: Any = None,
        rpc_layer: str = "grpc",
    ):
        super().__init__(
            jobs=jobs,
            port_base=port_base,
            gpus_per_node=0,
            gpus_per_task=0,
            tasks_per_node=tasks_per_node,
            auto_set_gpu=False,
            rpc_layer=rpc_layer,
        )

    def cluster_spec(self) -> tf.train.ClusterSpec:
        # TensorFlow's packing, with one (unused) "GPU slot" per task so every task gets its address
        per_node = max(self._task_configuration.values())
        self._gpus_per_node, self._gpus_per_task = per_node, 1
        try:
            return super().cluster_spec()
        finally:
            self._gpus_per_node, self._gpus_per_task = 0, 0

    def num_accelerators(
        self, task_type: Any = None, task_id: Any = None, config_proto: Any = None
    ) -> Dict[str, int]:
        return {"GPU": 0}


def slurm_cluster_resolver(port_base: Optional[int] = None, gpus_per_node: Optional[int] = None) -> Any:
    """The cluster resolver of the current SLURM step (one TensorFlow worker per task).

    Args:
        port_base: first port of each node's tasks (task j of a node listens on port_base + j); default
            ``TF_PORT_BASE`` from the environment, else 8888.
        gpus_per_node: GPUs per node; default ``SLURM_GPUS_ON_NODE`` (set by SLURM when GPUs were
            requested), else 0 (a CPU step: :class:`CpuSlurmClusterResolver`).

    Raises:
        InputError: not inside a SLURM step (no ``SLURM_PROCID``), or a bad ``TF_PORT_BASE``.
    """
    if "SLURM_PROCID" not in os.environ:
        raise InputError(
            "no SLURM_PROCID in the environment: run this inside an srun step", where="slurm_cluster_resolver"
        )
    if port_base is None:
        text = os.environ.get("TF_PORT_BASE", "8888")
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise InputError(
                f"TF_PORT_BASE must be a port number, got {text!r}", where="slurm_cluster_resolver"
            )
        port_base = int(text)
    if gpus_per_node is None:
        text = os.environ.get("SLURM_GPUS_ON_NODE", "0")
        gpus_per_node = int(text) if text.isdigit() else 0
    if gpus_per_node > 0:
        return _Slurm(port_base=port_base, gpus_per_node=gpus_per_node)
    return CpuSlurmClusterResolver(port_base=port_base)
