"""How the ranks' rows of one window combine, in the merge: one row per measured window.

The counting rule across ranks has two steps. The first runs on rank 0 before the window's shard
is written: :func:`energysweep.measure.combine.combine_ranks` stores the window's totals (tokens
summed over ranks, edges, requests, FLOPs) in every row of the shard. The second is
:func:`windows` here: one row per measured window. A window's GPU energy is the sum over its
*distinct* GPU UUIDs, so a GPU reported by two ranks counts once, and every node's GPUs of a
multi-node job are included. If any GPU of the window has no measured energy the window's energy
is null (never a partial sum). Host (RAPL) energy is summed over distinct hosts, each read once
by its local rank 0; CPU time over distinct processes. Idle-adjusted energy = gross - the
window's GPUs' idle power x window duration (``*_idle_adjusted_*``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from energysweep.aggregate.groups import Groups, is_in, null_if_empty, values_of
from energysweep.aggregate.serving import WINDOW_SERVING_COLUMNS, derived, window_columns
from energysweep.tables.phases import Phase
from energysweep.tables.shards import WINDOW_KEYS
from energysweep.tables.status import ACCEPTED, EnergyStatus, Status

MEASURED = set(ACCEPTED)
TRAIN_PHASE = Phase.TRAIN.value

# The shard columns windows() reads; aggregate() converts only these to pandas.
WINDOW_COLUMNS = [
    *WINDOW_KEYS,
    "status",
    "error",
    "window_start_ns",
    "window_end_ns",
    "iterations",
    "requests",
    "input_tokens",
    "output_tokens",
    "rank",
    "pid",
    "host",
    "device",
    "gpu_uuid",
    "gpu_energy_mj",
    "gpu_energy_status",
    "gpu_energy_method",
    "gpu_energy_detail",
    "energy_source",
    "gpu_energy_mj_zeus",
    "gpu_energy_zeus_status",
    "idle_gpu_power_w",
    "idle_gpu_power_status",
    "host_energy_mj",
    "host_dram_energy_mj",
    "host_energy_status",
    "host_energy_detail",
    "idle_host_power_w",
    "idle_host_power_status",
    "cpu_time_s",
    "model_parameters",
    "model_parameters_method",
    "flops_estimate",
    "loss",
    "config_hash",
    "code_version",
    *WINDOW_SERVING_COLUMNS,
]


def _host_columns(energy: pd.DataFrame, gid: np.ndarray, n: int, ok: np.ndarray) -> dict:
    """Host energy per window: each distinct host once, from the rank that read it.

    Per (window, host) the first row whose ``host_energy_status`` is not "not-read", else the
    host's first row; hosts in sorted order, as a per-window ``groupby("host")`` sees them.
    """
    host = energy["host"]
    keep = host.notna().to_numpy()
    order = pd.DataFrame(
        {
            "g": gid,
            "host": host,
            "not_read": is_in(energy, "host_energy_status", [EnergyStatus.NOT_READ]),
            "pos": np.arange(len(energy)),
        }
    )[keep].sort_values(["g", "host", "not_read", "pos"], kind="stable")
    per_host = order.drop_duplicates(["g", "host"])["pos"].to_numpy()
    h = Groups(gid, n, per_host)
    measured = ok & h.all(is_in(energy, "host_energy_status", [EnergyStatus.MEASURED]))
    idle_ok = measured & h.all(is_in(energy, "idle_host_power_status", [EnergyStatus.MEASURED]))
    host_measured = is_in(energy, "host_energy_status", [EnergyStatus.MEASURED])
    idle_measured = is_in(energy, "idle_host_power_status", [EnergyStatus.MEASURED])
    return {
        "host_energy_j": np.where(
            measured, h.sum_all_or_nan(values_of(energy, "host_energy_mj")) / 1e3, np.nan
        ),
        "host_dram_energy_j": np.where(
            measured, h.sum_all_or_nan(values_of(energy, "host_dram_energy_mj")) / 1e3, np.nan
        ),
        "host_energy_status": np.where(
            measured,
            EnergyStatus.MEASURED,
            h.status_of(energy["host_energy_status"], host_measured, host_measured),
        ).tolist(),
        "host_energy_detail": null_if_empty(h.joined(energy["host_energy_detail"], "; ")),
        "idle_host_power_w": np.where(
            idle_ok, h.sum_all_or_nan(values_of(energy, "idle_host_power_w")), np.nan
        ),
        "idle_host_status": np.where(
            idle_ok,
            EnergyStatus.MEASURED,
            h.status_of(energy["idle_host_power_status"], idle_measured, idle_measured),
        ).tolist(),
    }


def _gpu_columns(
    energy: pd.DataFrame, gid: np.ndarray, n: int, ok: np.ndarray, rows: Groups
) -> dict:
    """GPU energy, Zeus cross-check and idle power per window, each distinct GPU UUID once."""
    # GPUs: each distinct UUID of the window once (its first row).
    uuid = energy["gpu_uuid"]
    dup = pd.DataFrame({"g": gid, "u": uuid}).duplicated().to_numpy()
    gpus = Groups(gid, n, np.flatnonzero(uuid.notna().to_numpy() & ~dup))
    n_gpus = gpus.count
    has_gpus = n_gpus > 0
    estatus_measured = rows.all(is_in(energy, "gpu_energy_status", MEASURED))
    gpu_mj = values_of(energy, "gpu_energy_mj")
    gpu_complete = gpus.all(~np.isnan(gpu_mj))
    energy_ok = ok & has_gpus & estatus_measured & gpu_complete
    short = rows.any(is_in(energy, "gpu_energy_status", [EnergyStatus.SHORT_WINDOW]))
    unavailable = rows.all(is_in(energy, "gpu_energy_status", [EnergyStatus.UNAVAILABLE]))
    estatus = np.where(
        energy_ok,
        np.where(short, EnergyStatus.SHORT_WINDOW, EnergyStatus.MEASURED),
        np.where(unavailable, EnergyStatus.UNAVAILABLE, EnergyStatus.PARTIAL),
    )

    zeus_st = energy["gpu_energy_zeus_status"]
    zeus_measured = is_in(energy, "gpu_energy_zeus_status", [EnergyStatus.MEASURED])
    zeus_ok = is_in(energy, "gpu_energy_zeus_status", MEASURED)
    zeus_j = np.where(
        ok & has_gpus & gpus.all(zeus_ok),
        gpus.sum_all_or_nan(values_of(energy, "gpu_energy_mj_zeus")) / 1e3,
        np.nan,
    )
    zeus_status = np.where(
        has_gpus, gpus.status_of(zeus_st, zeus_measured, zeus_ok), EnergyStatus.NOT_REQUESTED
    )

    # Idle statuses come from the window's GPUs, or from all its rows when it has none.
    idle_st = energy["idle_gpu_power_status"]
    idle_measured = is_in(energy, "idle_gpu_power_status", [EnergyStatus.MEASURED])
    idle_in = is_in(energy, "idle_gpu_power_status", MEASURED)
    idle_w = np.where(
        has_gpus & gpus.all(idle_in),
        gpus.sum_all_or_nan(values_of(energy, "idle_gpu_power_w")),
        np.nan,
    )
    idle_status = np.where(
        has_gpus,
        gpus.status_of(idle_st, idle_measured, idle_in),
        rows.status_of(idle_st, idle_measured, idle_in),
    )
    return {
        "n_gpus": n_gpus,
        "gpu_energy_j": np.where(energy_ok, gpus.sum(gpu_mj) / 1e3, np.nan),
        "gpu_energy_status": estatus.tolist(),
        "gpu_energy_zeus_j": zeus_j,
        "zeus_status": zeus_status.tolist(),
        "idle_gpu_power_w": idle_w,
        "idle_status": idle_status.tolist(),
    }


def _derived(w: pd.DataFrame) -> pd.DataFrame:
    """``w`` with the per-token, per-second and idle-adjusted figures of each window added."""
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
    derived(w)
    return w


def windows(energy: pd.DataFrame) -> pd.DataFrame:
    """One row per measured window, with derived per-token and per-second figures.

    Vectorized: a few whole-frame passes, not a Python function per window (which cost 20-30 ms
    per window: bench/merge_scaling.py). Each value is what a per-window loop over the window's
    rows gives (tests/unit/test_aggregate_reference.py compares the two).
    """
    if energy.empty:
        return pd.DataFrame(columns=[*WINDOW_KEYS, "status"])
    gid = energy.groupby(WINDOW_KEYS, sort=True, dropna=False).ngroup().to_numpy()
    n = int(gid.max()) + 1
    _, first_pos = np.unique(gid, return_index=True)  # each window's first row
    first = energy.iloc[first_pos].reset_index(drop=True)
    ok = (first["status"] == Status.OK).to_numpy()
    rows = Groups(gid, n)

    gpu = _gpu_columns(energy, gid, n, ok, rows)
    hosts_pids = pd.DataFrame({"g": gid, "host": energy["host"], "pid": energy["pid"]})
    processes = Groups(gid, n, np.flatnonzero(~hosts_pids.duplicated().to_numpy()))

    dur = (first["window_end_ns"] - first["window_start_ns"]) / 1e9
    out = first[WINDOW_KEYS].copy()
    columns = {
        "status": first["status"],
        "error": first["error"],
        "duration_s": dur.where(ok, np.nan),
        "iterations": first["iterations"],
        "requests": first["requests"],
        "input_tokens": first["input_tokens"],
        "output_tokens": first["output_tokens"].where(ok, np.nan),
        "n_ranks": rows.nunique(energy["rank"]),
        "n_processes": processes.count,
        "n_gpus": gpu["n_gpus"],
        "n_hosts": rows.nunique(energy["host"]),
        "energy_source": rows.joined(energy["energy_source"], ",").tolist(),
        "gpu_energy_j": gpu["gpu_energy_j"],
        "gpu_energy_status": gpu["gpu_energy_status"],
        "gpu_energy_method": rows.joined(energy["gpu_energy_method"], ",").tolist(),
        "gpu_energy_detail": null_if_empty(rows.joined(energy["gpu_energy_detail"], "; ")),
        **{
            c: gpu[c]
            for c in ("gpu_energy_zeus_j", "zeus_status", "idle_gpu_power_w", "idle_status")
        },
        **_host_columns(energy, gid, n, ok),
        "cpu_time_s": processes.sum_min_count_1(values_of(energy, "cpu_time_s")),
        "model_parameters": first["model_parameters"],
        "flops_estimate": first["flops_estimate"],
        "loss": first["loss"].where(ok, np.nan),
        "flops_status": first["model_parameters_method"],
        "config_hash": first["config_hash"],
        "code_version": first["code_version"],
        "device": rows.joined(energy["device"], ",").tolist(),
        **window_columns(first, ok),
    }
    w = pd.concat([out, pd.DataFrame(columns, index=out.index)], axis=1)
    return _derived(w)
