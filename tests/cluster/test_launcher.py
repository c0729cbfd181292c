"""The local cluster launcher: TF_CONFIG per task, prefixed output, first failure, no orphans, shaping.

No TensorFlow here: the tasks are small Python scripts, so each test takes about a second.
"""

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from tf_commopt.cluster import ClusterResult, live_processes, run_cluster
from tf_commopt.errors import ClusterError, InputError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
IS_ROOT = os.geteuid() == 0
HAVE_NET = IS_ROOT and shutil.which("ip") and shutil.which("tc")


def _procs_with(token: str):
    """PIDs and command lines of live processes whose command line contains ``token``."""
    return live_processes(token)


def _script(body: str) -> list:
    return [PY, "-c", textwrap.dedent(body)]


# a task that starts a grandchild (a separate process) and sleeps; the token marks both
SLEEPER = """
import subprocess, sys, time, os, json
token = sys.argv[1]
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", token])
print("ready", json.loads(os.environ["TF_CONFIG"])["task"]["index"], flush=True)
time.sleep(300)
"""


def test_tf_config_prefix_and_ps_stopped_when_workers_finish():
    token = uuid.uuid4().hex
    body = """
    import json, os, sys, time
    c = json.loads(os.environ["TF_CONFIG"])
    t = c["task"]
    print("cluster", json.dumps(c["cluster"], sort_keys=True))
    print("me", t["type"], t["index"])
    sys.stderr.write("to stderr\\n")
    if t["type"] == "ps":
        time.sleep(300)   # parameter servers never finish by themselves
    time.sleep(1.0)       # let the ps print before the cluster ends
    """
    buf = io.StringIO()
    r = run_cluster(_script(body) + [token], workers=2, ps=1, chief=True, stream=buf, timeout=60)
    assert isinstance(r, ClusterResult)
    assert r.returncode == 0 and r.failed_task is None, r.message
    assert sorted(r.outputs) == ["chief:0", "ps:0", "worker:0", "worker:1"]
    clusters = {
        json.dumps(json.loads(lines[0].split(" ", 1)[1]), sort_keys=True) for lines in r.outputs.values()
    }
    assert len(clusters) == 1  # everybody sees the same cluster
    cluster = json.loads(clusters.pop())
    assert {k: len(v) for k, v in cluster.items()} == {"chief": 1, "worker": 2, "ps": 1}
    addrs = [a for v in cluster.values() for a in v]
    assert len(set(addrs)) == 4 and all(a.startswith("127.0.0.1:") for a in addrs)
    for name, lines in r.outputs.items():
        ttype, idx = name.split(":")
        assert lines[1] == f"me {ttype} {idx}"
        assert "to stderr" in lines  # stderr is captured too
        assert r.tf_configs[name]["task"] == {"type": ttype, "index": int(idx)}
    echoed = buf.getvalue().splitlines()
    assert "[worker:1] me worker 1" in echoed and "[ps:0] to stderr" in echoed
    assert all(line.startswith(("[chief:0] ", "[worker:0] ", "[worker:1] ", "[ps:0] ")) for line in echoed)
    assert r.wall_s < 30  # the sleeping ps did not hold the cluster up
    assert _procs_with(token) == []


def test_first_failure_exit_code_last_lines_and_no_orphans():
    token = uuid.uuid4().hex
    body = """
    import json, os, subprocess, sys, time
    token = sys.argv[1]
    i = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    if i == 1:
        for k in range(30):
            print("line", k)
        sys.exit(7)
    if i == 2:
        time.sleep(3)
        sys.exit(3)                  # fails too, but later: not the first failure
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", token])
    time.sleep(300)
    """
    t0 = time.monotonic()
    r = run_cluster(_script(body) + [token], workers=3, echo=False, timeout=120)
    assert r.returncode == 7 and r.failed_task == "worker:1"
    assert "worker:1" in r.message and "7" in r.message
    assert r.last_lines("worker:1", 5) == [f"line {k}" for k in range(25, 30)]
    assert time.monotonic() - t0 < 20  # failed fast: did not wait for the sleepers
    assert _procs_with(token) == []  # workers and their children are gone


