"""Snakemake step: draw energy per output token vs batch size."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

import pandas as pd  # noqa: E402

from energysweep.report import plot_energy_per_token  # noqa: E402
from energysweep.steplog import step_log  # noqa: E402

sm = snakemake  # noqa: F821
with step_log(sm.log[0], sm.rule):
    plot_energy_per_token(pd.read_csv(sm.input[0]), sm.output[0])
