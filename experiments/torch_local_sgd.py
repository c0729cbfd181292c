"""PyTorch's local SGD (``PeriodicModelAverager``) and synchronous SGD (DDP-style gradient all-reduce) on
the runner's testbed, as the outside reference of ``experiments.sc_speed_bench`` (variant ``torch_local``).

Run on every task of a local ``tf_commopt.cluster`` cluster, like the runner: rank, world size and the
rendezvous address come from ``TF_CONFIG`` (worker 0's address), gloo carries the collectives over the
same shaped links. The data are the runner's (the bundled MNIST, element i to shard i mod N, shuffled
with the seed), the model the runner's ``mlp`` or ``big_mlp`` in torch (same layer sizes, tf-keras's
initialisers: Glorot-uniform kernels, zero biases), plain SGD on the mean loss of each worker's batch.

The record (one JSON line on worker 0) times what the quoted PyTorch figures timed: from a barrier after
the process group is up to a barrier after the last step, evaluation excluded (local SGD averages once
more after the last step, as the runner does, so that every worker ends with one model); ``local_s`` is
the local steps' share, ``comm_s`` the averagings' (or all-reduces') share. PyTorch is not a dependency
of tf_commopt: ``pip install torch`` first (the CPU build).

Example (4 workers on one shared 100 Mbit/s segment, H = 16):
    python -m tf_commopt.cluster --workers 4 --bandwidth-mbit 100 --topology shared -- \\
        python -m experiments.torch_local_sgd --model=mlp --steps=300 --interval=16
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from experiments import _cli

__all__ = ["main", "build_mlp", "shard_batches", "WIDTHS"]

WIDTHS = {"mlp": [784, 128, 10], "big_mlp": [784, 2048, 2048, 2048, 10]}  # experiments.models' layer sizes


def define(fv: Any) -> None:
    from absl import flags

    d = dict(flag_values=fv)
    flags.DEFINE_string("model", "mlp", "mlp (784-128-10) or big_mlp (784-3x2048-10)", **d)
    flags.DEFINE_integer("steps", 300, "training steps", **d)
    flags.DEFINE_integer("batch_size", 128, "global batch (split evenly over the workers)", **d)
    flags.DEFINE_float("learning_rate", 0.05, "plain SGD learning rate", **d)
    flags.DEFINE_integer(
        "interval", 16, "local SGD: average every H steps; 0: synchronous SGD", lower_bound=0, **d
    )
    flags.DEFINE_integer("seed", 0, "data shuffle and initialisation seed", **d)


def build_mlp(torch: Any, model: str, seed: int) -> Any:
    """The runner's ``mlp`` / ``big_mlp`` in torch, with tf-keras's initialisers (Glorot-uniform, zero bias)."""
    widths = WIDTHS[model]
    torch.manual_seed(seed)
    layers: List[Any] = [torch.nn.Flatten()]
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        lin = torch.nn.Linear(a, b)
        torch.nn.init.xavier_uniform_(lin.weight)
        torch.nn.init.zeros_(lin.bias)
        layers += [lin] + ([torch.nn.ReLU()] if i < len(widths) - 2 else [])
    return torch.nn.Sequential(*layers)


def shard_batches(n: int, rank: int, world: int, per_rank: int, steps: int, seed: int) -> np.ndarray:
    """Indices of this rank's ``steps`` batches: element i belongs to shard i mod world, each shard
    shuffled (seeded) once per pass over it.

    >>> b = shard_batches(10, rank=1, world=2, per_rank=2, steps=3, seed=0)
    >>> b.shape, sorted(set(b.ravel().tolist())) <= [1, 3, 5, 7, 9]
    ((3, 2), True)
    """
    mine = np.arange(rank, n, world)
    rng = np.random.default_rng(seed + rank)
    need = steps * per_rank
    passes = -(-need // len(mine))  # enough shuffled passes over the shard for every batch
    return np.concatenate([rng.permutation(mine) for _ in range(passes)])[:need].reshape(steps, per_rank)


def _rendezvous() -> Tuple[int, int, str, int, str]:
    """(rank, world size, worker 0's host and port, this worker's own address) from TF_CONFIG."""
    cfg = json.loads(os.environ.get("TF_CONFIG") or "{}")
    workers = cfg.get("cluster", {}).get("worker")
    task = cfg.get("task", {})
    if not workers or task.get("type") != "worker":
        _cli.fail("run this on every worker of a tf_commopt.cluster cluster (TF_CONFIG names the workers)")
    rank = int(task["index"])
    host, port = workers[0].rsplit(":", 1)
    return rank, len(workers), host, int(port), workers[rank].rsplit(":", 1)[0]


def _interface(address: str) -> str:
    """The network interface holding ``address`` (gloo must send on the task's own, shaped link)."""
    import subprocess

    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3].split("/")[0] == address:
            return fields[1]
    return "lo" if address.startswith("127.") else ""


