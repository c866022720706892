"""Figure functions on small frames: what each draws, its notes, and what it never draws."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba
from matplotlib.container import ErrorbarContainer

from energysweep.aggregate import POINT_KEYS, bootstrap_ci
from energysweep.figures import (
    backends_compared,
    energy_per_token,
    layouts_at_equal_gpus,
    pareto_front,
    power_timeline,
    prefill_decode,
    prepare,
    stage_balance,
    training,
)
from energysweep.figures.draw import NOTE_GID, invalid_points, notes
from energysweep.figures.pareto import front_points, pareto_mask
from energysweep.figures.phases import DECODE_GID, PREFILL_GID
from energysweep.figures.style import INVALID_LABEL, layout_style
from energysweep.figures.timeline import SPAN_GID

LAYOUTS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2)]
BATCHES = [1, 4, 8]


def _point(backend, scenario, tp, pp, dp, bs, energy: bool, host: bool = False) -> dict:
    """One summary row; energy per token falls with the batch and rises with the world size."""
    world = tp * pp * dp
    e = 0.5 * world / bs if energy else math.nan
    tps = 100.0 * bs * dp / (1 + 0.2 * (tp - 1)) * (1.3 if backend == "vllm" else 1.0)
    train = scenario == "training"
    row = {
        "model": "m",
        "backend": backend,
        "scenario": scenario,
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "power_limit_w": "unset",
        "gpu_clock": "unset",
        "batch_size": bs,
        "load": "batch",
        "status": "ok",
        "device": "cuda" if energy else "cpu",
        "energy_per_output_token_j": math.nan if train else e,
        "energy_per_output_token_j_ci_low": math.nan if train else e * 0.9,
        "energy_per_output_token_j_ci_high": math.nan if train else e * 1.2,
        "output_tokens_per_s": math.nan if train else tps,
        "output_tokens_per_s_ci_low": math.nan if train else tps * 0.95,
        "output_tokens_per_s_ci_high": math.nan if train else tps * 1.05,
        "energy_per_train_token_j": e / 10 if train else math.nan,
        "energy_per_train_token_j_ci_low": e / 11 if train else math.nan,
        "energy_per_train_token_j_ci_high": e / 9 if train else math.nan,
        "train_tokens_per_s": 10 * tps if train else math.nan,
        "gpu_energy_status": "measured" if energy else "unavailable",
        "gpu_energy_detail": None if energy else "no GPU in use (device=cpu)",
        "host_energy_per_output_token_j": (0.1 / bs) if host and not train else math.nan,
        "mean_host_power_w": 30.0 if host else math.nan,
        "cpu_time_s": 0.2 * world,
        "window_s": 0.5,
        "iterations_per_window": 4.0,
        "output_tokens_per_window": math.nan if train else 16.0 * bs * dp * 4,
        "prefill_energy_fraction": 0.1 * (1 + bs / 8) if energy and not train else math.nan,
        "prefill_s_per_iteration": math.nan if train else 0.125 * 0.2,
        "decode_energy_per_output_token_j": e * 0.8 if energy and not train else math.nan,
        "decode_output_tokens_per_s": math.nan if train else tps * 1.1,
    }
    return row


def summary(
    energy=True, backends=("pytorch",), scenarios=("inference",), host=False, layouts=LAYOUTS
) -> pd.DataFrame:
    return pd.DataFrame(
        [
            _point(b, sc, *lay, bs, energy, host)
            for b in backends
            for sc in scenarios
            for lay in layouts
            for bs in BATCHES
        ]
    )


def _ax_series(ax) -> int:
    """Drawn series: one errorbar container or one plain line per series (markers excluded)."""
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    lines = [ln for ln in ax.get_lines() if ln.get_label() == "_line"]
    return len(bars) + len(lines)


def _legend(ax) -> list[str]:
    leg = ax.get_legend()
    return [t.get_text() for t in leg.get_texts()] if leg else []


# --- style ----------------------------------------------------------------------------------


def test_a_layout_has_one_style_everywhere_and_layouts_differ():
    a = layout_style(2, 1, 1, "pytorch")
    assert a == layout_style(2, 1, 1, "pytorch")  # deterministic, independent of any frame
    assert a.color == layout_style(2, 1, 1, "vllm").color  # backend changes the line only
    assert a.linestyle != layout_style(2, 1, 1, "vllm").linestyle
    colours = {to_rgba(layout_style(*lay).color) for lay in [*LAYOUTS, (2, 2, 1), (4, 1, 1)]}
    assert len(colours) == 6
    markers = {layout_style(*lay).marker for lay in LAYOUTS}
    assert len(markers) == 4


def test_same_layout_same_colour_across_figures():
    s = prepare(summary())
    fig1, fig2 = energy_per_token(s), layouts_at_equal_gpus(s)

    def colours(fig):
        out = {}
        for ax in fig.axes:
            for text, handle in zip(_legend(ax), ax.get_legend().legend_handles, strict=True):
                out[text] = to_rgba(handle.get_color())
        return out

    c1, c2 = colours(fig1), colours(fig2)
    shared = set(c1) & set(c2)
    assert shared == {"tp2 pp1 dp1", "tp1 pp2 dp1", "tp1 pp1 dp2"}
    assert all(c1[k] == c2[k] for k in shared)


# --- question 1 -----------------------------------------------------------------------------


def test_energy_per_token_draws_every_layout_with_ci_bars():
    fig = energy_per_token(prepare(summary()))
    left, right = fig.axes
    assert len([c for c in left.containers if isinstance(c, ErrorbarContainer)]) == 4
    assert len([c for c in right.containers if isinstance(c, ErrorbarContainer)]) == 4
    assert "GPU energy per output token [J]" == left.get_ylabel()
    assert left.get_xscale() == "log"  # batch sizes 1..8; y spans < 20x: linear
    assert left.get_yscale() == "linear"
    assert sorted(_legend(left)) == ["tp1 pp1 dp1", "tp1 pp1 dp2", "tp1 pp2 dp1", "tp2 pp1 dp1"]
    assert notes(fig) == []
    # CI bars span exactly the summary's CI (tp1 pp1 dp1 at bs 1: 0.5 J, CI 0.45..0.6)
    bar = next(
        c
        for c in left.containers
        if isinstance(c, ErrorbarContainer)
        and to_rgba(c.lines[0].get_color()) == to_rgba(layout_style(1, 1, 1).color)
    )
    segs = bar.lines[2][0].get_segments()
    assert np.allclose(segs[0][:, 1], [0.45, 0.6])


def test_without_any_energy_cpu_time_is_drawn_and_named_never_energy():
    s = prepare(summary(energy=False))
    fig = energy_per_token(s)
    left = fig.axes[0]
    assert "CPU time per output token" in left.get_ylabel() and "not energy" in left.get_ylabel()
    assert "J]" not in left.get_ylabel()
    (msg,) = notes(fig)
    assert "GPU energy not measured" in msg and "no GPU in use (device=cpu)" in msg
    assert "CPU time" in left.get_title()
    assert _ax_series(left) == 4
    # The drawn values are the measured CPU seconds per token, nothing else.
    drawn = sorted(
        y for ln in left.get_lines() if ln.get_label() == "_valid" for y in ln.get_ydata()
    )
    expected = sorted((s["cpu_time_s"] / s["output_tokens_per_window"]).tolist())
    assert np.allclose(drawn, expected) and min(drawn) > 0


def test_host_energy_is_the_first_substitute():
    fig = energy_per_token(prepare(summary(energy=False, host=True)))
    assert fig.axes[0].get_ylabel().startswith("host energy (RAPL")
    assert "showing host energy (RAPL)" in notes(fig)[0]


def test_nothing_per_token_at_all_is_a_note_not_an_empty_box():
    s = summary(energy=False).drop(columns=["cpu_time_s"])
    fig = energy_per_token(prepare(s))
    left = fig.axes[0]
    assert not left.axison and left.get_lines() == []
    assert any("nothing per token measured" in n for n in notes(fig))


def test_invalid_points_are_hollow_and_in_the_legend():
    s = summary()
    s["valid"] = True
    s["invalid_reasons"] = ""
    bad = (s["tp"] == 2) & s["batch_size"].isin([1, 4])
    s.loc[bad, "valid"] = False
    s.loc[bad, "invalid_reasons"] = "energy-counter-stale"
    s = pd.read_csv(pd.io.common.StringIO(s.to_csv(index=False)))  # as read from summary.csv
    fig = energy_per_token(prepare(s))
    left = fig.axes[0]
    assert invalid_points(left) == 2
    assert INVALID_LABEL in _legend(left)
    hollow = [ln for ln in left.get_lines() if ln.get_gid() == "energysweep-invalid"]
    assert all(ln.get_markerfacecolor() == "none" for ln in hollow)
    # without the column every point is valid
    assert invalid_points(energy_per_token(prepare(summary())).axes[0]) == 0


# --- question 2 -----------------------------------------------------------------------------


def test_layouts_at_equal_gpus_compares_at_the_global_batch():
    fig = layouts_at_equal_gpus(prepare(summary()))
    top = [ax for ax in fig.axes if ax.get_title() == "pytorch: 2 GPUs per job"]
    assert len(top) == 1 and len(fig.axes) == 2  # tp1pp1dp1 alone on 1 GPU: no column
    ax = top[0]
    assert sorted(_legend(ax)) == ["tp1 pp1 dp2", "tp1 pp2 dp1", "tp2 pp1 dp1"]
    dp2 = to_rgba(layout_style(1, 1, 2).color)
    xs = {
        tuple(ln.get_xdata())
        for ln in ax.get_lines()
        if ln.get_label() == "_valid" and to_rgba(ln.get_color()) == dp2
    }
    assert xs == {(2.0, 8.0, 16.0)}  # batch per replica x dp


def test_layouts_at_equal_gpus_without_a_pair_says_so():
    fig = layouts_at_equal_gpus(prepare(summary(layouts=[(1, 1, 1), (2, 2, 1)])))
    assert "no GPU count with two or more layouts" in notes(fig)[0]


# --- question 3 -----------------------------------------------------------------------------


def test_backends_side_by_side_on_shared_layouts():
    s = summary(backends=("pytorch", "vllm"), layouts=[(1, 1, 1), (2, 1, 1)])
    s = pd.concat([s, summary(layouts=[(1, 2, 1)])])  # pp2 only on pytorch: not compared
    fig = backends_compared(prepare(s))
    assert len(fig.axes) == 4  # 2 shared layouts x (energy, throughput)
    titles = sorted(ax.get_title() for ax in fig.axes)
    assert titles[0].startswith("tp1 pp1 dp1") and not any("pp2" in t for t in titles)
    for ax in fig.axes:
        assert sorted(_legend(ax)) == ["pytorch", "vllm"]
        styles = {h.get_linestyle() for h in ax.get_legend().legend_handles}
        assert len(styles) == 2
    # vLLM's throughput is 1.3x PyTorch's in this frame: the bottom panel shows it.
    thr = next(ax for ax in fig.axes if ax.get_title() == "tp1 pp1 dp1 — throughput")
    ys = [max(ln.get_ydata()) for ln in thr.get_lines() if ln.get_label() == "_valid"]
    assert max(ys) / min(ys) == pytest.approx(1.3)


def test_one_backend_is_a_note():
    fig = backends_compared(prepare(summary()))
    assert "no layout was run by two or more backends" in notes(fig)[0]
    assert "pytorch" in notes(fig)[0]


# --- question 4 -----------------------------------------------------------------------------


def test_pareto_mask():
    t = [1, 2, 3, 3, np.nan, 0.5]
    c = [1, 2, 1.5, 3, 0.1, 1]
    # (3, 1.5) dominates (2, 2) and (3, 3); (1, 1) is cheapest; (0.5, 1) is dominated by (1, 1)
    assert pareto_mask(t, c).tolist() == [True, False, True, False, False, False]


def test_pareto_front_highlights_and_labels_the_front():
    s = summary()
    fig = pareto_front(prepare(s))
    (ax,) = fig.axes
    tput = s["output_tokens_per_s"].to_numpy()
    cost = s["energy_per_output_token_j"].to_numpy()
    expected = int(pareto_mask(tput, cost).sum())
    assert front_points(fig) == expected >= 1
    starred = [t.get_text() for t in ax.texts if t.get_text().startswith("*")]
    assert len(starred) == expected and all(" bs" in t for t in starred)
    assert len([t for t in ax.texts if t.get_text().startswith("bs")]) == len(s) - expected
    assert f"Pareto front ({expected} points, *)" in _legend(ax)


def test_invalid_points_never_make_the_front():
    s = summary()
    best = s["output_tokens_per_s"].idxmax()
    s["valid"] = True
    s.loc[best, "valid"] = False
    fig = pareto_front(prepare(s))
    ax = fig.axes[0]
    front_x = [
        x
        for ln in ax.get_lines()
        if ln.get_gid() == "energysweep-pareto-front"
        for x in ln.get_xdata()
    ]
    assert s.loc[best, "output_tokens_per_s"] not in front_x
    assert invalid_points(ax) == 1 and INVALID_LABEL in _legend(ax)


def test_pareto_without_energy_is_a_cpu_time_front_said_so():
    fig = pareto_front(prepare(summary(energy=False, scenarios=("inference", "training"))))
    assert len(fig.axes) == 2
    assert all("CPU time" in ax.get_ylabel() for ax in fig.axes)
    assert len(notes(fig)) == 2 and all("GPU energy not measured" in n for n in notes(fig))


def test_cpu_time_front_drawn_although_every_point_lacks_gpu_energy():
    """On CPU every point is invalid (no_gpu_energy): the stand-in's front is still drawn,
    and the points stay hollow (their energy verdict)."""
    s = summary(energy=False)
    s["valid"], s["invalid_reasons"] = False, "no_gpu_energy"
    fig = pareto_front(prepare(s))
    ax = fig.axes[0]
    pts = prepare(s)
    expected = int(pareto_mask(pts["output_tokens_per_s"], pts["cpu_s_per_output_token"]).sum())
    assert front_points(fig) == expected >= 1
    assert invalid_points(ax) == len(s)


# --- question 5 -----------------------------------------------------------------------------


def _bars(ax):
    return [p for p in ax.patches if p.get_gid() in (PREFILL_GID, DECODE_GID)]


def test_prefill_decode_energy_split():
    s = prepare(summary())
    fig = prefill_decode(s)
    left, right = fig.axes
    bars = _bars(left)
    assert len(bars) == 2 * len(s)
    prefill = sorted(p.get_width() for p in bars if p.get_gid() == PREFILL_GID)
    assert np.allclose(prefill, sorted(s["prefill_energy_fraction"]))
    assert "energy" in left.get_title() and notes(fig) == []
    assert right.get_ylabel() == "GPU energy per decode output token [J]"


def test_prefill_decode_without_energy_splits_time_and_says_so():
    s = prepare(summary(energy=False))
    fig = prefill_decode(s)
    left, right = fig.axes
    shares = sorted(p.get_width() for p in _bars(left) if p.get_gid() == PREFILL_GID)
    assert np.allclose(shares, 0.2)  # prefill 0.025 s of a 0.125 s generate iteration
    assert "wall time" in left.get_title()
    assert any("split of wall time, not energy" in n for n in notes(fig))
    assert "decode output tokens / s" in right.get_ylabel()


# --- question 6 -----------------------------------------------------------------------------


def _stages(gpu: bool) -> pd.DataFrame:
    rows = []
    for bs in BATCHES:
        for rank, share in ((0, 0.6), (1, 0.4)):
            rows.append(
                {
                    "model": "m",
                    "backend": "pytorch",
                    "scenario": "inference",
                    "tp": 1,
                    "pp": 2,
                    "dp": 1,
                    "power_limit_w": "unset",
                    "gpu_clock": "unset",
                    "batch_size": bs,
                    "load": "batch",
                    "phase": "generate",
                    "pp_rank": rank,
                    "gpu_energy_j": 10 * share if gpu else math.nan,
                    "gpu_energy_share": share if gpu else math.nan,
                    "cpu_time_s": share,
                    "cpu_time_share": share,
                }
            )
            rows.append({**rows[-1], "phase": "prefill"})  # not drawn
    rows.append({**rows[0], "pp": 1, "pp_rank": 0})  # a pp=1 row: not drawn
    return pd.DataFrame(rows)


def test_stage_balance_bars_per_stage_with_balance_line():
    fig = stage_balance(_stages(gpu=True))
    (ax,) = fig.axes
    assert len(ax.patches) == 2 * len(BATCHES)
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    assert heights == [0.4] * 3 + [0.6] * 3
    assert any(list(ln.get_ydata()) == [0.5, 0.5] for ln in ax.get_lines())
    assert "GPU energy" in ax.get_ylabel() and notes(fig) == []


def test_stage_balance_without_gpu_energy_uses_cpu_time_labelled():
    fig = stage_balance(_stages(gpu=False))
    assert "CPU time" in fig.axes[0].get_ylabel()
    assert any("CPU-time share, not energy" in n for n in notes(fig))


def test_stage_balance_absent_table_or_no_pp_is_a_note():
    assert "results/stages.csv was not produced" in notes(stage_balance(None))[0]
    only_pp1 = _stages(gpu=True).assign(pp=1)
    assert "no pipeline-parallel (pp > 1) point" in notes(stage_balance(only_pp1))[0]
    with pytest.raises(ValueError, match="gpu_energy_share"):
        stage_balance(_stages(gpu=True).drop(columns=["gpu_energy_share"]))


# --- question 7 -----------------------------------------------------------------------------


def _energy_rows(job, scenario="inference", t0=10**18):
    rows = []
    for k, (bs, phase) in enumerate([(1, "generate"), (1, "prefill"), (4, "generate")]):
        start = t0 + k * 2 * 10**9
        for rank in (0, 1):
            rows.append(
                {
                    "job_id": job,
                    "model": "m",
                    "backend": "pytorch",
                    "scenario": scenario,
                    "tp": 2,
                    "pp": 1,
                    "dp": 1,
                    "power_limit_w": "unset",
                    "gpu_clock": "unset",
                    "batch_size": bs,
                    "repetition": 0,
                    "phase": phase,
                    "status": "ok",
                    "window_start_ns": start + rank,
                    "window_end_ns": start + 10**9,
                    "output_tokens": 64 * bs,
                    "input_tokens": 32 * bs,
                }
            )
    return rows


def test_power_timeline_draws_power_and_window_edges():
    t0 = 10**18
    power = pd.DataFrame(
        [
            {
                "job_id": "a",
                "gpu_uuid": f"GPU-{g}",
                "time_ns": t0 + i * 10**8,
                "power_mw": 100_000 + 1000 * i,
                "status": "measured",
                "detail": None,
            }
            for g in ("x", "y")
            for i in range(60)
        ]
        + [
            {
                "job_id": "b",
                "gpu_uuid": None,
                "time_ns": None,
                "power_mw": None,
                "status": "unavailable",
                "detail": "no GPU in use",
            }
        ]
    )
    energy = pd.DataFrame(_energy_rows("a", t0=t0) + _energy_rows("b", t0=t0))
    fig = power_timeline(power, energy)
    a, b = fig.axes[:2]
    gpu_lines = [ln for ln in a.get_lines() if ln.get_label().startswith("GPU ")]
    assert len(gpu_lines) == 2 and a.get_ylabel() == "GPU power [W]"
    assert max(gpu_lines[0].get_ydata()) == pytest.approx(159.0)
    assert sum(p.get_gid() == SPAN_GID for p in a.patches) == 3  # one span per window
    assert notes(fig) == [
        "no power samples in 1 of 2 jobs (no GPU in use): their panels show "
        "each window's token rate, not power"
    ]
    assert "token rate, no power samples" in b.get_title() and "token rate" not in a.get_title()
    rates = sorted(ln.get_ydata()[0] for ln in b.get_lines() if ln.get_label() == "_rate")
    assert np.allclose(rates, [64, 64, 256])  # tokens / 1 s window


def test_power_timeline_caps_panels_and_says_so():
    energy = pd.DataFrame([r for j in range(14) for r in _energy_rows(f"j{j:02d}")])
    fig = power_timeline(pd.DataFrame(columns=["job_id"]), energy)
    assert sum(ax.get_visible() for ax in fig.axes) == 12
    assert any("12 of 14 jobs shown" in n for n in notes(fig))


# --- question 8 -----------------------------------------------------------------------------


def test_training_vs_global_batch_with_ci():
    s = prepare(summary(scenarios=("inference", "training")))
    fig = training(s)
    left, right = fig.axes
    assert left.get_ylabel() == "GPU energy per training token [J]"
    assert len([c for c in left.containers if isinstance(c, ErrorbarContainer)]) == 4
    assert "global batch" in left.get_xlabel()
    assert {x for ln in left.get_lines() for x in ln.get_xdata()} == {1, 2, 4, 8, 16}
    assert right.get_ylabel() == "training tokens / s (global batch)"


def test_training_without_energy_or_points():
    fig = training(prepare(summary(energy=False, scenarios=("training",))))
    assert "CPU time per training token" in fig.axes[0].get_ylabel()
    assert "GPU energy not measured" in notes(fig)[0]
    none = training(prepare(summary()))
    assert all("no training points" in n for n in notes(none)) and len(notes(none)) == 2


# --- data -----------------------------------------------------------------------------------


def test_prepare_derives_cpu_time_per_token_with_bootstrap_ci_from_windows():
    s = summary(energy=False, layouts=[(1, 1, 1)])
    wins = []
    for bs in BATCHES:
        for rep, cpu in enumerate((0.10, 0.14, 0.12)):
            wins.append(
                {
                    **{k: s.iloc[0][k] for k in POINT_KEYS},
                    "batch_size": bs,
                    "repetition": rep,
                    "phase": "generate",
                    "status": "ok",
                    "output_tokens": 100.0,
                    "input_tokens": 50.0,
                    "cpu_time_s": cpu,
                    "host_energy_j": math.nan,
                    "duration_s": 0.5,
                }
            )
    p = prepare(s, pd.DataFrame(wins))
    row = p[p["batch_size"] == 4].iloc[0]
    assert row["cpu_s_per_output_token"] == pytest.approx(0.0012)
    lo, hi = bootstrap_ci([0.0010, 0.0014, 0.0012])
    assert (row["cpu_s_per_output_token_ci_low"], row["cpu_s_per_output_token_ci_high"]) == (
        pytest.approx(lo),
        pytest.approx(hi),
    )
    assert math.isnan(row["host_energy_per_output_token_j_ci_low"])
    fig = energy_per_token(p)
    assert len([c for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)]) == 1


def test_notes_are_found_by_gid():
    fig = energy_per_token(prepare(summary(energy=False)))
    assert all(
        t.get_gid() == NOTE_GID
        for ax in fig.axes
        for t in ax.texts
        if "not measured" in t.get_text()
    )


def test_only_the_drawn_jobs_power_files_are_read(tmp_path):
    from energysweep.figures.render import load_power

    energy, records = [], []
    for k in range(14):
        job = f"job{k:02d}"
        energy += [{**r, "dp": k + 1} for r in _energy_rows(job)]
        d = tmp_path / f"model~m/backend~pytorch/scenario~inference/tp~2/pp~1/dp~{k + 1}"
        d.mkdir(parents=True)
        (d / "job.json").write_text("{}")
        pd.DataFrame(
            [
                {
                    "job_id": job,
                    "gpu_uuid": None,
                    "time_ns": None,
                    "power_mw": None,
                    "status": "unavailable",
                    "detail": "no GPU in use",
                }
            ]
        ).to_parquet(d / "power.parquet")
        records.append(d / "job.json")
    energy = pd.DataFrame(energy)
    assert set(load_power(records)["job_id"]) == {f"job{k:02d}" for k in range(14)}
    # the timeline orders by layout (dp 1..12 numerically, not as text) and draws 12
    assert sorted(load_power(records, energy)["job_id"]) == [f"job{k:02d}" for k in range(12)]