def test_cli_shows_failing_task_last_lines():
    body = "import sys\nfor k in range(40): print('out', k)\nsys.exit(5)"
    p = subprocess.run(
        [PY, "-m", "tf_commopt.cluster", "--workers", "1", "--", PY, "-c", body],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 5
    assert "[worker:0] out 0" in p.stdout.splitlines()  # live, prefixed
    err = p.stderr.splitlines()
    assert "task worker:0 failed with exit code 5" in err[0]
    assert err[-1] == "[worker:0] out 39" and "[worker:0] out 20" in err and "[worker:0] out 19" not in err


def test_timeout_kills_every_process():
    token = uuid.uuid4().hex
    r = run_cluster(_script(SLEEPER) + [token], workers=2, timeout=2, echo=False)
    assert r.timed_out and r.returncode == 124
    assert "timeout" in r.message
    assert [line.split()[0] for line in r.outputs["worker:0"]] == ["ready"]
    assert _procs_with(token) == []


def _start_cli(args, token):
    p = subprocess.Popen(
        [PY, "-m", "tf_commopt.cluster"] + args + ["--", PY, "-c", SLEEPER, token],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ready = 0
    deadline = time.monotonic() + 60
    while ready < 2 and time.monotonic() < deadline:  # wait for both tasks (and their grandchildren)
        line = p.stdout.readline()
        ready += "ready" in line
    assert ready == 2
    return p


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_to_launcher_kills_every_process(sig, code):
    token = uuid.uuid4().hex
    p = _start_cli(["--workers", "2"], token)
    assert len(_procs_with(token)) >= 4  # 2 tasks + 2 grandchildren (+ launcher)
    p.send_signal(sig)
    p.communicate(timeout=30)
    assert p.returncode == code
    assert _procs_with(token) == []


@pytest.mark.skipif(not HAVE_NET, reason="needs root, ip and tc")
@pytest.mark.parametrize("topology", ["switch", "shared"])
def test_sigterm_removes_namespaces(topology):
    token = uuid.uuid4().hex
    p = _start_cli(["--workers", "2", "--bandwidth-mbit", "100", "--topology", topology], token)
    mine = [n for n in _netns() if n.startswith(f"tfco{p.pid}-")]
    assert len(mine) == (3 if topology == "switch" else 1)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    assert p.returncode == 143
    assert _procs_with(token) == []
    assert [n for n in _netns() if n.startswith(f"tfco{p.pid}-")] == []


@pytest.mark.skipif(not HAVE_NET, reason="needs root, ip and tc")
def test_namespaces_of_a_killed_launcher_are_reaped_by_the_next():
    dead = subprocess.Popen(["true"])
    dead.wait()  # its PID now belongs to no process: a SIGKILLed launcher
    stale = f"tfco{dead.pid}-1-sw"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        r = run_cluster([PY, "-c", "pass"], workers=1, bandwidth_mbit=100, echo=False, timeout=60)
        assert r.returncode == 0
        assert stale not in _netns()
    finally:
        subprocess.run(["ip", "netns", "del", stale], stderr=subprocess.DEVNULL)


def _netns():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


# pairs of tasks: task 2k+1 sends N bytes to task 2k, all pairs at once (the senders connect, then wait
# for each other at a barrier of files in argv[2], so that a slow process start does not stagger the flows);
# receivers report their rate
PAIR_FLOW = """
import json, os, socket, sys, time
c = json.loads(os.environ["TF_CONFIG"]); i = c["task"]["index"]; addrs = c["cluster"]["worker"]
N = int(sys.argv[1])
host, port = addrs[i - i % 2].rsplit(":", 1)
if i % 2 == 0:
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", int(port))); srv.listen(1)
    conn, _ = srv.accept(); got = 0; t = None
    while got < N:
        b = conn.recv(1 << 16)
        if not b: break
        t = t or time.time(); got += len(b)
    end = time.time()
    print("rx_mbit", round(got * 8 / 1e6 / (end - t), 2), "host", addrs[i].rsplit(":", 1)[0], "span", t, end)
else:
    for _ in range(200):
        try:
            s = socket.create_connection((host, int(port))); break
        except OSError:
            time.sleep(0.02)
    open(os.path.join(sys.argv[2], f"ready-{i}"), "w").close()
    while len(os.listdir(sys.argv[2])) < len(addrs) // 2:
        time.sleep(0.002)
    s.sendall(b"x" * N); s.close()
    print("sent", N)
"""


@pytest.mark.skipif(not HAVE_NET, reason="needs root, ip and tc")
def test_shaping_switch_is_per_link_shared_is_one_segment(tmp_path):
    """Two flows between disjoint pairs (1->0, 3->2): a switch carries more than one cap's worth in all
    (each flow has its own link), a shared segment at most the cap; no flow beats the cap."""
    cap, nbytes = 40.0, 3_000_000
    rates, total = {}, {}
    for topology in ("switch", "shared"):
        barrier = tmp_path / topology
        barrier.mkdir()
        r = run_cluster(
            [PY, "-c", PAIR_FLOW, str(nbytes), str(barrier)],
            workers=4,
            bandwidth_mbit=cap,
            topology=topology,
            echo=False,
            timeout=60,
        )
        assert r.returncode == 0, r.message + "\n" + "\n".join(sum(r.outputs.values(), []))
        lines = [r.outputs[f"worker:{i}"][-1].split() for i in (0, 2)]
        rates[topology] = [float(w[1]) for w in lines]
        span = max(float(w[6]) for w in lines) - min(float(w[5]) for w in lines)
        total[topology] = round(2 * nbytes * 8 / 1e6 / span, 2)  # both flows, first byte to last byte
        hosts = [w[3] for w in lines]
        assert hosts == (["10.213.0.1", "10.213.0.3"] if topology == "switch" else ["127.0.0.1"] * 2)
    print(
        f"\n[shaping] cap {cap:g} Mbit/s, two flows of {nbytes / 1e6:g} MB between disjoint pairs: switch "
        f"{rates['switch']} Mbit/s each, {total['switch']} in all; shared {rates['shared']} each, "
        f"{total['shared']} in all"
    )
    # no flow beats its link's cap (a 1 ms burst adds nothing to speak of); the switch carries more than
    # one cap's worth in all (two links), the shared segment never does. Only upper bounds and the
    # switch's total: a loaded machine slows every flow (27 Mbit/s a flow was seen beside the suite)
    for v in rates["switch"] + rates["shared"]:
        assert v < 1.15 * cap
    assert 1.15 * cap < total["switch"] < 2.3 * cap
    assert total["shared"] < 1.15 * cap


def test_unshaped_cluster_is_much_faster_than_a_cap(tmp_path):
    r = run_cluster([PY, "-c", PAIR_FLOW, "3000000", str(tmp_path)], workers=2, echo=False, timeout=60)
    assert r.returncode == 0, r.message
    assert float(r.outputs["worker:0"][-1].split()[1]) > 200


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--bandwidth-mbit", "fast", "--", "true"], "--bandwidth-mbit"),
        (["--bandwidth-mbit", "-5", "--", "true"], "--bandwidth-mbit"),
        (["--workers", "0", "--", "true"], "--workers"),
        (["--workers", "two", "--", "true"], "--workers"),
        (["--topology", "ring", "--bandwidth-mbit", "10", "--", "true"], "--topology"),
        (["--workers", "2"], "COMMAND"),
        (["--workers", "2", "--"], "COMMAND"),
        (["--bogus", "--", "true"], "--bogus"),
    ],
)
def test_bad_flags_one_line_exit_2(args, needle):
    p = subprocess.run(
        [PY, "-m", "tf_commopt.cluster"] + args, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and needle in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_api_rejects_bad_arguments():
    with pytest.raises(InputError, match="--workers"):
        run_cluster(["true"], workers=0)
    with pytest.raises(InputError, match="--topology"):
        run_cluster(["true"], bandwidth_mbit=10, topology="ring")
    with pytest.raises(InputError, match="COMMAND"):
        run_cluster([])
    with pytest.raises(ClusterError, match="no-such-program"):
        run_cluster(["/no-such-program"], workers=1, echo=False)


def test_missing_tc_is_a_clear_error(tmp_path):
    """PATH without tc: one line naming tc, exit 2, no namespace left behind."""
    os.symlink(shutil.which("ip") or "/usr/sbin/ip", tmp_path / "ip")
    env = dict(os.environ, PATH=str(tmp_path))
    p = subprocess.run(
        [PY, "-m", "tf_commopt.cluster", "--bandwidth-mbit", "10", "--", PY, "-c", "pass"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1 and ("`tc`" in line or "root" in line), line


def test_not_root_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ClusterError, match="needs root"):
        run_cluster(["true"], bandwidth_mbit=10, echo=False)


def test_task_killed_by_a_signal():
    r = run_cluster(["sh", "-c", "echo before; kill -9 $$"], workers=1, echo=False, timeout=60)
    assert (r.returncode, r.failed_signal, r.failed_task) == (137, 9, "worker:0")
    assert r.message == "task worker:0 failed with exit code 137" and r.outputs["worker:0"] == ["before"]


# a ps cluster of plain scripts: worker:1 fails on its first start (a file counts its starts), or on every
# start with ALWAYS set; the chief runs until worker:1 has started twice; ps tasks wait
FLAKY_WORKER = """
import json, os, sys, time
t = json.loads(os.environ["TF_CONFIG"])["task"]
starts = os.path.join(sys.argv[1], "starts")
if t["type"] == "ps":
    time.sleep(300)
if t["type"] == "chief":
    for _ in range(1200):
        if os.path.exists(starts) and len(open(starts).read()) >= 2:
            break
        time.sleep(0.05)
    time.sleep(0.5)
    print("chief done")
    sys.exit(0)
if t["index"] == 1:
    with open(starts, "a") as f:
        f.write("x")
    first = len(open(starts).read()) == 1
    print("start", "first" if first else "again", flush=True)
    if first or os.environ.get("ALWAYS"):
        sys.exit(3)
print("worker done")
"""


def test_restart_workers_starts_a_dead_worker_again_with_its_tf_config(tmp_path):
    buf = io.StringIO()
    r = run_cluster(
        [PY, "-c", FLAKY_WORKER, str(tmp_path)], workers=2, ps=1, chief=True, restart_workers=1, stream=buf
    )
    assert r.returncode == 0, r.message
    assert (r.worker_failures, r.restarts) == (["worker:1 exit 3"], 1)
    assert r.outputs["worker:1"] == ["start first", "start again", "worker done"]  # lines go on
    assert "tf_commopt.cluster: worker:1 exited with code 3; restarting it (1/1)" in buf.getvalue()
    assert r.message == "all 3 task(s) finished (1 worker failure(s) tolerated, 1 restart(s))"


def test_tolerated_worker_that_keeps_failing_is_dropped(tmp_path):
    r = run_cluster(
        [PY, "-c", FLAKY_WORKER, str(tmp_path)],
        workers=2,
        ps=1,
        chief=True,
        restart_workers=1,
        env={"ALWAYS": "1"},
        echo=False,
    )
    assert r.returncode == 0, r.message
    assert r.worker_failures == ["worker:1 exit 3", "worker:1 exit 3"] and r.restarts == 1
    assert r.outputs["chief:0"] == ["chief done"]


def test_failure_policies_decide_and_the_flags_fit_only_ps_clusters():
    from tf_commopt.cluster.policy import DEFAULT_WORKER_RESTARTS, Action, ClusterView, failure_policy

    strict = failure_policy(ps=1, chief=True, fail_fast=True)
    assert strict.on_failure("worker:0", 1, ClusterView(frozenset({"chief:0"}), 0)).action is Action.FAIL
    default = failure_policy(ps=1, chief=True)  # ps clusters restart dead workers by default, bounded
    assert default.max_restarts == DEFAULT_WORKER_RESTARTS == 3
    chief_up = ClusterView(frozenset({"chief:0"}), 0)
    assert default.on_failure("worker:0", 137, chief_up).action is Action.RESTART
    dropper = failure_policy(ps=1, chief=True, tolerate_worker_failures=True)
    assert dropper.on_failure("worker:0", 137, chief_up).action is Action.DROP
    assert failure_policy(ps=0, chief=False).on_failure("worker:0", 137, chief_up).action is Action.FAIL
    tolerant = failure_policy(ps=1, chief=True, tolerate_worker_failures=False, restart_workers=2)
    up = ClusterView(frozenset({"chief:0", "ps:0"}), 0)
    assert tolerant.on_failure("worker:3", 137, up).restart == ("worker:3",)
    assert (
        tolerant.on_failure("worker:3", 137, ClusterView(up.running, 2)).action is Action.DROP
    )  # budget spent
    assert tolerant.on_failure("worker:3", 137, ClusterView(frozenset({"ps:0"}), 0)).action is Action.DROP
    assert tolerant.on_failure("ps:0", 137, up).action is Action.FAIL  # only workers are tolerated
    assert tolerant.on_failure("chief:0", 1, up).action is Action.FAIL
    for kw, flag in (
        ({"restart_workers": 1}, "--restart-workers"),
        ({"tolerate_worker_failures": True}, "--tolerate"),
    ):
        with pytest.raises(InputError, match=flag):
            run_cluster(["true"], workers=2, echo=False, **kw)  # a collective cluster
    with pytest.raises(InputError, match="--restart-workers"):
        run_cluster(["true"], ps=1, chief=True, restart_workers=-1, echo=False)
