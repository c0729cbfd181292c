"""Workers of different speeds: the slowdown emulation (page docs/results/unequal.md) and time to
accuracy of SSGD, step-based and time-based skip-and-correct (``--sweep=tta``, page
docs/results/unequal_tta.md).

A sweep of runner launches on ``--workers`` processes, each variant one ``--slow_workers`` setting
(``equal``: none; ``slow1x2``: worker 1 computes 2x slower, ...), skip-and-correct at a fixed H so that
most steps are local (no wait for a peer). Every task's record is kept (``--step_times``: the median and
90th-percentile wall time per step after the first ten). The page compares each worker's median step
time with the same worker's in the equal run: a worker slowed k x should take about k x.

The ``tta`` sweep: a setting is ``MBIT:DATA:SLOWED`` (link rate, ``iid`` or ``skew`` shards, how many
workers compute 2x slower: workers 1 and 3 first; ``--device_factor=K`` stretches every worker's
computation K times, the slowed ones 2K), the variants ``ssgd``, ``sc_steps`` (every worker H
local steps per period) and ``sc_time`` (``--period=time``) at the same H; every run evaluates every
``--eval_every_s`` training seconds (or ``--eval_every`` steps) and records its time to ``--target_accuracy``
and final accuracy.

Example:
    python -m experiments.unequal_bench --repeats=1 --steps=60 --out=/tmp/unequal.jsonl
    python -m experiments.unequal_bench --out=docs/results/unequal.jsonl && python -m experiments.report unequal
    python -m experiments.unequal_bench --sweep=tta --settings=100:iid:0,100:iid:2 --out=docs/results/unequal_tta.jsonl
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from experiments import _cli
from experiments.batch_shares import calibrate_shares, speed_shares
from experiments.harness import Launch, Sweep, run_sweep
from experiments.page import Page, Table, median, verdict, when
from experiments.slow import parse_slow_workers, stretched_workers

VARIANTS = {"equal": "", "slow1x2": "1:2.0", "slow1x1.5": "1:1.5"}
TTA_VARIANTS = {
    "ssgd": ["--strategy=ssgd"],
    "sc_steps": ["--strategy=skip_correct", "--period=steps"],
    "sc_time": ["--strategy=skip_correct", "--period=time"],
    "sc_time_max": ["--strategy=skip_correct", "--period=time", "--tau_eff=max"],
    "sc_balanced": ["--strategy=skip_correct", "--period=steps"],  # + --batch_shares by --share_rule
    "sc_balanced_speed": ["--strategy=skip_correct", "--period=steps"],  # + --batch_shares by speed, always
}
TTA_DEFAULT = ["ssgd", "sc_steps", "sc_time"]
SLOWED = {0: "", 1: "1:2.0", 2: "1:2.0,3:2.0"}  # how many of the workers compute 2x slower
TTA_KEEP = ("wall_s", "train_s", "eval_s", "time_to_target_s", "steps_to_target", "test_accuracy", "steps")
TTA_KEEP += ("syncs", "comm_s", "real_steps", "period_steps", "cluster_wall_s", "curve", "curve_test_images")


def define(fv: Any) -> None:
    from absl import flags

    d = dict(flag_values=fv)
    flags.DEFINE_enum("sweep", "emulation", ["emulation", "tta"], "which bench", **d)
    flags.DEFINE_list("variants", ["equal", "slow1x2"], f"emulation: any of {', '.join(VARIANTS)}", **d)
    flags.DEFINE_list("tta_variants", TTA_DEFAULT, f"tta: any of {', '.join(TTA_VARIANTS)}", **d)
    flags.DEFINE_list("settings", ["100:iid:0", "100:iid:2"], "tta: MBIT:iid|skew:SLOWED (0, 1 or 2)", **d)
    flags.DEFINE_float("target_accuracy", 0.85, "tta: the test accuracy to reach", **d)
    flags.DEFINE_float("eval_every_s", 3.0, "tta: evaluate every this many training seconds", **d)
    flags.DEFINE_integer("eval_every", 0, "tta: evaluate every this many steps instead (0: by seconds)", **d)
    flags.DEFINE_enum(
        "share_rule",
        "speed",
        ["speed", "measured"],
        "tta, sc_balanced: shares 1 / each worker's factor, or from a calibration of every worker's step "
        "time at the full and the half batch (experiments/batch_shares.py), once per setting",
        **d,
    )
    flags.DEFINE_float(
        "device_factor",
        1.0,
        "tta: every worker computes this many times slower (the slowed ones twice that): emulated devices "
        "slower than a core, so that workers sharing the cores do not lend each other the cores a sleeping "
        "one leaves",
        **d,
    )
    flags.DEFINE_integer("workers", 2, "worker processes (tta: 4 unless given)", **d)
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


def parse_setting(text: str) -> Dict[str, Any]:
    """``"100:skew:2"`` -> {"mbit": 100.0, "data": "skew", "slowed": 2} (one line naming what is wrong).

    >>> parse_setting("10:iid:1")
    {'mbit': 10.0, 'data': 'iid', 'slowed': 1}
    """
    parts = text.split(":")
    try:
        mbit, data, slowed = float(parts[0]), parts[1], int(parts[2])
    except (ValueError, IndexError):
        _cli.fail(f"--settings: {text!r}: expected MBIT:iid|skew:SLOWED")
    if len(parts) != 3 or mbit < 0 or data not in ("iid", "skew") or slowed not in SLOWED:
        _cli.fail(f"--settings: {text!r}: expected MBIT >= 0, iid or skew, SLOWED 0, 1 or 2")
    return {"mbit": mbit, "data": data, "slowed": slowed}


def tta_sweep(fv: Any) -> Sweep:
    """Settings x {ssgd, sc_steps, sc_time} on ``--workers`` (default 4), time to the target accuracy."""
    settings = {s: parse_setting(s) for s in fv.settings}
    bad = [v for v in fv.tta_variants if v not in TTA_VARIANTS]
    if bad or not fv.tta_variants:
        _cli.fail(
            f"--tta_variants: unknown {', '.join(bad) or '(none given)'}; choose from {', '.join(TTA_VARIANTS)}"
        )
    workers = fv.workers if fv["workers"].present else 4  # the emulation's default is 2
    for text, setting in settings.items():
        need = 1 + max(parse_slow_workers(SLOWED[setting["slowed"]]), default=1)
        if workers < need:
            _cli.fail(
                f"--workers: setting {text} slows workers 1 and 3 first, needs >= {need}, got {workers}"
            )

    if not fv.device_factor >= 1.0:
        _cli.fail(f"--device_factor: must be >= 1, got {fv.device_factor:g}")
    if fv.eval_every < 0 or fv.eval_every % fv.interval:  # between syncs it would average out of rhythm
        _cli.fail(f"--eval_every: must be a multiple of --interval={fv.interval}, got {fv.eval_every}")

    def launch(setting: str, variant: str) -> Launch:
        st = settings[setting]
        argv = [f"--model={fv.model}", f"--steps={fv.steps}", f"--batch_size={fv.batch_size}"]
        argv += [f"--interval={fv.interval}", *TTA_VARIANTS[variant]]
        every = (
            f"--eval_every={fv.eval_every}" if fv.eval_every > 0 else f"--eval_every_s={fv.eval_every_s:g}"
        )
        argv += [every, f"--target_accuracy={fv.target_accuracy:g}"]
        if st["data"] == "skew":
            argv.append("--non_iid_classes=2")
        slow = stretched_workers(SLOWED[st["slowed"]], fv.device_factor, workers)
        if slow:
            argv.append(f"--slow_workers={slow}")
        if variant == "sc_balanced":
            argv.append(f"--batch_shares={shares(setting, slow)}")
        elif variant == "sc_balanced_speed":
            argv.append(f"--batch_shares={speed_shares(SLOWED[st['slowed']], workers)}")
        return Launch(argv, workers=workers, mbit=st["mbit"] or None)

    calibrations: Dict[str, Dict[str, Any]] = {}

    def shares(setting: str, slow: str) -> str:
        if fv.share_rule == "speed":
            return speed_shares(SLOWED[settings[setting]["slowed"]], workers)
        if setting not in calibrations:
            mbit = settings[setting]["mbit"] or None
            calibrations[setting] = calibrate_shares(fv.model, fv.batch_size, workers, slow, mbit)
        return calibrations[setting]["batch_shares"]

    def describe(setting: str) -> Dict[str, Any]:
        out = dict(settings[setting], slow_workers=SLOWED[settings[setting]["slowed"]])
        if "sc_balanced" in fv.tta_variants:
            out["share_rule"] = fv.share_rule
        if setting in calibrations:
            out["share_calibration"] = calibrations[setting]
        return out

    extra = {k: getattr(fv, k) for k in ("model", "interval", "steps", "batch_size", "device_factor")}
    extra["workers"] = workers
    extra["target_accuracy"] = fv.target_accuracy
    extra.update({"eval_every": fv.eval_every} if fv.eval_every > 0 else {"eval_every_s": fv.eval_every_s})
    return Sweep(
        "unequal_tta",
        list(settings),
        list(fv.tta_variants),
        fv.repeats,
        launch,
        extra=extra,
        keep=TTA_KEEP,
        describe=describe,
    )


def _body(fv: Any) -> int:
    run_sweep(tta_sweep(fv) if fv.sweep == "tta" else sweep(fv), fv.out, _cli.command(fv))
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


def emulation_setting_rows(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per emulation record: the record itself (its keys are the columns)."""
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
            emulation_setting_rows,
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


