"""docs/skip_correct.md's sentences on the auto-H probe are what docs/results/sc_speed.jsonl gives."""

import os

from experiments import sc_speed_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_probe_prose_matches_the_stability_records():
    records = sc_speed_report.load(os.path.join(ROOT, "docs", "results", "sc_speed.jsonl"))
    old = [r for r in records if r.get("part") == "auto" and sc_speed_report._probe(r) == 4]
    missed = [r for r in old if r["max_dev_from_median"] > sc_speed_report.GOALS["auto"]]
    devs = sorted(round(100 * r["max_dev_from_median"]) for r in missed)
    samples = [
        x
        for r in records
        if r.get("part") == "auto"
        for t in r.get("timings") or []
        for x in t["t_comp_samples_s"]
    ]
    with open(os.path.join(ROOT, "docs", "skip_correct.md"), encoding="utf-8") as f:
        text = " ".join(f.read().split())
    words = {2: "2", 3: "3", 4: "4", 5: "5"}
    assert (
        f"{words.get(len(missed), len(missed))} of the {words.get(len(old), len(old))} stability records "
        f"made with it missed the ±25% goal ({devs[0]}–{devs[-1]}%"
    ) in text
    lo, hi = min(samples) * 1e3, max(samples) * 1e3
    assert f"single steps range from {lo:.1f} to {hi:.0f} ms" in text, (lo, hi)


def test_probe16_prose_matches_the_stability_records():
    records = sc_speed_report.load(os.path.join(ROOT, "docs", "results", "sc_speed.jsonl"))
    new = [r for r in records if r.get("part") == "auto" and sc_speed_report._probe(r) == 16]
    met = [r for r in new if r["max_dev_from_median"] <= sc_speed_report.GOALS["auto"]]
    devs = ", ".join(f"{round(100 * r['max_dev_from_median'])}%" for r in new)
    loads = [r["load_average_1m"] for r in new]
    comps = [t["t_comp_s"] * 1e3 for r in new for t in r["timings"]]
    with open(os.path.join(ROOT, "docs", "skip_correct.md"), encoding="utf-8") as f:
        text = " ".join(f.read().split())
    assert f"Of the {len(new)} records with probe H 16" in text
    assert f"{len(met)} met the goal ({devs})" in text
    quiet = [r for r in new if r["load_average_1m"] < 2]
    assert all(r["max_dev_from_median"] <= sc_speed_report.GOALS["auto"] for r in quiet) and len(quiet) == 2
    assert f"(load {int(min(loads))}–{round(max(loads))})" in text, loads
    assert f"({min(comps):.2f}–{max(comps):.2f} ms across those runs)" in text, comps
