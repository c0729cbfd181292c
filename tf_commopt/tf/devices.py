"""Roofline device presets by name, each with a note saying where its numbers come from.

==============  ================  ==========  =================================================
name            GFLOP/s           GB/s        source
==============  ================  ==========  =================================================
``v100``        15,700            900         datasheet, fp32 (the default Roofline)
``a100``        19,500            1,555       datasheet, fp32
``a100-tf32``   156,000           1,555       datasheet, tf32 tensor cores (dense)
``h200``        67,000            4,800       datasheet, fp32 (alias ``h200-fp32``)
``h200-tf32``   494,700           4,800       datasheet, tf32 tensor cores (dense)
``h200-bf16``   989,000           4,800       datasheet, bf16 tensor cores (dense)
``h200-fit``    35,200            4,800       fitted to the H200 fp32 profiles (+0.08 ms/layer, bwd 1x)
``h200-bf16-fit`` 173,300         4,800       fitted to the H200 bf16 profiles (+0.08 ms/layer, bwd 1x)
``cpu``         100               20          stated: a guess for a small x86 box
``cpu-here``    measured          measured    :func:`tf_commopt.tf.profiler.measure_roofline` on /CPU:0,
                                              once per process
==============  ================  ==========  =================================================

Datasheet peaks are optimistic: kernels reach a fraction of them. ``docs/importing.md``
("Calibration") compares the presets with the bundled H200 per-layer measurements.

Example:
    >>> r, note = roofline_preset("h200-bf16")
    >>> r.peak_gflops, r.mem_gbps, note
    (989000.0, 4800.0, 'datasheet peaks, bf16 tensor cores (dense)')
"""

from __future__ import annotations

from typing import Dict, Tuple

from tf_commopt.errors import InputError
from tf_commopt.tf.op_costs import Roofline

__all__ = ["DEVICE_PRESETS", "roofline_preset", "preset_names"]

#: name -> (Roofline, where the numbers come from); ``cpu-here`` is measured on first use.
DEVICE_PRESETS: Dict[str, Tuple[Roofline, str]] = {
    "v100": (Roofline(15_700.0, 900.0), "datasheet peaks, fp32"),
    "a100": (Roofline(19_500.0, 1_555.0), "datasheet peaks, fp32"),
    "a100-tf32": (Roofline(156_000.0, 1_555.0), "datasheet peaks, tf32 tensor cores (dense)"),
    "h200": (Roofline(67_000.0, 4_800.0), "datasheet peaks, fp32"),
    "h200-fp32": (Roofline(67_000.0, 4_800.0), "datasheet peaks, fp32"),
    "h200-tf32": (Roofline(494_700.0, 4_800.0), "datasheet peaks, tf32 tensor cores (dense)"),
    "h200-bf16": (Roofline(989_000.0, 4_800.0), "datasheet peaks, bf16 tensor cores (dense)"),
    "h200-fit": (
        Roofline(35_200.0, 4_800.0, backward_factor=1.0, overhead_ms=0.08),
        "fitted to the bundled H200 fp32 per-layer profiles (6 models; docs/importing.md)",
    ),
    "h200-bf16-fit": (
        Roofline(173_300.0, 4_800.0, backward_factor=1.0, overhead_ms=0.08),
        "fitted to the bundled H200 bf16 per-layer profiles (6 models; docs/importing.md)",
    ),
    "cpu": (Roofline(100.0, 20.0), "stated guess for a small x86 machine, not measured"),
}

_measured: Dict[str, Tuple[Roofline, str]] = {}


def preset_names() -> Tuple[str, ...]:
    return tuple(DEVICE_PRESETS) + ("cpu-here",)


def roofline_preset(name: str) -> Tuple[Roofline, str]:
    """``(Roofline, note)`` for a preset name (see the module table).

    ``cpu-here`` runs a short matmul and memory benchmark on ``/CPU:0`` (about a second) the
    first time it is asked for in a process; the note gives the measured numbers.

    Raises:
        InputError: unknown name (the message lists the presets).
    """
    key = str(name).strip().lower()
    if key in DEVICE_PRESETS:
        return DEVICE_PRESETS[key]
    if key == "cpu-here":
        if key not in _measured:
            from tf_commopt.tf.profiler import measure_roofline

            r = measure_roofline("/CPU:0", size=512, mbytes=16, repeats=5)
            _measured[key] = (
                r,
                f"measured now on /CPU:0: matmul {r.peak_gflops:.1f} GFLOP/s, a+b {r.mem_gbps:.1f} GB/s",
            )
        return _measured[key]
    raise InputError(
        f"unknown device preset {name!r}; choose from {', '.join(preset_names())}", where="--device"
    )
