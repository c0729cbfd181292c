"""The page of :mod:`experiments.comm_bench` (docs/results/comm.md): time-to-accuracy tables, the
interval-selection overhead, the closed-form scaling beyond one machine, and the two figures.

Example:
    python -m experiments.report comm       # the page and, beside it, comm.png and comm_scaling.png
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from experiments.page import Page, Table
from tf_commopt.core.scaling import scaling_table

ORDER = ("ssgd", "local_sgd", "sc", "sc_auto", "adacomm", "grid", "compute_only")
SCALE_WORKERS = (8, 16, 32, 64, 128, 256, 512, 1024)
RATES = (100.0, 1000.0, 10000.0)
TARGETS = {"cnn": 0.9, "big_mlp": 0.85}
Records = List[Dict[str, Any]]
_OLD_COMMAND = (
    "python -m experiments.comm_bench --out=docs/results/comm.jsonl && python -m experiments.comm_bench "
    "--settings=big_mlp:100:iid --variants=ssgd,sc_auto --steps=24 --eval_every=8 --out=docs/results/comm.jsonl"
)


def flat(records: Records) -> Records:
    """One row per run with its setting (sweep records and the older one-row-per-run lines)."""
    out = []
    for r in records:
        if "runs" not in r:
            out.append(r)
            continue
        for v, rs in r["runs"].items():
            out += [dict(x, variant=v, model=r["model"], mbit=r["mbit"], split=r["split"]) for x in rs]
    return out


def groups(records: Records) -> Dict[Tuple[str, float, str], Dict[str, Dict[str, Any]]]:
    """(model, mbit, split) -> variant -> its latest run."""
    out: Dict[Tuple[str, float, str], Dict[str, Dict[str, Any]]] = {}
    for r in flat(records):
        out.setdefault((r["model"], r["mbit"], r["split"]), {})[r["variant"]] = r
    return dict(sorted(out.items(), key=lambda kv: (kv[0][0] != "cnn", kv[0][1], kv[0][2])))


def first(curve: List[Dict[str, float]], target: float, key: str) -> Optional[float]:
    """``key`` of the first curve point at or above ``target`` test accuracy."""
    return next((p[key] for p in curve if p["test_accuracy"] >= target), None)


def _compute_only(records: Records, model: str) -> Optional[Dict[str, Any]]:
    return next((r for r in flat(records) if r["model"] == model and r["variant"] == "compute_only"), None)


def _row(v: str, r: Dict[str, Any], ssgd: Optional[Dict[str, Any]], target: float) -> Dict[str, Any]:
    curve = r.get("curve", [])
    tta, steps_t = first(curve, target, "wall_s"), first(curve, target, "step")
    ssgd_tta = first(ssgd["curve"], target, "wall_s") if ssgd else None
    if v == "compute_only" and ssgd:
        ssgd_steps = first(ssgd["curve"], target, "step")
        tta = None if ssgd_steps is None else ssgd_steps * r["ms_per_step"] / 1000.0
    row = {k: r.get(k) for k in ("steps", "wall_s", "ms_per_step", "comm_s", "interval_overhead_s")}
    row.update(
        variant=v, tta=tta, steps_to_target=steps_t, syncs=r.get("syncs", r["steps"] if v == "ssgd" else None)
    )
    row["h"] = "∞" if v == "compute_only" else r.get("interval", 1 if v == "ssgd" else None)
    row["acc"] = None if v == "compute_only" else r.get("test_accuracy")
    if ssgd and v != "ssgd":
        row["wall_saved"] = f"{100 * (1 - r['wall_s'] / ssgd['wall_s']):+.0f}%"
        row["tta_saved"] = f"{100 * (1 - tta / ssgd_tta):+.0f}%" if tta and ssgd_tta else None
    row["selection_comm"] = r.get("interval_selection_comm_s")
    return row


def rows_tta(records: Records) -> Records:
    out = []
    for (model, mbit, split), vs in groups(records).items():
        target, ssgd = TARGETS.get(model, 0.9), vs.get("ssgd")
        mb = next(iter(vs.values()))["param_bytes"] / 1e6
        setting = dict(setting=f"{model}, {mbit:g} Mbit/s, {split}", mb=mb, target=target)
        co = vs.get("compute_only") or _compute_only(records, model)
        for v in ORDER:
            r = vs.get(v)
            if v == "compute_only" and r is None and co is not None and ssgd is not None:
                r = dict(co, curve=[], steps=ssgd["steps"], wall_s=co["ms_per_step"] * ssgd["steps"] / 1000.0)
            if r is not None:
                out.append(dict(setting, **_row(v, r, ssgd, target)))
    return out


def rows_auto(records: Records) -> Records:
    out = []
    for (model, mbit, split), vs in groups(records).items():
        a = vs.get("sc_auto")
        if a and "interval_t_comm_s" in a:
            row = dict(setting=f"{model}, {mbit:g} Mbit/s, {split}", h=a["interval"])
            out.append(dict(row, t_comm=1000 * a["interval_t_comm_s"], t_comp=1000 * a["interval_t_comp_s"]))
    return out


def rows_overhead(records: Records) -> Records:
    out = []
    for (model, mbit, split), vs in groups(records).items():
        a, ada, g = vs.get("sc_auto"), vs.get("adacomm"), vs.get("grid")
        if not a or not (ada or g):
            continue
        ours = a.get("interval_overhead_s", 0.0)
        row = dict(
            setting=f"{model}, {mbit:g} Mbit/s, {split}",
            ours=ours,
            with_syncs=ours + a.get("interval_selection_comm_s", 0.0),
        )
        row.update(ada=ada and ada["interval_overhead_s"], grid=g and g["interval_overhead_s"])
        if ours:  # a run shorter than the probe chose no H: nothing to compare
            row.update(
                grid_x=g and g["interval_overhead_s"] / ours, ada_x=ada and ada["interval_overhead_s"] / ours
            )
        out.append(row)
    return out


def scaling(records: Records) -> Dict[str, Dict[str, Any]]:
    """model -> its lowest-rate ``auto`` run with ``tabs``: rate -> the closed-form scaling rows."""
    src = [r for r in flat(records) if r["variant"] == "sc_auto" and "interval_t_comp_s" in r]
    by_model: Dict[str, Dict[str, Any]] = {}
    for r in sorted(src, key=lambda r: r["mbit"]):
        by_model.setdefault(r["model"], r)
    return {
        m: dict(
            r,
            tabs={
                x: scaling_table(
                    SCALE_WORKERS, r["param_bytes"], r["interval_t_comp_s"], 60000, 32, x, latency_s=50e-6
                )
                for x in RATES
            },
        )
        for m, r in sorted(by_model.items())
    }


def rows_scaling(records: Records) -> Records:
    out = []
    for model, r in scaling(records).items():
        for i, n in enumerate(SCALE_WORKERS):
            row0 = r["tabs"][RATES[0]][i]
            row = dict(
                model=model, mb=r["param_bytes"] / 1e6, t_comp=1000 * r["interval_t_comp_s"], workers=n
            )
            row.update(steps=row0["steps"], compute=row0["compute_only_epoch_s"])
            for x in RATES:
                t = r["tabs"][x][i]
                row[f"r{x:g}"] = (
                    f"H={t['interval']}: {t['ssgd_epoch_s']:.1f} / {t['skip_correct_epoch_s']:.1f} ({100 * t['reduction']:.0f}%)"
                )
            out.append(row)
    return out


def draw(records: Records, results: str) -> None:
    """Write comm.png (test loss against wall-clock) and comm_scaling.png beside the page."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _loss_figure(groups(records), os.path.join(results, "comm.png"), plt)
    _scaling_figure(scaling(records), RATES, os.path.join(results, "comm_scaling.png"), plt)


