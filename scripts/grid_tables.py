"""Snakemake step: write the grid's jobs and the points left out (with their reason)."""

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.util.steplog import step_log  # noqa: E402

sm = snakemake  # noqa: F821
COLS = ["model", "backend", "scenario", "tp", "pp", "dp"]
with step_log(sm.log[0], sm.rule):
    # The layout, then the GPU setting axes the config sweeps (energysweep.sweep.settings).
    COLS = [*COLS, *sm.params.setting_axes]
    for path, rows, cols in (
        (sm.output.jobs, sm.params.jobs, COLS),
        (sm.output.skipped, sm.params.skipped, [*COLS, "reason"]),
    ):
        with open(path, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=cols, delimiter="\t", lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        print(f"{path}: {len(rows)} rows")
