"""docs/deploy.md runs: its training script, fed the TFJob manifest's TF_CONFIG (the Kubeflow training
operator's format, pod addresses mapped to loopback) and the SLURM step environment its sbatch script gets
from srun (2 tasks on one node, read by SlurmClusterResolver), trains on 2 local worker processes through
TensorFlow's own multi-worker runtime; both workers end with the same global model and the expected syncs."""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from typing import Dict, List

import pytest

from tf_commopt.cluster.layout import pick_ports

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "deploy.md")
STEPS = 2 * (4000 // 64)  # 2 epochs of the 4,000 training images, global batch 64 (32 per worker per step)
# H = 4, plus the first epoch's end backup (step 62 is mid-period: it averages first); the second epoch
# ends at a sync (124 = 31·4), so its backup and evaluate find the replicas equal and send nothing
SYNCS = STEPS // 4 + 1


def _blocks() -> Dict[str, str]:
    text = open(DOC, encoding="utf-8").read()
    return dict(re.findall(r"<!-- deploy:(\S+) -->\n```\w*\n(.*?)```", text, flags=re.S))


def _free_pair() -> int:
    """A port p with p and p + 1 free (SlurmClusterResolver gives the tasks of one node consecutive ports),
    outside the ephemeral range like the launcher's (:func:`tf_commopt.cluster.layout.pick_ports`)."""
    for _ in range(200):
        p = pick_ports(1)[0]
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("localhost", p))
                b.bind(("localhost", p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


def _run_workers(argv: List[str], envs: List[Dict[str, str]], cwd: str) -> List[dict]:
    base = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
    base.update(
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=ROOT,
        OMP_NUM_THREADS="1",
        TF_NUM_INTEROP_THREADS="1",
        TF_NUM_INTRAOP_THREADS="1",
    )
    procs = [
        subprocess.Popen(
            argv, env=dict(base, **e), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for e in envs
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=600)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        assert lines, out[-4000:]
        results.append(json.loads(lines[-1]))
    return results


def _check(results: List[dict], tasks: List[str], out_dir: str) -> None:
    assert [r["task"] for r in results] == tasks
    for r in results:
        assert r["workers"] == 2 and r["interval"] == 4
        assert r["steps"] == STEPS and r["syncs"] == SYNCS, r
        assert r["test_accuracy"] > 0.8, r  # the bundled real MNIST: it learned
    # evaluate averaged first: both workers hold (and evaluate) the same global model
    assert results[0]["weights_sum"] == pytest.approx(results[1]["weights_sum"], rel=1e-6, abs=1e-5)
    assert results[0]["test_accuracy"] == results[1]["test_accuracy"]
    for t in tasks:
        assert os.path.exists(os.path.join(out_dir, "weights", t, "ckpt.index"))
    assert not os.path.exists(os.path.join(out_dir, "backup", "chief"))  # BackupAndRestore cleaned up


def test_tfjob_manifest_tf_config_runs_the_script_on_two_workers(tmp_path):
    yaml = pytest.importorskip("yaml")
    blocks = _blocks()
    script = tmp_path / "train_multihost.py"
    script.write_text(blocks["train_multihost.py"])
    job = yaml.safe_load(blocks["tfjob.yaml"])
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "TFJob"
    specs = job["spec"]["tfReplicaSpecs"]
    assert list(specs) == ["Worker"]  # workers only: worker 0 is the chief
    worker = specs["Worker"]
    container = worker["template"]["spec"]["containers"][0]
    assert container["name"] == "tensorflow"
    port = [p["containerPort"] for p in container["ports"] if p["name"] == "tfjob-port"][0]
    n = worker["replicas"]
    assert n == 2
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    # what the training operator sets in pod i
    cluster = {"worker": [f"{name}-worker-{i}.{ns}.svc:{port}" for i in range(n)]}
    operator_tf_configs = [
        {"cluster": cluster, "task": {"type": "worker", "index": i}, "environment": "cloud"} for i in range(n)
    ]
    # one machine: the pod addresses become loopback ports; everything else is the operator's TF_CONFIG
    local = {a: f"localhost:{_free_pair()}" for a in cluster["worker"]}
    envs = []
    for cfg in operator_tf_configs:
        cfg = dict(cfg, cluster={"worker": [local[a] for a in cfg["cluster"]["worker"]]})
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        env["TF_CONFIG"] = json.dumps(cfg)
        envs.append(env)
    out_dir = str(tmp_path / "out")
    args = [a.replace("/shared/skip-correct-mnist", out_dir) for a in container["args"]]
    assert container["command"][:2] == ["python", "/app/train_multihost.py"]
    results = _run_workers([sys.executable, str(script)] + args, envs, str(tmp_path))
    _check(results, ["worker-0", "worker-1"], out_dir)


def test_slurm_step_environment_runs_the_script_through_slurm_cluster_resolver(tmp_path):
    blocks = _blocks()
    script = tmp_path / "train_multihost.py"
    script.write_text(blocks["train_multihost.py"])
    sbatch = blocks["train.sbatch"]
    assert "#SBATCH --ntasks-per-node=1" in sbatch and "unset TF_CONFIG" in sbatch
    srun = [ln for ln in sbatch.splitlines() if ln.startswith("srun ")][0]
    argv = shlex.split(srun)
    argv = argv[argv.index("python") + 1 :]
    out_dir = str(tmp_path / "out")
    argv = [a.replace('"$OUT_DIR"', out_dir).replace("$OUT_DIR", out_dir) for a in argv]
    assert argv[0] == "train_multihost.py" and f"--out_dir={out_dir}" in argv, argv
    port = _free_pair()
    host = socket.gethostname()
    try:
        socket.getaddrinfo(host, port)
    except OSError:
        host = "localhost"
    # what srun sets for a 2-task step on one node (the variables SlurmClusterResolver reads, and the
    # usual company); the sbatch script exports TF_USE_LEGACY_KERAS and TF_PORT_BASE
    common = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "skip-correct-mnist",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NODELIST": host,
        "SLURM_STEP_NODELIST": host,
        "SLURM_NODELIST": host,
        "SLURM_TASKS_PER_NODE": "2",
        "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_NODEID": "0",
        "SLURMD_NODENAME": host,
        "TF_USE_LEGACY_KERAS": "1",
        "TF_PORT_BASE": str(port),
    }
    envs = [dict(common, SLURM_PROCID=str(i), SLURM_LOCALID=str(i)) for i in range(2)]
    results = _run_workers([sys.executable, str(script)] + argv[1:], envs, str(tmp_path))
    _check(results, ["worker-0", "worker-1"], out_dir)


def _slurm_env(monkeypatch, procid, nodelist, tasks_per_node, num_tasks):
    monkeypatch.setenv("PATH", "/nonexistent")  # neither scontrol nor nvidia-smi can be called
    monkeypatch.delenv("SLURM_GPUS_ON_NODE", raising=False)
    for k, v in {
        "SLURM_PROCID": str(procid),
        "SLURM_STEP_NUM_TASKS": str(num_tasks),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
    }.items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize(
    "procid,nodelist,per_node,n,workers,task",
    [
        (1, "node[01-02]", "1(x2)", 2, ["node01:8888", "node02:8888"], 1),
        (2, "gpu-a[3,7],cpu1", "2,1(x2)", 4, ["cpu1:8888", "gpu-a3:8888", "gpu-a3:8889", "gpu-a7:8888"], 2),
    ],
)
def test_cpu_slurm_resolver_reads_multi_node_steps(monkeypatch, procid, nodelist, per_node, n, workers, task):
    """The cluster our CPU resolver builds from a multi-node step: TensorFlow's addresses and packing
    (sorted hosts, port_base + local index), task = SLURM_PROCID, no GPU, no scontrol/nvidia-smi."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    from tf_commopt.distribute.slurm import CpuSlurmClusterResolver, slurm_cluster_resolver

    _slurm_env(monkeypatch, procid, nodelist, per_node, n)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "untouched")
    r = slurm_cluster_resolver()
    assert isinstance(r, CpuSlurmClusterResolver)
    assert r.cluster_spec().as_dict() == {"worker": workers}
    assert (r.task_type, r.task_id) == ("worker", task) and r.num_accelerators() == {"GPU": 0}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "untouched"
    # TensorFlow's own resolver on the same CPU step: the failure the subclass works around
    with pytest.raises(ValueError, match="must not be zero"):
        tf.distribute.cluster_resolver.SlurmClusterResolver(
            port_base=8888, gpus_per_node=0, auto_set_gpu=False
        ).cluster_spec()
    # with GPUs allocated it is TensorFlow's resolver, unchanged
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "2")
    g = slurm_cluster_resolver(port_base=9000)
    max_per_node = max(int(t.split("(")[0]) for t in per_node.split(","))
    assert type(g) is tf.distribute.cluster_resolver.SlurmClusterResolver
    assert g.num_accelerators() == {"GPU": 2 // max_per_node}


def test_slurm_resolver_bad_environment_is_one_line(monkeypatch):
    from tf_commopt.distribute.slurm import slurm_cluster_resolver
    from tf_commopt.errors import InputError

    monkeypatch.delenv("SLURM_PROCID", raising=False)
    with pytest.raises(InputError, match="inside an srun step"):
        slurm_cluster_resolver()
    _slurm_env(monkeypatch, 0, "n1", "1", 1)
    monkeypatch.setenv("TF_PORT_BASE", "http")
    with pytest.raises(InputError, match="TF_PORT_BASE must be a port number, got 'http'"):
        slurm_cluster_resolver()
