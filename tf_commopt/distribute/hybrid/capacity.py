"""The devices' capacities for the grouped hybrid: given, measured, or all equal; and the slow-down
factors that emulate them on one machine.

Example:
    >>> from tf_commopt.distribute.hybrid.capacity import emulated_slowdown
    >>> emulated_slowdown(["/CPU:0", "/CPU:1"], [1.0, 0.25])
    {'/device:CPU:1': 4.0}
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from tf_commopt.errors import InputError
from tf_commopt.tf.slowdown import canonical_device

__all__ = ["resolve_capacities", "emulated_slowdown", "slowdown_factors"]


def resolve_capacities(capacities: Any, devices: Sequence[str]) -> List[float]:
    """One positive capacity per device: ``capacities`` as given, all 1 if None, or measured with
    :func:`tf_commopt.tf.profiler.relative_capacities` if ``"measure"``."""
    if isinstance(capacities, str):
        if capacities != "measure":
            raise InputError(
                f"capacities must be a list of numbers or 'measure', got {capacities!r}", where="capacities"
            )
        from tf_commopt.tf.profiler import relative_capacities

        capacities = relative_capacities(list(devices))
    caps = [1.0] * len(devices) if capacities is None else [float(c) for c in capacities]
    if len(caps) != len(devices) or any(not (c > 0) for c in caps):
        raise InputError(
            f"need one positive capacity per device ({len(devices)}), got {capacities!r}", where="capacities"
        )
    return caps


def emulated_slowdown(devices: Sequence[str], capacities: Sequence[float]) -> Dict[str, float]:
    """A device of capacity ``c`` runs ``max(capacities) / c`` times slower (the fastest at full speed)."""
    top = max(capacities)
    return {canonical_device(d): top / c for d, c in zip(devices, capacities) if c < top}


def slowdown_factors(
    devices: Sequence[str],
    capacities: Sequence[float],
    emulate: bool,
    slowdown: Optional[Mapping[str, float]],
) -> Dict[str, float]:
    """``slowdown`` (device -> factor) if given, else :func:`emulated_slowdown` if ``emulate``, else none."""
    if slowdown is not None:
        return {canonical_device(k): float(v) for k, v in slowdown.items()}
    return emulated_slowdown(devices, capacities) if emulate else {}
