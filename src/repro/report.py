"""Rebuild a sweep's report: `python -m repro.report SWEEP_DIR [METRIC ...]`.

Works on a finished sweep, one whose jobs partly failed, or one still running (jobs without a
summary are listed as not finished). Writes sweep_summary.{json,csv,md} and sweep.png into
SWEEP_DIR and prints the markdown table. Each METRIC (a number in the jobs' summary.json, by name
or dotted path: best_val_acc, env.num_threads) is summarised beside the usual ones.
"""

from __future__ import annotations

import sys
from pathlib import Path

from repro.core.errors import DataError, UserError, exit_with
from repro.core.guards import folders
from repro.core.sweeps import render, report


def main(argv: list[str]) -> None:
    try:
        if not argv:
            raise DataError("usage: python -m repro.report SWEEP_DIR [METRIC ...]")
        sweep_dir, metrics = Path(argv[0]), argv[1:]
        folders.check_sweep(sweep_dir)  # the report's files go there
        built = report.build(sweep_dir, metrics)
        if not built.jobs:
            raise DataError(
                f"{sweep_dir}: no sweep jobs found (looked for */.hydra/overrides.yaml)"
            )
        for metric in metrics:
            if not any(metric in group for group in built.groups.values()):
                raise DataError(f"{metric}: no finished job's summary.json holds a number there")
    except UserError as error:
        exit_with(error)
    render.write(built)
    print(render.markdown(built), end="")


if __name__ == "__main__":
    from repro.core.runtime.launch import start

    start("repro.report", hash_seed=False)  # rebuilds no run: no hash seed to pin
    main(sys.argv[1:])
