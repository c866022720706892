"""The report's first screen (headline), the energy ladder figure and the GPU settings figure,
on summaries built from shard rows (tests/unit/test_ladder_and_setting.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from test_ladder_and_setting import _annotated, _rows, _summary

from energysweep import aggregate
from energysweep.figures import baseline, energy_ladder, headline_html, prepare, settings_figure
from energysweep.figures.draw import notes


def _sweep() -> pd.DataFrame:
    """bs 4: a valid point (2 J/token) and a cheaper invalid one; bs 8: only an invalid one."""
    good = _rows(power_limit_w="unset", job_id="a", gpu_name="NVIDIA H100")
    cheap = _rows(
        job_id="b",
        power_limit_w="300",
        gpu_power_limit_target_w=300.0,
        gpu_power_limit_w=300.0,
        gpu_power_limit_status="refused",
        gpu_setting_detail="NVMLError_NoPermission",
        gpu_energy_mj=64_000.0,
        gpu_name="NVIDIA H100",
    )
    big = _rows(  # two repetitions only: few_repetitions
        reps=2, job_id="c", batch_size=8, global_batch_size=8, requests=16, gpu_name="NVIDIA H100"
    )
    rows = pd.concat([good, cheap, big], ignore_index=True)
    s = _annotated(rows)
    return prepare(s)


def test_headline_names_the_best_valid_configuration_with_its_ci():
    s = _sweep()
    text = headline_html(s)
    assert "<b>3</b> points: <b>1</b> valid, <b>2</b> invalid" in text
    assert "cap_not_applied (1)" in text  # among the top reasons
    bs4 = text.split("<tr><td>4</td>")[1].split("</tr>")[0]
    assert "<b>2</b> J per output token" in bs4  # the valid one, not the cheaper invalid one
    assert "95% CI 2–2" in bs4 and "GPU setting: node default" in bs4
    bs8 = text.split("<tr><td>8</td>")[1].split("</tr>")[0]
    assert "no valid point (few_repetitions (1)" in bs8
    # The banner: each setting as read back, as a percentage of the GPU's default.
    assert "NVIDIA H100 — 300 W: power limit 43%, SM clock 100% of default" in text
    assert "node default: power limit 100%, SM clock 100% of default" in text


def test_headline_on_cpu_says_no_gpu_energy_and_names_cpu_time_leaders():
    rows = _rows(
        gpu_uuid=None,
        gpu_energy_mj=None,
        gpu_energy_status="unavailable",
        device="cpu",
        gpu_power_limit_w=None,
        gpu_default_power_limit_w=None,
        gpu_app_sm_clock_mhz=None,
        gpu_default_sm_clock_mhz=None,
    )
    text = headline_html(prepare(_annotated(rows)))
    assert "every point (1 of 1) is <code>no_gpu_energy</code>" in text
    assert "CPU s per output token" in text and "J per output token" not in text
    assert "no GPU read back" in text


def test_ladder_draws_measured_rungs_and_names_the_gaps():
    rows = _rows(
        node_energy_mj=None, node_energy_status="unavailable", node_energy_detail="no accounting"
    )
    s = prepare(_annotated(rows))
    fig = energy_ladder(s)
    left, right = fig.axes
    (line,) = left.get_lines()
    ys = line.get_ydata()
    assert ys[0] == 2.0 and math.isnan(ys[2])  # GPU rung measured, node rung a gap
    assert [t.get_text().splitlines()[0] for t in left.get_xticklabels()][:3] == [
        "GPU boards",
        "+ host CPU/DRAM",
        "node",
    ]
    assert any("node: unavailable (no accounting)" in n for n in notes(fig))
    (bar,) = right.patches
    # The widest measured boundary (GPU + host: 3.25 J/token) x PUE 1.5 x 400 g/kWh.
    assert np.isclose(bar.get_height(), 3.25 * 1.5 * 400 / 3.6e6)


def test_ladder_without_any_energy_is_a_note():
    rows = _rows(gpu_uuid=None, gpu_energy_mj=None, gpu_energy_status="unavailable")
    fig = energy_ladder(prepare(_annotated(rows)))
    assert any("no rung measured" in n for n in notes(fig))


def test_settings_figure_and_the_baseline_the_other_figures_draw():
    s = _sweep()
    base, note = baseline(s)
    assert set(base["gpu_setting"]) == {"node default"}
    assert note.startswith("GPU setting shown: node default (the sweep has 2")
    fig = settings_figure(s)
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks[0].startswith("node default\n(limit 100%") and ticks[1].startswith(
        "300 W\n(limit 43%"
    )
    one = s[s["gpu_setting"].eq("node default")]
    assert any("no GPU setting swept" in n for n in notes(settings_figure(one)))


def test_settings_read_back_from_csv_are_the_same_points(tmp_path):
    """summary.csv reads a power limit key back as a number; the windows have it as text."""
    rows = pd.concat(
        [_rows(power_limit_w="300"), _rows(power_limit_w="500", job_id="b")],
        ignore_index=True,
    )
    _summary(rows).to_csv(tmp_path / "summary.csv", index=False)
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary["power_limit_w"].dtype == "int64"  # as a CSV gives it back
    s = prepare(summary, aggregate.windows(rows))
    assert sorted(s["gpu_setting"]) == ["300 W", "500 W"]
    assert s["cpu_s_per_output_token"].notna().all()  # the windows matched their points