LABELS = {
    "ssgd": "SSGD",
    "local_sgd": "local SGD (H = 4)",
    "sc": "skip-and-correct (H = 4)",
    "sc_auto": "skip-and-correct (auto H)",
    "adacomm": "AdaComm-style",
    "grid": "grid search (trials included)",
}
COLORS = {
    "ssgd": "#000000",
    "local_sgd": "#56B4E9",
    "sc": "#009E73",
    "sc_auto": "#D55E00",
    "adacomm": "#CC79A7",
    "grid": "#E69F00",
}


def _loss_figure(
    groups: Dict[Tuple[str, float, str], Dict[str, Dict[str, Any]]], path: str, plt: Any
) -> None:
    """Test loss against wall-clock, one panel per setting (CNN settings above, big_mlp below), one colour
    per variant in every panel, log time axis (SSGD's 141 s and auto's 8.6 s both fit; nothing clipped);
    1000 px wide, 11 pt."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    keys = sorted(groups, key=lambda k: (k[0] != "cnn", k[1], k[2]))
    plt.rcParams.update({"font.size": 11})
    ncol = 3
    nrow = (len(keys) + ncol) // ncol  # one free cell for the legend
    fig, axes = plt.subplots(nrow, ncol, figsize=(10, 3.1 * nrow + 0.8), squeeze=False)
    cells = [ax for row in axes for ax in row]
    for ax, key in zip(cells, keys):
        for v in ORDER:
            r = groups[key].get(v)
            pts = [p for p in (r or {}).get("curve", []) if p["wall_s"] > 0]
            if pts:
                ax.plot(
                    [p["wall_s"] for p in pts],
                    [p["test_loss"] for p in pts],
                    marker="o",
                    ms=4,
                    lw=1.6,
                    color=COLORS[v],
                    label=LABELS[v],
                )
        auto = groups[key].get("sc_auto")
        h = f", auto H = {auto['interval']}" if auto else ""
        ax.set_title(f"{key[0]}, {key[1]:g} Mbit/s, {key[2].replace('_', '-')}{h}", fontsize=11)
        ax.set_xscale("log")
        lo, hi = ax.get_xlim()
        ax.set_xticks([t for t in (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500) if lo <= t <= hi])
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3)
    for ax in cells[len(keys) :]:
        ax.axis("off")
    handles = {}
    for ax in cells[: len(keys)]:
        for hd, lb in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lb, hd)
    cells[-1].legend(handles.values(), handles.keys(), loc="center", fontsize=11, frameon=False)
    for row in axes:
        row[0].set_ylabel("test loss")
    fig.supxlabel("training wall-clock seconds (log scale; evaluation excluded)", fontsize=11)
    fig.suptitle(
        "Test loss against wall-clock (lower and further left is better): skip-and-correct saves time\n"
        "where the network dominates (big_mlp); on the small CNN it is mixed",
        fontsize=12,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    plt.rcdefaults()


def _scaling_figure(
    by_model: Dict[str, Dict[str, Any]], rates: Tuple[float, ...], path: str, plt: Any
) -> None:
    """Skip-and-correct's epoch time as a fraction of SSGD's against workers: one panel per model, one
    colour per link rate (three series a panel), lower is better; 1000 px wide, 11 pt."""
    plt.rcParams.update({"font.size": 11})
    fig, axes = plt.subplots(1, len(by_model), figsize=(10, 4.5), sharey=True, squeeze=False)
    colors = ("#D55E00", "#0072B2", "#009E73")
    for ax, (model, r) in zip(axes[0], sorted(by_model.items())):
        for m, color, marker in zip(rates, colors, ("o", "s", "^")):
            rows = r["tabs"][m]
            ax.plot(
                [x["workers"] for x in rows],
                [x["skip_correct_epoch_s"] / x["ssgd_epoch_s"] for x in rows],
                color=color,
                marker=marker,
                ms=5,
                lw=1.8,
                label=f"{m / 1000:g} Gbit/s" if m >= 1000 else f"{m:g} Mbit/s",
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(SCALE_WORKERS), [str(w) for w in SCALE_WORKERS])
        ax.set_title(
            f"{model} ({r['param_bytes'] / 1e6:.1f} MB, t_comp {1000 * r['interval_t_comp_s']:.0f} ms)",
            fontsize=11,
        )
        ax.set_xlabel("workers")
        ax.set_ylim(0, 1.05)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("epoch time: skip-and-correct / SSGD")
    axes[0][-1].legend(title="link per worker", fontsize=10, title_fontsize=10, loc="lower left")
    fig.suptitle(
        "Epoch time relative to SSGD (closed form; lower is better): skip-and-correct saves most\n"
        "on slow links, and on fast links only from a few hundred workers on",
        fontsize=12,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    plt.rcdefaults()


_SETTING = [("setting", "setting", ""), ("MB", "mb", ".2f"), ("target", "target", "%")]
PAGE = Page(
    "comm",
    "Communication interval: time to accuracy on a bandwidth-limited cluster",
    'SSGD against local SGD and skip-and-correct at a fixed H and with `interval="auto"`, and the bound '
    "of compute-only runs (no communication), per setting of model, link rate and split, one run each on "
    "the shaped cluster (one CPU replica per worker). Wall = training seconds on the chief with evaluation "
    "excluded (the clock pauses for the averaging and evaluation), grid-search trials included. TTA = wall "
    "seconds until the averaged model first reaches the target test accuracy at an evaluation point; the "
    "compute-only TTA is SSGD's steps to target times compute-only seconds per step (a setting without "
    "its own compute-only run borrows the same model's). Then what `auto` measured, the selection "
    "overhead of `auto` against AdaComm-style and grid search, and skip-and-correct's epoch time against "
    "SSGD's beyond one machine by closed form (`tf_commopt.core.scaling.scaling_table`: the measured "
    "per-step compute and model bytes, the full MNIST epoch, weak scaling, a ring all-reduce over per-port "
    "links with a fixed latency per message, H by the thesis rule, capped). Records without a command or "
    "load predate them, made with a launcher whose token bucket let a small model's sync pass partly "
    "unshaped and a skip-and-correct step that all-reduced its metrics. Records without "
    "`curve_test_images` predate the runner's scoring of every evaluation on the whole test set: inside a "
    "multi-worker fit, tf-keras's evaluate scored each worker's shard only, so their curves and times to "
    "target come from the chief's share of the test images (a quarter of them with four workers; the "
    "final accuracy is on all of them).",
    [
        Table(
            "Time to accuracy",
            rows_tta,
            [
                *_SETTING,
                ("variant", "variant", ""),
                ("H", "h", "g"),
                ("steps", "steps", "d"),
                ("wall s", "wall_s", ".1f"),
                ("ms/step", "ms_per_step", ".0f"),
                ("syncs", "syncs", "d"),
                ("comm s", "comm_s", ".2f"),
                ("TTA s", "tta", ".1f"),
                ("steps to target", "steps_to_target", "d"),
                ("final acc", "acc", ".3f"),
                ("wall saved vs SSGD", "wall_saved", ""),
                ("TTA saved vs SSGD", "tta_saved", ""),
                ("selection overhead s", "interval_overhead_s", ".4f"),
                ("H = 1 warm-up syncs s", "selection_comm", ".2f"),
            ],
        ),
        Table(
            'What `interval="auto"` measured',
            rows_auto,
            [
                ("setting", "setting", ""),
                ("t_comm ms", "t_comm", ".1f"),
                ("t_comp ms", "t_comp", ".1f"),
                ("H", "h", "d"),
            ],
        ),
        Table(
            "Interval-selection overhead",
            rows_overhead,
            [
                ("setting", "setting", ""),
                ("auto: agreement + policy s", "ours", ".4f"),
                ("auto with its H = 1 warm-up syncs s", "with_syncs", ".3f"),
                ("AdaComm-style s", "ada", ".3f"),
                ("grid search s", "grid", ".2f"),
                ("grid / auto", "grid_x", ".0f"),
                ("AdaComm / auto", "ada_x", ".0f"),
            ],
        ),
        Table(
            "Beyond one machine (closed form): H, SSGD / skip-and-correct epoch seconds, time saved",
            rows_scaling,
            [
                ("model", "model", ""),
                ("MB", "mb", ".1f"),
                ("t_comp ms", "t_comp", ".0f"),
                ("workers", "workers", "d"),
                ("steps/epoch", "steps", "d"),
                ("compute-only s", "compute", ".1f"),
                *[(f"{x:g} Mbit/s", f"r{x:g}", "") for x in RATES],
            ],
        ),
    ],
    commands=lambda rs: sorted({r.get("command", _OLD_COMMAND) for r in rs}),
    figures=["comm.png", "comm_scaling.png"],
    draw=draw,
)
