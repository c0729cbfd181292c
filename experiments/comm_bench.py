"""Time to accuracy on a bandwidth-limited local cluster: SSGD, local SGD and skip-and-correct (fixed H and
``interval="auto"``), the compute-only bound, and the interval-selection overhead of ``auto`` against
AdaComm-style and grid search. Page: docs/results/comm.md (:mod:`experiments.comm_page`).

A sweep of runner launches: every (setting, variant) is one run on ``--workers`` processes (one CPU replica
each) on a loopback shaped to the setting's Mbit/s (``--topology``). Settings are ``model:mbit:split``
(``iid``, or ``non_iid`` = label-skewed shards), optionally ``=variant,...``. Every run but compute-only
evaluates the averaged model every ``--eval_every`` steps (runner ``--eval_every``: the clock pauses).

Variants: ``ssgd``, ``local_sgd`` (no correction, H), ``sc`` (vrl, H), ``sc_auto`` (vrl, ``interval="auto"``),
``adacomm`` (vrl + AdaComm-style, runner ``--interval_search=adacomm``), ``grid`` (vrl + grid search before
training, its trials counted in the wall time) and ``compute_only`` (no communication, no evaluation).

Example:
    python -m experiments.comm_bench --settings=mlp:100:iid --variants=ssgd,sc_auto --steps=12 --workers=2 \\
        --out=/tmp/comm.jsonl
    python -m experiments.comm_bench --out=docs/results/comm.jsonl && python -m experiments.report comm
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from experiments import _cli
from experiments.harness import Launch, Sweep, run_sweep

VARIANTS = {
    "ssgd": ["--strategy=ssgd"],
    "local_sgd": ["--strategy=local_sgd", "--interval={h}"],
    "sc": ["--strategy=skip_correct", "--correction=vrl", "--interval={h}"],
    "sc_auto": ["--strategy=skip_correct", "--correction=vrl", "--interval=auto"],
    "adacomm": ["--strategy=skip_correct", "--correction=vrl", "--interval={h}", "--interval_search=adacomm"],
    "grid": ["--strategy=skip_correct", "--correction=vrl", "--interval={h}", "--interval_search=grid"],
    "compute_only": ["--strategy=local_sgd", "--interval=1000000000"],
}
DEFAULT_SETTINGS = [
    "cnn:100:iid=ssgd,local_sgd,sc,sc_auto,adacomm,grid,compute_only",
    "cnn:100:non_iid=ssgd,local_sgd,sc,sc_auto",
    "cnn:1000:iid=ssgd,sc,sc_auto",
    "big_mlp:1000:iid=ssgd,local_sgd,sc,sc_auto,compute_only",
]
KEEP = (
    "param_bytes",
    "steps",
    "wall_s",
    "ms_per_step",
    "curve",
    "test_accuracy",
    "test_loss",
    "interval",
    "syncs",
    "comm_s",
    "compute_s",
    "interval_t_comm_s",
    "interval_t_comp_s",
    "interval_overhead_s",
    "interval_selection_comm_s",
    "adacomm_history",
    "grid_chosen",
    "cluster_wall_s",
)


def define(fv: Any) -> None:
    from absl import flags

    d = dict(flag_values=fv)
    flags.DEFINE_list("settings", DEFAULT_SETTINGS, "model:mbit:split[=variant,...] entries", **d)
    flags.DEFINE_list("variants", [], "override the variants of every setting", **d)
    flags.DEFINE_integer("workers", 4, "worker processes", **d)
    flags.DEFINE_string("topology", "switch", "switch or shared (see tf_commopt.cluster)", **d)
    flags.DEFINE_integer("steps", 0, "steps per run (0: 144 for cnn, 48 otherwise)", **d)
    flags.DEFINE_integer("eval_every", 0, "evaluate every this many steps (0: steps / 6)", **d)
    flags.DEFINE_integer("interval", 4, "H of the fixed-H variants (and AdaComm's start)", **d)
    flags.DEFINE_integer("batch_size", 128, "global batch", **d)
    flags.DEFINE_float("learning_rate", 0.05, "SGD learning rate", **d)
    flags.DEFINE_float("momentum", 0.9, "SGD momentum", **d)
    flags.DEFINE_integer("non_iid_classes", 2, "labels per worker in the non_iid split", **d)
    flags.DEFINE_integer("seed", 0, "seed", **d)
    flags.DEFINE_string(
        "out", "", "append one record per setting to this .jsonl (a .md: the .jsonl beside it)", **d
    )
    flags.DEFINE_bool("append", True, "records are always appended (kept for older commands)", **d)
    flags.DEFINE_bool("report_only", False, "render --out's page from the .jsonl beside it, no runs", **d)


def parse_setting(entry: str, override: List[str]) -> Dict[str, Any]:
    """``'cnn:100:iid=ssgd,sc'`` -> ``{"model", "mbit", "split", "variants"}``; UsageError naming the flag.

    >>> parse_setting("cnn:100:non_iid=ssgd,sc", [])["variants"]
    ['ssgd', 'sc']
    """
    head, _, vs = entry.partition("=")
    parts = head.split(":")
    if len(parts) != 3 or parts[2] not in ("iid", "non_iid"):
        _cli.fail(f"--settings: expected model:mbit:iid|non_iid[=variants], got {entry!r}")
    try:
        mbit = float(parts[1])
    except ValueError:
        _cli.fail(f"--settings: bad Mbit/s in {entry!r}")
    variants = override or (vs.split(",") if vs else list(VARIANTS))
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        _cli.fail(
            f"--{'variants' if override else 'settings'}: unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}"
        )
    return {"model": parts[0], "mbit": mbit, "split": parts[2], "variants": variants}


def _reduce(rec: Dict[str, Any]) -> Dict[str, Any]:
    """A runner record -> the run this bench keeps: wall = training without the evaluations, plus the
    grid search's trials (whose steps are not the run's: those are the curve's last step)."""
    grid = rec.get("interval_overhead_s", 0.0) if "grid_chosen" in rec else 0.0
    wall = rec["wall_s"] - rec.get("eval_s", 0.0) + grid
    steps = rec["curve"][-1]["step"] if rec.get("curve") else rec["steps"]
    rec = dict(rec, steps=steps, wall_s=round(wall, 3), ms_per_step=round(1000 * wall / steps, 1))
    return {k: rec[k] for k in KEEP if k in rec}


