"""Per point: the GPU setting behind it, the validity codes cap_not_applied / clock_not_applied,
and the energy boundary ladder (each rung's value, method and status; estimates with their band;
nulls explained, never 0)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from jobspec import validated_config

from energysweep import aggregate, results
from energysweep.aggregate import gpu_setting, ladder
from energysweep.job.sections import Facility
from energysweep.tables import shards
from energysweep.validity import recheck
from energysweep.validity import verdict as validity

from tests_rows import row

FACILITY = {
    "pue": {"value": 1.5, "low": 1.2, "high": 1.8, "source": "site report", "year": 2025},
    "carbon_intensity_g_per_kwh": {
        "value": 400.0,
        "low": 300.0,
        "high": 500.0,
        "source": "grid operator",
        "year": 2024,
    },
}
LOOSE = {  # thresholds that the synthetic 2 s windows pass
    "counter_period_s": 0.01,
    "min_counter_periods": 1,
    "min_iterations": 1,
    "min_steady_state_s": 0.1,
    "min_ok_repetitions": 3,
    "max_ci_half_width": 10,
    "require_timeline": False,
}


def _rows(reps=3, **over) -> pd.DataFrame:
    """A 1-GPU job on a 1-node Slurm step: each 2 s window 128 J GPU, 64 + 16 J host, 320 J node."""
    base = {
        "idle_gpu_power_w": 10.0,
        "idle_gpu_power_status": "measured",
        "host_energy_mj": 64_000.0,
        "host_dram_energy_mj": 16_000.0,
        "host_energy_status": "measured",
        "idle_host_power_w": 5.0,
        "idle_host_power_status": "measured",
        "node_energy_mj": 320_000.0,
        "node_energy_status": "measured",
        "node_energy_method": "slurm-sstat-consumed-energy",
        "node_energy_detail": "Slurm acct_gather_energy/ipmi, step 7.0",
    }
    rows = [row(**{**base, "repetition": rep, **over}) for rep in range(reps)]
    return shards.to_table(rows).to_pandas()


def _summary(rows: pd.DataFrame, facility=FACILITY) -> pd.DataFrame:
    win = aggregate.windows(rows)
    s = aggregate.summarize(win)
    node = rows[ladder.NODE_COLUMNS]
    setting = gpu_setting.setting_columns(s, rows[gpu_setting.ROW_COLUMNS])
    typed = None if facility is None else Facility.from_config(facility)
    return pd.concat([s, setting, ladder.ladder(s, win, node, typed)], axis=1)


def test_every_rung_from_the_same_windows():
    s = _summary(_rows()).iloc[0]
    assert s["ladder_token"] == "output token"
    assert s["boundary_gpu_j_per_token"] == pytest.approx(128 / 64)
    assert s["boundary_gpu_host_j_per_token"] == pytest.approx((128 + 64 + 16) / 64)
    assert s["boundary_node_j_per_token"] == pytest.approx(320 / 64)
    # idle-net of GPU + host (the node has no idle baseline): 10 W and 5 W over 2 s.
    assert s["boundary_idle_net_j_per_token"] == pytest.approx((128 - 20 + 64 - 10 + 16) / 64)
    assert "GPU boards + host CPU/DRAM" in s["boundary_idle_net_method"]
    assert {s[f"{r}_status"] for r in ladder.RUNGS} == {"measured"}
    # x PUE of the widest measured gross boundary (the node), with its band.
    fac = [s[f"facility_energy_estimate_j_per_token{x}"] for x in ("", "_low", "_high")]
    assert fac == pytest.approx([5 * 1.5, 5 * 1.2, 5 * 1.8])
    assert s["facility_energy_estimate_status"] == "estimated"
    assert s["facility_energy_estimate_method"] == (
        "PUE 1.5 [1.2-1.8] (site report, 2025) x nodes (Slurm energy accounting)"
    )
    co2 = [s[f"co2e_estimate_g_per_token{x}"] for x in ("", "_low", "_high")]
    assert co2 == pytest.approx([7.5 / 3.6e6 * 400, 6 / 3.6e6 * 300, 9 / 3.6e6 * 500])
    assert "gCO2e/kWh 400 [300-500] (grid operator, 2024)" in s["co2e_estimate_method"]


def test_unmeasured_rungs_are_null_with_a_reason_never_zero():
    rows = _rows(
        node_energy_mj=None,
        node_energy_status="unavailable",
        node_energy_method="none",
        node_energy_detail="the site gathers no node energy (AcctGatherEnergyType=none)",
        host_energy_mj=None,
        host_dram_energy_mj=None,
        host_energy_status="unavailable",
    )
    s = _summary(rows, facility=None)
    r = s.iloc[0]
    assert r["boundary_gpu_j_per_token"] == pytest.approx(2.0)
    for rung in ("boundary_gpu_host", "boundary_node"):
        assert math.isnan(r[f"{rung}_j_per_token"])
    assert r["boundary_gpu_host_status"] == "unavailable (host RAPL: unavailable)"
    assert "gathers no node energy" in r["boundary_node_status"]
    assert r["boundary_idle_net_method"].startswith("(GPU boards)")
    assert r["facility_energy_estimate_status"] == "not estimated (facility.pue is not set)"
    assert "carbon_intensity_g_per_kwh is not set" in r["co2e_estimate_status"]
    assert results.unexplained_nulls(s) == []
    # With a PUE, the GPU boundary (the widest measured) is what it scales.
    s = _summary(rows)
    assert s["facility_energy_estimate_j_per_token"].iloc[0] == pytest.approx(2.0 * 1.5)
    assert s["facility_energy_estimate_method"].iloc[0].endswith("x GPU boards")


def test_cpu_run_every_rung_has_a_status():
    rows = _rows(
        gpu_uuid=None,
        gpu_energy_mj=None,
        gpu_energy_status="unavailable",
        gpu_energy_method="none",
        gpu_energy_detail="no GPU in use (device=cpu)",
        device="cpu",
        gpu_power_limit_w=None,
        gpu_power_limit_end_w=None,
        gpu_default_power_limit_w=None,
        gpu_app_sm_clock_mhz=None,
        gpu_app_mem_clock_mhz=None,
        gpu_default_sm_clock_mhz=None,
        gpu_sm_clock_mhz=None,
        gpu_mem_clock_mhz=None,
        node_energy_mj=None,
        node_energy_status="unavailable",
        node_energy_method="none",
        node_energy_detail="not a Slurm job step",
    )
    s = _summary(rows)
    r = s.iloc[0]
    assert all(math.isnan(r[f"{x}_j_per_token"]) for x in ladder.RUNGS)
    assert r["boundary_gpu_status"].startswith("unavailable (no GPU energy")
    assert r["facility_energy_estimate_status"] == "unavailable (no measured boundary)"
    assert r["co2e_estimate_status"] == "unavailable (no measured boundary)"
    assert math.isnan(r["power_limit_pct_of_default"])
    assert results.unexplained_nulls(s) == []


def _annotated(rows):
    from energysweep.tables import power

    s = _summary(rows)
    table = recheck.recheck(rows, power.SCHEMA.empty_table().to_pandas(), None, 0.0)
    thresholds = validity.Thresholds.from_config(validated_config(validity=LOOSE)["validity"])
    return validity.annotate(s, rows, table, thresholds)


def test_setting_read_back_as_asked_is_valid_as_a_percentage_of_default():
    rows = _rows(
        power_limit_w="350",
        gpu_clock="medium",
        gpu_power_limit_target_w=350.0,
        gpu_sm_clock_target_mhz=1170,
        gpu_mem_clock_target_mhz=2619,
        gpu_power_limit_w=350.0,
        gpu_app_sm_clock_mhz=1170,
        gpu_power_limit_status="applied",
        gpu_clock_status="applied",
    )
    s = _annotated(rows).iloc[0]
    assert (s["power_limit_w"], s["gpu_clock"]) == ("350", "medium")
    assert s["power_limit_pct_of_default"] == pytest.approx(50.0)
    assert s["sm_clock_pct_of_default"] == pytest.approx(100 * 1170 / 1980)
    assert not {"cap_not_applied", "clock_not_applied"} & set(s["invalid_reasons"].split(";"))
    assert s["valid"], s["invalid_reasons"]


@pytest.mark.parametrize(
    "power, clock, codes",
    [
        ("refused", "applied", {"cap_not_applied"}),
        ("applied", "not-applied", {"clock_not_applied"}),
        ("unverified", "unverified", {"cap_not_applied", "clock_not_applied"}),
    ],
)
def test_a_setting_not_in_effect_invalidates_the_point(power, clock, codes):
    rows = _rows(
        power_limit_w="350",
        gpu_clock="medium",
        gpu_power_limit_status=power,
        gpu_clock_status=clock,
        gpu_setting_detail="NVMLError_NoPermission (Insufficient Permissions)",
    )
    # The last repetition alone is enough to flag the whole point.
    rows.loc[rows["repetition"] < 2, ["gpu_power_limit_status", "gpu_clock_status"]] = "applied"
    s = _annotated(rows).iloc[0]
    assert codes <= set(s["invalid_reasons"].split(";")) and not s["valid"]
    assert (s["gpu_power_limit_status"], s["gpu_clock_status"]) == (power, clock)
    assert "NVMLError_NoPermission" in s["gpu_setting_detail"]
    assert s["invalid_reasons"].split(";")[0] in {"cap_not_applied", "clock_not_applied"}


def test_settings_are_separate_points():
    a = _rows(power_limit_w="300")
    b = _rows(power_limit_w="unset", job_id="j2")
    s = _summary(pd.concat([a, b], ignore_index=True))
    assert sorted(s["power_limit_w"]) == ["300", "unset"]
    assert np.allclose(s["boundary_gpu_j_per_token"], 2.0)


@pytest.mark.parametrize("status, unexplained", [("applied", True), ("unset", False)])
def test_a_setting_read_back_as_asked_explains_no_null(status, unexplained):
    """``applied`` says the value is there: a null target beside it is an unexplained null,
    while ``unset`` (nothing asked) explains it."""
    s = pd.DataFrame({"gpu_power_limit_target_w": [None], "gpu_power_limit_status": [status]})
    expected = ["gpu_power_limit_target_w[0]"] if unexplained else []
    assert results.unexplained_nulls(s) == expected
