"""The figures and table of `make gpu-check` (energysweep.validity.gpu_check_figures)."""

from __future__ import annotations

import pandas as pd
import pytest

from energysweep.validity import gpu_check_figures as figs

S = 1_000_000_000


def energy_rows() -> pd.DataFrame:
    base = {"job_id": "j1", "scenario": "training", "phase": "train", "batch_size": 64,
            "gpu_uuid": "GPU-a", "status": "ok", "idle_gpu_power_w": 100.0}  # fmt: skip
    rows = [
        {
            **base,
            "repetition": r,
            "window_start_ns": (10 + 10 * r) * S,
            "window_end_ns": (15 + 10 * r) * S,
            "gpu_energy_mj": 1000e3 + r * 10e3,
            "gpu_energy_mj_zeus": 990e3,
        }  # fmt: skip
        for r in range(3)
    ]
    rows.append({**rows[0], "status": "error", "repetition": 9})  # not a measured window
    return pd.DataFrame(rows)


def test_intervals_hold_each_window_and_the_idle_baseline():
    jobs = [{"job_id": "j1", "timing": {"idle_start_ns": 2 * S, "idle_end_ns": 7 * S}}]
    iv = figs.intervals(energy_rows(), jobs, emulated=True)
    win = iv[iv["kind"] == "window"]
    assert len(win) == 3 and set(iv["source"]) == {"j1"}  # the emulated job's own node
    assert win["ours_j"].tolist() == [1000.0, 1010.0, 1020.0]
    idle = iv[iv["kind"] == "idle"].iloc[0]
    assert (idle["start_ns"], idle["end_ns"], idle["ours_j"]) == (2 * S, 7 * S, 500.0)
    assert set(figs.intervals(energy_rows(), jobs, emulated=False)["source"]) == {""}


def test_errors_in_percent_of_the_independent_reading():
    jobs = [{"job_id": "j1", "timing": {"idle_start_ns": 2 * S, "idle_end_ns": 7 * S}}]
    read = figs.intervals(energy_rows(), jobs, emulated=False)
    read["independent_j"] = [1000.0, 1000.0, 1000.0, 490.0]
    got = figs.energy_figures(read)
    ours = got["ours_vs_independent"]
    assert ours["n"] == 3 and ours["median_abs_pct"] == pytest.approx(1.0)
    assert ours["max_abs_pct"] == pytest.approx(2.0) and ours["mean_signed_pct"] == pytest.approx(1)
    assert got["zeus_vs_independent"]["mean_signed_pct"] == pytest.approx(-1.0)
    idle = got["idle"][0]
    assert idle["ours_w"] == pytest.approx(100) and idle["independent_w"] == pytest.approx(98)
    assert got["idle_vs_independent"]["median_abs_pct"] == pytest.approx(100 / 98 * 100 - 100)


def test_verdict_counts_and_the_shared_gpu_check():
    summary = pd.DataFrame(
        {"valid": [True, False, False], "invalid_reasons": ["", "ci_wide;gpu_shared", "ci_wide"]}
    )
    got = figs.verdict_figures(summary, {"ci_wide", "gpu_shared"})
    assert got["valid_points"] == 1 and got["points"] == 3
    assert got["invalid_reasons"] == {"ci_wide": 2, "gpu_shared": 1}
    assert got["gpu_shared"] == {"checked": True, "points_flagged": 1}
    assert figs.verdict_figures(summary, {"ci_wide"})["gpu_shared"]["checked"] is False


def test_window_fraction_and_the_table():
    jobs = [
        {"job_id": k, "job": {"scenario": s}, "timing": {"window_s": w, "rank0_wall_s": t}}
        for k, s, w, t in (("a", "inference", 30, 100), ("b", "training", 20, 50))
    ]
    jobs[0]["timing"]["phases_s"] = {"start": 9.0, "load": 41.0, "window": 30.0, "edges": 0.01,
                                     "cooldown": 20.0}  # fmt: skip
    j = figs.job_figures(jobs)
    assert j["window_fraction"] == pytest.approx(50 / 150)
    assert [x["window_fraction"] for x in j["jobs"]] == [pytest.approx(0.3), pytest.approx(0.4)]
    summary = pd.DataFrame({"valid": [False], "invalid_reasons": ["emulated"]})
    text = figs.table({"jobs": j, "verdict": figs.verdict_figures(summary, {"emulated"})})
    assert "shared-GPU check: not checked" in text
    assert "valid points: 0 of 1; reasons: emulated 1" in text
    assert "window fraction (wall in windows / job wall): 33%" in text
    # Where each job's wall went, phases under 0.05 s left out; a job without phases, no line.
    assert "  inference 100.0 s: start 9.0, load 41.0, window 30.0, cooldown 20.0" in text
    assert "  training" not in text
