"""The report figure: one row of panels per scenario, no zeros where nothing was measured."""

from __future__ import annotations

import math

import pandas as pd
from matplotlib import image

from energysweep.report import plot_energy_per_token


def _summary(scenarios: list[str], energy: float | None) -> pd.DataFrame:
    rows = []
    for scenario in scenarios:
        training = scenario == "training"
        for bs in (1, 4):
            rows.append({
                "model": "tiny", "backend": "pytorch", "scenario": scenario, "tp": 1, "pp": 1,
                "dp": 1, "batch_size": bs, "device": "cpu",
                "energy_per_output_token_j": math.nan if training else energy,
                "output_tokens_per_s": math.nan if training else 10.0 * bs,
                "energy_per_train_token_j": energy if training else math.nan,
                "train_tokens_per_s": 100.0 * bs if training else math.nan,
                "gpu_energy_detail": None if energy else "no NVML on this host",
            })
    return pd.DataFrame(rows)


def test_training_adds_a_row_of_panels(tmp_path):
    only = plot_energy_per_token(_summary(["inference"], 0.5), tmp_path / "inf.png")
    both = plot_energy_per_token(_summary(["inference", "training"], 0.5), tmp_path / "both.png")
    assert set(only) == {"inference"} and set(both) == {"inference", "training"}
    # one layout: one line per panel; training rows never leak into the inference panels
    for drawn in both.values():
        assert drawn == {"energy_lines": 1, "throughput_lines": 1, "note": None}
    h_inf = image.imread(tmp_path / "inf.png").shape[0]
    h_both = image.imread(tmp_path / "both.png").shape[0]
    assert h_both == 2 * h_inf


def test_without_energy_the_panel_says_why(tmp_path):
    drawn = plot_energy_per_token(_summary(["training"], None), tmp_path / "none.png")
    assert drawn["training"]["energy_lines"] == 0
    assert "no NVML on this host" in drawn["training"]["note"]
    assert drawn["training"]["throughput_lines"] == 1
