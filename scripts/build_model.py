"""Snakemake step: build the tiny random Llama checkpoint (no download)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.util.steplog import step_log  # noqa: E402

sm = snakemake  # noqa: F821
with step_log(sm.log[0], sm.rule):
    from energysweep.sweep.tinymodel import DEFAULT_SPEC, build_tiny_model, default_cache

    spec = {**DEFAULT_SPEC, **sm.params.spec}
    print("tiny model spec", spec)
    build_tiny_model(sm.output[0], spec, cache=default_cache())
