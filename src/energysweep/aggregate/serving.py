"""The serving columns of windows and points (scenario serving; README "Serving").

Per window, from its first shard row (the serving columns are the window's, not a GPU's), plus:

- ``energy_per_total_token_j`` = GPU energy / (input + output tokens of the window), and the
  idle-adjusted ``energy_per_request_idle_adjusted_j``, ``energy_per_total_token_idle_adjusted_j``
  (J/request and J/output token are the shared ``energy_per_request_j`` and
  ``energy_per_output_token_j``);
- ``goodput_rps`` = requests completed in the window within serving.slo / window length;
- ``cpu_time_per_request_s``: the server's CPU seconds per completed request (measured; the
  figure CPU-only runs show instead of energy, never called energy).

Per point: medians over its ok repetitions, except ``load_sustained_min`` (the worst repetition:
a load is sustained only if every repetition sustained it), ``load_offered_min`` (at a request
rate, the worst repetition's requests sent in the window per second / the offered rate: whether
the client offered the load the point is named for; null at concurrency levels, a closed loop),
``load_offered_tolerance`` (the arrivals' own randomness that check allows, 3 / sqrt(expected
arrivals x min(1, burstiness)), of the shortest window: the widest) and ``request_errors``,
``requests_sent``, ``requests_cancelled``, ``requests_dropped`` (summed over every repetition);
bootstrap CIs of J/request and J/total token, gross and idle-adjusted, of the idle-adjusted
J/output token (the gross one's is every point's) and of achieved requests/s, as for the other
headline figures.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from energysweep.aggregate.bootstrap import bootstrap_ci_groups
from energysweep.aggregate.groups import Groups, values_of
from energysweep.tables.shards import SERVING_NULLABLE

# Shard columns windows() carries per window (first row).
WINDOW_SERVING_COLUMNS = ["load_mode", *SERVING_NULLABLE, "serving_status"]
# Per-window figures whose median over ok repetitions a point reports.
_MEDIANS = [
    "energy_per_total_token_j", "energy_per_request_idle_adjusted_j",
    "energy_per_total_token_idle_adjusted_j", "goodput_rps", "cpu_time_per_request_s",
    "host_energy_per_request_j", "arrival_rate_rps", "achieved_rate_rps",
    "achieved_concurrency", "queue_waiting_mean", "queue_waiting_max", "queue_time_mean_s",
    "ramp_s", "drain_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "itl_p50_s",
    "itl_p99_s", "e2e_p50_s", "e2e_p99_s",
]  # fmt: skip
_SUMMED = ("request_errors", "requests_sent", "requests_cancelled", "requests_dropped")
# Gross and idle-adjusted (J/output token gross: the shared energy_per_output_token_j's CI).
_CI = [
    "energy_per_request_j", "energy_per_total_token_j", "energy_per_request_idle_adjusted_j",
    "energy_per_total_token_idle_adjusted_j", "energy_per_output_token_idle_adjusted_j",
    "achieved_rate_rps",
]  # fmt: skip
NOT_SERVING = "not-applicable (no serving load)"


def window_columns(first: pd.DataFrame, ok: np.ndarray) -> dict:
    """A window's serving columns from its first row (measured ones null where it failed)."""
    out = {"load_mode": first["load_mode"]}
    for c in SERVING_NULLABLE:
        kept = c in _SUMMED  # a failed run's requests and errors still count
        out[c] = first[c] if kept else first[c].where(ok, np.nan)
    out["serving_status"] = first["serving_status"]
    return out


def derived(w: pd.DataFrame) -> None:
    """Adds the per-window serving figures to ``w`` (in place; NaN outside serving windows)."""
    tokens = w["input_tokens"] + w["output_tokens"]
    w["energy_per_total_token_j"] = w["gpu_energy_j"] / tokens
    w["energy_per_request_idle_adjusted_j"] = w["gpu_energy_idle_adjusted_j"] / w["requests"]
    w["energy_per_total_token_idle_adjusted_j"] = w["gpu_energy_idle_adjusted_j"] / tokens
    w["goodput_rps"] = w["slo_met_requests"] / w["duration_s"]
    w["cpu_time_per_request_s"] = (w["cpu_time_s"] / w["requests"]).where(w["load_mode"] != "batch")
    w["host_energy_per_request_j"] = (w["host_energy_j"] / w["requests"]).where(
        w["load_mode"] != "batch"
    )


