"""Snakemake step: write the report's first screen (the sweep's answer) as an HTML fragment."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.util.steplog import step_log  # noqa: E402

sm = snakemake  # noqa: F821
with step_log(sm.log[0], sm.rule):
    from energysweep.figures.render import write_headline

    write_headline(sm.input.summary, sm.input.energy, sm.output.headline)
