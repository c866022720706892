"""Snakemake step: merge all shards into the energy table, the summary and the environment."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.aggregate import aggregate  # noqa: E402

sm = snakemake  # noqa: F821
with open(sm.log[0], "w") as log:
    sys.stderr = sys.stdout = log
    aggregate(
        list(sm.input.shards),
        sm.output.energy,
        sm.output.summary,
        jobs=list(sm.input.jobs),
        environment_out=sm.output.environment,
    )
