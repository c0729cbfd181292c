"""Devices, links and groups: what a plan is placed on.

A device's ``capacity`` is its speed relative to the device the profile was measured on
(2.0 = twice as fast: a stage's profiled time is divided by it). A device may also name a
``kind`` whose per-node costs the CostGraph holds (see ``CostGraph.add_kind``); the capacity
then scales those costs.

Example:
    >>> from tf_commopt.core.devices import Device, Link, Cluster
    >>> c = Cluster.homogeneous(4, bandwidth_gbps=10.0)
    >>> round(c.link(0, 1).transfer_ms(1.25e6), 3)   # 1.25 MB over 10 Gbit/s
    1.0
    >>> Cluster.from_capacities([1, 1, 0.5]).capacities
    [1.0, 1.0, 0.5]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from tf_commopt.errors import InputError

__all__ = ["Device", "Link", "Cluster", "parse_capacities"]


@dataclass(frozen=True)
class Device:
    """One compute device.

    Attributes:
        name: e.g. ``"/job:worker/task:0/device:GPU:0"`` or ``"gpu0"``.
        capacity: relative speed (> 0); profiled times are divided by it.
        memory_bytes: memory cap for parameters + stashed activations, or None for unlimited.
        kind: device kind whose per-node costs the graph holds, or None for the graph's defaults.
    """

    name: str
    capacity: float = 1.0
    memory_bytes: Optional[float] = None
    kind: Optional[str] = None

    def __post_init__(self):
        if not (
            isinstance(self.capacity, (int, float)) and math.isfinite(self.capacity) and self.capacity > 0
        ):
            raise InputError(
                f"capacity must be a positive finite number, got {self.capacity!r}",
                where=f"device {self.name!r}",
            )
        if self.memory_bytes is not None and not (math.isfinite(self.memory_bytes) and self.memory_bytes > 0):
            raise InputError(
                f"memory_bytes must be positive, got {self.memory_bytes!r}", where=f"device {self.name!r}"
            )


@dataclass(frozen=True)
class Link:
    """A network link: ``bandwidth_gbps`` in Gbit/s (10**9 bit/s), ``latency_ms`` per message."""

    bandwidth_gbps: float = 10.0
    latency_ms: float = 0.0

    def __post_init__(self):
        if not (math.isfinite(self.bandwidth_gbps) and self.bandwidth_gbps > 0):
            raise InputError(
                f"bandwidth must be a positive finite number of Gbit/s, got {self.bandwidth_gbps!r}"
            )
        if not (math.isfinite(self.latency_ms) and self.latency_ms >= 0):
            raise InputError(f"latency must be a non-negative finite number of ms, got {self.latency_ms!r}")

    @property
    def bytes_per_ms(self) -> float:
        return self.bandwidth_gbps * 1e9 / 8.0 / 1e3

    def transfer_ms(self, nbytes: float) -> float:
        """Time to send ``nbytes`` one way: latency + bytes / bandwidth (0 for 0 bytes)."""
        if nbytes <= 0:
            return 0.0
        return self.latency_ms + nbytes / self.bytes_per_ms


@dataclass
class Cluster:
    """Devices and the links between them (one default link, optional per-pair overrides).

    ``groups`` optionally partitions device indices for grouped hybrid parallelism.
    """

    devices: List[Device]
    default_link: Link = field(default_factory=Link)
    links: Dict[Tuple[int, int], Link] = field(default_factory=dict)
    groups: Optional[List[List[int]]] = None

    def __post_init__(self):
        if not self.devices:
            raise InputError("a cluster needs at least one device")
        names = [d.name for d in self.devices]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise InputError(f"duplicate device name(s): {sorted(dup)}")

    def __len__(self) -> int:
        return len(self.devices)

    @property
    def capacities(self) -> List[float]:
        return [float(d.capacity) for d in self.devices]

    def link(self, a: int, b: int) -> Link:
        """The link from device ``a`` to device ``b``."""
        return self.links.get((a, b)) or self.links.get((b, a)) or self.default_link

    def subset(self, devices: Sequence[int]) -> "Cluster":
        """The devices ``devices`` (renumbered 0..len-1) with their links.

        >>> Cluster.from_capacities([1, 0.5, 0.25]).subset([2, 0]).capacities
        [0.25, 1.0]
        """
        pos = {d: k for k, d in enumerate(devices)}
        links = {(pos[a], pos[b]): lk for (a, b), lk in self.links.items() if a in pos and b in pos}
        return Cluster([self.devices[i] for i in devices], self.default_link, links)

    @classmethod
    def homogeneous(
        cls,
        n: int,
        bandwidth_gbps: float = 10.0,
        latency_ms: float = 0.0,
        memory_bytes: Optional[float] = None,
    ) -> "Cluster":
        if not isinstance(n, int) or n < 1:
            raise InputError(f"number of devices must be a positive integer, got {n!r}")
        return cls([Device(f"dev{i}", 1.0, memory_bytes) for i in range(n)], Link(bandwidth_gbps, latency_ms))

    @classmethod
    def from_capacities(
        cls,
        capacities: Sequence[float],
        bandwidth_gbps: float = 10.0,
        latency_ms: float = 0.0,
        kinds: Optional[Sequence[Optional[str]]] = None,
        memory_bytes: Optional[Sequence[Optional[float]]] = None,
    ) -> "Cluster":
        caps = list(capacities)
        if kinds is not None and len(kinds) != len(caps):
            raise InputError(f"{len(kinds)} kinds for {len(caps)} capacities")
        devs = [
            Device(
                f"dev{i}",
                float(c),
                None if memory_bytes is None else memory_bytes[i],
                None if kinds is None else kinds[i],
            )
            for i, c in enumerate(caps)
        ]
        return cls(devs, Link(bandwidth_gbps, latency_ms))


def parse_capacities(text: str, where: str = "--capacities") -> List[float]:
    """Parse ``"1,1,0.5,0.5"`` into floats; one-line InputError naming the bad item otherwise.

    >>> parse_capacities("1, 0.5")
    [1.0, 0.5]
    """
    items = [t.strip() for t in str(text).split(",")]
    if not items or any(t == "" for t in items):
        raise InputError(f"expected comma-separated positive numbers, got {text!r}", where=where)
    out = []
    for i, t in enumerate(items):
        try:
            v = float(t)
        except ValueError:
            raise InputError(f"item {i} {t!r} is not a number", where=where) from None
        if not math.isfinite(v) or v <= 0:
            raise InputError(f"item {i} {t!r} must be a positive finite number", where=where)
        out.append(v)
    return out
