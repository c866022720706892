"""Snakemake step: the preflight verdict of every node; fails when required energy is missing."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.util.steplog import step_log, to_console  # noqa: E402

sm = snakemake  # noqa: F821
with step_log(sm.log[0], sm.rule):
    from energysweep.validity import preflight

    reports = [json.loads(Path(p).read_text()) for p in sm.input]
    text = preflight.verdict(reports)
    print(text)
    to_console(text)  # the one-screen verdict, on the terminal too
    if not all(r["pass"] for r in reports):
        raise SystemExit(
            "preflight failed: energy that measurement.require_energy asks for cannot be "
            "measured on every node (see the verdict above and results/preflight/*.json)"
        )
    Path(sm.output[0]).write_text(text + "\n")
