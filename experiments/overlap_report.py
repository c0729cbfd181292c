"""``python -m experiments.overlap_report RECORDS.jsonl PAGE.md``: page ``overlap`` of :mod:`experiments.report`."""

from experiments import _report

if __name__ == "__main__":
    raise SystemExit(_report.main("overlap"))
