"""Validity verdict, re-check and stages at the NVML boundary (fake pynvml, real code above it).

Each scenario runs a short job's measurement path for real: NvmlSource windows and the
PowerSampler thread read a fake NVML whose counter advances by itself (tests/fake_pynvml.py);
the rows go through aggregate.windows/summarize, recheck.recheck and validity.annotate.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pynvml as real
import pytest
from jobspec import validated_config

from energysweep import aggregate, results
from energysweep.energy import nvml as es_nvml
from energysweep.energy import sampler, wall_ns
from energysweep.tables import power as power_tbl
from energysweep.tables import shards
from energysweep.validity import recheck, stages
from energysweep.validity import timeline as power_timeline
from energysweep.validity import verdict as validity

import fake_pynvml
from tests_rows import row

# Thresholds scaled to 0.25 s windows (the defaults are for real sweeps: 5 s, 20 s, 32 its).
FAST = {
    "counter_period_s": 0.005,
    "min_counter_periods": 5,
    "min_iterations": 2,
    "min_steady_state_s": 0.1,
    "min_ok_repetitions": 3,
    "max_ci_half_width": 0.5,
}
WINDOW_S = 0.25


def run_job(mod, gpus, reps=3, requests=4, job_id="j1", pp_ranks=None):
    """An idle baseline, then ``reps`` windows of ``gpus`` (fake GPUs) with NVML counters and a
    100 Hz timeline, as a job's ranks take them; returns (shard rows, power samples, idle
    bounds)."""
    uuids = [g.uuid for g in gpus]
    samp = sampler.PowerSampler(uuids, 100, job_id, rank=0, host="h")
    samp.start()
    src = es_nvml.NvmlSource(uuids)
    time.sleep(0.03)
    idle = pd.DataFrame({"job_id": [job_id], "idle_start_ns": [wall_ns()]})
    time.sleep(0.1)  # the idle baseline
    idle["idle_end_ns"] = wall_ns()
    rows = []
    for rep in range(reps):
        src.begin()  # the window rule's order: edges after the counter's refresh waits
        start = wall_ns()
        time.sleep(WINDOW_S)
        end = wall_ns()
        readings = src.end()
        for i, r in enumerate(readings):
            pp_rank = (pp_ranks or [0] * len(gpus))[i]
            rows.append(
                row(
                    job_id=job_id,
                    repetition=rep,
                    rank=i,
                    pid=100 + i,
                    gpu_uuid=r.gpu_uuid,
                    gpu_index=r.gpu_index,
                    gpu_name=r.gpu_name,
                    gpu_energy_mj=r.energy_mj,
                    gpu_energy_status=r.status,
                    window_start_ns=start,
                    window_end_ns=end,
                    iterations=2,
                    requests=requests,
                    batch_size=2,
                    global_batch_size=2,
                    pp=len(set(pp_ranks or [0])),
                    tp=len(gpus) // len(set(pp_ranks or [0])),
                    world_size=len(gpus),
                    pp_rank=pp_rank,
                    cpu_time_s=0.1 * (1 + pp_rank),
                    output_tokens=requests * 16,
                    idle_gpu_power_w=gpus[i].power_mw / 1e3,
                    idle_gpu_power_status="measured",
                )
            )
    time.sleep(0.05)
    src.close()
    power = pd.DataFrame(samp.stop())
    return shards.to_table(rows).to_pandas(), power, idle


def verdict(rows, power, cfg=FAST, idle=None):
    """The verdict with ``cfg`` over the schema's defaults (validated as the workflow does)."""
    summary = aggregate.summarize(aggregate.windows(rows))
    table = recheck.recheck(rows, power, idle, 0.0)
    thresholds = validity.Thresholds.from_config(validated_config(validity=cfg)["validity"])
    return validity.annotate(summary, rows, table, thresholds), table


def codes(s) -> set[str]:
    return set(filter(None, s["invalid_reasons"].iloc[0].split(";")))


