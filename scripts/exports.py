"""Snakemake step: the summary in public units (results/exports/, docs/exports.md)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.util.steplog import step_log  # noqa: E402

sm = snakemake  # noqa: F821
with step_log(sm.log[0], sm.rule):
    from energysweep.archive.exports import write_exports

    write_exports(
        sm.input.summary, sm.input.energy, sm.params.measurement, Path(sm.output.mlenergy).parent
    )
