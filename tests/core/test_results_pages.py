"""Results pages generated from data: regenerating each page from the .jsonl beside it gives the committed
page byte for byte, so no number in their prose can drift from the data."""

import os

import pytest

from experiments import correction_report, overlap_report, sc_speed_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "docs", "results")

PAGES = [
    ("sc_speed.jsonl", "sc_speed.md", sc_speed_report),
    ("correction.jsonl", "correction.md", correction_report),
    ("overlap.jsonl", "overlap.md", overlap_report),
]


@pytest.mark.parametrize("jsonl,page,module", PAGES, ids=[p[1] for p in PAGES])
def test_page_is_what_its_data_gives(jsonl, page, module):
    with open(os.path.join(RESULTS, page), encoding="utf-8") as f:
        committed = f.read()
    assert module.render(module.load(os.path.join(RESULTS, jsonl)), jsonl) == committed, (
        f"docs/results/{page} differs from what docs/results/{jsonl} gives: rerun "
        f"python -m experiments.{module.__name__.split('.')[-1]} docs/results/{jsonl} docs/results/{page}"
    )


def _readme_row(start: str) -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return next(line for line in f if line.startswith(start))


def test_readme_skip_correct_row_is_what_the_data_gives():
    row = _readme_row("| skip-and-correct: 88.9%")
    recs = sc_speed_report.load(os.path.join(RESULTS, "sc_speed.jsonl"))
    table = [r for r in recs if r["part"] == "table" and r.get("steps_per_execution", 1) == 1][-1]
    ratio = table["wall_ratio_vs_ssgd"]
    acc = {k: v["test_accuracy"] for k, v in table["rows"].items()}
    assert (
        f"{100 * (1 - ratio['sc_auto']):.1f}% less wall time than SSGD ({ratio['sc_auto']:.3f} of it)" in row
    ), row
    assert f"H = 16 {100 * (1 - ratio['sc_h16_none']):.1f}% less" in row
    assert (
        f"({100 * acc['sc_auto']:.1f}%, {100 * acc['sc_h16_none']:.1f}% vs {100 * acc['ssgd']:.1f}%)" in row
    )
    syncs = sorted(r["ratio_to_bound"] for r in recs if r["part"] == "sync" and r["topology"] == "shared")
    assert f"within {syncs[0]:.2f}–{syncs[-1]:.2f}x of the ring all-reduce bound" in row


def test_readme_correction_row_is_what_the_data_gives():
    row = _readme_row("| the correction keeps")
    t = correction_report.table(correction_report.load(os.path.join(RESULTS, "correction.jsonl")))
    auto = [t[(o, "auto", 16)][0] - t[(o, "ssgd", 1)][0] for o in ("sgd", "momentum", "adam")]
    none = [t[(o, "none", 16)][0] - t[(o, "ssgd", 1)][0] for o in ("sgd", "momentum", "adam")]
    assert f"SGD {auto[0]:.1f}, momentum {auto[1]:.1f}, Adam {auto[2]:.1f} points vs SSGD".replace(
        "-", "−"
    ) in row.replace("−0.0", "−0.0"), row
    assert f"plain local SGD {none[0]:.1f} / {none[1]:.1f} / {none[2]:.1f}".replace("-", "−") in row, row


# ------------------------------------------------------------------------------------------------------
# Every number of README.md's results table and of each results page's headline sentences, recomputed
# from the .jsonl beside the page (issue 17). Pages whose prose is hand-written are checked claim by claim.
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402

_ISOLATED = {}


def _bench(name: str):
    """``experiments.<name>`` loaded under its own absl FlagValues (the benches define clashing flags such as
    ``--profiles``), without touching ``sys.modules``: only its pure report functions are used here."""
    if name in _ISOLATED:
        return _ISOLATED[name]
    import functools
    import importlib.util
    import inspect

    from absl import flags

    fresh, saved = flags.FlagValues(), {"FLAGS": flags.FLAGS}
    for attr in dir(flags):
        f = getattr(flags, attr)
        if callable(f) and not inspect.isclass(f):
            try:
                params = inspect.signature(f).parameters
            except (TypeError, ValueError):
                continue
            if "flag_values" in params:
                saved[attr] = f
                setattr(flags, attr, functools.partial(f, flag_values=fresh))
    flags.FLAGS = fresh
    try:
        spec = importlib.util.spec_from_file_location(
            f"_isolated_{name}", os.path.join(ROOT, "experiments", name + ".py")
        )
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        for attr, f in saved.items():
            setattr(flags, attr, f)
    _ISOLATED[name] = mod
    return mod


