"""How a link is shaped: the ``tc tbf`` token bucket for a rate, as numbers and as a command.

Pure functions, no side effects: :mod:`tf_commopt.cluster.netns` runs the commands. Every shaped device
gets (R in bytes/s)::

    tc qdisc add dev DEV root tbf rate <R x 8>bit burst max(R x 1 ms, 4 x 1514) limit max(R x 100 ms, 128 KiB)

The bucket holds about 1 ms of traffic (what a NIC pacing at line rate lets out at once) but at least
four full Ethernet frames (tbf drops a packet larger than its bucket); the queue is bounded at 100 ms of
traffic. The reasons are in docs/architecture.md ("Cluster launcher"). :class:`ShapingOptions` changes
these sizes for comparison runs.

Example:
    >>> tbf_params(20)
    (20000000, 6056, 250000)
    >>> " ".join(tbf_command("eth0", 20))
    'tc qdisc add dev eth0 root tbf rate 20000000bit burst 6056 limit 250000'
    >>> tbf_params(20, ShapingOptions(burst_s=0.0, min_burst=256 * 1024))[1]
    262144
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

__all__ = [
    "TOPOLOGIES",
    "ETH_FRAME",
    "TBF_BURST_S",
    "TBF_MIN_BURST",
    "TBF_LIMIT_S",
    "TBF_MIN_LIMIT",
    "ShapingOptions",
    "DEFAULT_SHAPING",
    "tbf_params",
    "tbf_command",
]

#: ``switch``: a shaped link per host; ``shared``: one shaped segment (loopback) for every task
TOPOLOGIES = ("switch", "shared")
ETH_FRAME = 1514  # bytes of a full Ethernet frame at MTU 1500 (what tbf counts per packet)
TBF_BURST_S = 0.001  # token bucket depth: 1 ms of traffic at the rate ...
TBF_MIN_BURST = 4 * ETH_FRAME  # ... but at least 4 full frames (a bucket smaller than a frame drops it)
TBF_LIMIT_S = 0.1  # queue: 100 ms of traffic at the rate ...
TBF_MIN_LIMIT = 128 * 1024  # ... but at least 128 KiB


@dataclass(frozen=True)
class ShapingOptions:
    """Token-bucket sizes and per-namespace sysctls of a shaped cluster (the defaults are the launcher's).

    Attributes:
        burst_s: bucket depth in seconds of traffic at the rate.
        min_burst: smallest bucket, bytes.
        limit_s: queue length in seconds of traffic at the rate.
        min_limit: smallest queue, bytes.
        sysctls: ``"key=value"`` sysctls set in every namespace (none by default), e.g.
            ``("net.ipv4.tcp_slow_start_after_idle=0",)``.

    Example:
        >>> ShapingOptions(sysctls=("net.ipv4.tcp_slow_start_after_idle=0",)).min_burst
        6056
    """

    burst_s: float = TBF_BURST_S
    min_burst: int = TBF_MIN_BURST
    limit_s: float = TBF_LIMIT_S
    min_limit: int = TBF_MIN_LIMIT
    sysctls: Tuple[str, ...] = ()


DEFAULT_SHAPING = ShapingOptions()


def tbf_params(bandwidth_mbit: float, options: ShapingOptions = DEFAULT_SHAPING) -> Tuple[int, int, int]:
    """``(rate bit/s, burst bytes, limit bytes)`` of the token bucket that shapes a link to ``bandwidth_mbit``.

    burst = max(rate x ``burst_s``, ``min_burst``); limit = max(rate x ``limit_s``, ``min_limit``), rates
    in bytes/s.

    Args:
        bandwidth_mbit: the link's rate in Mbit/s (at least 0.001).
        options: the bucket's sizing rule.

    Example:
        >>> tbf_params(1000)      # 1 Gbit/s
        (1000000000, 125000, 12500000)
    """
    rate_bit = max(1000, int(round(float(bandwidth_mbit) * 1e6)))
    rate_bytes = rate_bit / 8.0
    burst = max(int(round(rate_bytes * options.burst_s)), int(options.min_burst))
    limit = max(int(round(rate_bytes * options.limit_s)), int(options.min_limit))
    return rate_bit, burst, limit


def tbf_command(dev: str, bandwidth_mbit: float, options: ShapingOptions = DEFAULT_SHAPING) -> List[str]:
    """The ``tc`` argv that shapes ``dev`` to ``bandwidth_mbit`` (sizes in bytes: tc reads plain numbers).

    Example:
        >>> tbf_command("lo", 100)[-4:]
        ['burst', '12500', 'limit', '1250000']
    """
    rate_bit, burst, limit = tbf_params(bandwidth_mbit, options)
    return ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{rate_bit}bit"] + [
        "burst",
        str(burst),
        "limit",
        str(limit),
    ]
