"""Serving points in the results: per-point figures, the knee, the two validity reasons, and the
serving figures (on small frames)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from energysweep import aggregate
from energysweep.figures import draw as fdraw
from energysweep.figures import prepare, serving_latency, serving_pareto, serving_slo
from energysweep.figures.pareto import FRONT_GID
from energysweep.figures.serving import KNEE_GID, NO_SERVING, SLO_GID
from energysweep.job.sections import schema_defaults
from energysweep.results import unexplained_nulls
from energysweep.tables import shards
from energysweep.validity import serving as sv
from energysweep.validity.verdict import Thresholds, annotate

from tests_rows import row


def _thresholds() -> Thresholds:
    """The schema's validity thresholds."""
    return Thresholds.from_config(schema_defaults("validity"))


def serving_row(level: float, rep: int, sustained: float, errors: int = 0, **over) -> dict:
    """A serving window's row of one GPU: 2 s, 40 requests, load ``rate=level`` (``over``
    replaces any field)."""
    fields = dict(
        scenario="serving", backend="vllm", launch_mode="server", phase="serve",
        load=f"rate={level:g}", load_mode="rate", offered_load=float(level), burstiness=1.0,
        repetition=rep, requests=40, iterations=40, input_tokens=400, output_tokens=640,
        requests_sent=60, request_errors=errors, requests_cancelled=0, requests_dropped=0,
        arrival_rate_rps=float(level), achieved_rate_rps=20.0, achieved_concurrency=3.0,
        load_sustained=sustained, slo_met_requests=30, ramp_s=0.5, drain_s=0.2,
        queue_waiting_mean=0.0, queue_waiting_max=1.0, queue_time_mean_s=0.001, ttft_p50_s=0.01,
        ttft_p99_s=0.02, tpot_p50_s=0.002, tpot_p99_s=0.003, itl_p50_s=0.002, itl_p99_s=0.004,
        e2e_p50_s=0.05, e2e_p99_s=0.08, serving_status="ok", gpu_energy_mj=100_000.0 + 1000 * rep,
        idle_gpu_power_w=10.0, idle_gpu_power_status="measured",
    )  # fmt: skip
    return row(**{**fields, **over})


def test_serving_windows_and_points_carry_their_figures():
    rows = [serving_row(8, r, 1.0) for r in range(3)] + [row()]
    table = shards.to_table(rows).to_pandas()
    s = aggregate.summarize(aggregate.windows(table[aggregate.WINDOW_COLUMNS]))
    serve = s[s["scenario"] == "serving"].iloc[0]
    assert serve["load"] == "rate=8" and serve["load_mode"] == "rate"
    assert serve["energy_per_request_j"] == pytest.approx(101.0 / 40)
    assert serve["energy_per_total_token_j"] == pytest.approx(101.0 / 1040)
    # Idle-adjusted: 10 W over the 2 s window less per request.
    assert serve["energy_per_request_idle_adjusted_j"] == pytest.approx((101.0 - 20) / 40)
    assert serve["goodput_rps"] == pytest.approx(15.0) and serve["load_sustained_min"] == 1.0
    assert serve["requests_sent"] == 180 and serve["request_errors"] == 0
    assert serve["energy_per_request_j_ci_low"] <= serve["energy_per_request_j"]
    for m in ("energy_per_request", "energy_per_total_token", "energy_per_output_token"):
        lo, hi = (serve[f"{m}_idle_adjusted_j_ci_{e}"] for e in ("low", "high"))
        assert lo <= serve[f"{m}_idle_adjusted_j"] <= hi, m
    batch = s[s["scenario"] == "inference"].iloc[0]
    assert batch["load"] == "batch" and math.isnan(batch["goodput_rps"])
    assert batch["serving_status"].startswith("not-applicable")
    assert aggregate.unexplained_nulls(s) == []


