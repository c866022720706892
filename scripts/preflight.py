"""Snakemake step: energy preflight of the node this job landed on (validity.preflight)."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))  # noqa: F821

from energysweep.util.steplog import step_log  # noqa: E402

sm = snakemake  # noqa: F821
with step_log(sm.log[0], sm.rule):
    import time

    from energysweep.hw import emulated

    if sm.params.device == "emulated":  # an idle emulated node, before hw.nvml picks its module
        state = Path(sm.output[0]).with_name(f"emulated-{Path(sm.output[0]).stem}")
        node = emulated.prepare(state, sm.params.emulated, time.time_ns())
        os.environ.update(emulated.job_env(state, node, dict(os.environ)))

    from energysweep.hw import nvml as hw_nvml
    from energysweep.validity import preflight

    report = preflight.run(
        preflight.PROBE_SECONDS,
        require=sm.params.require,
        max_idle_std_w=sm.params.max_idle_std_w,
        throttle_reasons=sm.params.throttle_reasons,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        torch_uuids=hw_nvml.torch_uuids,
    )
    out = Path(sm.output[0])
    preflight.write_report(report, out.parent)  # results/preflight/<host>.json
    preflight.write_report(report, out.parent, out.stem)  # this slot's declared output
    print(preflight.verdict([report]))
