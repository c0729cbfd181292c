"""Cheaper syncs, measured: flat skip-and-correct against compressed syncs and two-level averaging at the
same H, on 4 workers as 2 hosts x 2 (host mates unshaped, the hosts joined by a capped link). Page:
docs/results/cheapsync.md.

A sweep of runner launches (``experiments.harness``): every setting (model, inter-host Mbit/s, iid or
label-skewed) runs each variant ``--repeats`` times, interleaved: ``flat`` (float32 syncs), ``bf16`` and
``fp16`` (``--compression``), ``two_level``, ``two_level_bf16`` and ``two_level_int8`` (``--host_interval``). The page shows
the medians of wall time, test accuracy and sync time, their ratios to ``flat``, and the bytes one
worker put into the syncs; the bytes that cross the slow link are derived from them: a ring all-reduce
over N ranks sends 2(N-1)/N of each rank's payload to the next rank, and with the tasks in host order
exactly one rank per host sends across the hosts' link; a two-level global sync sends each worker's
slice of its host value once (``inter_host_bytes``), so a host sends p slices. With ``--interval=auto``
every run chooses its own H, and with ``--host_interval=auto`` too the two-level runs choose h and H
together (``SkipCorrectStrategy(host_interval="auto")``); each run's record keeps the H and h it used.

Example:
    python -m experiments.cheapsync_bench --settings=mlp:100:iid --repeats=1 --steps=16 --out=/tmp/cs.jsonl
    python -m experiments.cheapsync_bench --out=docs/results/cheapsync.jsonl && python -m experiments.report cheapsync
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from experiments import _cli
from experiments.harness import Launch, Sweep, run_sweep
from experiments.page import Page, Table, median, when
from tf_commopt.core.interval import validate_interval

VARIANTS = {
    "flat": [],
    "bf16": ["--compression=bf16"],
    "fp16": ["--compression=fp16"],
    "two_level": ["--host_interval={h}"],
    "two_level_bf16": ["--host_interval={h}", "--compression=bf16"],
    "two_level_int8": ["--host_interval={h}", "--compression=int8"],
}
KEEP = ("wall_s", "test_accuracy", "syncs", "comm_s", "compute_s", "bytes_communicated", "sync_payload_bytes")
KEEP += ("first_sync_s", "interval", "cluster_wall_s", "host_syncs", "host_comm_s", "inter_host_bytes")
KEEP += ("host_interval",)  # the h a run used (chosen by it with --host_interval=auto)


def define(fv: Any) -> None:
    from absl import flags

    d = dict(flag_values=fv)
    flags.DEFINE_list("settings", ["big_mlp:100:iid"], "model:inter-host Mbit/s:iid|non_iid, ...", **d)
    flags.DEFINE_list(
        "variants", ["flat", "bf16", "two_level", "two_level_bf16"], f"any of {', '.join(VARIANTS)}", **d
    )
    flags.DEFINE_string("correction", "auto", "the runner's --correction, the same for every variant", **d)
    flags.DEFINE_string(
        "host_interval",
        "2",
        "h of the two_level variants (H a multiple of it), or auto (needs --interval=auto)",
        **d,
    )
    flags.DEFINE_integer("hosts", 2, "hosts", **d)
    flags.DEFINE_integer("tasks_per_host", 2, "workers per host (unshaped between them)", **d)
    flags.DEFINE_integer("steps", 48, "steps per run", **d)
    flags.DEFINE_string(
        "interval", "8", "H, the same for every variant, or auto (each run chooses its own)", **d
    )
    flags.DEFINE_integer("batch_size", 128, "global batch", **d)
    flags.DEFINE_float("learning_rate", 0.05, "the optimizer's learning rate", **d)
    flags.DEFINE_integer("non_iid_classes", 2, "labels per worker in a non_iid setting", **d)
    flags.DEFINE_integer("repeats", 3, "repetitions (variants interleaved)", **d)
    flags.DEFINE_string("out", "", "append one record per setting to this .jsonl", **d)


def parse_setting(entry: str) -> Dict[str, Any]:
    """``model:mbit:iid|non_iid`` -> its parts (``_cli.fail`` with one line otherwise).

    >>> parse_setting("big_mlp:100:iid")["mbit"]
    100.0
    """
    parts = entry.split(":")
    if len(parts) != 3 or parts[2] not in ("iid", "non_iid"):
        _cli.fail(f"--settings: expected model:mbit:iid|non_iid, got {entry!r}")
    try:
        mbit = float(parts[1])
    except ValueError:
        _cli.fail(f"--settings: {parts[1]!r} is not a number of Mbit/s in {entry!r}")
    return {"model": parts[0], "mbit": mbit, "split": parts[2]}


def sweep(fv: Any) -> Sweep:
    bad = [v for v in fv.variants if v not in VARIANTS]
    if bad:
        _cli.fail(f"--variants: unknown {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    for name in ("hosts", "tasks_per_host", "steps", "repeats"):
        if getattr(fv, name) < 1:
            _cli.fail(f"--{name}: must be >= 1, got {getattr(fv, name)}")
    interval = validate_interval(fv.interval, where="--interval")
    host_interval = validate_interval(fv.host_interval, where="--host_interval")
    if host_interval == "auto" and interval != "auto":
        _cli.fail("--host_interval: auto chooses h with H: give --interval=auto")
    settings = {s: parse_setting(s) for s in fv.settings}
    workers = fv.hosts * fv.tasks_per_host

    def launch(setting: str, variant: str) -> Launch:
        s = settings[setting]
        argv = [f"--model={s['model']}", f"--steps={fv.steps}", f"--batch_size={fv.batch_size}"]
        argv += [
            f"--learning_rate={fv.learning_rate}",
            "--strategy=skip_correct",
            f"--interval={interval}",
            f"--correction={fv.correction}",
        ]
        argv += [f"--non_iid_classes={fv.non_iid_classes}"] if s["split"] == "non_iid" else []
        return Launch(
            argv + [a.format(h=host_interval) for a in VARIANTS[variant]],
            workers=workers,
            mbit=s["mbit"],
            tasks_per_host=fv.tasks_per_host,
        )

    extra = {k: getattr(fv, k) for k in ("hosts", "tasks_per_host", "steps", "batch_size")}
    extra.update(interval=interval, learning_rate=fv.learning_rate, host_interval=host_interval)
    extra["correction"] = fv.correction
    return Sweep(
        "cheapsync",
        list(settings),
        fv.variants,
        fv.repeats,
        launch,
        keep=KEEP,
        describe=lambda s: dict(settings[s]),
        extra=extra,
    )


def _body(fv: Any) -> int:
    run_sweep(sweep(fv), fv.out, _cli.command(fv))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.cheapsync_bench`` in process; returns the exit code."""
    return _cli.main("experiments.cheapsync_bench", argv, define, _body)


