"""Predicted wall time and slow-link bytes of cheaper syncs (closed form, nothing is run or measured).

Prints, per model, inter-host rate and global interval H, the four variants of
:mod:`tf_commopt.core.sync_cost` — flat fp32 skip-and-correct, compressed (bf16) deltas, two-level
averaging, and both — on N workers as C hosts, with the ratios to the flat run. It is the prediction the
measured page is compared with; it is not a results page. ``auto`` is the H ``AutoInterval`` would choose
for the flat fp32 sync; h is the largest divisor of H not above ``TwoLevelInterval().intra_interval``.

The default step times are inputs, not measurements of this command: big_mlp 121 ms (the compute-only
run of docs/results/comm.md, 2.9 s / 24 steps) and mlp 1.75 ms (the no-sync skip-and-correct step of
docs/results/sc_speed.md); give your own with ``--models=name:MB:ms``.

Example:
    python -m experiments.cheapsync_estimate
    python -m experiments.cheapsync_estimate --models=big_mlp:40.08:121 --inter_mbit=100 --intervals=8
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from experiments import _cli


def define(fv: Any) -> None:
    from absl import flags

    d = dict(flag_values=fv)
    flags.DEFINE_string(
        "models", "big_mlp:40.08:121,mlp:0.41:1.75", "name:MB:ms-per-step, comma-separated", **d
    )
    flags.DEFINE_string("inter_mbit", "100,1000", "inter-host link rates (Mbit/s), comma-separated", **d)
    flags.DEFINE_float(
        "intra_mbit", 10000.0, "rate between workers of one host (Mbit/s; unshaped loopback)", **d
    )
    flags.DEFINE_string(
        "intervals", "4,16,auto", "global intervals H (integers or auto), comma-separated", **d
    )
    flags.DEFINE_integer("workers", 4, "workers", **d)
    flags.DEFINE_integer("hosts", 2, "hosts (workers split evenly)", **d)
    flags.DEFINE_integer("steps", 240, "steps per run", **d)
    flags.DEFINE_float("latency_ms", 0.0, "latency per ring step (ms)", **d)


def _models(text: str) -> List[Tuple[str, float, float]]:
    out = []
    for item in text.split(","):
        parts = item.split(":")
        try:
            name, mb, ms = parts[0], float(parts[1]), float(parts[2])
        except (IndexError, ValueError):
            _cli.fail(f"--models: expected name:MB:ms, got {item!r}")
        if len(parts) != 3 or not name or mb <= 0 or ms < 0:
            _cli.fail(f"--models: expected name:MB:ms with MB > 0 and ms >= 0, got {item!r}")
        out.append((name, mb, ms))
    return out


def _numbers(text: str, flag: str, allow_auto: bool = False) -> List[Any]:
    out: List[Any] = []
    for item in text.split(","):
        if allow_auto and item == "auto":
            out.append(item)
            continue
        try:
            value = int(item) if allow_auto else float(item)
        except ValueError:
            _cli.fail(f"--{flag}: {item!r} is not a {'positive integer or auto' if allow_auto else 'number'}")
        if value <= 0:
            _cli.fail(f"--{flag}: must be > 0, got {item!r}")
        out.append(value)
    return out


def _divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, n + 1) if n % d == 0 and d <= max(1, cap))


def rows(fv: Any) -> List[dict]:
    """Every printed row, as dicts (model, inter_mbit, H, h, variant, and sync_cost.estimate's keys)."""
    from tf_commopt.core import sync_cost
    from tf_commopt.core.interval import first_iteration_interval
    from tf_commopt.core.levels import TwoLevelInterval

    out = []
    lat = fv.latency_ms / 1e3
    per_host = fv.workers // fv.hosts
    for name, mb, ms in _models(fv.models):
        b, t_comp = mb * 1e6, ms / 1e3
        for mbit in _numbers(fv.inter_mbit, "inter_mbit"):
            t_flat = sync_cost.flat_sync_s(b, fv.workers, mbit, None, lat)
            t_intra = sync_cost.intra_sync_s(b, per_host, fv.intra_mbit, lat)
            for interval in _numbers(fv.intervals, "intervals", allow_auto=True):
                big_h = first_iteration_interval(t_flat, t_comp) if interval == "auto" else interval
                h = _divisor_at_most(big_h, TwoLevelInterval().intra_interval(t_intra, t_comp))
                kw = dict(intra_mbit=fv.intra_mbit, workers=fv.workers, hosts=fv.hosts, latency_s=lat)
                for row in sync_cost.compare(b, t_comp, fv.steps, big_h, h, mbit, **kw):
                    out.append(
                        {"model": name, "MB": mb, "inter_mbit": mbit, "auto": interval == "auto", **row}
                    )
    return out


def _body(fv: Any) -> int:
    if fv.workers < 2 or fv.hosts < 1 or fv.workers % fv.hosts or fv.steps < 1 or fv.latency_ms < 0:
        _cli.fail("--workers >= 2 split evenly over --hosts, --steps >= 1, --latency_ms >= 0")
    if fv.intra_mbit <= 0:
        _cli.fail(f"--intra_mbit: must be > 0, got {fv.intra_mbit}")
    table = rows(fv)
    print(
        f"Prediction (closed form, tf_commopt.core.sync_cost), not a measurement: {fv.workers} workers as "
        f"{fv.hosts} hosts, intra-host {fv.intra_mbit:g} Mbit/s, {fv.steps} steps, latency {fv.latency_ms:g} ms."
    )
    print(
        "| model | inter Mbit/s | H | h | variant | wall s | comm s | slow-link MB | wall / flat | bytes / flat |"
    )
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in table:
        h_text = f"{r['H']} (auto)" if r["auto"] else str(r["H"])
        print(
            f"| {r['model']} | {r['inter_mbit']:g} | {h_text} | {r['h']} | {r['variant']} | {r['wall_s']:.1f} | "
            f"{r['comm_s']:.1f} | {r['slow_link_mb']:.1f} | {r['wall_ratio']:.2f} | {r['bytes_ratio']:.2f} |"
        )
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.cheapsync_estimate`` in process; returns the exit code."""
    return _cli.main("experiments.cheapsync_estimate", argv, define, _body)


if __name__ == "__main__":
    raise SystemExit(main())