def test_healthy_job_is_valid_and_timeline_agrees(fake_nvml):
    mod = fake_nvml(fake_pynvml.h100s(2))
    for g in mod.fake_gpus:
        g.counter_period_s = 0.005
    rows, power, idle = run_job(mod, mod.fake_gpus)
    s, table = verdict(rows, power, idle=idle)
    assert codes(s) == set() and bool(s["valid"].iloc[0]), s["invalid_reasons"].iloc[0]
    assert s["validity_unchecked"].iloc[0] == ""
    gpu = table[table["scope"] == "gpu"]
    assert len(gpu) == 6 and (gpu["status"] == "ok").all()
    # 300 W for 0.25 s; the counter ticks every 5 ms, so it agrees to about 2 %.
    assert gpu["timeline_counter_ratio"].between(0.95, 1.05).all()
    assert abs(s["recheck_ratio"].iloc[0] - 1) < 0.05 and s["recheck_status"].iloc[0] == "ok"
    win = table[table["scope"] == "window"]
    assert len(win) == 3 and np.allclose(
        win["counter_energy_j"], gpu.groupby("repetition")["counter_energy_j"].sum()
    )
    assert s["gpu_count"].iloc[0] == 2 and s["gpu_model"].iloc[0] == "NVIDIA H100 80GB HBM3"
    assert results.unexplained_nulls(s) == []


def test_slow_counter_period_makes_window_short(fake_nvml):
    mod = fake_nvml(fake_pynvml.h100s(1))
    mod.fake_gpus[0].counter_period_s = 0.1  # 5 periods = 0.5 s > the 0.25 s windows
    rows, power, idle = run_job(mod, mod.fake_gpus)
    s, _ = verdict(rows, power, idle=idle)
    # Observed from 100 Hz samples: an upper bound (a loaded machine samples less often).
    assert 0.09 <= s["observed_counter_period_s"].iloc[0] <= 0.25
    assert s["counter_period_s"].iloc[0] == s["observed_counter_period_s"].iloc[0]
    # A counter that ticks twice a window also disagrees with the timeline (quantization).
    assert "window_short" in codes(s) and codes(s) <= {"window_short", "recheck_mismatch"}


def test_stuck_counter(fake_nvml):
    mod = fake_nvml(fake_pynvml.h100s(1))
    mod.fake_gpus[0].counter_period_s = 0.005
    mod.fake_gpus[0].counter_stuck = True
    rows, power, idle = run_job(mod, mod.fake_gpus)
    s, table = verdict(rows, power, idle=idle)
    assert "counter_stuck" in codes(s) and not s["valid"].iloc[0]
    assert table.loc[table["scope"] == "gpu", "counter_stuck"].all()


def test_counter_and_timeline_disagree(fake_nvml):
    mod = fake_nvml(fake_pynvml.h100s(1))
    g = mod.fake_gpus[0]
    g.counter_period_s, g.counter_rate_mw = 0.005, 400_000  # the power reading says 300 W
    rows, power, idle = run_job(mod, mod.fake_gpus)
    s, _ = verdict(rows, power, idle=idle)
    assert codes(s) == {"recheck_mismatch"}
    assert 0.7 < s["recheck_ratio"].iloc[0] < 0.8


def test_throttling_reasons(fake_nvml):
    mod = fake_nvml(fake_pynvml.h100s(1))
    g = mod.fake_gpus[0]
    g.counter_period_s = 0.005
    g.clock_event_reasons = real.nvmlClocksEventReasonHwThermalSlowdown
    rows, power, idle = run_job(mod, mod.fake_gpus)
    s, table = verdict(rows, power, idle=idle)
    assert codes(s) == {"throttled"} and s["clock_event_reasons_seen"].iloc[0] == "hw_thermal"
    assert (table.loc[table["scope"] == "gpu", "clock_event_reason_names"] == "hw_thermal").all()
    # At the power limit (SW power cap) a GPU is working normally: reported, not invalid...
    g.clock_event_reasons = real.nvmlClocksEventReasonSwPowerCap
    rows, power, idle = run_job(mod, mod.fake_gpus, job_id="j2")
    s, _ = verdict(rows, power, idle=idle)
    assert codes(s) == set() and s["clock_event_reasons_seen"].iloc[0] == "sw_power_cap"
    # ...unless the config says so.
    s, _ = verdict(rows, power, {**FAST, "throttle_reasons": ["sw_power_cap"]}, idle)
    assert codes(s) == {"throttled"}


