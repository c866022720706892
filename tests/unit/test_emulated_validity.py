"""Each scripted fault of the emulated node produces its reason code in the validity verdict.

A job's measurement path for real above NVML, in virtual time: energysweep's NVML source (tick-
aligned windows), a 10 Hz power timeline read through the emulated pynvml, shard rows, then
aggregate.windows/summarize, recheck.recheck and verdict.annotate. The emulated node runs the
default h100-sxm profile (1 s averaged power sampled 25% of the time, 100 ms counter refreshes)
and 5.2 s windows after 2 s of cooldown, as the schema's measurement defaults run them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pynvml as real
import pytest
from jobspec import validated_config

from energysweep import aggregate
from energysweep.energy.nvml import CounterWentBackwards, NvmlSource
from energysweep.energy.unavailable import UnavailableSource
from energysweep.hw import nvml as hw_nvml
from energysweep.tables import shards
from energysweep.validity import recheck
from energysweep.validity import verdict as validity

from emulated_helpers import VirtualJob
from tests_rows import row

WINDOW_S, COOLDOWN_S, REPS = 5.2, 2.0, 3
# The schema's thresholds, less those a 3-window test job cannot meet by design.
CFG = {"min_iterations": 1, "min_steady_state_s": 0, "max_ci_half_width": 1.0}
THRESHOLDS = validity.Thresholds.from_config(validated_config(validity=CFG)["validity"])


def run_job(tmp_path, monkeypatch, faults: list[dict], gpus: int = 1):
    """An idle baseline, then REPS windows; returns (summary with the verdict, shard rows)."""
    job = VirtualJob(tmp_path, gpus, faults)
    monkeypatch.setattr(hw_nvml, "pynvml", job.nvml)
    sources = []
    for uuid in job.uuids:  # one rank per GPU; make_source's auto fallback where NVML fails
        try:
            sources.append(
                NvmlSource(
                    [uuid], clock=lambda: job.clock.t / 1e9, sleep=job.sleep, background=False
                )
            )
        except hw_nvml.NVMLError as exc:
            sources.append(UnavailableSource(f"NVML unavailable: {type(exc).__name__}"))
    job.sleep(2.0)
    idle = pd.DataFrame({"job_id": ["j1"], "idle_start_ns": [job.clock.t]})
    job.sleep(5.0)
    idle["idle_end_ns"] = job.clock.t
    rows = []
    for rep in range(REPS):
        job.sleep(COOLDOWN_S)
        rows += window_rows(job, sources, rep)
    job.sleep(2.0)
    rows = shards.to_table(rows).to_pandas()
    summary = aggregate.summarize(aggregate.windows(rows))
    columns = ["job_id", "gpu_uuid", "time_ns", "power_mw", "energy_counter_mj",
               "clock_event_reasons"]  # fmt: skip
    power = pd.DataFrame(job.samples, columns=columns)
    table = recheck.recheck(rows, power, idle, THRESHOLDS.power_average_s)  # the schema's 1 s
    return validity.annotate(summary, rows, table, THRESHOLDS), rows


def window_rows(job, sources, rep: int) -> list[dict]:
    """One window as the window rule takes it (prepare, barrier, begin ... end) on every rank."""
    for s in sources:
        s.prepare()
    for s in sources:
        s.begin()
    start = job.clock.t
    job.busy = True
    job.sleep(WINDOW_S)
    job.busy = False
    end = job.clock.t
    out = []
    for rank, s in enumerate(sources):
        base = {"repetition": rep, "rank": rank, "local_rank": rank, "pid": 100 + rank,
                "window_start_ns": start, "window_end_ns": end, "tp": len(sources),
                "world_size": len(sources), "iterations": 2, "requests": 8, "batch_size": 4,
                "global_batch_size": 4, "gpu_energy_method": "emulated:nvml-total-energy-counter",
                "idle_gpu_power_w": 70.0, "idle_gpu_power_status": "measured"}  # fmt: skip
        try:
            (r,) = s.end()
        except (CounterWentBackwards, real.NVMLError) as exc:
            out.append(row(**base, status="error", error=f"{type(exc).__name__}: {exc}",
                           gpu_uuid=job.uuids[rank], gpu_energy_mj=None,
                           gpu_energy_status="unavailable"))  # fmt: skip
            s._anchor = None
            continue
        out.append(row(**base, gpu_uuid=r.gpu_uuid, gpu_index=r.gpu_index, gpu_name=r.gpu_name,
                       gpu_energy_mj=r.energy_mj, gpu_energy_status=r.status,
                       gpu_energy_detail=r.detail or None))  # fmt: skip
    return out


def codes(summary) -> set[str]:
    return set(filter(None, summary["invalid_reasons"].iloc[0].split(";")))


def test_a_healthy_emulated_job_fails_only_as_emulated(tmp_path, monkeypatch):
    s, rows = run_job(tmp_path, monkeypatch, [])
    assert codes(s) == {"emulated"}, s[["invalid_reasons", "recheck_max_deviation"]].to_dict()
    assert s["recheck_max_deviation"].iloc[0] < 0.05  # the power average undone (1 s, 25%)
    assert rows["gpu_energy_mj"].notna().all()


FAULTS = {
    # kind: (fault settings, GPUs of the job, the reason code it must produce)
    "stuck_counter": ({"kind": "stuck_counter", "gpu": 0}, 1, "counter_stuck"),
    "throttle": ({"kind": "throttle", "gpu": 0}, 1, "throttled"),
    "missing_gpu": ({"kind": "missing_gpu", "gpu": 1}, 2, "partial_gpus"),
    "init_error": ({"kind": "init_error", "error": "DRIVER_NOT_LOADED"}, 1, "no_gpu_energy"),
    # Inside the second window (it starts ~9.2 s after the epoch): that window fails.
    "counter_reset": ({"kind": "counter_reset", "gpu": 0, "start_s": 19.0}, 1, "few_repetitions"),
    "nvml_error": ({"kind": "nvml_error", "gpu": 0, "start_s": 20.0, "duration_s": 2.5}, 1,
                   "few_repetitions"),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_each_scripted_fault_produces_its_reason_code(kind, tmp_path, monkeypatch):
    fault, gpus, code = FAULTS[kind]
    s, rows = run_job(tmp_path, monkeypatch, [fault], gpus)
    assert code in codes(s) and "emulated" in codes(s), (kind, codes(s))
    if kind in ("counter_reset", "nvml_error"):  # the failed window says why
        errors = rows.loc[rows["status"] == "error", "error"]
        want = "CounterWentBackwards" if kind == "counter_reset" else "NVMLError_GpuIsLost"
        assert len(errors) == 1 and want in errors.iloc[0], errors.tolist()
    assert not np.any(s["valid"])
