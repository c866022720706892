"""Serving points: their validity checks, and the knee of every load series.

Checks (codes of ``invalid_reasons``):

- ``load_not_offered``: at a request rate, in some repetition the client sent fewer than
  ``validity.min_load_offered`` x the offered rate inside the window, by more than the arrivals'
  own randomness: ``load_offered_min`` < ``min_load_offered`` - ``load_offered_tolerance``, that
  being 3 / sqrt(expected arrivals) of the point's shortest window, the expected arrivals its
  offered rate x its length (Poisson: their count's standard deviation is sqrt(expected); vLLM's
  generator, which fixes the time of every 256 arrivals, is tighter; bursty gamma arrivals of
  shape ``burstiness`` < 1 vary as expected / burstiness, and the tolerance widens so). A
  client short of CPU sends late, and the point is not the load it is named for (seen on the
  2-core machine: 63 req/s sent at ``rate=256``). Concurrency levels are a closed loop: not
  applicable;
- ``load_not_sustained``: in some repetition the achieved load was below
  ``validity.min_load_sustained`` x the offered load (requests completed / sent per second inside
  the window at request rates; mean requests running in the engine / requests kept in flight at
  concurrency levels: the rest waited in the server's queue). Unchecked where the server exports
  no queue metrics at a concurrency level;
- ``request_errors``: a request of the point's load runs failed (any phase, any repetition).

The knee, one load series at a time (one model, backend, layout, batch cap and load axis, by
increasing offered load): a point is **sustainable** unless

1. a request failed, or
2. it failed ``load_not_sustained``, or
3. its achieved requests/s fell below ``validity.knee_min_throughput_fraction`` x the best
   earlier point's, or
4. its p99 time to first token grew more than ``validity.knee_max_ttft_growth`` times faster
   than its achieved requests/s since the last sustainable point (latency rising with no
   matching gain in throughput: requests queue instead of being served);

the **knee** is the series' first point that breaks a rule (``knee_reason`` says which), and it
and every point after it are past the knee (``past_knee``) and not sustainable.
A point before the knee that failed ``load_not_offered`` and neither rule 1 nor 2 tells nothing of
the server at its load: ``sustainable`` and ``past_knee`` are null there (``knee_reason`` says
why), and the walk goes on past it as if it were not there (rules 3 and 4 compare with the
points before it). ``sustained_rate_rps`` is the achieved request rate of sustainable points
only: an overloaded point's throughput, or one the client did not offer, is never reported as
sustained.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from energysweep.validity.thresholds import Thresholds

SERVING_MODES = ("rate", "concurrency")
REASONS = {
    "load_not_offered": "the client sent < validity.min_load_offered x the offered rate, "
    "beyond the arrivals' own randomness (serving)",
    "load_not_sustained": "achieved load < validity.min_load_sustained x offered (serving)",
    "request_errors": "a request of the point's load runs failed (serving)",
}
SERIES_KEYS = ["model", "backend", "scenario", "tp", "pp", "dp", "batch_size", "load_mode"]
NOT_SERVING = "not-applicable (no serving load)"
# Summary columns added here -> status columns explaining their nulls (aggregate.nulls).
NULL_STATUS = {"sustained_rate_rps": ("knee_reason", "serving_status", "status")}
INFO_COLUMNS = {"sustainable", "past_knee", "knee"}


def is_serving(s: pd.DataFrame) -> np.ndarray:
    return (
        s["load_mode"].isin(SERVING_MODES).to_numpy()
        if "load_mode" in s
        else np.zeros(len(s), bool)
    )


def not_offered(offered_min, tolerance, c: Thresholds):
    """Whether the client's worst repetition sent too few of the offered arrivals (module
    docstring, ``load_not_offered``); False where a figure is missing. Arrays or scalars."""
    floor = c.min_load_offered - np.asarray(tolerance, dtype=float)
    return np.asarray(offered_min, dtype=float) < floor  # NaN compares False


def fails(s: pd.DataFrame, c: Thresholds) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(code -> failing points, code -> points whose check could not run)."""
    serving = is_serving(s)
    sustained = s["load_sustained_min"].to_numpy(dtype=float)
    offered = s["load_offered_min"].to_numpy(dtype=float)
    tolerance = s["load_offered_tolerance"].to_numpy(dtype=float)
    rate = serving & (s["load_mode"] == "rate").to_numpy()
    unknown = {
        "load_not_offered": rate & (np.isnan(offered) | np.isnan(tolerance)),
        "load_not_sustained": serving & np.isnan(sustained),
    }
    return (
        {
            "load_not_offered": rate & not_offered(offered, tolerance, c),
            "load_not_sustained": serving
            & ~unknown["load_not_sustained"]
            & ~(sustained >= c.min_load_sustained),
            "request_errors": serving & (s["request_errors"].fillna(0).to_numpy() > 0),
        },
        unknown,
    )


