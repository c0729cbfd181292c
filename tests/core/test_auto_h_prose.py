"""docs/skip_correct.md's sentences on the auto-H probe are what docs/results/sc_speed.jsonl gives."""
import os

from experiments import sc_speed_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_probe_prose_matches_the_stability_records():
    records = sc_speed_report.load(os.path.join(ROOT, "docs", "results", "sc_speed.jsonl"))
    old = [r for r in records if r.get("part") == "auto" and sc_speed_report._probe(r) == 4]
    missed = [r for r in old if r["max_dev_from_median"] > sc_speed_report.GOALS["auto"]]
    devs = sorted(round(100 * r["max_dev_from_median"]) for r in missed)
    samples = [x for r in records if r.get("part") == "auto" for t in r.get("timings") or []
               for x in t["t_comp_samples_s"]]
    with open(os.path.join(ROOT, "docs", "skip_correct.md"), encoding="utf-8") as f:
        text = " ".join(f.read().split())
    words = {2: "2", 3: "3", 4: "4", 5: "5"}
    assert (f"{words.get(len(missed), len(missed))} of the {words.get(len(old), len(old))} stability records "
            f"made with it missed the ±25% goal ({devs[0]}–{devs[-1]}%") in text
    lo, hi = min(samples) * 1e3, max(samples) * 1e3
    assert f"single steps range from {lo:.1f} to {hi:.0f} ms" in text, (lo, hi)