# ---------------------------------------------------------------------------------------- the tta page
def _where(r: Dict[str, Any]) -> str:
    text = f"{when(r)}: {r['model']}, {r['workers']} workers, {r['mbit']:g} Mbit/s, {r['data']}, {r['slowed']} slowed"
    if r.get("device_factor", 1.0) != 1.0:
        text += f", devices {r['device_factor']:g}x slower"
    runs = [x for v in r["runs"].values() for x in v]
    if not all(x.get("curve_test_images") for x in runs):
        text += " (curves on the first worker's shard)"
    return text


def setting_rows(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per record: what it ran (model, workers, H, ...), when and under which load."""
    keys = ("model", "workers", "interval", "steps", "batch_size", "target_accuracy", "eval_every_s")
    keys += ("eval_every",)
    return [
        dict({k: r.get(k) for k in keys}, setting=_where(r), load=r.get("load_average_1m"), shares=_shares(r))
        for r in records
    ]


def _shares(r: Dict[str, Any]) -> Optional[str]:
    """sc_balanced's ``--batch_shares`` in record ``r`` and how they were chosen (None without it)."""
    if "sc_balanced" not in r["runs"]:
        return None
    if "share_calibration" in r:
        return f"measured: {r['share_calibration']['batch_shares']}"
    return f"by speed: {speed_shares(r['slow_workers'], r['workers'])}"


def _med(runs: List[Dict[str, Any]], key: str) -> Any:
    vals = [x.get(key) for x in runs if x.get(key) is not None]
    return median(vals) if vals else None


def tta_rows(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per (setting, variant): medians over the repeats (time to target over the runs that
    reached it, with how many did)."""
    out = []
    for r in records:
        for v, runs in r["runs"].items():
            reached = [x for x in runs if x.get("time_to_target_s") is not None]
            out.append(
                dict(
                    setting=_where(r),
                    variant=v,
                    reached=f"{len(reached)}/{len(runs)}",
                    time_to_target_s=_med(reached, "time_to_target_s"),
                    steps_to_target=_med(reached, "steps_to_target"),
                    test_accuracy=_med(runs, "test_accuracy"),
                    train_s=_med(runs, "train_s"),
                    syncs=_med(runs, "syncs"),
                    real_steps=_med(runs, "real_steps"),
                )
            )
    return out


def _goal_row(r: Dict[str, Any], variant: str) -> Dict[str, Any]:
    runs = r["runs"]
    t_time, t_steps = ([x.get("time_to_target_s") for x in runs[v]] for v in (variant, "sc_steps"))
    ratio = None
    if t_time and t_steps and None not in t_time + t_steps:
        ratio = median(t_time) / median(t_steps)
    train = _med(runs[variant], "train_s"), _med(runs["sc_steps"], "train_s")
    train_ratio = train[0] / train[1] if None not in train else None
    acc = _med(runs[variant], "test_accuracy"), _med(runs["sc_steps"], "test_accuracy")
    diff = 100 * (acc[0] - acc[1]) if None not in acc else None
    bound = 0.7 if r["slowed"] else 1.0
    ok = None if ratio is None or diff is None else ratio <= bound and (not r["slowed"] or diff >= -0.5)
    bound_text = f"≤ {bound:g}" + (", accuracy ≥ −0.5" if r["slowed"] else "")
    return dict(
        setting=_where(r),
        variant=variant,
        ratio=ratio,
        train_ratio=train_ratio,
        bound=bound_text,
        acc_diff=diff,
        goal=verdict(ok),
    )


def goal_rows(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Time-based (each ``sc_time*`` variant) and batch-balanced (``sc_balanced``) against step-based
    skip-and-correct per setting: the ratio of
    the median times to target and the accuracy difference; the goal is <= 0.7 and within 0.5 points with
    slowed workers, <= 1 with none (a ratio needs every run of both to reach the target)."""
    out = []
    for r in records:
        if "sc_steps" in r["runs"]:
            rules = ("sc_time", "sc_time_max", "sc_balanced", "sc_balanced_speed")
            out += [_goal_row(r, v) for v in rules if v in r["runs"]]
    return out


TTA_PAGE = Page(
    "unequal_tta",
    "Workers of different speeds: time to accuracy",
    "Workers on a shaped local cluster (four unless the setting says otherwise), some computing 2x slower (`--slow_workers`, the odd-numbered "
    "workers first), "
    "IID or label-skewed shards: synchronous SGD, step-based skip-and-correct (every worker H local steps "
    "per period, so the fast ones wait at each sync) and time-based skip-and-correct (`--period=time`: "
    "every worker steps for the time the fastest needs for H steps, FedNova-normalised sync; `sc_time_max` "
    "with `--tau_eff=max`, a sync moving as far as the fastest worker's steps along the normalised "
    "average) at the same H; `sc_balanced` is the step rule with batches by speed (`--batch_shares`: a "
    "worker half as fast reads half as many examples per step, so every worker's H steps take about as "
    "long). "
    "Its shares are by speed (one over each worker's factor) or measured (`--share_rule=measured`: per "
    "setting, two short calibration runs time every worker's step at the full and at half the per-worker "
    "batch, and each worker gets the batch whose step takes as long as the fastest worker's full batch, "
    "`tf_commopt.core.shares`; the calibration runs are not in the times, as a profile is not); "
    "`sc_balanced_speed` always takes them by speed, so a sweep can set both rules side by side. "
    "Each run evaluates the averaged model every few training seconds or steps, as the settings say "
    "(evaluation time excluded; skip-and-correct right after a sync, when the model is the average) and "
    "records the training seconds to the first evaluation at or above the target accuracy and the final "
    "test accuracy; medians over the repeats, the variants interleaved. The real steps are those of the "
    "first worker (a fast one; the steps column counts global steps). Time to target is only as fine as "
    "the evaluation interval (by steps: one evaluation per sync is as fine as the average exists); the "
    "training seconds ratio compares the whole runs. In a setting with devices "
    "slower (`--device_factor`), every worker's computation is stretched that many times and the slowed "
    "ones twice that: the emulated devices are slower than a core, so workers sharing the cores neither "
    "compete for them nor take over the cores a sleeping worker leaves, and each runs at its set speed. "
    'Settings marked "curves on the first worker\'s shard" were measured before the runner scored every '
    "evaluation on the whole test set: inside a multi-worker fit, tf-keras's evaluate scored each "
    "worker's shard only, so their curves and times to target come from the first worker's share of the "
    "test images (noisier, and not the figure their final accuracy is).",
    [
        Table(
            "Settings",
            setting_rows,
            [("setting", "setting", "")]
            + [(k, k, "g") for k in ("interval", "steps", "batch_size", "target_accuracy", "eval_every_s")]
            + [("eval_every", "eval_every", "g")]
            + [("sc_balanced's batch shares", "shares", ""), ("load average", "load", "g")],
        ),
        Table(
            "Time to target and final accuracy",
            tta_rows,
            [
                ("setting", "setting", ""),
                ("variant", "variant", ""),
                ("reached", "reached", ""),
                ("s to target", "time_to_target_s", ".1f"),
                ("steps to target", "steps_to_target", "g"),
                ("final accuracy", "test_accuracy", "%"),
                ("training s", "train_s", ".1f"),
                ("syncs", "syncs", "g"),
                ("first worker's real steps", "real_steps", "g"),
            ],
        ),
        Table(
            "Goal: time-based or batch-balanced / step-based skip-and-correct",
            goal_rows,
            [
                ("setting", "setting", ""),
                ("variant", "variant", ""),
                ("time to target ratio", "ratio", ".2f"),
                ("training s ratio", "train_ratio", ".2f"),
                ("goal", "bound", ""),
                ("accuracy difference (points)", "acc_diff", "+.1f"),
                ("verdict", "goal", ""),
            ],
        ),
    ],
)

if __name__ == "__main__":
    raise SystemExit(main())