def test_missing_uuid_is_no_gpu_energy_and_unchecked(fake_nvml):
    from energysweep import energy

    mod = fake_nvml(fake_pynvml.h100s(1))
    src = energy.make_source("auto", "cuda:0", ["GPU-deadbeef-0000-0000-0000-000000000000"])
    (r,) = (src.begin(), src.end())[1]
    assert r.energy_mj is None and "NVMLError_NotFound" in r.detail
    rows = shards.to_table(
        [
            row(
                repetition=k,
                gpu_uuid=None,
                gpu_index=None,
                gpu_name=None,
                gpu_energy_mj=None,
                gpu_energy_status=r.status,
                gpu_energy_detail=r.detail,
            )
            for k in range(3)
        ]
    ).to_pandas()
    s, table = verdict(rows, pd.DataFrame(samples_of(mod, [])))
    assert codes(s) == {"no_gpu_energy"} and not s["valid"].iloc[0]
    assert set(s["validity_unchecked"].iloc[0].split(";")) == set(validity.GPU_CHECKS)
    assert (table["status"] == recheck.NO_COUNTER).all()
    assert results.unexplained_nulls(s) == []


def samples_of(mod, uuids):
    samp = sampler.PowerSampler(uuids, 100, "j1", rank=0, host="h")
    return samp.stop()


def test_partial_gpus_few_repetitions_and_no_timeline():
    two = dict(tp=2, world_size=2)
    rows = [row(repetition=k, **two) for k in range(2)]
    rows += [
        row(
            repetition=k,
            rank=1,
            pid=2,
            gpu_uuid="GPU-b",
            **two,
            gpu_energy_mj=None if k == 0 else 1000.0,
            gpu_energy_status="unavailable" if k == 0 else "measured",
        )
        for k in range(2)
    ]
    s, _ = verdict(shards.to_table(rows).to_pandas(), EMPTY_POWER)
    assert codes(s) == {"partial_gpus", "few_repetitions", "no_timeline"}


EMPTY_POWER = pd.DataFrame(
    columns=[
        "job_id",
        "gpu_uuid",
        "time_ns",
        "power_mw",
        "energy_counter_mj",
        "clock_event_reasons",
    ]
)


def test_batch_not_full_and_ci_wide():
    rows = [row(repetition=k, requests=6, gpu_energy_mj=1000.0 * (1 + 5 * k)) for k in range(3)]
    frame = shards.to_table(rows).to_pandas()
    s, _ = verdict(frame, EMPTY_POWER, {**FAST, "require_timeline": False})
    assert s["batch_fill"].iloc[0] == 0.75
    assert codes(s) == {"batch_not_full", "ci_wide"}
    assert s["ci_half_width_fraction"].iloc[0] > 0.5


def test_idle_unstable_from_timeline():
    rows = shards.to_table(
        [
            row(repetition=k, idle_gpu_power_w=60.0, idle_gpu_power_status="measured")
            for k in range(3)
        ]
    ).to_pandas()
    t = np.arange(0, 2.0, 0.1)
    idle_p = np.where(np.arange(len(t)) % 2, 50_000, 70_000)  # 60 W +/- 10 W
    power = pd.DataFrame(
        {
            "job_id": "j1",
            "gpu_uuid": "GPU-a",
            "time_ns": (t * 1e9).astype(np.int64) + 10**8,
            "power_mw": idle_p,
            "energy_counter_mj": None,
            "clock_event_reasons": None,
        }
    )
    idle = pd.DataFrame(
        {"job_id": ["j1"], "idle_start_ns": [2 * 10**8], "idle_end_ns": [18 * 10**8]}
    )
    s, table = verdict(rows, power, {**FAST, "require_timeline": False}, idle)
    idle_row = table[table["scope"] == "idle"].iloc[0]
    assert idle_row["power_std_w"] == pytest.approx(10.0, rel=0.01)
    # idle power x idle time (60 W x 1.6 s) against the timeline's integral of the same.
    assert idle_row["timeline_counter_ratio"] == pytest.approx(1.0, abs=0.07)
    assert "idle_unstable" in codes(s) and s["idle_gpu_power_std_w"].iloc[0] > 9.9