def point_columns(
    head: pd.DataFrame, gid: np.ndarray, rows: Groups, ok: pd.DataFrame, ok_gid: np.ndarray,
    n: int, n_ok: np.ndarray,
) -> dict:  # fmt: skip
    """Per point the serving figures (module docstring); NaN on other scenarios' points."""
    med = ok[_MEDIANS].astype(float).groupby(ok_gid).median().reindex(range(n))
    worst = ok["load_sustained"].astype(float).groupby(ok_gid).min().reindex(range(n))
    rate = ok["load_mode"] == "rate"
    offered = ok["offered_load"].astype(float)
    sent = (ok["arrival_rate_rps"].astype(float) / offered).where(rate)
    # Gamma arrivals of shape k < 1 (bursty) vary as expected / k; k >= 1 less than Poisson.
    shape = ok["burstiness"].astype(float).fillna(1.0).clip(upper=1.0)
    noise = (3.0 / np.sqrt(offered * ok["duration_s"].astype(float) * shape)).where(rate)
    offered_worst = sent.groupby(ok_gid).min().reindex(range(n))
    offered_noise = noise.groupby(ok_gid).max().reindex(range(n))
    out: dict = {
        "load_mode": rows.first(head["load_mode"]).tolist(),
        **{c: rows.first(values_of(head, c)).astype(float) for c in ("offered_load", "burstiness")},
        **{c: med[c].to_numpy() for c in _MEDIANS},
        "load_sustained_min": worst.to_numpy(),
        "load_offered_min": offered_worst.to_numpy(),
        "load_offered_tolerance": offered_noise.to_numpy(),
        **{c: rows.sum_min_count_1(values_of(head, c)) for c in _SUMMED},
        "serving_status": _serving_status(head, rows),
    }
    for metric in _CI:
        lo, hi = bootstrap_ci_groups(ok_gid, values_of(ok, metric), n)
        out[f"{metric}_ci_low"], out[f"{metric}_ci_high"] = lo, hi
    return out


def _serving_status(head: pd.DataFrame, rows: Groups) -> list:
    joined = rows.joined(head["serving_status"], ",")
    return np.where(joined == "", NOT_SERVING, joined).tolist()


# Summary column -> status columns explaining its nulls (aggregate.nulls.NULL_STATUS).
_ENERGY = ("serving_status", "gpu_energy_status", "status")
NULL_STATUS: dict[str, tuple[str, ...]] = {
    **{c: ("serving_status", "status") for c in _MEDIANS},
    **{c: _ENERGY for c in _MEDIANS if "energy" in c},
    "cpu_time_per_request_s": ("serving_status", "status"),
    "host_energy_per_request_j": ("serving_status", "host_energy_status", "status"),
    **{c: ("serving_status",) for c in ("offered_load", *_SUMMED)},
    "burstiness": ("serving_status", "load_mode"),
    "load_sustained_min": ("serving_status", "status"),
    "load_offered_min": ("serving_status", "load_mode", "status"),
    "load_offered_tolerance": ("serving_status", "load_mode", "status"),
    **{f"{m}_ci_{e}": ("ci_status", *_ENERGY) for m in _CI for e in ("low", "high")},
}
# Idle-adjusted: also null without an idle baseline; per output token: also on training points.
for _e in ("low", "high"):
    for _m in _CI:
        if "idle_adjusted" in _m:
            NULL_STATUS[f"{_m}_ci_{_e}"] = ("idle_status", *NULL_STATUS[f"{_m}_ci_{_e}"])
    _c = f"energy_per_output_token_idle_adjusted_j_ci_{_e}"
    NULL_STATUS[_c] = ("output_token_status", *NULL_STATUS[_c])
