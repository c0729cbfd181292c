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