def knee_frame(points: list[tuple]) -> pd.DataFrame:
    """A series of serving points: (offered, achieved req/s, p99 TTFT, sustained, errors)."""
    return pd.DataFrame([
        {"model": "m", "backend": "vllm", "scenario": "serving", "tp": 1, "pp": 1, "dp": 1,
         "batch_size": 4, "load_mode": "rate", "load": f"rate={o}", "offered_load": o,
         "achieved_rate_rps": a, "ttft_p99_s": t, "load_sustained_min": s, "request_errors": e}
        for o, a, t, s, e in points
    ])  # fmt: skip


@pytest.mark.parametrize(
    "points, knee_at, why",
    [
        # queue grows at 64: achieved 50% of offered
        ([(2, 2, 0.01, 1.0, 0), (16, 16, 0.012, 1.0, 0), (64, 30, 0.3, 0.5, 0)], 64, "50%"),
        # a failed request
        ([(2, 2, 0.01, 1.0, 0), (16, 16, 0.01, 1.0, 3), (64, 30, 0.3, 1.0, 0)], 16, "failed"),
        # throughput fell below 95% of the best earlier point
        ([(2, 2, 0.01, 1.0, 0), (16, 16, 0.01, 1.0, 0), (64, 14, 0.01, 0.95, 0)], 64, "fell"),
        # TTFT x10 for requests/s x1.2: latency without throughput
        ([(2, 10, 0.01, 1.0, 0), (4, 12, 0.1, 1.0, 0)], 4, "p99 TTFT x10.0"),
    ],
)
def test_the_knee_is_the_first_point_that_breaks_a_rule(points, knee_at, why):
    k = sv.knee(knee_frame(points), _thresholds()).set_index("offered_load")
    assert k.loc[knee_at, "knee"] is True and why in k.loc[knee_at, "knee_reason"]
    assert k["knee"].sum() == 1
    below = k.index < knee_at
    assert (k.loc[below, "sustainable"] == True).all()  # noqa: E712 - object column
    assert (k.loc[~below, "sustainable"] == False).all()  # noqa: E712
    assert k.loc[below, "sustained_rate_rps"].notna().all()
    assert k.loc[~below, "sustained_rate_rps"].isna().all()  # never reported as sustained


def test_throughput_rising_with_latency_is_no_knee():
    k = sv.knee(knee_frame([(1, 10, 0.013, 1.0, 0), (4, 27, 0.034, 1.0, 0)]), _thresholds())
    assert (k["sustainable"] == True).all() and not k["knee"].any()  # noqa: E712


def _annotated(rows: list[dict]) -> pd.DataFrame:
    merged = shards.to_table(rows).to_pandas()
    s = aggregate.summarize(aggregate.windows(merged[aggregate.WINDOW_COLUMNS]))
    from energysweep.validity import recheck
    from energysweep.validity.verdict import ROW_COLUMNS

    validation = recheck.recheck(merged[ROW_COLUMNS], pd.DataFrame(), {}, 0.0)
    return annotate(s, merged, validation, _thresholds()).set_index("load")


def test_load_not_sustained_and_request_errors_invalidate_serving_points_only():
    rows = [serving_row(2, r, 1.0) for r in range(3)]
    rows += [serving_row(64, r, s, errors=e) for r, (s, e) in enumerate([(0.95, 0), (0.4, 1),
                                                                         (0.9, 0)])]  # fmt: skip
    rows += [row(repetition=r) for r in range(3)]
    out = _annotated(rows)
    codes = out["invalid_reasons"].str.split(";")
    assert "load_not_sustained" not in codes["rate=2"]
    assert {"load_not_sustained", "request_errors"} <= set(codes["rate=64"])
    assert not {"load_not_sustained", "request_errors"} & set(codes["batch"])
    # A serving point's batch use is informative, never a batch_not_full failure.
    assert out.loc["rate=2", "batch_fill"] == pytest.approx(3.0 / 4)
    assert "batch_not_full" not in codes["rate=2"]
    assert out.loc["rate=64", "knee"] is True and out.loc["batch", "knee"] is None
    assert unexplained_nulls(out.reset_index()) == []