def test_trapezoid_integral_with_interpolated_edges():
    t = np.array([0.0, 1.0, 2.0, 3.0])
    p = np.array([100.0, 200.0, 200.0, 100.0])  # W
    tl = power_timeline.timelines(
        pd.DataFrame(
            {
                "job_id": "j",
                "gpu_uuid": "GPU-a",
                "time_ns": (t * 1e9).astype(np.int64)[::-1],
                "power_mw": p[::-1] * 1e3,
                "energy_counter_mj": [500_000, 350_000, 150_000, 0],
                "clock_event_reasons": None,
            }
        )
    )[("j", "GPU-a")]  # sorted by time on the way in
    out = tl.window(int(0.5e9), int(2.5e9))
    # [0.5, 1]: 150 -> 200 W (87.5 J); [1, 2]: 200 J; [2, 2.5]: 200 -> 150 W (87.5 J).
    assert out["timeline_energy_j"] == pytest.approx(375.0)
    assert out["samples"] == 2 and out["max_sample_gap_s"] == pytest.approx(1.0)
    assert tl.window(int(-1e9), int(1e9))["status"] == power_timeline.NOT_COVERED


def test_clock_reason_bits_are_pynvmls():
    names = {
        "gpu_idle": "GpuIdle",
        "applications_clocks_setting": "ApplicationsClocksSetting",
        "sw_power_cap": "SwPowerCap",
        "hw_slowdown": "HwSlowdown",
        "sync_boost": "SyncBoost",
        "sw_thermal": "SwThermalSlowdown",
        "hw_thermal": "HwThermalSlowdown",
        "hw_power_brake": "HwPowerBrakeSlowdown",
        "display_clock_setting": "DisplayClockSetting",
    }
    for ours, theirs in names.items():
        real_bit = getattr(real, f"nvmlClocksEventReason{theirs}")
        assert power_tbl.CLOCK_EVENT_REASONS[ours] == real_bit
    assert set(validity.REASONS) >= set(validity.GPU_CHECKS)


def test_stage_energy_and_shares(fake_nvml):
    mod = fake_nvml(fake_pynvml.h100s(2))
    mod.fake_gpus[0].counter_period_s = mod.fake_gpus[1].counter_period_s = 0.005
    mod.fake_gpus[1].power_mw = 100_000  # stage 1 draws a third of stage 0's power
    rows, power, idle = run_job(mod, mod.fake_gpus, pp_ranks=[0, 1])
    table = stages.stage_table(rows)
    assert list(table["pp_rank"]) == [0, 1] and (table["n_gpus"] == 1).all()
    assert table["gpu_energy_share"].iloc[0] == pytest.approx(0.75, abs=0.03)
    assert table["cpu_time_share"].tolist() == pytest.approx([1 / 3, 2 / 3])
    s, _ = verdict(rows, power, idle=idle)
    assert s["stage_status"].iloc[0] == "ok"
    assert s["stage_gpu_energy_max_min_ratio"].iloc[0] == pytest.approx(3.0, rel=0.1)
    assert s["gpu_energy_max_min_ratio"].iloc[0] == pytest.approx(3.0, rel=0.1)
    assert s["stage_cpu_time_max_min_ratio"].iloc[0] == pytest.approx(2.0)


def test_cpu_stages_have_cpu_time_and_null_energy():
    cpu = dict(
        gpu_uuid=None,
        gpu_index=None,
        gpu_name=None,
        gpu_energy_mj=None,
        gpu_energy_status="unavailable",
        device="cpu",
        pp=2,
        world_size=2,
    )
    rows = shards.to_table(
        [row(rank=r, pid=r, pp_rank=r, cpu_time_s=1.0 + r, **cpu) for r in range(2)]
    ).to_pandas()
    table = stages.stage_table(rows)
    assert table["gpu_energy_j"].isna().all() and table["gpu_energy_share"].isna().all()
    assert table["cpu_time_s"].tolist() == [1.0, 2.0]
    assert table["gpu_energy_status"].str.startswith("unavailable").all()


def test_failed_point_says_few_repetitions_not_window_codes():
    failed = dict(
        status="oom",
        error="OOM",
        window_start_ns=None,
        window_end_ns=None,
        iterations=None,
        requests=None,
        input_tokens=None,
        output_tokens=None,
        gpu_uuid=None,
        gpu_energy_mj=None,
        gpu_energy_status="unavailable",
    )
    rows = shards.to_table([row(repetition=k, **failed) for k in range(3)]).to_pandas()
    s, _ = verdict(rows, EMPTY_POWER)
    assert codes(s) == {"no_gpu_energy", "few_repetitions"} and not s["valid"].iloc[0]
    assert set(validity.WINDOW_CHECKS) <= set(s["validity_unchecked"].iloc[0].split(";"))
    assert results.unexplained_nulls(s) == []
