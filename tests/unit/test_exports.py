"""The exports in public units (energysweep.archive.exports) on a small synthetic sweep."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest
from archive_results import energy_rows, make_results, summary_of

from energysweep.archive import exports

UNIT = re.compile(r"(_J|_W|_Wh|_hz|_seconds|_per_s|_J_mean|_J_std|_J_ci_low|_J_ci_high)$")
# Columns that are labels or counts, not figures with a unit.
NOT_FIGURES = {
    "gpu_count",
    "tp",
    "pp",
    "dp",
    "batch_size",
    "energy_per_token_windows",
    "output_tokens_per_query",
}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    results, _, _ = make_results(tmp_path_factory.mktemp("exports"))
    return {name: pd.read_csv(results / "exports" / f) for name, f in exports.EXPORT_FILES.items()}


def test_every_numeric_figure_names_its_unit(sweep):
    for name, frame in sweep.items():
        figures = [c for c in frame.select_dtypes("number").columns if c not in NOT_FIGURES]
        assert figures, name
        assert [c for c in figures if not UNIT.search(c)] == [], name


def test_mlenergy_rows_are_the_inference_points_with_their_figures(sweep):
    t = sweep["mlenergy"].set_index("batch_size")
    assert list(t.index) == [1, 4] and set(t["scenario"]) == {"inference"}
    # Batch 1: 64 J and 65 J over 64 output tokens in 2 s, 2 requests.
    assert t.loc[1, "energy_per_output_token_J"] == pytest.approx(64.5 / 64)
    assert t.loc[1, "energy_per_request_J"] == pytest.approx(64.5 / 2)
    assert t.loc[1, "output_throughput_tokens_per_s"] == pytest.approx(32.0)
    assert {"model", "gpu_model", "engine"} <= set(t.columns)
    assert not t["emulated_gpu"].any()


def test_ai_energy_score_is_wh_per_1000_queries_of_batch_1_with_the_differences(sweep):
    t = sweep["ai_energy_score"]
    assert list(t["batch_size"]) == [1]
    row = t.iloc[0]
    assert row["gpu_energy_per_1000_queries_Wh"] == pytest.approx(64.5 / 2 * 1000 / 3600)
    assert row["output_tokens_per_query"] == pytest.approx(32.0)
    assert "not AI Energy Score's protocol" in row["protocol_differences"]


def test_mlcommons_fields_mean_and_std_over_windows(sweep):
    t = sweep["mlcommons"].set_index(["scenario", "batch_size"])
    bs1 = t.loc[("inference", 1)]
    per_token = [64.0 / 64, 65.0 / 64]
    assert bs1["energy_per_token_J_mean"] == pytest.approx(sum(per_token) / 2)
    assert bs1["energy_per_token_J_std"] == pytest.approx(pd.Series(per_token).std())
    assert bs1["energy_per_token_windows"] == 2
    assert bs1["sampling_rate_hz"] == pytest.approx(10.0)  # counter period 0.1 s
    assert bs1["thermal_stabilization_seconds"] == pytest.approx(0.1)  # cooldown_s
    assert bs1["measurement_method"].startswith("nvml: cumulative GPU board energy counter")
    train = t.loc[("training", 2)]
    assert train["energy_per_token_unit"] == "J per trained token"
    assert train["energy_per_token_J_mean"] == pytest.approx((50.0 / 128 + 50.001 / 128) / 2)


def test_an_unmeasured_point_is_null_never_zero():
    energy = energy_rows(False)
    energy.loc[energy["batch_size"] == 4, "gpu_energy_mj"] = None
    energy.loc[energy["batch_size"] == 4, "gpu_energy_status"] = "unavailable"
    energy.loc[energy["batch_size"] == 4, "energy_source"] = "none"
    summary = summary_of(energy)
    spread = exports.window_spread(energy)
    ml = exports.mlenergy(summary).set_index("batch_size")
    assert math.isnan(ml.loc[4, "energy_per_output_token_J"])
    assert ml.loc[4, "gpu_energy_status"] == "unavailable"
    mc = exports.mlcommons(summary, spread, {"sampler_hz": 10, "cooldown_s": 0.1})
    mc = mc[mc["scenario"] == "inference"].set_index("batch_size")
    assert math.isnan(mc.loc[4, "energy_per_token_J_mean"])
    assert "no GPU energy measured" in mc.loc[4, "measurement_method"]
    assert math.isnan(mc.loc[4, "sampling_rate_hz"])  # no counter was read


def test_emulated_rows_are_labelled(tmp_path):
    results, _, _ = make_results(tmp_path, emulated=True)
    for f in exports.EXPORT_FILES.values():
        assert pd.read_csv(results / "exports" / f)["emulated_gpu"].all(), f
