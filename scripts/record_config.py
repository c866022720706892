"""Snakemake step: record the validated config (defaults filled), sweep_hash and code version."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.util.steplog import step_log  # noqa: E402

sm = snakemake  # noqa: F821
with step_log(sm.log[0], sm.rule):
    import yaml

    record = {
        "sweep_hash": sm.params.sweep_hash,
        "code_version": sm.params.code_version,
        "config": dict(sm.params.config),
    }
    with open(sm.output[0], "w") as fh:
        yaml.safe_dump(record, fh, sort_keys=False)
