"""The per-window and per-point loops that ``aggregate.windows``/``summarize`` replaced.

Kept unchanged (only reformatted) as the specification that test_aggregate_reference holds the
vectorized code to: each window is a pandas group, each figure computed from that group's rows
alone. It costs 20-30 ms per window, too slow for 10^4 shards (bench/merge_scaling.py), but it
is easy to read.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from energysweep.aggregate import (
    HEADLINE_PHASES,
    MEASURED,
    NO_OUTPUT_TOKENS,
    NOT_TRAINING,
    POINT_KEYS,
    TRAIN_PHASE,
    WINDOW_KEYS,
    bootstrap_ci,
    prefill_decode,
)
from energysweep.tables.shards import SERVING_NULLABLE


def _all_or_nan(values: pd.Series) -> float:
    """Sum of values, or NaN if any is missing (never a partial sum)."""
    return float(values.sum()) if len(values) and values.notna().all() else np.nan


def _status_of(statuses: set, measured=MEASURED) -> str:
    if statuses <= {"measured"}:
        return "measured"
    if statuses <= measured:
        return "short-window"
    if len(statuses) == 1:
        return next(iter(statuses))
    return "partial"


def _host(group: pd.DataFrame, ok: bool) -> dict:
    """Host energy of a window: each distinct host once, from the rank that read it."""
    per_host = []
    for _, h in group.groupby("host", sort=True):
        read = h[h["host_energy_status"] != "not-read"]
        per_host.append(read.iloc[0] if len(read) else h.iloc[0])
    per_host = pd.DataFrame(per_host)
    statuses = set(per_host["host_energy_status"])
    measured = ok and statuses <= {"measured"}
    idle_ok = measured and set(per_host["idle_host_power_status"]) <= {"measured"}
    return {
        "host_energy_j": _all_or_nan(per_host["host_energy_mj"]) / 1e3 if measured else np.nan,
        "host_dram_energy_j": (
            _all_or_nan(per_host["host_dram_energy_mj"]) / 1e3 if measured else np.nan
        ),
        "host_energy_status": "measured" if measured else _status_of(statuses, {"measured"}),
        "host_energy_detail": "; ".join(sorted(set(per_host["host_energy_detail"].dropna())))
        or None,
        "idle_host_power_w": _all_or_nan(per_host["idle_host_power_w"]) if idle_ok else np.nan,
        "idle_host_status": (
            "measured"
            if idle_ok
            else _status_of(set(per_host["idle_host_power_status"]), {"measured"})
        ),
    }


def _window(group: pd.DataFrame) -> pd.Series:
    first = group.iloc[0]
    ok = first["status"] == "ok"
    gpus = group.dropna(subset=["gpu_uuid"]).drop_duplicates("gpu_uuid")
    statuses = set(group["gpu_energy_status"])
    if ok and len(gpus) and statuses <= MEASURED and gpus["gpu_energy_mj"].notna().all():
        energy_j = gpus["gpu_energy_mj"].sum() / 1e3
        estatus = "short-window" if "short-window" in statuses else "measured"
    else:
        energy_j = np.nan
        estatus = "unavailable" if statuses <= {"unavailable"} else "partial"
    zeus_statuses = set(gpus["gpu_energy_zeus_status"]) if len(gpus) else {"not-requested"}
    zeus_j = (
        _all_or_nan(gpus["gpu_energy_mj_zeus"]) / 1e3
        if ok and len(gpus) and zeus_statuses <= MEASURED
        else np.nan
    )
    idle_statuses = (
        set(gpus["idle_gpu_power_status"]) if len(gpus) else set(group["idle_gpu_power_status"])
    )
    idle_w = _all_or_nan(gpus["idle_gpu_power_w"]) if idle_statuses <= MEASURED else np.nan
    details = sorted({d for d in group["gpu_energy_detail"].dropna()})
    dur = (first["window_end_ns"] - first["window_start_ns"]) / 1e9 if ok else np.nan
    out_tok = first["output_tokens"] if ok else np.nan
    return pd.Series(
        {
            "status": first["status"],
            "error": first["error"],
            "duration_s": dur,
            "iterations": first["iterations"],
            "requests": first["requests"],
            "input_tokens": first["input_tokens"],
            "output_tokens": out_tok,
            "n_ranks": group["rank"].nunique(),
            "n_processes": group[["host", "pid"]].drop_duplicates().shape[0],
            "n_gpus": len(gpus),
            "n_hosts": group["host"].nunique(),
            "energy_source": ",".join(sorted(set(group["energy_source"]))),
            "gpu_energy_j": energy_j,
            "gpu_energy_status": estatus,
            "gpu_energy_method": ",".join(sorted(set(group["gpu_energy_method"]))),
            "gpu_energy_detail": "; ".join(details) or None,
            "gpu_energy_zeus_j": zeus_j,
            "zeus_status": _status_of(zeus_statuses),
            "idle_gpu_power_w": idle_w,
            "idle_status": _status_of(idle_statuses) if len(idle_statuses) else "unavailable",
            **_host(group, ok),
            "cpu_time_s": group.drop_duplicates(["host", "pid"])["cpu_time_s"].sum(min_count=1),
            "model_parameters": first["model_parameters"],
            "flops_estimate": first["flops_estimate"],
            "loss": first["loss"] if ok else np.nan,
            "flops_status": first["model_parameters_method"],
            "config_hash": first["config_hash"],
            "code_version": first["code_version"],
            "device": ",".join(sorted(set(group["device"]))),
            **_serving_window(first, ok),
        }
    )


SUMMED = ("request_errors", "requests_sent", "requests_cancelled", "requests_dropped")
SERVING_MEDIANS = [
    "energy_per_total_token_j", "energy_per_request_idle_adjusted_j",
    "energy_per_total_token_idle_adjusted_j", "goodput_rps", "cpu_time_per_request_s",
    "host_energy_per_request_j", "arrival_rate_rps", "achieved_rate_rps",
    "achieved_concurrency", "queue_waiting_mean", "queue_waiting_max", "queue_time_mean_s",
    "ramp_s", "drain_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "itl_p50_s",
    "itl_p99_s", "e2e_p50_s", "e2e_p99_s",
]  # fmt: skip


def _serving_window(first: pd.Series, ok: bool) -> dict:
    """A window's serving columns: its first row's; measured figures null where it failed."""
    out = {"load_mode": first["load_mode"]}
    for c in SERVING_NULLABLE:
        out[c] = first[c] if ok or c in SUMMED else np.nan
    out["serving_status"] = first["serving_status"]
    return out


def _serving_derived(w: pd.DataFrame) -> None:
    tokens = w["input_tokens"] + w["output_tokens"]
    serving = w["load_mode"] != "batch"
    w["energy_per_total_token_j"] = w["gpu_energy_j"] / tokens
    w["energy_per_request_idle_adjusted_j"] = w["gpu_energy_idle_adjusted_j"] / w["requests"]
    w["energy_per_total_token_idle_adjusted_j"] = w["gpu_energy_idle_adjusted_j"] / tokens
    w["goodput_rps"] = w["slo_met_requests"] / w["duration_s"]
    w["cpu_time_per_request_s"] = (w["cpu_time_s"] / w["requests"]).where(serving)
    w["host_energy_per_request_j"] = (w["host_energy_j"] / w["requests"]).where(serving)


def _offered_tolerance(ok: pd.DataFrame) -> float:
    """3 / sqrt(expected arrivals x min(1, burstiness)) of the shortest rate window."""
    shape = ok["burstiness"].fillna(1.0).clip(upper=1.0)
    noise = 3.0 / np.sqrt(ok["offered_load"] * ok["duration_s"] * shape)
    return noise.where(ok["load_mode"] == "rate").max()


def _serving_point(g: pd.DataFrame, ok: pd.DataFrame) -> dict:
    statuses = ",".join(sorted(set(g["serving_status"])))
    row = {
        "load_mode": g["load_mode"].iloc[0],
        "offered_load": float(g["offered_load"].iloc[0]),
        "burstiness": float(g["burstiness"].iloc[0]),
        **{c: _median(ok[c].astype(float)) for c in SERVING_MEDIANS},
        "load_sustained_min": ok["load_sustained"].astype(float).min(),
        "load_offered_min": (
            (ok["arrival_rate_rps"] / ok["offered_load"]).where(ok["load_mode"] == "rate").min()
        ),
        "load_offered_tolerance": _offered_tolerance(ok),
        **{c: g[c].astype(float).sum(min_count=1) for c in SUMMED},
        "serving_status": statuses or "not-applicable (no serving load)",
    }
    for metric in ("energy_per_request_j", "energy_per_total_token_j",
                   "energy_per_request_idle_adjusted_j", "energy_per_total_token_idle_adjusted_j",
                   "energy_per_output_token_idle_adjusted_j", "achieved_rate_rps"):  # fmt: skip
        row[f"{metric}_ci_low"], row[f"{metric}_ci_high"] = bootstrap_ci(ok[metric].astype(float))
    return row


def windows(energy: pd.DataFrame) -> pd.DataFrame:
    """One row per measured window, with derived per-token and per-second figures."""
    if energy.empty:
        return pd.DataFrame(columns=[*WINDOW_KEYS, "status"])
    w = energy.groupby(WINDOW_KEYS, sort=True, dropna=False).apply(_window, include_groups=False)
    w = w.reset_index()
    w["energy_per_output_token_j"] = w["gpu_energy_j"] / w["output_tokens"]
    w["energy_per_request_j"] = w["gpu_energy_j"] / w["requests"]
    w["energy_per_iteration_j"] = w["gpu_energy_j"] / w["iterations"]
    w["output_tokens_per_s"] = w["output_tokens"] / w["duration_s"]
    w["mean_gpu_power_w"] = w["gpu_energy_j"] / w["duration_s"]
    w["gpu_energy_idle_adjusted_j"] = w["gpu_energy_j"] - w["idle_gpu_power_w"] * w["duration_s"]
    w["energy_per_output_token_idle_adjusted_j"] = (
        w["gpu_energy_idle_adjusted_j"] / w["output_tokens"]
    )
    w["host_energy_per_output_token_j"] = w["host_energy_j"] / w["output_tokens"]
    w["mean_host_power_w"] = w["host_energy_j"] / w["duration_s"]
    w["host_energy_idle_adjusted_j"] = w["host_energy_j"] - w["idle_host_power_w"] * w["duration_s"]
    w["zeus_nvml_energy_ratio"] = w["gpu_energy_zeus_j"] / w["gpu_energy_j"]
    w["flops_estimate_per_s"] = w["flops_estimate"] / w["duration_s"]
    w["flops_estimate_per_j"] = w["flops_estimate"] / w["gpu_energy_j"]
    # Training windows: input_tokens = tokens trained on and requests = sequences (all replicas).
    train = w["phase"] == TRAIN_PHASE
    w["energy_per_train_token_j"] = (w["gpu_energy_j"] / w["input_tokens"]).where(train)
    w["train_tokens_per_s"] = (w["input_tokens"] / w["duration_s"]).where(train)
    w["samples_per_s"] = (w["requests"] / w["duration_s"]).where(train)
    _serving_derived(w)
    return w


def _median(s: pd.Series) -> float:
    return s.median() if s.notna().any() else np.nan


def _join(values) -> str | None:
    return "; ".join(sorted({v for v in values if isinstance(v, str) and v})) or None


def _point_status(g: pd.DataFrame) -> str:
    ok = g[g["status"] == "ok"]
    if len(ok) == len(g):
        return "ok"
    return "partial" if len(ok) else ",".join(sorted(set(g["status"])))


def summarize(win: pd.DataFrame) -> pd.DataFrame:
    """One row per grid point: medians and bootstrap CIs over repetitions; statuses say why."""
    split = prefill_decode(win) if len(win) else pd.DataFrame()
    rows = []
    head = win[win["phase"].isin(HEADLINE_PHASES)]
    for key, g in head.groupby(POINT_KEYS, sort=True):
        ok = g[g["status"] == "ok"]
        n_ok = len(ok)
        energy_statuses = sorted(set(ok["gpu_energy_status"])) if n_ok else ["unavailable"]
        row = {
            **dict(zip(POINT_KEYS, key, strict=True)),
            "status": _point_status(g),
            "error": _join(g["error"]),
            "repetitions": len(g),
            "repetitions_ok": n_ok,
            "energy_source": ",".join(sorted(set(g["energy_source"]))),
            "energy_per_output_token_j": _median(ok["energy_per_output_token_j"]),
            "energy_per_request_j": _median(ok["energy_per_request_j"]),
            "energy_per_iteration_j": _median(ok["energy_per_iteration_j"]),
            "output_tokens_per_s": _median(ok["output_tokens_per_s"]),
            "mean_gpu_power_w": _median(ok["mean_gpu_power_w"]),
        }
        training = row["scenario"] == "training"
        row.update(
            {
                "output_token_status": NO_OUTPUT_TOKENS if training else "ok",
                "training_status": "ok" if training else NOT_TRAINING,
                "energy_per_train_token_j": _median(ok["energy_per_train_token_j"]),
                "train_tokens_per_s": _median(ok["train_tokens_per_s"]),
                "samples_per_s": _median(ok["samples_per_s"]),
                "loss": _median(ok["loss"]),
            }
        )
        for metric in (
            "energy_per_output_token_j",
            "output_tokens_per_s",
            "mean_gpu_power_w",
            "energy_per_train_token_j",
        ):
            row[f"{metric}_ci_low"], row[f"{metric}_ci_high"] = bootstrap_ci(ok[metric])
        row["ci_status"] = (
            "ok" if n_ok >= 2 else f"too-few-repetitions ({n_ok} ok; a CI needs 2 or more)"
        )
        row.update(
            {
                "gpu_energy_status": ",".join(energy_statuses),
                "gpu_energy_detail": _join(ok["gpu_energy_detail"]),
                "idle_gpu_power_w": _median(ok["idle_gpu_power_w"]),
                "gpu_energy_idle_adjusted_j": _median(ok["gpu_energy_idle_adjusted_j"]),
                "energy_per_output_token_idle_adjusted_j": _median(
                    ok["energy_per_output_token_idle_adjusted_j"]
                ),
                "idle_status": ",".join(sorted(set(ok["idle_status"]))) or "unavailable",
            }
        )
        pd_rows = (
            split.merge(ok[["job_id", *POINT_KEYS, "repetition"]], how="inner")
            if len(split)
            else pd.DataFrame()
        )
        if len(pd_rows):
            good = pd_rows[pd_rows["prefill_decode_status"] == "ok"]
            for c in (
                "prefill_energy_per_request_j",
                "decode_energy_per_output_token_j",
                "prefill_energy_fraction",
            ):
                row[c] = _median(good[c])
            timed = pd_rows[pd_rows["prefill_s_per_iteration"].notna()]
            row["prefill_s_per_iteration"] = _median(timed["prefill_s_per_iteration"])
            row["decode_output_tokens_per_s"] = _median(timed["decode_output_tokens_per_s"])
            row["prefill_decode_status"] = ",".join(sorted(set(pd_rows["prefill_decode_status"])))
        else:
            for c in (
                "prefill_energy_per_request_j",
                "decode_energy_per_output_token_j",
                "prefill_energy_fraction",
                "prefill_s_per_iteration",
                "decode_output_tokens_per_s",
            ):
                row[c] = np.nan
            row["prefill_decode_status"] = (
                "not-applicable (training)"
                if training
                else "no-prefill-window (measurement.prefill_pass: false)"
                if n_ok
                else "point-failed"
            )
        host_statuses = sorted(set(ok["host_energy_status"])) if n_ok else ["unavailable"]
        row.update(
            {
                "host_energy_per_output_token_j": _median(ok["host_energy_per_output_token_j"]),
                "mean_host_power_w": _median(ok["mean_host_power_w"]),
                "host_energy_per_output_token_idle_adjusted_j": _median(
                    ok["host_energy_idle_adjusted_j"] / ok["output_tokens"]
                ),
                "host_energy_status": ",".join(host_statuses),
                "host_energy_detail": _join(ok["host_energy_detail"]),
                "idle_host_status": ",".join(sorted(set(ok["idle_host_status"]))) or "unavailable",
                "zeus_nvml_energy_ratio": _median(ok["zeus_nvml_energy_ratio"]),
                "zeus_status": ",".join(sorted(set(ok["zeus_status"]))) or "not-requested",
                "flops_estimate_per_s": _median(ok["flops_estimate_per_s"]),
                "flops_estimate_per_j": _median(ok["flops_estimate_per_j"]),
                "flops_status": ",".join(sorted(set(g["flops_status"]))),
                "window_s": _median(ok["duration_s"]),
                "iterations_per_window": _median(ok["iterations"]),
                "output_tokens_per_window": _median(ok["output_tokens"]),
                "n_processes": int(g["n_processes"].max()),
                "n_gpus": int(g["n_gpus"].max()),
                "n_hosts": int(g["n_hosts"].max()),
                "cpu_time_s": _median(ok["cpu_time_s"]),
                "device": ",".join(sorted(set(g["device"]))),
                "config_hash": ",".join(sorted(set(g["config_hash"]))),
                "code_version": ",".join(sorted(set(g["code_version"]))),
            }
        )
        row.update(_serving_point(g, ok))
        rows.append(row)
    return pd.DataFrame(rows)