def knee(s: pd.DataFrame, c: Thresholds) -> pd.DataFrame:
    """``s`` with ``sustainable``, ``past_knee``, ``knee``, ``knee_reason`` and
    ``sustained_rate_rps`` (module docstring); non-serving points get them null / not-applicable."""
    out = s.copy()
    out["sustainable"] = pd.Series([None] * len(s), index=s.index, dtype=object)
    out["past_knee"] = out["sustainable"].copy()
    out["knee"] = out["sustainable"].copy()
    out["knee_reason"] = NOT_SERVING
    serving = is_serving(s)
    if serving.any():
        for _, idx in s[serving].groupby(SERIES_KEYS, sort=False).groups.items():
            _series(out, s.loc[idx].sort_values("offered_load"), c)
    ok = out["sustainable"].eq(True)
    out["sustained_rate_rps"] = s["achieved_rate_rps"].where(ok) if serving.any() else np.nan
    return out


def _series(out: pd.DataFrame, series: pd.DataFrame, c: Thresholds) -> None:
    """Walk one series by increasing load, writing its knee columns into ``out``."""
    best = 0.0
    last = None  # (p99 TTFT, requests/s) of the last sustainable point
    past = False
    for i, row in series.iterrows():
        reasons = []
        if row["request_errors"] > 0:
            reasons.append(f"{int(row['request_errors'])} request(s) failed")
        sustained = row["load_sustained_min"]
        if pd.notna(sustained) and sustained < c.min_load_sustained:
            reasons.append(f"achieved {sustained:.0%} of the offered load")
        offered = row.get("load_offered_min")
        short = row["load_mode"] == "rate" and bool(
            not_offered(offered, row.get("load_offered_tolerance"), c)
        )
        if short and not reasons and not past:
            # The server was never offered this load: nothing to say of it (module docstring).
            out.at[i, "knee"] = False
            out.at[i, "knee_reason"] = (
                f"unknown: the client sent {offered:.0%} of the offered rate in a repetition "
                "(load_not_offered)"
            )
            continue
        if short and reasons:
            reasons.append(f"the client sent {offered:.0%} of the offered rate")
        rate = row["achieved_rate_rps"]
        if best > 0 and pd.notna(rate) and rate < c.knee_min_throughput_fraction * best:
            reasons.append(f"requests/s fell to {rate / best:.0%} of the best earlier point")
        ttft = row["ttft_p99_s"]
        if last is not None and pd.notna(ttft) and pd.notna(rate) and rate > 0:
            growth = (ttft / last[0]) / (rate / last[1])
            if growth > c.knee_max_ttft_growth:
                reasons.append(
                    f"p99 TTFT x{ttft / last[0]:.1f} for requests/s x{rate / last[1]:.2f} since "
                    "the last sustainable point"
                )
        out.at[i, "knee"] = bool(reasons and not past)
        past = past or bool(reasons)
        sustainable = not past
        out.at[i, "sustainable"] = sustainable
        out.at[i, "past_knee"] = past
        out.at[i, "knee_reason"] = (
            "; ".join(reasons)
            if reasons
            else ("past the knee (a lower load was not sustainable)" if past else "ok")
        )
        if sustainable and pd.notna(ttft) and ttft > 0 and pd.notna(rate) and rate > 0:
            last = (ttft, rate)
        if pd.notna(rate):
            best = max(best, rate)