def _train(torch: Any, fv: Any, rank: int, world: int) -> Dict[str, Any]:
    from tf_commopt.datasets import load_dataset

    dist = torch.distributed
    data = load_dataset("mnist", seed=fv.seed)
    x = torch.from_numpy(data.x_train.reshape(len(data.x_train), -1))
    y = torch.from_numpy(data.y_train.astype(np.int64))
    per_rank = fv.batch_size // world
    batches = shard_batches(len(x), rank, world, per_rank, fv.steps, fv.seed)
    model = build_mlp(torch, fv.model, fv.seed)
    opt = torch.optim.SGD(model.parameters(), lr=fv.learning_rate)
    params = list(model.parameters())
    averager = None
    if fv.interval > 0:
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        from torch.distributed.algorithms.model_averaging.utils import average_parameters

        averager = PeriodicModelAverager(period=fv.interval, warmup_steps=0)
    comm = 0.0
    dist.barrier()
    t0 = time.perf_counter()
    for step in range(fv.steps):
        idx = torch.from_numpy(batches[step])
        # the mean over this rank's batch: a local step is a step of SGD on it, and the all-reduced
        # mean of these gradients is the gradient of the mean over the global batch
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if averager is None:
            tc = time.perf_counter()
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat)
            flat /= world
            for p, g in zip(params, flat.split([p.numel() for p in params])):
                p.grad.copy_(g.view_as(p))
            comm += time.perf_counter() - tc
            opt.step()
        else:
            opt.step()
            tc = time.perf_counter()
            averager.average_parameters(params)
            comm += time.perf_counter() - tc
    if averager is not None and (fv.steps - 1) % fv.interval:
        tc = time.perf_counter()  # one model at the end, as the runner's: average the last local steps
        average_parameters(params, dist.group.WORLD)
        comm += time.perf_counter() - tc
    dist.barrier()
    wall = time.perf_counter() - t0
    return _record(torch, model, data, fv, world, wall, comm)


def _record(
    torch: Any, model: Any, data: Any, fv: Any, world: int, wall: float, comm: float
) -> Dict[str, Any]:
    with torch.no_grad():
        logits = model(torch.from_numpy(data.x_test.reshape(len(data.x_test), -1)))
        acc = float((logits.argmax(1).numpy() == data.y_test).mean())
    h = fv.interval
    return {
        "framework": f"torch {torch.__version__}",
        "strategy": "torch_local_sgd" if h > 0 else "torch_ssgd",
        "model": fv.model,
        "workers": world,
        "steps": fv.steps,
        "interval": h or None,
        # PeriodicModelAverager averages after steps 0, H, 2H, ... (its counter starts at 0); then one
        # more average at the end unless the last step was one
        "syncs": len(range(0, fv.steps, h)) + bool((fv.steps - 1) % h) if h > 0 else fv.steps,
        "wall_s": round(wall, 3),
        "comm_s": round(comm, 3),
        "local_s": round(wall - comm, 3),
        "test_accuracy": round(acc, 4),
        "threads": torch.get_num_threads(),
    }


def _body(fv: Any) -> int:
    if fv.model not in WIDTHS:
        _cli.fail(f"--model={fv.model!r}: the PyTorch reference has {', '.join(WIDTHS)}")
    for name in ("steps", "batch_size"):
        if getattr(fv, name) < 1:
            _cli.fail(f"--{name}: must be >= 1, got {getattr(fv, name)}")
    rank, world, host, port, own = _rendezvous()
    if fv.batch_size % world:
        _cli.fail(f"--batch_size={fv.batch_size} does not split evenly over {world} workers")
    try:
        import torch
    except ImportError:
        _cli.fail("the PyTorch reference needs torch: pip install torch (the CPU build)")
    ifname = _interface(own)
    if ifname:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", ifname)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://{host}:{port}", rank=rank, world_size=world
    )
    try:
        rec = _train(torch, fv, rank, world)
    finally:
        torch.distributed.destroy_process_group()
    if rank == 0:
        print(json.dumps(rec), flush=True)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m experiments.torch_local_sgd`` in process; returns the exit code."""
    return _cli.main("experiments.torch_local_sgd", argv, define, _body)


if __name__ == "__main__":
    sys.exit(main())
