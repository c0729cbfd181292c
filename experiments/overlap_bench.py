"""Overlapped syncs on the shaped cluster: wall time against the perfect-overlap bound and accuracy
against the blocking version. Page: docs/results/overlap.md.

For every ``--settings`` entry (``model:split``, split ``iid`` or ``non_iid`` = label-skewed shards, each
worker mostly holding ``--non_iid_classes`` labels) three variants of the runner (``--strategy=skip_correct
--momentum=0``, so the correction is vrl) on a ``--workers`` cluster with ``--bandwidth_mbit`` per link,
repeated ``--repeats`` times with the variants interleaved:

* ``blocking``: H = ``--interval``, each sync stops every worker;
* ``overlap``: the same with ``--overlap`` (the all-reduce runs behind the next H local steps);
* ``compute_only``: H larger than the run: the same steps with no communication at all.

communication-only = blocking − compute-only; the perfect-overlap bound = max(compute-only,
communication-only). One record per setting (medians and every run) is appended to ``--out``.

Example:
    python -m experiments.overlap_bench --settings=mlp:iid --repeats=1 --steps=40 --out=/tmp/overlap.jsonl
    python -m experiments.overlap_bench --out=docs/results/overlap.jsonl && python -m experiments.report overlap
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

from experiments import _cli
from experiments.harness import Launch, Sweep, run_sweep
from experiments.page import Page, Table, median, verdict, write_page

VARIANTS = ("blocking", "overlap", "compute_only")
SPLITS = {"iid": "IID", "non_iid": "label-skewed"}
GOALS = {"overlap_vs_bound": 1.15, "overlap_vs_blocking": 1.0, "accuracy_points": 1.5}
NO_SYNC = 10**6  # compute-only: H beyond any run
KEEP = (
    "wall_s",
    "first_step_s",
    "last_step_end_s",
    "train_end_s",
    "drain_wait_s",
    "test_accuracy",
    "interval",
    "syncs",
    "comm_s",
    "first_sync_s",
    "compute_s",
    "background_comm_s",
    "bytes_communicated",
)


def define(fv: Any) -> None:
    from absl import flags

    flags.DEFINE_list(
        "settings", ["mlp:iid", "mlp:non_iid", "cnn:iid"], "model:split entries", flag_values=fv
    )
    flags.DEFINE_integer("workers", 2, "worker processes", flag_values=fv)
    flags.DEFINE_float("bandwidth_mbit", 10.0, "link rate (Mbit/s) of the shaped cluster", flag_values=fv)
    flags.DEFINE_string("topology", "switch", "switch (a shaped link per worker) or shared", flag_values=fv)
    flags.DEFINE_integer("interval", 16, "H of the blocking and overlapped runs", flag_values=fv)
    flags.DEFINE_integer("steps", 300, "training steps per run", flag_values=fv)
    flags.DEFINE_integer("repeats", 3, "repetitions (variants interleaved; medians reported)", flag_values=fv)
    flags.DEFINE_integer(
        "non_iid_classes", 5, "non_iid settings: labels each worker mostly holds", flag_values=fv
    )
    flags.DEFINE_float("learning_rate", 0.05, "SGD learning rate (momentum 0)", flag_values=fv)
    flags.DEFINE_string("out", "", "append the records to this .jsonl", flag_values=fv)
    flags.DEFINE_string("page", "", "then render this page from --out's records", flag_values=fv)


def train_wall(run: Dict[str, Any]) -> float:
    """fit start → training ended plus, with overlap, the wait for the mean still in flight then."""
    return run["train_end_s"] + run.get("drain_wait_s", 0.0)


def summarize(setting: str, runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Medians per variant, the bound and the ratios (what each record carries besides its runs)."""
    med = {
        v: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "test_accuracy")}
        for v, rs in runs.items()
    }
    for v, rs in runs.items():
        if all("train_end_s" in r for r in rs):
            med[v]["train_wall_s"] = statistics.median(train_wall(r) for r in rs)
    compute, blocking, overlap = (med[v]["wall_s"] for v in ("compute_only", "blocking", "overlap"))
    comm = blocking - compute
    bound = max(compute, comm)
    return {
        "median": med,
        "communication_only_s": round(comm, 3),
        "bound_s": round(bound, 3),
        "overlap_vs_blocking": round(overlap / blocking, 3),
        "overlap_vs_bound": round(overlap / bound, 3),
        "blocking_vs_bound": round(blocking / bound, 3),
        "accuracy_points_vs_blocking": round(
            100 * (med["overlap"]["test_accuracy"] - med["blocking"]["test_accuracy"]), 2
        ),
    }


