"""Snakemake step: draw every figure of the report from the merged tables."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.util.steplog import step_log  # noqa: E402

sm = snakemake  # noqa: F821
with step_log(sm.log[0], sm.rule):
    from energysweep.figures.render import draw_all

    inputs = dict(sm.input.items())
    draw_all(
        inputs["summary"],
        inputs["energy"],
        list(sm.input.jobs),
        outputs=dict(sm.output.items()),
        stages_csv=inputs.get("stages"),
        slo=dict(sm.params.slo),
    )
