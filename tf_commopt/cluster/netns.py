"""The network a local cluster runs on: plain loopback, or hosts in shaped network namespaces.

A *host* is where tasks run; tasks on one host share its address and reach each other unshaped.
:func:`open_network` gives one of two things with the same interface (``addresses``, ``wrap``,
``close``):

* :class:`Loopback` (no rate): every host is ``127.0.0.1``; nothing is created.
* :class:`ShapedNetwork` (root, ``ip`` and ``tc``): namespaces named ``tfco<pid>-<serial>-...``.

  - ``topology="switch"``: a namespace per host holding ``eth0`` (``10.213.0.<h+1>/24``, MTU 1500), joined
    by a veth pair to a bridge ``br0`` in a switch namespace; both ends of every veth are shaped, so each
    host's link runs at the rate in each direction.
  - ``topology="shared"``: one namespace whose loopback is shaped (MTU 1500) for every host: the *sum* of
    all traffic shares one segment.

Namespaces (with their links and qdiscs) are deleted by ``close()``, at exit, and by the next launcher
if this one was SIGKILLed (its PID is in the name). Only private addresses inside namespaces made here
are used; no traffic leaves the machine.

Example:
    >>> net = open_network(hosts=2, bandwidth_mbit=None)
    >>> net.addresses, net.wrap(1, ["python", "-V"])
    (['127.0.0.1', '127.0.0.1'], ['python', '-V'])
    >>> net.close()
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
from typing import List, Optional, Sequence

from tf_commopt.cluster.shaping import DEFAULT_SHAPING, TOPOLOGIES, ShapingOptions, tbf_command
from tf_commopt.errors import ClusterError

__all__ = ["SUBNET", "Loopback", "ShapedNetwork", "open_network", "reap_stale_namespaces"]

SUBNET = "10.213.0"  # private addresses, only inside namespaces this module creates
NS_PREFIX = "tfco"
MTU = "1500"


def _run(cmd: Sequence[str]) -> None:
    p = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        msg = " ".join(p.stdout.split()) or f"exit code {p.returncode}"
        raise ClusterError(f"network set-up failed: `{' '.join(cmd)}`: {msg}")


def check_network_capability() -> None:
    """Raise ClusterError unless this process may build shaped namespaces (root, ``ip``, ``tc``)."""
    if os.geteuid() != 0:
        raise ClusterError(
            "--bandwidth-mbit needs root (network namespaces and tc); run as root or drop the cap"
        )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise ClusterError(
                f"--bandwidth-mbit needs the `{tool}` command (iproute2), which is not on PATH"
            )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _list_netns() -> List[str]:
    p = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def reap_stale_namespaces() -> None:
    """Delete namespaces left by launchers that were SIGKILLed (their PID is in the name)."""
    for name in _list_netns():
        m = re.fullmatch(rf"{NS_PREFIX}(\d+)-[\w-]+", name)
        if m and not _pid_alive(int(m.group(1))):
            subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)


class Loopback:
    """An unshaped cluster: every host is ``127.0.0.1``, commands run as given."""

    def __init__(self, hosts: int):
        self.addresses: List[str] = ["127.0.0.1"] * hosts
        self.namespaces: List[str] = []

    def wrap(self, host: int, command: List[str]) -> List[str]:
        """``command`` as run on ``host`` (unchanged)."""
        return list(command)

    def close(self) -> None:
        """Nothing to remove."""


class ShapedNetwork:
    """Namespaces, links and qdiscs of one shaped cluster; ``close()`` removes them (idempotent).

    Args:
        hosts: how many hosts (each gets its own shaped link with ``topology="switch"``).
        bandwidth_mbit: the rate of every shaped link, Mbit/s.
        topology: ``"switch"`` or ``"shared"``.
        options: token-bucket sizes and sysctls.
    """

    _serial = 0

    def __init__(
        self, hosts: int, bandwidth_mbit: float, topology: str, options: ShapingOptions = DEFAULT_SHAPING
    ):
        check_network_capability()
        ShapedNetwork._serial += 1
        self.base = f"{NS_PREFIX}{os.getpid()}-{ShapedNetwork._serial}"
        self.namespaces: List[str] = []
        self.addresses: List[str] = []
        self.host_ns: List[str] = []
        self.bandwidth_mbit = bandwidth_mbit
        self.options = options
        self._closed = False
        atexit.register(self.close)
        try:
            reap_stale_namespaces()
            if topology == "shared":
                self._shared(hosts)
            else:
                self._switch(hosts)
        except BaseException:
            self.close()
            raise

    def _add_ns(self, name: str) -> str:
        p = subprocess.run(
            ["ip", "netns", "add", name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        if p.returncode != 0:
            raise ClusterError(
                f"cannot create network namespace {name!r} (`ip netns add`): "
                f"{' '.join(p.stdout.split()) or p.returncode}"
            )
        self.namespaces.append(name)
        return name

    def _shape(self, ns: str, dev: str) -> None:
        _run(["ip", "netns", "exec", ns] + tbf_command(dev, self.bandwidth_mbit, self.options))

    def _sysctls(self, ns: str) -> None:
        for setting in self.options.sysctls:
            _run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", setting])

    def _shared(self, hosts: int) -> None:
        ns = self._add_ns(f"{self.base}-shared")
        _run(["ip", "-n", ns, "link", "set", "lo", "mtu", MTU, "up"])
        self._sysctls(ns)
        self._shape(ns, "lo")
        self.host_ns = [ns] * hosts
        self.addresses = ["127.0.0.1"] * hosts

    def _switch(self, hosts: int) -> None:
        sw = self._add_ns(f"{self.base}-sw")
        _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", "br0", "up"])
        for h in range(hosts):
            ns = self._add_ns(f"{self.base}-h{h}")
            ip = f"{SUBNET}.{h + 1}"
            port = f"p{h}"
            _run(["ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns])
            _run(["ip", "-n", sw, "link", "set", port, "mtu", MTU, "master", "br0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "mtu", MTU, "up"])
            self._sysctls(ns)
            self._shape(ns, "eth0")  # host -> switch
            self._shape(sw, port)  # switch -> host
            self.host_ns.append(ns)
            self.addresses.append(ip)

    def wrap(self, host: int, command: List[str]) -> List[str]:
        """``command`` run inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self.host_ns[host]] + list(command)

    def close(self) -> None:
        """Delete every namespace made here (their veths and qdiscs go with them)."""
        if self._closed:
            return
        self._closed = True
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            atexit.unregister(self.close)
        except Exception:  # pragma: no cover
            pass


def open_network(
    hosts: int,
    bandwidth_mbit: Optional[float],
    topology: str = "switch",
    options: ShapingOptions = DEFAULT_SHAPING,
):
    """The network of a cluster of ``hosts`` hosts: :class:`Loopback` without a rate, else shaped.

    Args:
        hosts: number of hosts.
        bandwidth_mbit: rate of the shaped links (Mbit/s), or None for plain loopback.
        topology: one of :data:`~tf_commopt.cluster.shaping.TOPOLOGIES` (with a rate only).
        options: token-bucket sizes and sysctls.

    Example:
        >>> open_network(1, None).addresses
        ['127.0.0.1']
    """
    if bandwidth_mbit is None:
        return Loopback(hosts)
    if topology not in TOPOLOGIES:
        raise ClusterError(f"unknown topology {topology!r}; choose one of {', '.join(TOPOLOGIES)}")
    return ShapedNetwork(hosts, float(bandwidth_mbit), topology, options)
