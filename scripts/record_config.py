"""Snakemake step: record the validated config (defaults filled), its hash and the code version."""

import sys

import yaml

sm = snakemake  # noqa: F821
with open(sm.log[0], "w") as log:
    sys.stderr = sys.stdout = log
    record = {
        "config_hash": sm.params.config_hash,
        "code_version": sm.params.code_version,
        "config": dict(sm.params.config),
    }
    with open(sm.output[0], "w") as fh:
        yaml.safe_dump(record, fh, sort_keys=False)
