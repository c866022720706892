"""Snakemake step: write the report's summary table and environment pages (self-contained HTML)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.util.steplog import step_log  # noqa: E402

sm = snakemake  # noqa: F821
with step_log(sm.log[0], sm.rule):
    from energysweep.figures.report_pages import write_pages

    write_pages(
        sm.input.summary,
        sm.input.environment,
        sm.input.config,
        sm.input.jobs,
        sm.input.skipped,
        sm.output.summary,
        sm.output.environment,
    )
