"""``python -m experiments.correction_report RECORDS.jsonl PAGE.md``: page ``correction`` of :mod:`experiments.report`."""

from experiments import _report

if __name__ == "__main__":
    raise SystemExit(_report.main("correction"))
