"""The chaos page, docs/results/chaos.md, from the records of :mod:`experiments.chaos_bench`.

Example:
    python -m experiments.chaos_bench --repeats=3 --out=docs/results/chaos.jsonl
    python -m experiments.report chaos
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from experiments.page import Page, Table, median, verdict

__all__ = ["PAGE", "EXACT", "ACCURACY_POINTS", "rows_outcome", "rows_faults", "rows_costs"]

EXACT = 1e-5  # final weights "equal" to the uninterrupted run's: largest absolute difference
ACCURACY_POINTS = 0.5  # where the data order differs by design: test accuracy within this many points


def _latest(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {}
    for r in records:
        out[r["setting"]] = r
    return list(out.values())


def _judge(variant: str, diff: Optional[float], points: Optional[float]) -> str:
    if variant in ("uninterrupted", "no_backups") or diff is None:
        return "—"
    if diff <= EXACT:
        return f"met (equal weights: ≤ {EXACT:g})"
    ok = points is not None and points <= ACCURACY_POINTS
    return f"{verdict(ok)} (weights differ; goal: accuracy within {ACCURACY_POINTS:g} points)"


def rows_outcome(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    for r in _latest(records):
        ref = r["runs"].get("uninterrupted", [])
        for v, runs in r["runs"].items():
            diffs = [x.get("max_weight_diff") for x in runs]
            pts = [100 * abs(x["test_accuracy"] - u["test_accuracy"]) for x, u in zip(runs, ref)]
            diff = max(diffs) if None not in diffs and diffs else None
            row = dict(
                setting=r["setting"], variant=v, repeats=len(runs), diff=diff, points=max(pts, default=None)
            )
            row.update(
                restarts=[x.get("cluster_restarts") for x in runs], steps=[x.get("steps") for x in runs]
            )
            row.update(
                acc=median([x["test_accuracy"] for x in runs]),
                wall=median([x["cluster_wall_s"] for x in runs]),
            )
            out.append(dict(row, ok=_judge(v, diff, row["points"] if v != "no_backups" else None)))
    return out


def rows_faults(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    for r in _latest(records):
        startup = median([x.get("startup_s") for x in r["runs"].get("uninterrupted", [])]) or None
        for v, runs in r["runs"].items():
            for x in runs:
                for f in x.get("faults", []):
                    row = dict(f, setting=r["setting"], variant=v, seed=x.get("seed"))
                    if f.get("restart_s") is not None and startup is not None:
                        row["over"] = f["restart_s"] - startup  # the restart beyond a cold start
                    out.append(dict(row, ok=verdict(f.get("met"))))
    return out


def rows_costs(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    for r in _latest(records):
        ref, plain = r["runs"].get("uninterrupted", []), r["runs"].get("no_backups", [])
        row = dict(setting=r["setting"], every=r.get("backup_every"))
        row.update(
            startup=median([x.get("startup_s") for x in ref]), step=median([x.get("step_s") for x in ref])
        )
        row["period"] = row["every"] * row["step"] if row["every"] and ref else None
        row.update(
            wall=median([x["wall_s"] for x in ref]),
            plain=median([x["wall_s"] for x in plain]) if plain else None,
        )
        row["ratio"] = row["wall"] / row["plain"] if row["plain"] else None
        out.append(row)
    return out


PAGE = Page(
    "chaos",
    "Chaos: collective runs that recover by themselves",
    "`experiments.train --strategy=skip_correct` on a local collective cluster run by "
    "`tf_commopt.cluster --max-restarts`, with workers killed while the run goes on, against the "
    "uninterrupted run of the same repeat (same flags and backups, deterministic data order; variants "
    "interleaved). `chaos`: three SIGKILLs, one per attempt: a random worker held inside a backup write "
    "(between the write and the rename), a worker killed while the others wait for it inside a sync's "
    "all-reduce, and a random worker a random time after the third attempt's first step (seeded). "
    "`preempted`: SIGTERM to a random worker before a random step: every worker backs up at the next "
    "sync, exits as preempted and the launcher starts them all again. `no_backups`: the run without a "
    "backup directory (another data order by design: only its time is compared). Goal: final weights "
    "equal to the uninterrupted run's, or else the same accuracy within a tolerance (both in the goal "
    "column); the time a failure costs at most the start-up plus one backup period of the "
    "uninterrupted run.",
    [
        Table(
            "Final weights and accuracy",
            rows_outcome,
            [
                ("setting", "setting", ""),
                ("variant", "variant", ""),
                ("repeats", "repeats", "d"),
                ("restarts", "restarts", ""),
                ("steps", "steps", ""),
                ("max abs(w − uninterrupted)", "diff", ".2g"),
                ("accuracy (median)", "acc", "%"),
                ("max points from uninterrupted", "points", ".1f"),
                ("cluster wall s (median)", "wall", ".1f"),
                ("goal", "ok", ""),
            ],
        ),
        Table(
            "Time lost per failure",
            rows_faults,
            [
                ("setting", "setting", ""),
                ("variant", "variant", ""),
                ("seed", "seed", "d"),
                ("fault", "phase", ""),
                ("attempt", "attempt", "d"),
                ("resumed at step", "resumed_at", "d"),
                ("lost s", "lost_s", ".1f"),
                ("work redone s", "redone_s", ".1f"),
                ("restart s", "restart_s", ".1f"),
                ("restart − start-up s", "over", "+.1f"),
                ("goal s", "goal_s", ".1f"),
                ("goal", "ok", ""),
            ],
            "Lost = from the end of the backup resumed from to the end of the first step after the restart "
            "(from the ledger each task keeps beside its backups); work redone = backup to kill; restart = "
            "kill (for SIGTERM: the backup) to that first step; restart − start-up: what a restart takes beyond the "
            "uninterrupted run's start-up (median). Goal = start-up + one backup period of the "
            "uninterrupted run (table below).",
        ),
        Table(
            "What the goal is made of, and what the backups cost",
            rows_costs,
            [
                ("setting", "setting", ""),
                ("backup every (steps)", "every", "d"),
                ("start-up s (launch to first step)", "startup", ".1f"),
                ("step s", "step", ".3f"),
                ("backup period s", "period", ".1f"),
                ("fit wall s, backups", "wall", ".1f"),
                ("fit wall s, no backups", "plain", ".1f"),
                ("backups / none", "ratio", ".2f"),
            ],
            "Medians over the repeats of the uninterrupted and no_backups runs.",
        ),
    ],
)
