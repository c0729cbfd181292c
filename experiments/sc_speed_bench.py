"""Skip-and-correct speed against the floor, MultiWorkerMirroredStrategy and the ring bound, in four parts,
each a sweep of runner launches (docs/results/sc_speed.md):

* ``step`` — per-step and start-up cost (runner ``--step_times``) of ``floor`` (``single`` on every task),
  ``mwms`` (``ssgd``), ``sc_local`` (``local_sgd``, H beyond the run) and ``sc_h16`` (H = 16);
* ``sync`` — one sync's wall time against the ring all-reduce bound, per ``--sync_settings`` entry;
* ``auto`` — ``--auto_runs`` identical runs of ``--interval=auto``: how stable the chosen H is;
* ``table`` — SSGD, fixed H without correction blocking, overlapped and with bf16 deltas, and ``auto``,
  on each ``--table_settings`` entry (and PyTorch's local SGD where torch is installed).

Example:
    python -m experiments.sc_speed_bench --parts=sync,auto,table --out=docs/results/sc_speed.jsonl
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

from experiments import _cli
from experiments.harness import Launch, Sweep, run_sweep
from experiments.page import write_page
from experiments.sc_speed_page import PAGE

PARTS = ("step", "sync", "auto", "table")
STEP_VARIANTS = ("floor", "mwms", "sc_local", "sc_h16")
TABLE_VARIANTS = {  # {h}: the setting's H
    "ssgd": ["--strategy=ssgd"],
    "sc_block": ["--strategy=skip_correct", "--interval={h}", "--correction=none", "--nooverlap"],
    "sc_overlap": ["--strategy=skip_correct", "--interval={h}", "--correction=none", "--overlap"],
    "sc_auto": ["--strategy=skip_correct", "--interval=auto", "--nooverlap"],
    "sc_bf16": ["--strategy=skip_correct", "--interval={h}", "--correction=none", "--nooverlap"]
    + ["--compression=bf16"],
    "sc_overlap_bf16": ["--strategy=skip_correct", "--interval={h}", "--correction=none", "--overlap"]
    + ["--compression=bf16"],
    # the outside reference, measured in the same sweep: PyTorch's PeriodicModelAverager (needs torch)
    "torch_local": ["--interval={h}"],
}
TORCH_MODULE = "experiments.torch_local_sgd"


def default_table_variants() -> List[str]:
    """Every table variant; ``torch_local`` only where torch is installed (it is not a dependency)."""
    import importlib.util

    have_torch = importlib.util.find_spec("torch") is not None
    return [v for v in TABLE_VARIANTS if v != "torch_local" or have_torch]


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
    flags.DEFINE_list(
        "table_settings",
        ["mlp:4:shared:100:300:16", "big_mlp:4:shared:1000:40:8"],
        "table part: model:workers:topology:mbit:steps:H entries",
        **d,
    )
    flags.DEFINE_integer("table_repeats", 3, "table part: repetitions (variants interleaved)", **d)
    flags.DEFINE_list(
        "table_variants",
        None,
        f"table part: variants to run, of {', '.join(TABLE_VARIANTS)} (default: all; torch_local only "
        "where torch is installed)",
        **d,
    )
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
        # sc_local: few syncs (H = steps / 4), so the graph loop makes several calls to time
        argv += (
            [f"--interval={16 if variant == 'sc_h16' else max(1, fv.steps // 4)}"]
            if strategy == "local_sgd"
            else []
        )
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

    extra = dict(
        part="step", workers=fv.workers, model=fv.model, steps=fv.steps, sc_local_interval=fv.steps // 4
    )
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
        argv += ["--momentum=0", "--strategy=local_sgd", f"--interval={h}", "--nooverlap"]  # a blocking sync
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
    for setting in fv.table_settings:
        _fields(setting, 6, "table_settings")
    keep = ("wall_s", "test_accuracy", "interval", "syncs", "comm_s", "first_sync_s", "first_step_s")
    keep += ("background_comm_s", "last_step_end_s", "local_s", "framework")
    variants = table_variants(fv)

    def launch(setting: str, variant: str) -> Launch:
        model, workers, topology, mbit, steps, h = setting.split(":")
        argv = [f"--model={model}", f"--steps={steps}", "--batch_size=128"]
        if variant == "torch_local":
            argv += [a.format(h=h) for a in TABLE_VARIANTS[variant]]
            return Launch(
                argv, workers=int(workers), mbit=float(mbit), topology=topology, module=TORCH_MODULE
            )
        argv += ["--momentum=0", f"--steps_per_execution={fv.steps_per_execution}"]
        argv += [a.format(h=h) for a in TABLE_VARIANTS[variant]]
        return Launch(argv, workers=int(workers), mbit=float(mbit), topology=topology)

    def summarize(setting: str, runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
        def med(rs: List[Dict[str, Any]], k: str) -> Any:
            vals = [x[k] for x in rs if x.get(k) is not None]
            return statistics.median(vals) if vals else None

        keys = ("wall_s", "test_accuracy", "interval", "syncs", "first_step_s", "comm_s")
        rows = {name: {k: med(rs, k) for k in keys} for name, rs in runs.items()}
        out = {"setting": ":".join(setting.split(":")[:5]), "rows": rows}
        if "ssgd" in rows:
            ssgd = rows["ssgd"]["wall_s"]
            out["wall_ratio_vs_ssgd"] = {k: round(v["wall_s"] / ssgd, 3) for k, v in rows.items()}
        return out

    extra = {"part": "table", "steps_per_execution": fv.steps_per_execution}
    return Sweep(
        "sc_speed",
        fv.table_settings,
        variants,
        fv.table_repeats,
        launch,
        keep,
        summarize=summarize,
        extra=extra,
    )


def table_variants(fv: Any) -> List[str]:
    """The table part's variants (``--table_variants``, checked), in TABLE_VARIANTS' order."""
    if not fv.table_variants:
        variants = default_table_variants()
        if "torch_local" not in variants:
            print(
                "table: torch is not installed, the PyTorch reference (torch_local) is left out", flush=True
            )
        return variants
    bad = [v for v in fv.table_variants if v not in TABLE_VARIANTS]
    if bad:
        _cli.fail(f"--table_variants: unknown {', '.join(bad)}; choose from {', '.join(TABLE_VARIANTS)}")
    if "torch_local" in fv.table_variants and "torch_local" not in default_table_variants():
        _cli.fail("--table_variants=torch_local needs torch: pip install torch (the CPU build)")
    return [v for v in TABLE_VARIANTS if v in fv.table_variants]


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


if __name__ == "__main__":
    raise SystemExit(main())
