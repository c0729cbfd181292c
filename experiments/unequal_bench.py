"""Workers of different speeds: is the emulated slowdown right? Page: docs/results/unequal.md.

A sweep of runner launches on ``--workers`` processes, each variant one ``--slow_workers`` setting
(``equal``: none; ``slow1x2``: worker 1 computes 2x slower, ...), skip-and-correct at a fixed H so that
most steps are local (no wait for a peer). Every task's record is kept (``--step_times``: the median and
90th-percentile wall time per step after the first ten). The page compares each worker's median step
time with the same worker's in the equal run: a worker slowed k x should take about k x.

Example:
    python -m experiments.unequal_bench --repeats=1 --steps=60 --out=/tmp/unequal.jsonl
    python -m experiments.unequal_bench --out=docs/results/unequal.jsonl && python -m experiments.report unequal
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from experiments import _cli
from experiments.harness import Launch, Sweep, run_sweep
from experiments.page import Page, Table, median
from experiments.slow import parse_slow_workers

VARIANTS = {"equal": "", "slow1x2": "1:2.0", "slow1x1.5": "1:1.5"}


def define(fv: Any) -> None:
    from absl import flags

    d = dict(flag_values=fv)
    flags.DEFINE_list("variants", ["equal", "slow1x2"], f"any of {', '.join(VARIANTS)}", **d)
    flags.DEFINE_integer("workers", 2, "worker processes", **d)
    flags.DEFINE_float("bandwidth_mbit", 0.0, "shape each link to this rate (0 = no shaping)", **d)
    flags.DEFINE_integer("steps", 120, "steps per run", **d)
    flags.DEFINE_integer("interval", 16, "H of skip-and-correct (most steps local)", **d)
    flags.DEFINE_string("model", "cnn", "experiments.models model name", **d)
    flags.DEFINE_integer("batch_size", 128, "global batch", **d)
    flags.DEFINE_integer("repeats", 3, "repetitions (variants interleaved)", **d)
    flags.DEFINE_string("out", "", "append the record to this .jsonl", **d)


def run_row(rec: Dict[str, Any]) -> Dict[str, Any]:
    """A launch's tasks -> {worker index: the step figures it recorded}."""
    out = {}
    for t in rec["tasks"]:
        index = int(t["task"].split(":")[1])
        out[str(index)] = {k: t.get(k) for k in ("step_ms", "step_ms_p90", "slow_factor", "steps", "wall_s")}
    return {"workers": out}


def sweep(fv: Any) -> Sweep:
    bad = [v for v in fv.variants if v not in VARIANTS]
    if bad:
        _cli.fail(f"--variants: unknown {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    for name in ("workers", "steps", "interval", "repeats"):
        if getattr(fv, name) < 1:
            _cli.fail(f"--{name}: must be >= 1, got {getattr(fv, name)}")

    def launch(setting: str, variant: str) -> Launch:
        argv = [f"--model={fv.model}", f"--steps={fv.steps}", f"--batch_size={fv.batch_size}"]
        argv += ["--strategy=skip_correct", f"--interval={fv.interval}", "--step_times"]
        if VARIANTS[variant]:
            argv.append(f"--slow_workers={VARIANTS[variant]}")
        return Launch(argv, workers=fv.workers, mbit=fv.bandwidth_mbit or None, all_tasks=True)

    setting = f"{fv.model}:{fv.workers}:{fv.bandwidth_mbit:g}"
    extra = {
        k: getattr(fv, k) for k in ("model", "workers", "bandwidth_mbit", "interval", "steps", "batch_size")
    }
    extra["slow_workers"] = {v: VARIANTS[v] for v in fv.variants}
    return Sweep("unequal", [setting], fv.variants, fv.repeats, launch, extra=extra, reduce=run_row)


def _body(fv: Any) -> int:
    run_sweep(sweep(fv), fv.out, _cli.command(fv))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.unequal_bench`` in process; returns the exit code."""
    return _cli.main("experiments.unequal_bench", argv, define, _body)


# ------------------------------------------------------------------------------------------------ page
def emulation_rows(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per (record, variant, worker): the median over repeats of its median step time, and its
    ratio to the same worker's in the equal variant."""
    out = []
    for r in records:
        rows = []
        for v, reps in r["runs"].items():
            for w in sorted({w for rep in reps for w in rep["workers"]}, key=int):
                seen = [rep["workers"][w] for rep in reps if w in rep["workers"]]
                factor = parse_slow_workers(r["slow_workers"][v]).get(int(w), 1.0)
                row = dict(variant=v, worker=int(w), factor=factor, repeats=len(seen))
                row.update(
                    step_ms=median([x["step_ms"] for x in seen]),
                    step_ms_p90=median([x["step_ms_p90"] for x in seen]),
                )
                rows.append(row)
        base = {row["worker"]: row["step_ms"] for row in rows if row["variant"] == "equal"}
        for row in rows:
            row["ratio"] = row["step_ms"] / base[row["worker"]] if row["worker"] in base else None
        out += rows
    return out


def setting_rows(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return records


PAGE = Page(
    "unequal",
    "Workers of different speeds: the slowdown emulation",
    "Skip-and-correct on a local cluster at a fixed H (most steps local, so a worker does not wait for its "
    "peer), without and with `--slow_workers`: each worker's median wall time per step (after the first "
    "ten steps; the median over the repeats), and its ratio to the same worker's in the run without "
    "slowing. The emulation stretches the forward and backward pass only, so a worker's per-step overhead "
    "outside them (the Keras loop, the optimizer's apply) is not multiplied.",
    [
        Table(
            "Setting",
            setting_rows,
            [(k, k, "g") for k in ("workers", "bandwidth_mbit", "interval", "steps", "batch_size")]
            + [("model", "model", "")],
        ),
        Table(
            "Step time per worker",
            emulation_rows,
            [
                ("variant", "variant", ""),
                ("worker", "worker", "d"),
                ("factor", "factor", "g"),
                ("ms/step (median)", "step_ms", ".2f"),
                ("ms/step p90", "step_ms_p90", ".2f"),
                ("ratio to equal", "ratio", ".2f"),
                ("repeats", "repeats", "d"),
            ],
        ),
    ],
)

if __name__ == "__main__":
    raise SystemExit(main())
