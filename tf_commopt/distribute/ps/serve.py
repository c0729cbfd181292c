"""Worker and ps tasks of a parameter-server cluster: start the TF server, serve, exit with the chief.

Example (first lines of a script that runs on every task of a TF_CONFIG cluster with ps tasks)::

    from tf_commopt.distribute.ps import serve_unless_chief
    tfc = serve_unless_chief()      # worker / ps: serve here, exit 0 when the chief is gone; chief: go on

TensorFlow's own parameter-server tasks call ``server.join()`` and never end, so a launcher that waits
for its workers would wait for ever; ``serve`` watches the chief's port instead and exits 0 once the
chief, seen up before, stops answering.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Optional

from tf_commopt import use_tf_keras
from tf_commopt.core.tfconfig import TFConfig, tf_config_from_env
from tf_commopt.distribute.ps.probe import reachable
from tf_commopt.errors import InputError

__all__ = ["serve", "serve_unless_chief"]

_CHIEF_GONE_POLLS = 4


def serve(
    tf_config: Optional[TFConfig] = None,
    exit_with_chief: bool = True,
    poll_s: float = 0.5,
    chief_start_timeout_s: float = 600.0,
) -> None:
    """Start this task's ``tf.distribute.Server`` and serve (worker and ps tasks). Does not return.

    Example:
        >>> serve()   # doctest: +SKIP  (on a worker or ps task: blocks until the chief is gone)

    With ``exit_with_chief`` the process watches the chief's port: once the chief has been seen and then
    stops answering, the task exits 0 (so a launcher that waits for every worker sees a clean end);
    if the chief never shows up within ``chief_start_timeout_s`` it exits 1 with one line on stderr.
    Without it, it blocks in ``server.join()`` as TensorFlow's own parameter-server tasks do.
    """
    tfc = tf_config or tf_config_from_env()
    if tfc is None:
        raise InputError(
            "TF_CONFIG is not set: serve() runs a worker or ps task of a cluster", where="TF_CONFIG"
        )
    if tfc.task_type not in ("worker", "ps"):
        raise InputError(
            f"serve() is for worker and ps tasks, this task is {tfc.task_type}", where="TF_CONFIG"
        )
    use_tf_keras()
    import tensorflow as tf

    spec = tf.train.ClusterSpec(tfc.cluster)
    server = tf.distribute.Server(
        spec, job_name=tfc.task_type, task_index=tfc.task_index, protocol=tfc.rpc_layer or "grpc", start=True
    )
    print(f"tf_commopt: {tfc.task_type}:{tfc.task_index} serving at {tfc.address}", flush=True)
    chief = (tfc.cluster.get("chief") or [None])[0]
    if not exit_with_chief or chief is None:
        server.join()
        return
    seen, gone, start = False, 0, time.monotonic()
    while True:
        time.sleep(poll_s)
        up = reachable(chief)
        if up:
            seen, gone = True, 0
        elif seen:
            gone += 1
            if gone >= _CHIEF_GONE_POLLS:
                print(
                    f"tf_commopt: {tfc.task_type}:{tfc.task_index}: chief {chief} is gone; exiting",
                    flush=True,
                )
                sys.stdout.flush()
                os._exit(0)  # the gRPC server cannot be stopped cleanly in-process
        elif time.monotonic() - start > chief_start_timeout_s:
            sys.stderr.write(
                f"tf_commopt: {tfc.task_type}:{tfc.task_index}: chief {chief} did not start within "
                f"{chief_start_timeout_s:g} s\n"
            )
            sys.stderr.flush()
            os._exit(1)


def serve_unless_chief(tf_config: Optional[TFConfig] = None) -> Optional[TFConfig]:
    """On a worker or ps task: ``serve()`` (never returns). On the chief: return its TFConfig.

    Example:
        >>> tfc = serve_unless_chief()   # doctest: +SKIP
    """
    tfc = tf_config or tf_config_from_env()
    if tfc is None:
        raise InputError("TF_CONFIG is not set: a parameter-server cluster needs one", where="TF_CONFIG")
    if not tfc.num_ps or not tfc.has_chief:
        raise InputError("a parameter-server cluster needs 'ps' tasks and a 'chief' task", where="TF_CONFIG")
    if tfc.task_type in ("worker", "ps"):
        serve(tfc)
    if tfc.task_type != "chief":
        raise InputError(
            f"task type {tfc.task_type!r} has no role in parameter-server training", where="TF_CONFIG"
        )
    return tfc
