"""Results pages generated from data: regenerating each page from the .jsonl beside it gives the committed
page byte for byte, so no number in their prose can drift from the data."""
import os

import pytest

from experiments import correction_report, sc_speed_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "docs", "results")

PAGES = [("sc_speed.jsonl", "sc_speed.md", sc_speed_report), ("correction.jsonl", "correction.md", correction_report)]


@pytest.mark.parametrize("jsonl,page,module", PAGES, ids=[p[1] for p in PAGES])
def test_page_is_what_its_data_gives(jsonl, page, module):
    with open(os.path.join(RESULTS, page), encoding="utf-8") as f:
        committed = f.read()
    assert module.render(module.load(os.path.join(RESULTS, jsonl)), jsonl) == committed, (
        f"docs/results/{page} differs from what docs/results/{jsonl} gives: rerun "
        f"python -m experiments.{module.__name__.split('.')[-1]} docs/results/{jsonl} docs/results/{page}")


def _readme_row(start: str) -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return next(line for line in f if line.startswith(start))


def test_readme_skip_correct_row_is_what_the_data_gives():
    row = _readme_row("| skip-and-correct: 88.9%")
    recs = sc_speed_report.load(os.path.join(RESULTS, "sc_speed.jsonl"))
    table = [r for r in recs if r["part"] == "table" and r.get("steps_per_execution", 1) == 1][-1]
    ratio = table["wall_ratio_vs_ssgd"]
    acc = {k: v["test_accuracy"] for k, v in table["rows"].items()}
    assert f"89.4% less wall time than SSGD (0.106 of it)" in row and ratio["sc_auto"] == 0.106
    assert f"H = 16 {100 * (1 - ratio['sc_h16_none']):.1f}% less" in row
    assert f"({100 * acc['sc_auto']:.1f}%, {100 * acc['sc_h16_none']:.1f}% vs {100 * acc['ssgd']:.1f}%)" in row
    syncs = sorted(r["ratio_to_bound"] for r in recs if r["part"] == "sync" and r["topology"] == "shared")
    assert f"within {syncs[0]:.2f}–{syncs[-1]:.2f}x of the ring all-reduce bound" in row


def test_readme_correction_row_is_what_the_data_gives():
    row = _readme_row("| the correction keeps")
    t = correction_report.table(correction_report.load(os.path.join(RESULTS, "correction.jsonl")))
    auto = [t[(o, "auto", 16)][0] - t[(o, "ssgd", 1)][0] for o in ("sgd", "momentum", "adam")]
    none = [t[(o, "none", 16)][0] - t[(o, "ssgd", 1)][0] for o in ("sgd", "momentum", "adam")]
    assert (f"SGD {auto[0]:.1f}, momentum {auto[1]:.1f}, Adam {auto[2]:.1f} points vs SSGD".replace("-", "−")
            in row.replace("−0.0", "−0.0")), row
    assert f"plain local SGD {none[0]:.1f} / {none[1]:.1f} / {none[2]:.1f}".replace("-", "−") in row, row