def sweep(fv: Any) -> Sweep:
    """The bench as data, from the parsed flags."""
    for s in fv.settings:
        model, _, split = s.partition(":")
        from experiments.models import MODELS

        if split not in SPLITS or model not in MODELS:
            _cli.fail(f"--settings: {s!r} is not model:split with a model of {MODELS} and split iid|non_iid")
    for name in ("workers", "interval", "steps", "repeats", "non_iid_classes"):
        if getattr(fv, name) < 1:
            _cli.fail(f"--{name}: must be >= 1, got {getattr(fv, name)}")
    if not fv.bandwidth_mbit > 0:
        _cli.fail(f"--bandwidth_mbit: must be > 0, got {fv.bandwidth_mbit}")

    def launch(setting: str, variant: str) -> Launch:
        model, split = setting.split(":")
        argv = [f"--model={model}", f"--steps={fv.steps}", "--batch_size=128", "--momentum=0"]
        argv += [f"--learning_rate={fv.learning_rate}", "--strategy=skip_correct"]
        argv += [f"--non_iid_classes={fv.non_iid_classes}"] if split == "non_iid" else []
        argv += [f"--interval={NO_SYNC if variant == 'compute_only' else fv.interval}"]
        argv += ["--overlap"] if variant == "overlap" else ["--nooverlap"]
        return Launch(argv, workers=fv.workers, mbit=fv.bandwidth_mbit, topology=fv.topology)

    def describe(setting: str) -> Dict[str, Any]:
        model, split = setting.split(":")
        skew = fv.non_iid_classes if split == "non_iid" else 0
        return dict(
            model=model,
            split=split,
            workers=fv.workers,
            bandwidth_mbit=fv.bandwidth_mbit,
            non_iid_classes=skew,
        )

    extra = dict(topology=fv.topology, interval=fv.interval, steps=fv.steps, learning_rate=fv.learning_rate)
    sw = Sweep("overlap", fv.settings, VARIANTS, fv.repeats, launch, KEEP, describe, summarize, extra)
    sw.describe = lambda s: dict(
        describe(s), non_iid_classes=fv.non_iid_classes if s.endswith(":non_iid") else 0
    )
    return sw


