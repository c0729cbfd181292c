"""``python -m experiments.sc_speed_report RECORDS.jsonl PAGE.md``: page ``sc_speed`` of :mod:`experiments.report`."""

from experiments import _report

if __name__ == "__main__":
    raise SystemExit(_report.main("sc_speed"))