def sweeps(fv: Any) -> List[Sweep]:
    """One sweep per setting (settings may differ in their variants)."""
    out = []
    for entry in fv.settings:
        s = parse_setting(entry, fv.variants)
        steps = fv.steps or (144 if s["model"] == "cnn" else 48)
        every = fv.eval_every or max(1, steps // 6)

        def launch(setting: str, variant: str, s=s, steps=steps, every=every) -> Launch:
            argv = [
                f"--model={s['model']}",
                f"--steps={steps}",
                f"--batch_size={fv.batch_size}",
                f"--seed={fv.seed}",
            ]
            argv += [f"--learning_rate={fv.learning_rate}", f"--momentum={fv.momentum}", "--max_interval=64"]
            argv += [f"--non_iid_classes={fv.non_iid_classes}"] if s["split"] == "non_iid" else []
            argv += [a.format(h=fv.interval) for a in VARIANTS[variant]]
            argv += [] if variant == "compute_only" else [f"--eval_every={every}"]
            return Launch(argv, workers=fv.workers, mbit=s["mbit"], topology=fv.topology, timeout=900)

        head = {k: s[k] for k in ("model", "mbit", "split")}
        extra = dict(head, workers=fv.workers, topology=fv.topology, interval=fv.interval)
        out.append(
            Sweep("comm", [entry.partition("=")[0]], s["variants"], 1, launch, extra=extra, reduce=_reduce)
        )
    return out


def _body(fv: Any) -> int:
    import os

    jsonl = os.path.splitext(fv.out)[0] + ".jsonl" if fv.out else ""
    if fv.report_only:
        if not fv.out.endswith(".md") or not os.path.exists(jsonl):
            _cli.fail(f"--report_only: needs --out=PAGE.md with its .jsonl beside it ({jsonl!r} not found)")
        from experiments.comm_page import PAGE
        from experiments.page import load_jsonl, write_page

        write_page(PAGE, jsonl, fv.out)
        PAGE.draw(load_jsonl(jsonl), os.path.dirname(fv.out) or ".")
        return 0
    for sw in sweeps(fv):  # every setting checked before the first run
        run_sweep(sw, jsonl, _cli.command(fv))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m experiments.comm_bench`` in process; returns the exit code."""
    return _cli.main("experiments.comm_bench", argv, define, _body)


if __name__ == "__main__":
    raise SystemExit(main())
