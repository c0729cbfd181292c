"""The comm page is rendered by ``python -m experiments.report comm`` from the records of
``experiments.comm_bench`` (:mod:`experiments.comm_page`)."""

import sys

if __name__ == "__main__":
    sys.stderr.write(
        "experiments.comm_report: error: the page of experiments.comm_bench is rendered by "
        "python -m experiments.report comm\n"
    )
    sys.exit(2)