def _jsonl(name):
    with open(os.path.join(RESULTS, name), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _page(name):
    with open(os.path.join(RESULTS, name), encoding="utf-8") as f:
        return " ".join(f.read().split())  # prose wraps anywhere: compare with single spaces


def _readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return " ".join(f.read().split())


def _pm(x: float, nd: int = 1) -> str:
    """+1.2 / −1.2 with the typographic minus the pages use."""
    return f"{x:+.{nd}f}".replace("-", "−")


def _has(text: str, *claims: str) -> None:
    missing = [c for c in claims if c not in text]
    assert not missing, f"not in the page (recomputed from its data): {missing}"


# ---- comm.md (measured before issue 12) and README's interval-selection row
def _comm():
    return {(r["model"], r["mbit"], r["split"], r["variant"]): r for r in _jsonl("comm.jsonl")}


def test_comm_headlines_are_what_comm_jsonl_gives():
    g, page = _comm(), _page("comm.md")
    saved = lambda m, b, s, v: 100 * (1 - g[(m, b, s, v)]["wall_s"] / g[(m, b, s, "ssgd")]["wall_s"])  # noqa: E731
    b1, b100 = g[("big_mlp", 1000.0, "iid", "sc_auto")], g[("big_mlp", 100.0, "iid", "sc_auto")]
    _has(
        page,
        f"**{saved('big_mlp', 1000.0, 'iid', 'sc_auto'):.0f}%** wall",
        f"(auto H = {b1['interval']})",
        f"**{saved('big_mlp', 100.0, 'iid', 'sc_auto'):.0f}%** wall at 100 Mbit/s (auto H = {b100['interval']};",
    )
    # the conservative figure: the three evaluation averagings charged at the measured sync time
    cons = 100 * (
        1 - (b100["wall_s"] + 3 * b100["interval_t_comm_s"]) / g[("big_mlp", 100.0, "iid", "ssgd")]["wall_s"]
    )
    _has(
        page,
        f"**{cons:.0f}%** if the three evaluation averagings",
        f"at the measured {b100['interval_t_comm_s']:.1f} s each",
    )
    cnn = sorted(
        saved("cnn", b, s, "sc_auto") for b, s in ((100.0, "iid"), (100.0, "non_iid"), (1000.0, "iid"))
    )
    _has(
        page,
        f"**{_pm(cnn[0], 0)}% to {_pm(cnn[-1], 0)}%** for the 0.23 MB CNN",
        f"{cnn[2]:.0f}% and {cnn[1]:.0f}% less wall time in two settings, {-cnn[0]:.0f}% more in the third",
    )
    a, ada, grid = (g[("cnn", 100.0, "iid", v)] for v in ("sc_auto", "adacomm", "grid"))
    ours, charged = a["interval_overhead_s"], a["interval_overhead_s"] + a["interval_selection_comm_s"]
    _has(
        page,
        f"**{math.log10(grid['interval_overhead_s'] / ours):.1f} orders** less than grid search "
        f"({1000 * ours:.1f} ms vs {grid['interval_overhead_s']:.1f} s)",
        f"**{math.log10(ada['interval_overhead_s'] / ours):.1f} orders** less than AdaComm-style "
        f"({1000 * ours:.1f} ms vs {ada['interval_overhead_s']:.2f} s)",
        f"H = 1 warm-up syncs ({a['interval_selection_comm_s']:.2f} s",
        f"{grid['interval_overhead_s'] / charged:.0f}× and {ada['interval_overhead_s'] / charged:.1f}×",
    )
    # the overhead bullet
    _has(
        page,
        f"{ada['syncs']} syncs → {ada['interval_overhead_s']:.2f} s in {ada['steps']} steps",
        f"{grid['interval_overhead_s']:.1f} s, {grid['interval_overhead_s'] / g[('cnn', 100.0, 'iid', 'ssgd')]['wall_s']:.0f}× "
        "the whole 144-step training",
        f"{b100['interval_selection_comm_s']:.1f} s at 100 Mbit/s on big_mlp",
        f"{100 * b100['interval_selection_comm_s'] / g[('big_mlp', 100.0, 'iid', 'ssgd')]['wall_s']:.0f}% of SSGD's "
        f"{g[('big_mlp', 100.0, 'iid', 'ssgd')]['wall_s']:.0f} s there",
    )
    assert not [
        k for k in g if k[0] == "big_mlp" and k[3] in ("grid", "adacomm")
    ]  # the page says they did not run
    # the rule bullet: the agreed timings and the H they give
    for m, b in (("big_mlp", 1000.0), ("big_mlp", 100.0)):
        r = g[(m, b, "iid", "sc_auto")]
        _has(
            page,
            f"{1000 * r['interval_t_comm_s']:,.0f} / {1000 * r['interval_t_comp_s']:.0f} ms → H = {r['interval']}",
        )
    c = g[("cnn", 100.0, "iid", "sc_auto")]
    _has(page, f"CNN {1000 * c['interval_t_comm_s']:.1f} / {1000 * c['interval_t_comp_s']:.1f} ms → H = 1")
    # the big_mlp bullet
    co, ss = g[("big_mlp", 1000.0, "iid", "compute_only")], g[("big_mlp", 1000.0, "iid", "ssgd")]
    _has(
        page,
        f"only save {100 * (1 - co['ms_per_step'] / ss['ms_per_step']):.0f}% (the compute-only bound: "
        f"{co['ms_per_step']:.0f} vs {ss['ms_per_step']:.0f} ms/step)",
        f"({100 * b1['test_accuracy']:.1f}% vs {100 * ss['test_accuracy']:.1f}% after 48 steps)",
        f"SSGD takes {g[('big_mlp', 100.0, 'iid', 'ssgd')]['ms_per_step'] / 1000:.1f} s per step",
        f"({b1['ms_per_step']:.0f} vs {g[('big_mlp', 1000.0, 'iid', 'sc')]['ms_per_step']:.0f} ms/step)",
    )


def test_readme_interval_selection_row_is_what_comm_jsonl_gives():
    g = _comm()
    a, ada, grid = (g[("cnn", 100.0, "iid", v)] for v in ("sc_auto", "adacomm", "grid"))
    ours = a["interval_overhead_s"]
    ratio = grid["interval_overhead_s"] / ours
    charged = grid["interval_overhead_s"] / (ours + a["interval_selection_comm_s"])
    row = " ".join(_readme_row("| interval selection:").split())
    _has(
        row,
        f"{1000 * ours:.1f} ms vs {grid['interval_overhead_s']:.1f} s for grid search "
        f"({round(ratio, -2):,.0f}x; {charged:.0f}x when the selection's H = 1 syncs are charged) and "
        f"{ada['interval_overhead_s']:.2f} s for AdaComm-style",
    )


# ---- pipeline.md and README's two partitioning rows
def _pipeline():
    pb = _bench("pipeline_bench")
    rows = _jsonl("pipeline.jsonl")
    return rows, pb.compare(rows), pb.configs(rows)


def _stats(cs, key, better):
    vals = [c[key] for c in cs]
    return {
        "median": statistics.median(vals),
        "best": min(vals) if better < 0 else max(vals),
        "worst": max(vals) if better < 0 else min(vals),
        "n": len(vals),
        "wins": sum(v * better > 1e-6 for v in vals),
        "losses": sum(v * better < -1e-6 for v in vals),
    }


def test_pipeline_page_tables_and_findings_are_what_pipeline_jsonl_gives():
    import re

    tables = _bench("pipeline_bench").tables
    rows, comps, cf = _pipeline()
    with open(os.path.join(RESULTS, "pipeline.md"), encoding="utf-8") as f:
        raw = f.read()
    m = re.search(r"1,000 micro-batches on 8 stages in ([\d.]+) s \(GPipe\), ([\d.]+) s \(1F1B\)", raw)
    assert tables(rows, {"gpipe": float(m.group(1)), "1f1b": float(m.group(2))}) in raw
    page = _page("pipeline.md")
    best = [c for c in comps if c["baseline"] == "best_baseline"]
    s, a, b = _stats(best, "sync_pct", -1), _stats(best, "async_pct", 1), _stats(best, "bytes_pct", -1)
    n = s["n"]
    _has(
        page,
        f"GPipe iteration is shorter in {s['wins']}/{n} configurations and longer in **{s['losses']}/{n}** "
        f"(median {_pm(s['median'])}%, best {_pm(s['best'])}%)",
        f"1F1B throughput is higher in {a['wins']}/{n} and lower in **{a['losses']}/{n}** (median "
        f"{_pm(a['median'])}%, best {_pm(a['best'])}%)",
        f"more bytes than the best baseline in {b['losses']}/{n} configurations (up to {_pm(b['worst'], 0)}%; "
        f"median over all {_pm(b['median'])}%)",
    )
    br = [c for c in best if c["branchy"] and c["bandwidth_gbps"] == 10.0]
    s10, a10 = _stats(br, "sync_pct", -1), _stats(br, "async_pct", 1)
    _has(
        page,
        f"({len(br)} configurations): GPipe iteration {_pm(s10['median'])}% median ({_pm(s10['worst'])}% "
        f"to {_pm(s10['best'])}%, better in {s10['wins']}/{len(br)}); 1F1B throughput {_pm(a10['median'])}% "
        f"median ({_pm(a10['worst'])}% to {_pm(a10['best'])}%, better in {a10['wins']}/{len(br)})",
    )
    lw = [c for c in comps if c["baseline"] == "layerwise"]
    ls, la, lb = _stats(lw, "sync_pct", -1), _stats(lw, "async_pct", 1), _stats(lw, "bytes_pct", -1)
    _has(
        page,
        f"GPipe iteration {_pm(ls['median'])}% median ({ls['wins']}/{n} shorter), 1F1B throughput "
        f"{_pm(la['median'], 0)}% median ({la['wins']}/{n} higher), bytes {_pm(lb['median'])}% median "
        f"(lower in {lb['wins']}/{n})",
    )
    fast = [c for c in lw if c["base_comm_compute_ratio"] <= 1.0]
    fs, fa, fb = _stats(fast, "sync_pct", -1), _stats(fast, "async_pct", 1), _stats(fast, "bytes_pct", -1)
    _has(
        page,
        f"({len(fast)} configurations) the figures are {_pm(fs['median'])}% GPipe, {_pm(fa['median'])}% "
        f"1F1B, {_pm(fb['median'])}% bytes (more bytes than layer-wise in {fb['losses']}/{len(fast)})",
    )


def test_readme_partitioning_rows_are_what_pipeline_jsonl_gives():
    rows, comps, cf = _pipeline()
    best = [c for c in comps if c["baseline"] == "best_baseline"]
    lw = [c for c in comps if c["baseline"] == "layerwise"]
    fast = [c for c in lw if c["base_comm_compute_ratio"] <= 1.0]
    n = len(best)
    s, a, b = _stats(best, "sync_pct", -1), _stats(best, "async_pct", 1), _stats(best, "bytes_pct", -1)
    br = [c for c in best if c["branchy"] and c["bandwidth_gbps"] == 10.0]
    # plans that "win" against layer-wise by not pipelining at all (one stage holds everything)
    alone = [k for k, ms in cf.items() if ms["ga"]["bytes_injected"] == 0]
    alone_fast = [
        c
        for c in fast
        if cf[(c["profile"], c["stages"], c["bandwidth_gbps"], c["devices"])]["ga"]["bytes_injected"] == 0
    ]
    assert not alone_fast  # the "where links are fast enough" figures below contain none
    row = " ".join(_readme_row("| graph partitioning:").split())
    _has(
        row,
        f"vs layer-wise: {_pm(_stats(fast, 'sync_pct', -1)['median'])}% median where links are fast enough "
        f"to pipeline, {_pm(_stats(lw, 'sync_pct', -1)['median'], 0)}% over all {n} settings "
        f"({len(alone)} of them won by not pipelining at all: one stage does everything;",
        f"never slower ({s['losses']}/{n}), {_pm(s['median'])}% median, up to {_pm(s['best'])}%; branchy models "
        f"at 10 Gbit/s {_pm(_stats(br, 'sync_pct', -1)['median'])}% median",
    )
    row = " ".join(_readme_row("| up to 15% better asynchronous").split())
    _has(
        row,
        f"vs layer-wise: {_pm(_stats(fast, 'async_pct', 1)['median'], 0)}% median 1F1B throughput where links "
        f"are fast enough, traffic {_pm(_stats(lw, 'bytes_pct', -1)['median'], 0)}% median over all settings",
        f"1F1B throughput never lower ({a['losses']}/{n}), {_pm(a['median'])}% median, up to {_pm(a['best'])}% "
        f"({_pm(_stats(br, 'async_pct', 1)['median'])}% median on branchy models at 10 Gbit/s); traffic "
        f"{_pm(b['median'])}% median but higher in {b['losses']}/{n}",
    )


# ---- hybrid.md and README's hybrid row
def test_hybrid_page_and_readme_row_are_what_hybrid_jsonl_gives():
    hb = _bench("hybrid_bench")
    pct, summary = hb.pct, hb.summary
    rows = _jsonl("hybrid.jsonl")
    with open(os.path.join(RESULTS, "hybrid.md"), encoding="utf-8") as f:
        assert summary(rows) in f.read()
    page = _page("hybrid.md")
    bws = (10.0, 100.0, 400.0)
    by = {bw: [r for r in rows if r["bandwidth_gbps"] == bw] for bw in bws}
    gain = {
        bw: statistics.mean(
            pct(r["hybrid_iteration_ms"], r["data_parallel_proportional_overlap_iteration_ms"])
            for r in by[bw]
        )
        for bw in bws
    }
    faster = {
        bw: sum(
            pct(r["hybrid_iteration_ms"], r["data_parallel_proportional_overlap_iteration_ms"]) < -1
            for r in by[bw]
        )
        for bw in bws
    }
    within = {
        bw: sum(r["hybrid_iteration_ms"] <= 1.6 * r["ideal_iteration_ms"] for r in by[bw]) for bw in bws
    }
    dpw = {
        bw: sum(
            r["data_parallel_proportional_overlap_iteration_ms"] <= 1.6 * r["ideal_iteration_ms"]
            for r in by[bw]
        )
        for bw in bws
    }
    n = {len(v) for v in by.values()}
    assert len(n) == 1
    n = n.pop()
    j = lambda d, f="{:.1f}%": " / ".join(f.format(abs(d[bw])) for bw in bws)  # noqa: E731
    _has(
        page,
        f"**{j(gain)} shorter than proportional data parallel with overlap** at 10 / 100 / 400 Gbit/s "
        f"({n} configurations each; >1% faster in {j(faster, '{}')} of them",
        f"within 1.6x of the compute-only ideal in {j(within, '{}')} of {n} configurations (proportional DP with "
        f"overlap: {j(dpw, '{}')})",
    )
    at10 = by[10.0]
    for src, label in (("pipedream/", "PipeDream-profile configurations"), ("h200/", "H200-profile ones")):
        sel = [r for r in at10 if r["profile"].startswith(src)]
        ok = sum(r["hybrid_iteration_ms"] <= 1.6 * r["ideal_iteration_ms"] for r in sel)
        _has(page, f" {ok} of {len(sel)} {label}")
    eq10 = statistics.mean(pct(r["hybrid_iteration_ms"], r["data_parallel_iteration_ms"]) for r in at10)
    row = " ".join(_readme_row("| grouped hybrid:").split())
    _has(
        row,
        f"vs equal-split SSGD: {_pm(eq10)}% mean at 10 Gbit/s (simulated, {n} configurations)",
        f"mean {' / '.join(_pm(gain[bw]) + '%' for bw in bws)} at 10 / 100 / 400 Gbit/s",
    )


# ---- partition.md
def test_partition_page_is_what_partition_jsonl_gives():
    pb = _bench("partition_bench")
    _fmt, _med, _summary = pb._fmt, pb._med, pb._summary
    recs = _jsonl("partition.jsonl")
    rows = [r for r in recs if "ga" in r]
    with open(os.path.join(RESULTS, "partition.md"), encoding="utf-8") as f:
        raw = f.read()
    for line in [_fmt(r) for r in rows] + _summary(rows):
        assert line in raw, line
    page, n = _page("partition.md"), len(rows)
    g = sorted(r["ga_gain_pct"] for r in rows)
    chain = [r["ga_gain_pct"] for r in rows if not r["branchy"]]
    b10 = sorted(r["ga_gain_pct"] for r in rows if r["branchy"] and r["bandwidth_gbps"] == 10)
    ob = sorted(100 * (1 - r["ga"]["gpipe_ms"] / r["ga_objective"]["gpipe_ms"]) for r in rows)
    old_slower = sum(r["ga_objective"]["gpipe_ms"] > r["best_baseline_ms"] * (1 + 1e-9) for r in rows)
    syn = next(r for r in recs if "ga" not in r)
    _has(
        page,
        f"{sum(r['ga_not_slower'] for r in rows)}/{n} configurations (by construction; tested). Its median "
        f"gain over that best baseline is {_med(g):.1f}% (max {g[-1]:.1f}%); on chain models (VGG, ResNet, "
        f"GNMT, MobileNet, AlexNet) {_med(chain):.1f}% median",
        f"({len(b10)} configurations): median {_med(b10):.1f}%, min {b10[0]:.1f}%, max {b10[-1]:.1f}%; ≥ 10% in "
        f"{sum(x >= 10 for x in b10)}/{len(b10)}",
        f"slower than the best baseline in {old_slower}/{n} configurations**; the new default is a median "
        f"{_med(ob):.1f}% faster than it (max {ob[-1]:.1f}%)",
        f"8 stages: {syn['search_s']:.2f} s",
    )


# ---- skip_correct*.md (measured before issue 12) and docs/skip_correct.md's summary of them
SC_PAGES = ("skip_correct", "skip_correct_momentum0", "skip_correct_non_iid")


@pytest.mark.parametrize("name", SC_PAGES)
def test_skip_correct_table_is_what_its_jsonl_gives(name):
    with open(os.path.join(RESULTS, name + ".md"), encoding="utf-8") as f:
        raw = f.read()
    steps = int(raw.split(" timed steps")[0].rsplit(", ", 1)[1])
    for r in _jsonl(name + ".jsonl"):
        line = (
            f"| {r['variant']} | {r['ms_per_step']} | {r['test_accuracy']} | {r['test_loss']} | "
            f"{r.get('syncs', steps)} | {r.get('comm_s', '')} | {r.get('bytes_per_worker', '')} |"
        )
        assert line in raw, line


def test_skip_correct_doc_summary_is_what_the_jsonl_gives():
    with open(os.path.join(ROOT, "docs", "skip_correct.md"), encoding="utf-8") as f:
        doc = " ".join(f.read().split())
    d = {n: {r["variant"]: r for r in _jsonl(n + ".jsonl")} for n in SC_PAGES}
    ssgd09 = sorted(d[n]["ssgd"]["ms_per_step"] for n in ("skip_correct", "skip_correct_non_iid"))
    sc = sorted(r["ms_per_step"] for n in SC_PAGES for v, r in d[n].items() if v != "ssgd")
    syncs = sorted(1000 * r["comm_s"] / r["syncs"] for n in SC_PAGES for v, r in d[n].items() if v != "ssgd")
    r0 = lambda x: int(math.floor(x + 0.5))  # noqa: E731  (half up, as the prose rounds)
    _has(
        doc,
        f"SSGD {r0(ssgd09[0])}–{r0(ssgd09[-1])} ms with momentum 0.9 and "
        f"{r0(d['skip_correct_momentum0']['ssgd']['ms_per_step'])} ms with momentum 0",
        f"skip-and-correct variants {r0(sc[0])}–{r0(sc[-1])} ms; each sync {r0(syncs[0])}–{r0(syncs[-1])} ms",
    )
    acc = lambda n, v: f"{100 * d[n][v]['test_accuracy']:.1f}%"  # noqa: E731
    _has(
        doc,
        f"iid — SSGD {acc('skip_correct', 'ssgd')}, local SGD {acc('skip_correct', 'local_sgd')}, vrl with the "
        f'rule\'s lr {acc("skip_correct", "vrl")}, vrl with `correction_lr="effective"` '
        f"{acc('skip_correct', 'vrl_effective')}",
        f"label-skewed — SSGD {acc('skip_correct_non_iid', 'ssgd')}, local SGD {acc('skip_correct_non_iid', 'local_sgd')}, "
        f"vrl (rule's lr) **{acc('skip_correct_non_iid', 'vrl')} (diverged)**, vrl effective "
        f"{acc('skip_correct_non_iid', 'vrl_effective')}",
    )
    m0 = d["skip_correct_momentum0"]
    accs = [100 * m0[v]["test_accuracy"] for v in ("ssgd", "vrl", "local_sgd")]
    _has(
        doc,
        f"ended within {max(accs) - min(accs):.1f} points of each other ({accs[0]:.1f}%, {accs[1]:.1f}%, "
        f"{accs[2]:.1f}%)",
        f"literal rule diverged ({acc('skip_correct_non_iid', 'vrl')} test accuracy) while "
        f'`correction_lr="effective"` reached {acc("skip_correct_non_iid", "vrl_effective")}',
    )


# ---- ps.md
def test_ps_page_tables_are_what_ps_jsonl_gives():
    page = _page("ps.md")
    recs = _jsonl("ps.jsonl")
    by = {r["run"]: r for r in recs}
    labels = {
        "ssgd_collective": "SSGD, collective (MultiWorkerMirrored)",
        "skip_correct_collective": "skip-and-correct, collective (`SkipCorrectStrategy`)",
        "ssgd_ps": "SSGD, parameter server (`ParameterServerSkipCorrect`, H = 1)",
        "skip_correct_ps": "skip-and-correct, parameter server",
    }
    for run, label in labels.items():
        r = by[run]
        mb = f"{r['bytes_communicated'] / 1e6:,.1f}" if "bytes_communicated" in r else "—"
        _has(
            page,
            f"| {label} | {r['wall_s']:.1f} | {r['steps_per_s']:.1f} | {100 * r['test_accuracy']:.1f}% | {mb} |",
        )
    tf = next(r for r in recs if r["run"].startswith("tf_ps") and not r.get("killed_at_s"))
    _has(
        page,
        f"| TensorFlow `ParameterServerStrategy` + `model.fit` (async) | {tf['wall_s']:.1f} |",
        f"{100 * tf['test_accuracy']:.1f}% |",
    )
    sp, cp = by["skip_correct_ps"], by["ssgd_ps"]
    _has(
        page,
        f"({cp['bytes_communicated'] / 1e9:.2f} GB in all)",
        f"moves {sp['bytes_communicated'] / 1e9:.2f} GB",
        f"is {sp['steps_per_s'] / cp['steps_per_s']:.1f}× faster",
    )


# ---- allreduce.md: everything above the hand-written Findings is generated
def test_allreduce_page_is_what_allreduce_jsonl_gives(tmp_path):
    write_page = _bench("allreduce_bench").write_page
    page = os.path.join(RESULTS, "allreduce.md")
    copy = tmp_path / "allreduce.md"
    with open(page, encoding="utf-8") as f:
        committed = f.read()
    copy.write_text(committed, encoding="utf-8")
    write_page(str(copy), os.path.join(RESULTS, "allreduce.jsonl"))
    assert copy.read_text(encoding="utf-8") == committed


def test_pipeline_page_points_3_and_5_are_what_pipeline_jsonl_gives():
    rows, comps, cf = _pipeline()
    page = _page("pipeline.md")
    n = len(cf)
    best = {
        (c["profile"], c["stages"], c["bandwidth_gbps"], c["devices"]): c
        for c in comps
        if c["baseline"] == "best_baseline"
    }
    old = [c for c in comps if c["baseline"] == "ga_objective"]
    # point 3: the old default (ga_objective) against the best baseline and against the new default
    old_sync_slower = sum(
        ms["ga_objective"]["sync_iteration_ms"]
        > min(ms[b]["sync_iteration_ms"] for b in ("layerwise", "balanced", "pipedream")) * (1 + 1e-9)
        for ms in cf.values()
    )
    old_async_slower = sum(
        ms["ga_objective"]["async_throughput"]
        < max(ms[b]["async_throughput"] for b in ("layerwise", "balanced", "pipedream")) * (1 - 1e-9)
        for ms in cf.values()
    )
    assert best  # (keys line up with configs)
    s, a = _stats(old, "sync_pct", -1), _stats(old, "async_pct", 1)
    _has(
        page,
        f"slower than the best baseline in GPipe in {old_sync_slower}/{n} configurations and in 1F1B in "
        f"{old_async_slower}/{n}",
        f"iteration is a median {-s['median']:.1f}% shorter than it (up to {-s['best']:.1f}%), 1F1B throughput "
        f"{_pm(a['median'])}% median",
        f"in {a['losses']}/{n} configurations",
        f"by up to {-a['worst']:.1f}%",
    )
    # point 5: the ablation, restated from the table
    ga = [r for r in rows if r["method"] == "ga"]

    def gains(tag, rs, a, b):
        return [100 * (1 - r[f"{tag}_{a}_best_ms"] / r[f"{tag}_{b}_best_ms"]) for r in rs]

    ls = {t: [x for x in gains(t, ga, "local", "seeds") if x > 1e-6] for t in ("sync", "async")}
    gg_all = {t: gains(t, ga, "ga", "local") for t in ("sync", "async")}
    gg = {t: [x for x in gg_all[t] if x > 1e-6] for t in ("sync", "async")}
    _has(
        page,
        f"improves the best seed in {len(ls['sync'])}/{n} (GPipe) and {len(ls['async'])}/{n} (1F1B) "
        f"configurations, median {statistics.median(ls['sync']):.2f}% / {statistics.median(ls['async']):.2f}% "
        f"where it does, up to {max(ls['sync']):.1f}% / {max(ls['async']):.1f}%",
        f"improves on the local search in {len(gg['sync'])}/{n} (GPipe) and {len(gg['async'])}/{n} (1F1B) "
        f"configurations, median {statistics.median(gg['sync']):.2f}% / {statistics.median(gg['async']):.2f}% "
        f"where it does, up to {max(gg['sync']):.1f}% / {max(gg['async']):.1f}%; by ≥ 1% in "
        f"{sum(x >= 1 for x in gg_all['sync'])}/{n} (GPipe) and {sum(x >= 1 for x in gg_all['async'])}/{n} (1F1B)",
    )
    ss = sorted(r["search_s"] for r in ga)
    _has(
        page,
        f"Search time: median {statistics.median(ss):.2f} s (GPipe) per plan, max {ss[-1]:.1f} s (GPipe) "
        f"and {max(r['async_search_s'] for r in ga):.1f} s (1F1B",
    )


def test_comm_page_generated_part_is_what_comm_jsonl_gives(tmp_path):
    """Everything after comm.md's ``<!-- generated -->`` marker (tables, figures) comes from comm.jsonl."""
    pytest.importorskip("matplotlib")
    from experiments.comm_report import write_report

    page = tmp_path / "comm.md"
    with open(os.path.join(RESULTS, "comm.md"), encoding="utf-8") as f:
        committed = f.read()
    page.write_text(committed, encoding="utf-8")
    with open(os.path.join(RESULTS, "comm.jsonl"), encoding="utf-8") as f:
        (tmp_path / "comm.jsonl").write_text(f.read(), encoding="utf-8")
    write_report(str(page), {"cnn": 0.9, "big_mlp": 0.85}, "--report_only")
    assert page.read_text(encoding="utf-8") == committed, (
        "rerun python -m experiments.comm_bench --report_only --out=docs/results/comm.md"
    )
    assert {p.name for p in tmp_path.glob("*.png")} == {"comm.png", "comm_scaling.png"}


# ---- overlap.md (issue 18): the headline ratios recomputed from every run in overlap.jsonl
def test_overlap_headlines_are_what_overlap_jsonl_gives():
    page = _page("overlap.md")
    latest = {}
    for r in _jsonl("overlap.jsonl"):
        latest[r["setting"]] = r
    assert latest
    for r in latest.values():
        wall = {
            v: statistics.median(x["wall_s"] for x in r["runs"][v])
            for v in ("blocking", "overlap", "compute_only")
        }
        acc = {
            v: statistics.median(x["test_accuracy"] for x in r["runs"][v]) for v in ("blocking", "overlap")
        }
        assert len(r["runs"]["overlap"]) == r["repeats"]
        bound = max(wall["compute_only"], wall["blocking"] - wall["compute_only"])
        vs_blocking, vs_bound = wall["overlap"] / wall["blocking"], wall["overlap"] / bound
        points = 100 * (acc["overlap"] - acc["blocking"])
        ok = lambda good: "met" if good else "**missed**"  # noqa: E731
        _has(
            page,
            f"| {wall['blocking']:.2f} | {wall['overlap']:.2f} | {wall['compute_only']:.2f} | "
            f"{wall['blocking'] - wall['compute_only']:.2f} | {bound:.2f} | "
            f"{vs_blocking:.3f} ({ok(vs_blocking <= 1.0)}) | {vs_bound:.3f} ({ok(vs_bound <= 1.15)}) | "
            f"{100 * acc['blocking']:.1f}% → {100 * acc['overlap']:.1f}% ({points:+.1f}, {ok(abs(points) <= 1.5)}) |",
        )
