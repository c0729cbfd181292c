"""Skip-and-correct speed against the floor, MultiWorkerMirroredStrategy and the ring bound, in four parts,
each a sweep of runner launches (docs/results/sc_speed.md):

* ``step`` — per-step and start-up cost (runner ``--step_times``) of ``floor`` (``single`` on every task),
  ``mwms`` (``ssgd``), ``sc_local`` (``local_sgd``, H beyond the run) and ``sc_h16`` (H = 16);
* ``sync`` — one sync's wall time against the ring all-reduce bound, per ``--sync_settings`` entry;
* ``auto`` — ``--auto_runs`` identical runs of ``--interval=auto``: how stable the chosen H is;
* ``table`` — SSGD, H = 16 without correction, ``auto`` and H = 1000 on ``--table_setting``.

Example:
    python -m experiments.sc_speed_bench --parts=sync,auto,table --out=docs/results/sc_speed.jsonl
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

from experiments import _cli
from experiments.harness import Launch, Sweep, run_sweep
from experiments.page import Page, Table, verdict, write_page

PARTS = ("step", "sync", "auto", "table")
STEP_VARIANTS = ("floor", "mwms", "sc_local", "sc_h16")
TABLE_VARIANTS = {
    "ssgd": ["--strategy=ssgd"],
    "sc_h16_none": ["--strategy=skip_correct", "--interval=16", "--correction=none"],
    "sc_auto": ["--strategy=skip_correct", "--interval=auto"],
    "sc_h1000": ["--strategy=skip_correct", "--interval=1000"],
}
GOALS = {"step": 1.25, "startup": 1.2, "sync": 1.1, "auto": 0.25, "table": 0.13}
NO_SYNC = 10**9


def define(fv: Any) -> None:
    from absl import flags

    d = dict(flag_values=fv)
    flags.DEFINE_list("parts", list(PARTS), f"parts to run: {', '.join(PARTS)}", **d)
    flags.DEFINE_integer("workers", 2, "step part: worker processes", **d)
    flags.DEFINE_integer("repeats", 3, "step part: repetitions (variants interleaved)", **d)
    flags.DEFINE_string("model", "mlp", "step part: experiments.models name", **d)
    flags.DEFINE_integer("steps", 300, "step part: steps per run", **d)
    flags.DEFINE_integer("per_replica_batch", 32, "step part: examples per replica per step", **d)
    flags.DEFINE_integer("steps_per_execution", 1, "step and table parts: tf-keras steps_per_execution", **d)
    flags.DEFINE_list(
        "sync_settings",
        ["mlp:4:shared:100:4", "big_mlp:4:shared:1000:4", "mlp:2:switch:10:4"],
        "sync part: model:workers:topology:mbit:H entries",
        **d,
    )
    flags.DEFINE_integer("sync_syncs", 8, "sync part: syncs per run", **d)
    flags.DEFINE_integer("auto_runs", 5, "auto part: identical runs", **d)
    flags.DEFINE_string(
        "auto_setting", "mlp:2:switch:10:300", "auto part: model:workers:topology:mbit:steps", **d
    )
    flags.DEFINE_integer("auto_max_interval", 100000, "auto part: the runner's --max_interval", **d)
    flags.DEFINE_string(
        "table_setting", "mlp:4:shared:100:300", "table part: model:workers:topology:mbit:steps", **d
    )
    flags.DEFINE_integer("table_repeats", 3, "table part: repetitions (variants interleaved)", **d)
    flags.DEFINE_string("out", "", "append the records to this .jsonl", **d)
    flags.DEFINE_string("page", "", "then render this page from --out's records", **d)


def _fields(setting: str, n: int, flag: str) -> List[str]:
    parts = setting.split(":")
    if len(parts) != n:
        _cli.fail(f"--{flag}: {setting!r} is not {n} colon-separated fields")
    return parts


def _tasks_median(rec: Dict[str, Any], key: str) -> float:
    return statistics.median(t[key] for t in rec["tasks"] if key in t)


# ------------------------------------------------------------------------------------------------ step
def step_sweep(fv: Any) -> Sweep:
    def launch(setting: str, variant: str) -> Launch:
        strategy = {"floor": "single", "mwms": "ssgd"}.get(variant, "local_sgd")
        batch = fv.per_replica_batch * (1 if variant == "floor" else fv.workers)
        argv = [f"--model={fv.model}", f"--steps={fv.steps}", f"--batch_size={batch}", "--momentum=0"]
        argv += [f"--strategy={strategy}", f"--steps_per_execution={fv.steps_per_execution}", "--step_times"]
        argv += [f"--interval={16 if variant == 'sc_h16' else NO_SYNC}"] if strategy == "local_sgd" else []
        return Launch(argv, workers=fv.workers, all_tasks=True)

    def reduce(rec: Dict[str, Any]) -> Dict[str, Any]:
        return {"step_ms": _tasks_median(rec, "step_ms"), "startup_s": _tasks_median(rec, "startup_s")}

    def summarize(setting: str, runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
        med = {
            v: {k: statistics.median(r[k] for r in rs) for k in ("step_ms", "startup_s")}
            for v, rs in runs.items()
        }
        return {
            "median": med,
            "step_ratio_sc_local_vs_floor": round(med["sc_local"]["step_ms"] / med["floor"]["step_ms"], 3),
            "startup_ratio_sc_vs_mwms": round(med["sc_local"]["startup_s"] / med["mwms"]["startup_s"], 3),
        }

    extra = dict(part="step", workers=fv.workers, model=fv.model, steps=fv.steps)
    extra.update(per_replica_batch=fv.per_replica_batch, steps_per_execution=fv.steps_per_execution)
    setting = f"{fv.model}:{fv.workers}"
    return Sweep(
        "sc_speed",
        [setting],
        STEP_VARIANTS,
        fv.repeats,
        launch,
        (),
        summarize=summarize,
        extra=extra,
        reduce=reduce,
    )


# ------------------------------------------------------------------------------------------------ sync
def sync_sweep(fv: Any) -> Sweep:
    def parse(setting: str) -> tuple:
        model, workers, topology, mbit, h = _fields(setting, 5, "sync_settings")
        return model, int(workers), topology, float(mbit), int(h)

    def launch(setting: str, variant: str) -> Launch:
        model, workers, topology, mbit, h = parse(setting)
        argv = [f"--model={model}", f"--steps={h * (fv.sync_syncs + 1)}", f"--batch_size={32 * workers}"]
        argv += ["--momentum=0", "--strategy=local_sgd", f"--interval={h}"]
        return Launch(argv, workers=workers, mbit=mbit, topology=topology)

    def summarize(setting: str, runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
        from tf_commopt.core.scaling import ring_allreduce_s

        model, workers, topology, mbit, h = parse(setting)
        r = runs["sc"][0]
        per_sync = (r["comm_s"] - r["first_sync_s"]) / (r["syncs"] - 1)
        bound = ring_allreduce_s(r["param_bytes"], workers, mbit, topology=topology)
        out = dict(model=model, workers=workers, topology=topology, mbit=mbit, interval=h)
        out.update(param_bytes=r["param_bytes"], syncs=r["syncs"], sync_s=round(per_sync, 4))
        return dict(out, bound_s=round(bound, 4), ratio_to_bound=round(per_sync / bound, 3))

    keep = ("wall_s", "syncs", "comm_s", "first_sync_s", "param_bytes")
    return Sweep(
        "sc_speed", fv.sync_settings, ["sc"], 1, launch, keep, summarize=summarize, extra={"part": "sync"}
    )


# ------------------------------------------------------------------------------------------------ auto
def _default_probe_interval() -> int:
    """The probe H of ``interval="auto"`` (the runner's ``--auto_probe_interval`` default)."""
    from experiments.config import Config

    return Config().auto_probe_interval


def auto_sweep(fv: Any) -> Sweep:
    model, workers, topology, mbit, steps = _fields(fv.auto_setting, 5, "auto_setting")

    def launch(setting: str, variant: str) -> Launch:
        argv = [f"--model={model}", f"--steps={steps}", "--strategy=skip_correct", "--interval=auto"]
        argv += ["--momentum=0", f"--max_interval={fv.auto_max_interval}"]
        return Launch(argv, workers=int(workers), mbit=float(mbit), topology=topology)

    def summarize(setting: str, runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
        rs = runs["auto"]
        hs = [r["interval"] for r in rs]
        med = statistics.median(hs)
        keys = ("t_comm_s", "t_comp_s", "t_comm_samples_s", "t_comp_samples_s")
        return {
            "intervals": hs,
            "walls_s": [r["wall_s"] for r in rs],
            "median_h": med,
            "max_dev_from_median": round(max(abs(h - med) / med for h in hs), 3),
            "max_interval": fv.auto_max_interval,
            "probe_interval": _default_probe_interval(),
            "timings": [{k: r.get("interval_" + k) for k in keys} for r in rs],
        }

    return Sweep(
        "sc_speed",
        [fv.auto_setting],
        ["auto"],
        fv.auto_runs,
        launch,
        summarize=summarize,
        extra={"part": "auto"},
    )


# ----------------------------------------------------------------------------------------------- table
def table_sweep(fv: Any) -> Sweep:
    model, workers, topology, mbit, steps = _fields(fv.table_setting, 5, "table_setting")
    keep = ("wall_s", "test_accuracy", "interval", "syncs", "comm_s", "first_sync_s")

    def launch(setting: str, variant: str) -> Launch:
        argv = [f"--model={model}", f"--steps={steps}", "--batch_size=128", "--momentum=0"]
        argv += [f"--steps_per_execution={fv.steps_per_execution}", *TABLE_VARIANTS[variant]]
        return Launch(argv, workers=int(workers), mbit=float(mbit), topology=topology)

    def summarize(setting: str, runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
        def med(rs: List[Dict[str, Any]], k: str) -> Any:
            vals = [x[k] for x in rs if x.get(k) is not None]
            return statistics.median(vals) if vals else None

        rows = {
            name: {k: med(rs, k) for k in ("wall_s", "test_accuracy", "interval", "syncs")}
            for name, rs in runs.items()
        }
        ssgd = rows["ssgd"]["wall_s"]
        return {
            "rows": rows,
            "wall_ratio_vs_ssgd": {k: round(v["wall_s"] / ssgd, 3) for k, v in rows.items()},
        }

    extra = {"part": "table", "steps_per_execution": fv.steps_per_execution}
    return Sweep(
        "sc_speed",
        [fv.table_setting],
        list(TABLE_VARIANTS),
        fv.table_repeats,
        launch,
        keep,
        summarize=summarize,
        extra=extra,
    )


SWEEPS = {"step": step_sweep, "sync": sync_sweep, "auto": auto_sweep, "table": table_sweep}


def _body(fv: Any) -> int:
    bad = [p for p in fv.parts if p not in PARTS]
    if bad:
        _cli.fail(f"--parts: unknown part(s) {', '.join(bad)}; choose from {', '.join(PARTS)}")
    for name in (
        "workers",
        "repeats",
        "steps",
        "per_replica_batch",
        "steps_per_execution",
        "sync_syncs",
        "auto_runs",
        "table_repeats",
    ):
        if getattr(fv, name) < 1:
            _cli.fail(f"--{name}: must be >= 1, got {getattr(fv, name)}")
    if fv.page and not fv.out:
        _cli.fail("--page: needs --out (the records it is rendered from)")
    sweeps = [SWEEPS[p](fv) for p in fv.parts]  # every setting checked before the first run
    for part, sw in zip(fv.parts, sweeps):
        print(f"== {part}", flush=True)
        run_sweep(sw, fv.out, _cli.command(fv))
    if fv.page:
        write_page(PAGE, fv.out, fv.page)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.sc_speed_bench`` in process; returns the exit code."""
    return _cli.main("experiments.sc_speed_bench", argv, define, _body)


# ------------------------------------------------------------------------------------------------ page
def _latest(records: List[Dict[str, Any]], part: str, key: Any) -> List[Dict[str, Any]]:
    out: Dict[Any, Dict[str, Any]] = {}
    for r in records:
        if r.get("part") == part:
            out[key(r)] = r
    return [out[k] for k in sorted(out)]


def probe(r: Dict[str, Any]) -> int:
    """An auto record's probe H: recorded, else its t_comp samples / 3 timed syncs, else 4 (the old default)."""
    if "probe_interval" in r:
        return int(r["probe_interval"])
    timings = r.get("timings") or []
    if timings and timings[0].get("t_comp_samples_s"):
        return len(timings[0]["t_comp_samples_s"]) // 3
    return 4


def rows_step(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    for r in _latest(records, "step", lambda r: (r["workers"], r["model"], r["steps_per_execution"])):
        m = r["median"]
        sr, ur = r["step_ratio_sc_local_vs_floor"], r["startup_ratio_sc_vs_mwms"]
        row = {k: r[k] for k in ("workers", "model", "steps_per_execution")}
        row.update({f"{v}_ms": m[v]["step_ms"] for v in ("floor", "mwms", "sc_local", "sc_h16")})
        row.update({f"{v}_s": m[v]["startup_s"] for v in ("floor", "mwms", "sc_local")})
        row.update(
            mirrored_ms=m.get("mirrored", {}).get("step_ms"),
            vs_mirrored=r.get("step_ratio_sc_local_vs_mirrored"),
        )
        row.update(
            vs_floor=f"{sr:.2f} ({verdict(sr <= GOALS['step'])})", when=r["when"][5:16].replace("T", " ")
        )
        out.append(dict(row, vs_mwms=f"{ur:.2f} ({verdict(ur <= GOALS['startup'])})"))
    return out


def rows_sync(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    for r in _latest(records, "sync", lambda r: (r["model"], r["workers"], r["topology"], r["mbit"])):
        row = {k: r[k] for k in ("model", "workers", "topology", "mbit", "interval", "sync_s", "bound_s")}
        ok = verdict(r["ratio_to_bound"] <= GOALS["sync"])
        out.append(dict(row, mb=r["param_bytes"] / 1e6, ratio=f"{r['ratio_to_bound']:.2f} ({ok})"))
    return out


def rows_auto(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    for r in (r for r in records if r.get("part") == "auto"):
        dev = r["max_dev_from_median"]
        row = {k: r.get(k) for k in ("setting", "intervals", "median_h", "load_average_1m", "walls_s")}
        row.update(when=r["when"][5:16].replace("T", " "), probe=probe(r), cap=r.get("max_interval", 256))
        out.append(dict(row, dev=f"{dev:.0%} ({verdict(dev <= GOALS['auto'])})"))
    return out


def rows_auto_runs(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    for r in (r for r in records if r.get("part") == "auto" and r.get("timings")):
        for i, (h, t, w) in enumerate(zip(r["intervals"], r["timings"], r["walls_s"]), 1):
            row = dict(when=r["when"][5:16].replace("T", " "), probe=probe(r), run=i, h=h, wall=w)
            row.update(t_comm=1e3 * t["t_comm_s"], t_comp=1e3 * t["t_comp_s"])
            out.append(dict(row, samples=len(t.get("t_comp_samples_s") or [])))
    return out


NAMES = {
    "ssgd": "SSGD (MultiWorkerMirroredStrategy)",
    "sc_h16_none": "skip-correct H = 16, no correction",
    "sc_auto": "skip-correct `interval=auto` (vrl)",
    "sc_h1000": "skip-correct H = 1000 (one sync)",
}


def rows_table(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    for r in _latest(records, "table", lambda r: (r["setting"], r.get("steps_per_execution", 1))):
        for key, row in r["rows"].items():
            ratio = r["wall_ratio_vs_ssgd"][key]
            goal = f" ({verdict(ratio <= GOALS['table'])})" if key == "sc_h16_none" else ""
            cells = dict(
                setting=r["setting"], spe=r.get("steps_per_execution", 1), repeats=r.get("repeats", 1)
            )
            cells.update(
                run=NAMES.get(key, key), h=row.get("interval"), syncs=row.get("syncs"), wall=row["wall_s"]
            )
            out.append(dict(cells, ratio=f"{ratio:.3f}{goal}", acc=row["test_accuracy"]))
    return out


PAGE = Page(
    "sc_speed",
    "Skip-and-correct speed: against the floor, MultiWorkerMirroredStrategy and the ring bound",
    "Four parts, each on the shaped local cluster of the runner. Step: the per-step wall time (median after "
    "the first steps) and start-up (strategy construction to the end of the first step) of skip-and-correct "
    "without syncs and with syncs, against the floor (one device per process, no collective) and "
    "MultiWorkerMirroredStrategy, all processes of a variant at once, variants interleaved. Sync: one sync's "
    "steady wall time against the ring all-reduce bound on payload bytes (shared segment: every rank's "
    "traffic on one link; switch: each rank's own link). Auto: identical runs of `--interval=auto`, the H "
    "each chose and the timings the rule agreed on. Table: wall time (`model.fit`) and accuracy of SSGD "
    "and skip-and-correct variants on one testbed, medians over interleaved repeats. Records made under "
    "different load are not comparable across tables.",
    [
        Table(
            "Cost of a step and of start-up",
            rows_step,
            [
                ("workers", "workers", "d"),
                ("model", "model", ""),
                ("steps/exec", "steps_per_execution", "d"),
                ("floor ms", "floor_ms", ".2f"),
                ("1-replica Mirrored ms", "mirrored_ms", ".2f"),
                ("MWMS ms", "mwms_ms", ".2f"),
                ("SC no sync ms", "sc_local_ms", ".2f"),
                ("SC H=16 ms", "sc_h16_ms", ".2f"),
                (f"SC/floor step (goal ≤ {GOALS['step']})", "vs_floor", ""),
                ("SC/Mirrored step", "vs_mirrored", ".2f"),
                ("floor start s", "floor_s", ".2f"),
                ("MWMS start s", "mwms_s", ".2f"),
                ("SC start s", "sc_local_s", ".2f"),
                (f"SC/MWMS start-up (goal ≤ {GOALS['startup']})", "vs_mwms", ""),
            ],
        ),
        Table(
            "One sync against the ring all-reduce bound",
            rows_sync,
            [
                ("model", "model", ""),
                ("MB", "mb", ".2f"),
                ("workers", "workers", "d"),
                ("topology", "topology", ""),
                ("Mbit/s", "mbit", "g"),
                ("H", "interval", "d"),
                ("sync s", "sync_s", ".3f"),
                ("bound s", "bound_s", ".3f"),
                (f"ratio (goal ≤ {GOALS['sync']})", "ratio", ""),
            ],
        ),
        Table(
            'Stability of `interval="auto"`',
            rows_auto,
            [
                ("when (UTC)", "when", ""),
                ("setting", "setting", ""),
                ("probe H", "probe", "d"),
                ("cap", "cap", "d"),
                ("chosen H per run", "intervals", "g"),
                ("median", "median_h", "g"),
                (f"largest deviation (goal ≤ {GOALS['auto']:.0%})", "dev", ""),
                ("load average", "load_average_1m", "g"),
                ("wall s", "walls_s", ".1f"),
            ],
            "Setting = model:workers:topology:Mbit/s:steps; every record, oldest first. The probe H of records "
            "made before it was recorded is their sample count over the timed syncs, or the old default.",
        ),
        Table(
            'What `interval="auto"` measured, per run',
            rows_auto_runs,
            [
                ("when (UTC)", "when", ""),
                ("probe H", "probe", "d"),
                ("run", "run", "d"),
                ("H", "h", "g"),
                ("agreed t̃_comm ms", "t_comm", ".1f"),
                ("agreed t̃_comp ms", "t_comp", ".3f"),
                ("t_comp samples", "samples", "d"),
                ("wall s", "wall", ".1f"),
            ],
        ),
        Table(
            "SSGD and skip-and-correct on one testbed",
            rows_table,
            [
                ("setting", "setting", ""),
                ("steps/exec", "spe", "d"),
                ("repeats", "repeats", "d"),
                ("run", "run", ""),
                ("H", "h", "g"),
                ("syncs", "syncs", "g"),
                ("wall s", "wall", ".1f"),
                (f"wall / SSGD (goal for H = 16 ≤ {GOALS['table']})", "ratio", ""),
                ("test accuracy", "acc", ".3f"),
            ],
        ),
    ],
)

if __name__ == "__main__":
    raise SystemExit(main())