def test_a_rate_the_client_did_not_send_is_flagged_and_never_called_sustained():
    """Run 84 (2-core machine): at rate=256 the client, short of CPU, sent 63 req/s; the server
    kept up with those, so nothing said the point was not the load it is named for."""
    # 2 s windows. rate=64: one repetition sent 16 req/s (32 of 128 expected arrivals).
    rows = [serving_row(2, r, 1.0, arrival_rate_rps=1.0) for r in range(3)]  # 2 of 4: noise
    rows += [serving_row(64, r, 1.0, arrival_rate_rps=[64.0, 16.0, 60.0][r]) for r in range(3)]
    rows += [serving_row(128, r, 1.0, arrival_rate_rps=110.0) for r in range(3)]  # 86%: noise
    out = _annotated(rows)
    codes = out["invalid_reasons"].str.split(";")
    assert out.loc["rate=64", "load_offered_min"] == pytest.approx(0.25)
    assert out.loc["rate=2", "load_offered_min"] == pytest.approx(0.5)
    assert "load_not_offered" in codes["rate=64"]
    assert "load_not_offered" not in codes["rate=2"] and "load_not_offered" not in codes["rate=128"]
    assert "load_not_sustained" not in codes["rate=64"]  # the server kept up with what it got
    # Unknown to the knee: neither sustainable nor past it, and the walk goes on past it.
    assert out.loc["rate=64", "sustainable"] is None and out.loc["rate=64", "past_knee"] is None
    assert out.loc["rate=64", "knee"] is False
    assert out.loc["rate=64", "knee_reason"].startswith("unknown: the client sent 25%")
    assert math.isnan(out.loc["rate=64", "sustained_rate_rps"])
    assert out.loc["rate=128", "sustainable"] is True
    assert unexplained_nulls(out.reset_index()) == []


@pytest.mark.parametrize(
    "offered_min, window_s, flagged",
    [
        (0.5, 2.0, False),  # rate 2: 4 expected arrivals, 2 sent: within Poisson noise
        (0.5, 20.0, False),  # 40 expected, 20 sent: 2.5 standard deviations below 0.9 x 40
        (0.3, 20.0, True),  # 12 sent: 3.8 standard deviations below
        (0.85, 2000.0, True),  # 4000 expected: 0.85 is short of 0.9 beyond any noise
        (0.95, 2.0, False),
        (float("nan"), 2.0, False),  # unknown, never failed
    ],
)
def test_the_client_shortfall_allows_for_the_arrivals_randomness(offered_min, window_s, flagged):
    rows = [serving_row(2, 0, 1.0, arrival_rate_rps=2.0 * offered_min,
                        window_end_ns=1_000_000_000 + int(window_s * 1e9))]  # fmt: skip
    s = aggregate.summarize(aggregate.windows(shards.to_table(rows).to_pandas()))
    tolerance = s["load_offered_tolerance"].iloc[0]
    assert tolerance == pytest.approx(3 / math.sqrt(2.0 * window_s))  # rate 2 over the window
    assert bool(sv.not_offered(offered_min, tolerance, _thresholds())) is flagged


def test_bursty_arrivals_widen_the_tolerance_as_their_count_varies():
    """Gamma arrivals of shape 0.25 vary 4 times as much as Poisson ones (count variance
    expected / shape): their tolerance doubles; a shape over 1 (steadier) keeps Poisson's."""
    rows = [serving_row(8, 0, 1.0, burstiness=b, load=f"rate=8,burstiness={b:g}",
                        arrival_rate_rps=4.0) for b in (0.25, 1.0, 4.0)]  # fmt: skip
    s = aggregate.summarize(aggregate.windows(shards.to_table(rows).to_pandas()))
    tol = s.set_index("burstiness")["load_offered_tolerance"]
    assert tol[1.0] == pytest.approx(3 / math.sqrt(16)) and tol[4.0] == tol[1.0]  # 16 expected
    assert tol[0.25] == pytest.approx(2 * tol[1.0])