# ------------------------------------------------------------------------------------------------ page
def _slow_link_mb(rec: Dict[str, Any], run: Dict[str, Any]) -> float:
    """MB one host sends to the other over the capped link: a ring all-reduce over every worker (tasks
    in host order) sends 2(N-1)/N of a worker's bytes across; two-level averaging sends each worker's
    slice of the host value (``inter_host_bytes``), so the host's p workers send p slices."""
    if run.get("inter_host_bytes") is not None:
        return run["inter_host_bytes"] * rec["tasks_per_host"] / 1e6
    n = rec["hosts"] * rec["tasks_per_host"]
    return run["bytes_communicated"] * 2 * (n - 1) / n / 1e6


def variant_rows(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per (setting, variant): medians over the repeats and ratios to ``flat``'s medians."""
    out = []
    for r in records:
        name = f"{when(r)}: {r['model']}, {r['mbit']:g} Mbit/s, {r['split']}"
        meds = {}
        for v, runs in r["runs"].items():
            meds[v] = {
                k: median([x[k] for x in runs if x.get(k) is not None])
                for k in ("wall_s", "test_accuracy", "comm_s", "compute_s", "syncs", "bytes_communicated")
            }
            hs = [x["host_syncs"] for x in runs if x.get("host_syncs") is not None]
            meds[v]["host_syncs"] = median(hs) if hs else None
            meds[v]["slow_mb"] = median([_slow_link_mb(r, x) for x in runs])
        base = meds.get("flat")
        for v, m in meds.items():
            row = dict(setting=name, variant=v, repeats=len(r["runs"][v]), **m)
            row["accuracy_pct"] = 100 * m["test_accuracy"]
            if base is not None:
                row["wall_ratio"] = m["wall_s"] / base["wall_s"]
                row["sync_ratio"] = m["comm_s"] / base["comm_s"] if base["comm_s"] else None
                row["slow_ratio"] = m["slow_mb"] / base["slow_mb"]
                row["accuracy_delta"] = 100 * (m["test_accuracy"] - base["test_accuracy"])
            out.append(row)
    return out


def setting_rows(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    keys = ("model", "mbit", "split", "hosts", "tasks_per_host", "interval", "steps", "batch_size")
    return [
        dict(
            {k: r[k] for k in keys},
            when=when(r),
            load=r.get("load_average_1m"),
            cores=r.get("cores"),
            host_interval=r.get("host_interval")
            if any(v.startswith("two_level") for v in r["runs"])
            else None,
            correction=r.get("correction", "auto"),
        )
        for r in records
    ]


PAGE = Page(
    "cheapsync",
    "Cheaper syncs: compressed model deltas and two-level averaging on hosts of several workers",
    "Skip-and-correct (vrl or gradient, as `--correction=auto` picks for the optimizer) at the same global "
    "H on workers placed as hosts of several workers (`tf_commopt.cluster --hosts --tasks-per-host`, the "
    "settings table says how many: host mates talk unshaped, the hosts through the capped link): `flat` "
    "sends float32 models in a ring over every worker; `bf16` / `fp16` the period's model delta in half "
    "precision with error feedback (`--compression`); `two_level` averages the host mates every "
    "`--host_interval` steps and, every H, crosses the hosts once per host value, each worker carrying "
    "its slice (`--host_interval`); `two_level_bf16` both; `two_level_int8` two-level with the hosts "
    "exchanging int8 blocks (a float32 scale each) by all-gather. Wall time is the runner's training time "
    "(start-up excluded); sync s is the summed time of the global syncs (host syncs apart); bytes/worker "
    "is what one worker put into all-reduces, host mates' included; MB on the slow link is what one host "
    "sends the other, derived from the records as the bench module's docstring says. The syncs include "
    "the run's last, out-of-rhythm average before evaluation (float32; two-level variants send it "
    "across the hosts once too) when the last step was not a scheduled sync; newer records skip it when "
    "it was (their syncs column counts one less). Wall time includes the first call (graph building), which compression "
    "lengthens. Medians of the repeats, variants interleaved; ratios are to flat's medians.",
    [
        Table(
            "Settings",
            setting_rows,
            [
                ("when (UTC)", "when", ""),
                ("model", "model", ""),
                ("inter-host Mbit/s", "mbit", "g"),
                ("split", "split", ""),
                ("hosts", "hosts", "d"),
                ("workers/host", "tasks_per_host", "d"),
                ("H", "interval", "d"),
                ("h (two-level)", "host_interval", "d"),
                ("correction", "correction", ""),
                ("steps", "steps", "d"),
                ("batch", "batch_size", "d"),
                ("load (1 min, at the end)", "load", ".2f"),
                ("cores", "cores", "d"),
            ],
        ),
        Table(
            "Flat against compressed and two-level, same global H",
            variant_rows,
            [
                ("setting", "setting", ""),
                ("variant", "variant", ""),
                ("wall s", "wall_s", ".1f"),
                ("wall / flat", "wall_ratio", ".2f"),
                ("sync s", "comm_s", ".1f"),
                ("sync / flat", "sync_ratio", ".2f"),
                ("compute s", "compute_s", ".1f"),
                ("syncs", "syncs", "g"),
                ("host syncs", "host_syncs", "g"),
                ("bytes/worker", "bytes_communicated", ".3g"),
                ("MB on the slow link", "slow_mb", ".1f"),
                ("slow link / flat", "slow_ratio", ".2f"),
                ("test acc. %", "accuracy_pct", ".2f"),
                ("Δ acc. (points)", "accuracy_delta", "+.2f"),
                ("repeats", "repeats", "d"),
            ],
        ),
    ],
)

if __name__ == "__main__":
    raise SystemExit(main())
