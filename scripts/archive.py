"""Snakemake step: write the sweep's Workflow Run RO-Crate, read it back, validate it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.util.steplog import step_log, to_console  # noqa: E402

sm = snakemake  # noqa: F821
with step_log(sm.log[0], sm.rule):
    from energysweep.archive.crate import archive

    lines = archive(
        Path(sm.input.config).parent,  # results/: the config as run lies at its top
        sm.params.workflow,
        list(sm.input.jobs),
        sm.output.crate,
        sm.params.name,
    )
    for line in lines:
        print(line)  # the rule log
        to_console(line)  # and the terminal: the crate's size is reported
