"""Snakemake step: write the grid's jobs and the points left out (with their reason)."""

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.util.steplog import step_log  # noqa: E402

sm = snakemake  # noqa: F821
with step_log(sm.log[0], sm.rule):
    # The job-key columns of the sweep's paths (energysweep.sweep.gpu_axes.path_keys).
    COLS = list(sm.params.key_columns)
    for path, rows, cols in (
        (sm.output.jobs, sm.params.jobs, COLS),
        (sm.output.skipped, sm.params.skipped, [*COLS, "reason"]),
    ):
        with open(path, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=cols, delimiter="\t", lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        print(f"{path}: {len(rows)} rows")