def _body(fv: Any) -> int:
    if fv.page and not fv.out:
        _cli.fail("--page: needs --out (the records it is rendered from)")
    run_sweep(sweep(fv), fv.out, _cli.command(fv))
    if fv.page:
        write_page(PAGE, fv.out, fv.page)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.overlap_bench`` in process; returns the exit code."""
    return _cli.main("experiments.overlap_bench", argv, define, _body)


# ------------------------------------------------------------------------------------------------ page
def _latest(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {}
    for r in records:
        out[r["setting"]] = r
    return list(out.values())


def _walls(r: Dict[str, Any], wall: Any) -> Optional[Dict[str, float]]:
    if not all(wall(x) is not None for v in VARIANTS for x in r["runs"][v]):
        return None
    w = {v: median([wall(x) for x in r["runs"][v]]) for v in VARIANTS}
    comm = w["blocking"] - w["compute_only"]
    bound = max(w["compute_only"], comm)
    vb, vo = w["overlap"] / w["blocking"], w["overlap"] / bound
    return {
        "blocking": w["blocking"],
        "overlap": w["overlap"],
        "compute": w["compute_only"],
        "comm": comm,
        "bound": bound,
        "vs_blocking": f"{vb:.3f} ({verdict(vb <= GOALS['overlap_vs_blocking'])})",
        "vs_bound": f"{vo:.3f} ({verdict(vo <= GOALS['overlap_vs_bound'])})",
    }


def _setting(r: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "model": r["model"],
        "split": SPLITS.get(r["split"], r["split"]),
        "net": f"{r['workers']} × {r['bandwidth_mbit']:g} ({r['topology']})",
        "interval": r["interval"],
        "steps": r["steps"],
        "repeats": r["repeats"],
    }


def rows_wall(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    for r in _latest(records):
        acc = {v: median([x["test_accuracy"] for x in r["runs"][v]]) for v in ("blocking", "overlap")}
        points = 100 * (acc["overlap"] - acc["blocking"])
        ok = verdict(abs(points) <= GOALS["accuracy_points"])
        row = dict(_setting(r), **_walls(r, lambda x: x["wall_s"]), acc_blocking=acc["blocking"])
        out.append(dict(row, acc_overlap=acc["overlap"], points=f"{points:+.1f} ({ok})"))
    return out


def rows_train_wall(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    for r in _latest(records):
        w = _walls(r, lambda x: train_wall(x) if "train_end_s" in x else None)
        if w:
            out.append(dict(_setting(r), **w))
    return out


def rows_first_step(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    for r in _latest(records):
        if not all("first_step_s" in x for v in VARIANTS for x in r["runs"][v]):
            continue
        w = {v: median([x["wall_s"] for x in r["runs"][v]]) for v in VARIANTS}
        first = median([x["first_step_s"] for x in r["runs"]["compute_only"]])
        serial = max(w["compute_only"], first + w["blocking"] - w["compute_only"])
        hideable = min(w["compute_only"] - first, w["blocking"] - w["compute_only"])
        co = [x["wall_s"] for x in r["runs"]["compute_only"]]
        row = dict(_setting(r), first=first, serial=serial, vs_serial=w["overlap"] / serial)
        row.update(hideable=hideable, hidden=w["blocking"] - w["overlap"], co_min=min(co), co_max=max(co))
        ov = r["runs"]["overlap"]
        if all("train_end_s" in x and "background_comm_s" in x for x in ov):
            row["floor"] = median([x["first_step_s"] + x["background_comm_s"] for x in ov])
            row["vs_floor"] = median([train_wall(x) for x in ov]) / row["floor"]
        out.append(row)
    return out


def rows_time(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    for r in _latest(records):
        for v in VARIANTS:
            runs = r["runs"][v]
            rest = median([x["wall_s"] - x.get("comm_s", 0) - x.get("compute_s", 0) for x in runs])
            bg = [x["background_comm_s"] for x in runs if "background_comm_s" in x]
            row = dict(_setting(r), variant=v, syncs=median([x.get("syncs") for x in runs]), rest=rest)
            row.update(
                comm=median([x.get("comm_s") for x in runs]),
                compute=median([x.get("compute_s") for x in runs]),
            )
            out.append(dict(row, background=median(bg) if bg else None))
    return out


_SET = [("model", "model", ""), ("shards", "split", "")]
_WALLS = [
    ("blocking s", "blocking", ".2f"),
    ("overlap s", "overlap", ".2f"),
    ("compute-only s", "compute", ".2f"),
    ("comm-only s", "comm", ".2f"),
    ("bound s", "bound", ".2f"),
    (f"overlap / blocking (goal ≤ {GOALS['overlap_vs_blocking']:g})", "vs_blocking", ""),
    (f"overlap / bound (goal ≤ {GOALS['overlap_vs_bound']:g})", "vs_bound", ""),
]
PAGE = Page(
    "overlap",
    "Overlapped syncs: hiding the global averaging behind local steps",
    "`SkipCorrectStrategy(overlap=True)` (runner: `--overlap`) against the same run with blocking syncs "
    "and against compute-only runs (H beyond the run: no communication), all runner runs with `--strategy=skip_correct` "
    "and no momentum (so the correction is vrl) on the shaped cluster, variants interleaved, medians over the repeats. "
    "Wall = `model.fit`; communication-only = blocking − compute-only; the perfect-overlap bound = "
    "max(compute-only, communication-only). The teardown-free wall ends at `on_train_end` (plus the "
    "wait for the last in-flight mean); the first step cannot overlap anything, so a second bound takes it "
    "as serial, and an overlapped run cannot end before its first step plus its background all-reduces.",
    [
        Table(
            "Wall time and accuracy",
            rows_wall,
            [*_SET, ("workers × Mbit/s", "net", ""), ("H", "interval", "d"), ("steps", "steps", "d")]
            + [("repeats", "repeats", "d"), *_WALLS, ("accuracy blocking", "acc_blocking", "%")]
            + [
                ("accuracy overlap", "acc_overlap", "%"),
                (f"points (goal ± {GOALS['accuracy_points']:g})", "points", ""),
            ],
        ),
        Table("Teardown-free wall (fit start to the end of training)", rows_train_wall, [*_SET, *_WALLS]),
        Table(
            "The first step and what overlap could hide",
            rows_first_step,
            [
                *_SET,
                ("first step s", "first", ".2f"),
                ("bound, first step serial s", "serial", ".2f"),
                ("overlap / that", "vs_serial", ".3f"),
                ("first step + background all-reduces s", "floor", ".2f"),
                ("teardown-free overlap / that", "vs_floor", ".3f"),
                ("hideable s", "hideable", ".2f"),
                ("hidden (blocking − overlap) s", "hidden", ".2f"),
                ("compute-only min s", "co_min", ".2f"),
                ("compute-only max s", "co_max", ".2f"),
            ],
            "Hideable = min(compute-only − first step, communication-only).",
        ),
        Table(
            "Where the time goes (medians, seconds)",
            rows_time,
            [
                *_SET,
                ("variant", "variant", ""),
                ("syncs", "syncs", "g"),
                ("comm_s", "comm", ".2f"),
                ("background_comm_s", "background", ".2f"),
                ("compute_s", "compute", ".2f"),
                ("fit wall − comm_s − compute_s", "rest", ".2f"),
            ],
            "From each run's `strategy.stats()`, which also counts the runner's final sync after `fit`.",
        ),
    ],
)

if __name__ == "__main__":
    raise SystemExit(main())