def test_a_rate_the_client_did_not_send_still_breaks_a_series_that_the_server_lost():
    frame = knee_frame([(2, 2, 0.01, 1.0, 0), (16, 8, 0.3, 0.5, 0), (64, 9, 0.3, 1.0, 0)])
    frame["load_offered_tolerance"] = 3 / np.sqrt(frame["offered_load"] * 4.0)  # 4 s windows
    frame["load_offered_min"] = [1.0, 0.3, 0.2]  # the server fell behind even the load it got
    k = sv.knee(frame, _thresholds()).set_index("offered_load")
    assert k.loc[16, "knee"] is True and k.loc[16, "sustainable"] is False
    assert "the client sent 30% of the offered rate" in k.loc[16, "knee_reason"]
    assert k.loc[64, "sustainable"] is False and k.loc[64, "past_knee"] is True


def figure_frame(energy: bool = True) -> pd.DataFrame:
    rows = []
    for cap, loads in ((2, [(2, 2.0, 0.01), (8, 7.0, 0.02), (64, 9.0, 0.9)]),
                       (4, [(2, 2.0, 0.01), (8, 8.0, 0.015), (64, 20.0, 0.5)])):  # fmt: skip
        for i, (offered, achieved, ttft) in enumerate(loads):
            past = offered == 64
            rows.append({
                "model": "m", "backend": "vllm", "scenario": "serving", "tp": 1, "pp": 1,
                "dp": 1, "batch_size": cap, "load": f"rate={offered}", "load_mode": "rate",
                "offered_load": float(offered), "achieved_rate_rps": achieved,
                "ttft_p50_s": ttft / 2, "ttft_p99_s": ttft, "tpot_p50_s": 0.002,
                "tpot_p99_s": 0.004, "status": "ok", "valid": False,
                "energy_per_request_j": (1.0 / (i + 1)) if energy else np.nan,
                "cpu_time_per_request_s": 0.05 / (i + 1), "sustainable": not past,
                "knee": past, "gpu_energy_status": "measured" if energy else "unavailable",
            })  # fmt: skip
    return prepare(pd.DataFrame(rows))


def _gid_points(fig, gid) -> int:
    return sum(len(ln.get_xdata()) for ax in fig.axes for ln in ax.get_lines()
               if ln.get_gid() == gid)  # fmt: skip


def test_serving_figures_mark_the_knee_and_keep_overload_off_the_front():
    fig = serving_pareto(figure_frame())
    assert _gid_points(fig, KNEE_GID) == 2
    assert _gid_points(fig, fdraw.INVALID_GID) == 2  # the two points past the knee, hollow
    front_x = [x for ax in fig.axes for ln in ax.get_lines() if ln.get_gid() == FRONT_GID
               for x in ln.get_xdata()]  # fmt: skip
    assert front_x and max(front_x) < 20.0  # the overloaded 20 req/s point is not on it
    assert not fdraw.notes(fig)
    lat = serving_latency(figure_frame(), {"ttft_ms": 100, "tpot_ms": 50})
    assert _gid_points(lat, KNEE_GID) == 4  # both panels
    assert sum(ln.get_gid() == SLO_GID for ax in lat.axes for ln in ax.get_lines()) == 2
    slo = serving_slo(figure_frame(), {"ttft_ms": 100})
    assert sum(ln.get_gid() == SLO_GID for ax in slo.axes for ln in ax.get_lines()) == 1


def test_serving_figures_say_what_stands_in_for_energy_and_when_there_is_nothing():
    fig = serving_pareto(figure_frame(energy=False))
    assert any("GPU energy not measured" in n and "CPU time" in n for n in fdraw.notes(fig))
    assert "not energy" in fig.axes[0].get_ylabel()
    none = pd.DataFrame([{"model": "m", "backend": "pytorch", "scenario": "inference", "tp": 1,
                          "pp": 1, "dp": 1, "batch_size": 1, "load": "batch",
                          "load_mode": "batch"}])  # fmt: skip
    for make in (serving_pareto, serving_latency, serving_slo):
        assert NO_SERVING in fdraw.notes(make(prepare(none)))
