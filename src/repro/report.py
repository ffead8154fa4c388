"""Rebuild a sweep's report: `python -m repro.report SWEEP_DIR`.

Works on a finished sweep, one whose jobs partly failed, or one still running (jobs without a
summary are listed as not finished). Writes sweep_summary.{json,csv,md} and sweep.png into
SWEEP_DIR and prints the markdown table.
"""

from __future__ import annotations

import sys
from pathlib import Path

from repro.errors import DataError, UserError, exit_with
from repro.sweeps import report


def main(argv: list[str]) -> None:
    try:
        if len(argv) != 1:
            raise DataError("usage: python -m repro.report SWEEP_DIR")
        sweep_dir = Path(argv[0])
        built = report.build(sweep_dir)
        if not built.jobs:
            raise DataError(
                f"{sweep_dir}: no sweep jobs found (looked for */.hydra/overrides.yaml)"
            )
    except UserError as error:
        exit_with(error)
    report.write(built)
    print(report.markdown(built), end="")


if __name__ == "__main__":
    main(sys.argv[1:])
