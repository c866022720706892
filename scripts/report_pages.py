"""Snakemake step: write the report's summary table and environment pages (self-contained HTML)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

sm = snakemake  # noqa: F821
with open(sm.log[0], "w") as log:
    sys.stderr = sys.stdout = log
    from energysweep.report_pages import write_pages

    write_pages(
        sm.input.summary,
        sm.input.environment,
        sm.input.config,
        sm.input.jobs,
        sm.input.skipped,
        sm.output.summary,
        sm.output.environment,
    )
