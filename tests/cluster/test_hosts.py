"""Several tasks per host (``--hosts 2 --tasks-per-host 2``): tasks of a host share its address and
reach each other unshaped, hosts are joined by the capped links, every task is told its host.

No TensorFlow: small Python tasks that send bytes to a partner (a few seconds in all)."""

import os
import shutil
import sys

import pytest

from tf_commopt.cluster import run_cluster
from tf_commopt.cluster.cli import main
from tf_commopt.errors import InputError

PY = sys.executable
HAVE_NET = os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")

# worker i < 2 receives N bytes from worker i + SHIFT (SHIFT 1: its host mate; 2: the other host)
FLOW = """
import json, os, socket, sys, time
N, shift = int(sys.argv[1]), int(sys.argv[2])
cfg = json.loads(os.environ["TF_CONFIG"]); addrs = cfg["cluster"]["worker"]; i = cfg["task"]["index"]
host = os.environ["TF_COMMOPT_HOST"]
receiver = i % (2 * shift) < shift
peer = i + shift if receiver else i - shift
if receiver:
    port = int(addrs[i].rsplit(":", 1)[1])
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port)); srv.listen(1)
    conn, _ = srv.accept(); got = 0; t = None
    while got < N:
        b = conn.recv(1 << 16)
        if not b: break
        t = t or time.time(); got += len(b)
    print("rx_mbit", round(got * 8 / 1e6 / (time.time() - t), 1), "host", host, addrs[i].rsplit(":", 1)[0])
else:
    a, p = addrs[peer].rsplit(":", 1)
    for _ in range(300):
        try:
            s = socket.create_connection((a, int(p))); break
        except OSError:
            time.sleep(0.02)
    s.sendall(b"x" * N); s.close()
    print("sent host", host, addrs[i].rsplit(":", 1)[0])
"""


@pytest.mark.skipif(not HAVE_NET, reason="needs root, ip and tc")
def test_two_hosts_of_two_tasks_share_an_address_and_only_hosts_are_capped():
    cap, rates = 40.0, {}
    for shift, nbytes in ((1, 20_000_000), (2, 2_000_000)):  # host mates, then across the hosts
        r = run_cluster(
            [PY, "-c", FLOW, str(nbytes), str(shift)],
            workers=4,
            tasks_per_host=2,
            bandwidth_mbit=cap,
            echo=False,
            timeout=60,
        )
        assert r.returncode == 0, r.message + "\n" + "\n".join(sum(r.outputs.values(), []))
        last = {t: r.outputs[t][-1].split() for t in r.outputs}
        # the environment and the addresses say which tasks share a host: (0, 1) and (2, 3)
        hosts = {t: (w[-2], w[-1]) for t, w in last.items()}
        assert [hosts[f"worker:{i}"] for i in range(4)] == [("0", "10.213.0.1")] * 2 + [
            ("1", "10.213.0.2")
        ] * 2
        rates[shift] = [float(w[1]) for t, w in sorted(last.items()) if w[0] == "rx_mbit"]
    print(f"\n[hosts] cap {cap:g} Mbit/s: host mates {rates[1]} Mbit/s, across hosts {rates[2]} Mbit/s")
    assert min(rates[1]) > 5 * cap  # the host's loopback: unshaped
    assert max(rates[2]) < 1.15 * cap  # across hosts: the capped links
    assert sum(rates[2]) < 1.6 * cap  # both flows leave host 1 through its one link (each rate is timed
    # from its own first byte, so the two overlap only partly: measured 47 in all at a 40 cap)


def test_hosts_flags_set_the_workers_and_are_checked(capsys):
    assert main(["--hosts", "2", "--tasks-per-host", "2", "--quiet", "--", PY, "-c", "pass"]) == 0
    capsys.readouterr()
    assert main(["--hosts", "2", "--workers", "3", "--", "true"]) == 2
    assert "--hosts" in capsys.readouterr().err
    assert main(["--tasks-per-host", "0", "--", "true"]) == 2
    with pytest.raises(InputError, match="--tasks-per-host"):
        run_cluster(["true"], workers=4, tasks_per_host=2, bandwidth_mbit=10, topology="shared")
