"""Every results page in docs/results/ is generated: rendering it from its .jsonl through
``experiments.report`` gives the committed page byte for byte, and no sentence a person wrote on a page
carries a number (the numbers all come from the records)."""

import os
import re

import pytest

from experiments import report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "docs", "results")
PAGES = report.pages()


@pytest.mark.parametrize("name", sorted(PAGES))
def test_page_is_what_its_data_gives(name):
    with open(os.path.join(RESULTS, f"{name}.md"), encoding="utf-8") as f:
        committed = f.read()
    assert report.render(name) == committed, (
        f"docs/results/{name}.md differs: python -m experiments.report {name}"
    )


def test_every_page_in_docs_results_is_generated():
    on_disk = {f[:-3] for f in os.listdir(RESULTS) if f.endswith(".md")}
    assert on_disk == set(PAGES)


@pytest.mark.parametrize("name", sorted(PAGES))
def test_hand_written_text_has_no_number(name):
    page = PAGES[name]
    texts = [page.title, page.compared] + [t.heading for t in page.tables] + [t.note for t in page.tables]
    number = re.compile(r"(?<![\w-])\d+(?:[.,]\d+)?(?![\w])")  # 1F1B or float32 are names, not numbers
    assert [(t, number.findall(t)) for t in texts if number.search(t)] == []


@pytest.mark.parametrize("name", sorted(PAGES))
def test_page_states_command_load_and_what_is_compared(name):
    text = report.render(name)
    assert "**What is compared.**" in text and "**Machine load:**" in text
    assert re.search(r"^    python -m (experiments|tf_commopt)\.\w+", text, re.M), "no command on the page"


def test_a_new_record_renders_next_to_the_old(tmp_path):
    """A sweep record of the harness and the older line formats render on the same page."""
    from experiments import skip_correct_bench
    from experiments.page import render_page

    old = {"variant": "ssgd", "ms_per_step": 96.36, "test_accuracy": 0.906, "test_loss": 0.27, "steps": 60}
    new = {
        "bench": "skip_correct",
        "setting": "mlp:2:switch:0",
        "model": "mlp",
        "workers": 2,
        "runs": {
            "vrl": [{"ms_per_step": 12.5, "steps": 6, "test_accuracy": 0.7, "test_loss": 1.1, "syncs": 2}]
        },
        "command": "python -m experiments.skip_correct_bench --steps=6",
        "load_average_1m": 3.5,
        "cores": 2,
    }
    text = render_page(skip_correct_bench.PAGES[0], [old, new])
    assert "| ssgd | 96.36 | 0.906 | 0.27 | 60 | — | — |" in text
    assert "| vrl | 12.5 | 0.7 | 1.1 | 2 | — | — |" in text
    assert "1-minute load average 3.5 at the records' ends on 2 cores; 1 of 2 records carry none." in text
