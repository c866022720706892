"""Windows -> one row per grid point: medians and bootstrap CIs over repetitions.

Per repetition, prefill energy per iteration comes from the prefill window and decode energy
per output token = (generate - prefill energy per iteration) / (output tokens - requests per
iteration): the prefill pass generates each request's first token. Training windows give energy
per training token (GPU energy / tokens trained on), training tokens and samples per second and
the loss; output-token figures stay null for them (``output_token_status`` says why), as
training figures do for inference points (``training_status``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from energysweep.aggregate.bootstrap import bootstrap_ci_groups
from energysweep.aggregate.groups import Groups, null_if_empty, values_of
from energysweep.aggregate.serving import point_columns
from energysweep.aggregate.windows import MEASURED
from energysweep.tables.phases import HEADLINE_PHASES, Phase
from energysweep.tables.shards import POINT_KEYS
from energysweep.tables.status import EnergyStatus, Status

UNAVAILABLE = EnergyStatus.UNAVAILABLE
NOT_TRAINING = "not-applicable (inference: no optimizer steps)"
NO_OUTPUT_TOKENS = "not-applicable (training generates no output tokens)"


def prefill_decode(win: pd.DataFrame) -> pd.DataFrame:
    """Per (job, point, repetition): the prefill/decode split from a generate and a prefill window.

    Returns one row per generate window with the split's columns and ``prefill_decode_status``.
    """
    keys = ["job_id", *POINT_KEYS, "repetition"]
    gen = win[win["phase"] == Phase.GENERATE.value].set_index(keys)
    pre = win[win["phase"] == Phase.PREFILL.value].set_index(keys)
    out = pd.DataFrame(index=gen.index)
    pre = pre.reindex(gen.index)
    g_iter = gen["gpu_energy_j"] / gen["iterations"]
    p_iter = pre["gpu_energy_j"] / pre["iterations"]
    req_iter = gen["requests"] / gen["iterations"]
    decode_tokens_iter = gen["output_tokens"] / gen["iterations"] - req_iter
    g_time = gen["duration_s"] / gen["iterations"]
    p_time = pre["duration_s"] / pre["iterations"]
    out["prefill_energy_per_request_j"] = p_iter / req_iter
    decode_tokens = decode_tokens_iter.where(decode_tokens_iter > 0)
    out["decode_energy_per_output_token_j"] = (g_iter - p_iter) / decode_tokens
    out["prefill_energy_fraction"] = p_iter / g_iter
    out["prefill_s_per_iteration"] = p_time
    out["decode_output_tokens_per_s"] = decode_tokens / (g_time - p_time).where(g_time > p_time)
    status = pd.Series(Status.OK.value, index=gen.index, dtype=object)
    no_energy = ~gen["gpu_energy_status"].isin(MEASURED) | ~pre["gpu_energy_status"].isin(MEASURED)
    status[no_energy] = "energy-unavailable"
    status[(g_iter - p_iter) < 0] = "decode-negative (prefill per iteration >= generate)"
    status[g_time <= p_time] = "decode-time-not-positive"
    status[~(decode_tokens_iter > 0)] = "no-decode-tokens (output_tokens is 1)"
    status[pre["status"].ne(Status.OK)] = "no-prefill-window"
    status[gen["status"].ne(Status.OK)] = "point-failed"
    out["prefill_decode_status"] = status
    return out.reset_index()


# The columns a point's medians are taken of (over its ok repetitions).
_MEDIAN_COLUMNS = [
    "energy_per_output_token_j",
    "energy_per_request_j",
    "energy_per_iteration_j",
    "output_tokens_per_s",
    "mean_gpu_power_w",
    "energy_per_train_token_j",
    "train_tokens_per_s",
    "samples_per_s",
    "loss",
    "idle_gpu_power_w",
    "gpu_energy_idle_adjusted_j",
    "energy_per_output_token_idle_adjusted_j",
    "host_energy_per_output_token_j",
    "mean_host_power_w",
    "host_energy_per_output_token_idle_adjusted_j",
    "zeus_nvml_energy_ratio",
    "flops_estimate_per_s",
    "flops_estimate_per_j",
    "duration_s",
    "iterations",
    "output_tokens",
    "cpu_time_s",
]


def _medians(frame: pd.DataFrame, gid: np.ndarray, n: int, columns: list[str]) -> pd.DataFrame:
    """Per group the median of each column (NaNs skipped; NaN when none is present)."""
    return frame[columns].astype(float).groupby(gid).median().reindex(range(n))


def summarize(win: pd.DataFrame) -> pd.DataFrame:
    """One row per grid point: medians and bootstrap CIs over repetitions; statuses say why.

    Vectorized over points (whole-frame passes); tests/unit/test_aggregate_reference.py checks
    it against the per-point loop it replaced.
    """
    split = prefill_decode(win) if len(win) else pd.DataFrame()
    head = win[win["phase"].isin(HEADLINE_PHASES)]
    if head.empty:
        return pd.DataFrame()
    ngroup = head.groupby(POINT_KEYS, sort=True).ngroup()
    head = head[ngroup.notna().to_numpy()].reset_index(drop=True)  # a null key has no point
    gid = ngroup.dropna().to_numpy(dtype=np.int64)
    n = int(gid.max()) + 1
    _, first_pos = np.unique(gid, return_index=True)
    first = head.iloc[first_pos].reset_index(drop=True)
    is_ok = (head["status"] == Status.OK).to_numpy()
    rows = Groups(gid, n)
    good = Groups(gid, n, np.flatnonzero(is_ok))
    ok = head[is_ok]
    ok_gid = gid[is_ok]
    n_rows, n_ok = rows.count, good.count
    training = (first["scenario"] == "training").to_numpy()

    med = _medians(
        ok.assign(
            host_energy_per_output_token_idle_adjusted_j=(
                ok["host_energy_idle_adjusted_j"] / ok["output_tokens"]
            )
        ),
        ok_gid,
        n,
        _MEDIAN_COLUMNS,
    )

    status_set = rows.joined(head["status"], ",")
    columns: dict = {
        **{k: first[k] for k in POINT_KEYS},
        "status": np.where(
            n_ok == n_rows, Status.OK, np.where(n_ok > 0, Status.PARTIAL, status_set)
        ).tolist(),
        "error": _join_text(head, gid, rows, "error"),
        "repetitions": n_rows,
        "repetitions_ok": n_ok,
        "energy_source": rows.joined(head["energy_source"], ",").tolist(),
        **{
            c: med[c].to_numpy()
            for c in (
                "energy_per_output_token_j",
                "energy_per_request_j",
                "energy_per_iteration_j",
                "output_tokens_per_s",
                "mean_gpu_power_w",
            )
        },
        "output_token_status": np.where(training, NO_OUTPUT_TOKENS, Status.OK).tolist(),
        "training_status": np.where(training, Status.OK, NOT_TRAINING).tolist(),
        **{
            c: med[c].to_numpy()
            for c in (
                "energy_per_train_token_j",
                "train_tokens_per_s",
                "samples_per_s",
                "loss",
            )
        },
        **_ci_columns(ok, ok_gid, n, n_ok),
        **_idle_columns(head, gid, good, med),
        **_prefill_decode_columns(split, ok, ok_gid, n, n_ok, training),
        **_host_and_window_columns(head, gid, rows, good, med),
        **point_columns(head, gid, rows, ok, ok_gid, n, n_ok),
    }
    summary = pd.DataFrame(columns)
    for k in POINT_KEYS:  # as a frame built from rows of Python values has them
        if pd.api.types.is_integer_dtype(summary[k].dtype):
            summary[k] = summary[k].astype(np.int64)
    return summary


def _joined_ok(head: pd.DataFrame, good: Groups, column: str, default: str) -> list:
    """The ok repetitions' distinct values, or ``default`` where there are none."""
    j = good.joined(head[column], ",")
    return np.where(j != "", j, default).tolist()


def _join_text(head: pd.DataFrame, gid: np.ndarray, frame_rows: Groups, column: str) -> list:
    """The distinct non-empty texts of ``column`` over ``frame_rows``, "; "-joined (None: none)."""
    v = values_of(head, column)
    texts = np.array([isinstance(x, str) and x != "" for x in v])
    sub = Groups(gid, frame_rows.n, frame_rows.rows[texts[frame_rows.rows]])
    return null_if_empty(sub.joined(v, "; "))


def _idle_columns(head: pd.DataFrame, gid: np.ndarray, good: Groups, med: pd.DataFrame) -> dict:
    """Per point the GPU energy status and the idle-adjusted figures."""
    return {
        "gpu_energy_status": _joined_ok(head, good, "gpu_energy_status", EnergyStatus.UNAVAILABLE),
        "gpu_energy_detail": _join_text(head, gid, good, "gpu_energy_detail"),
        **{
            c: med[c].to_numpy()
            for c in (
                "idle_gpu_power_w",
                "gpu_energy_idle_adjusted_j",
                "energy_per_output_token_idle_adjusted_j",
            )
        },
        "idle_status": _joined_ok(head, good, "idle_status", EnergyStatus.UNAVAILABLE),
    }


def _host_and_window_columns(
    head: pd.DataFrame, gid: np.ndarray, rows: Groups, good: Groups, med: pd.DataFrame
) -> dict:
    """Per point host energy, Zeus cross-check, FLOPs, window size, processes and provenance."""
    return {
        **{
            c: med[c].to_numpy()
            for c in (
                "host_energy_per_output_token_j",
                "mean_host_power_w",
                "host_energy_per_output_token_idle_adjusted_j",
            )
        },
        "host_energy_status": _joined_ok(head, good, "host_energy_status", UNAVAILABLE),
        "host_energy_detail": _join_text(head, gid, good, "host_energy_detail"),
        "idle_host_status": _joined_ok(head, good, "idle_host_status", UNAVAILABLE),
        "zeus_nvml_energy_ratio": med["zeus_nvml_energy_ratio"].to_numpy(),
        "zeus_status": _joined_ok(head, good, "zeus_status", EnergyStatus.NOT_REQUESTED),
        **{c: med[c].to_numpy() for c in ("flops_estimate_per_s", "flops_estimate_per_j")},
        "flops_status": rows.joined(head["flops_status"], ",").tolist(),
        **{
            out: med[c].to_numpy()
            for out, c in (
                ("window_s", "duration_s"),
                ("iterations_per_window", "iterations"),
                ("output_tokens_per_window", "output_tokens"),
            )
        },
        **{
            c: head[c].groupby(gid).max().to_numpy().astype(np.int64)
            for c in ("n_processes", "n_gpus", "n_hosts")
        },
        "cpu_time_s": med["cpu_time_s"].to_numpy(),
        **{
            c: rows.joined(head[c], ",").tolist() for c in ("device", "config_hash", "code_version")
        },
    }


def _ci_columns(ok: pd.DataFrame, ok_gid: np.ndarray, n: int, n_ok: np.ndarray) -> dict:
    """Per point the bootstrap CI of the median of each headline metric, and ``ci_status``."""
    columns: dict[str, Any] = {}
    for metric in (
        "energy_per_output_token_j",
        "output_tokens_per_s",
        "mean_gpu_power_w",
        "energy_per_train_token_j",
    ):
        lo, hi = bootstrap_ci_groups(ok_gid, values_of(ok, metric), n)
        columns[f"{metric}_ci_low"], columns[f"{metric}_ci_high"] = lo, hi
    columns["ci_status"] = [
        Status.OK if k >= 2 else f"too-few-repetitions ({k} ok; a CI needs 2 or more)" for k in n_ok
    ]
    return columns


def _prefill_decode_columns(
    split: pd.DataFrame,
    ok: pd.DataFrame,
    ok_gid: np.ndarray,
    n: int,
    n_ok: np.ndarray,
    training: np.ndarray,
) -> dict:
    """Per point the prefill/decode split over its ok repetitions (see :func:`prefill_decode`)."""
    keys = ["job_id", *POINT_KEYS, "repetition"]
    cols = [
        "prefill_energy_per_request_j",
        "decode_energy_per_output_token_j",
        "prefill_energy_fraction",
        "prefill_s_per_iteration",
        "decode_output_tokens_per_s",
    ]
    if len(split):
        rows = split.merge(ok[keys].assign(_point=ok_gid), on=keys, how="inner")
    else:
        rows = pd.DataFrame({"_point": np.array([], dtype=np.int64)})
    g = rows["_point"].to_numpy(dtype=np.int64)
    has = np.bincount(g, minlength=n) > 0
    out: dict = {}
    if len(rows):
        good = (rows["prefill_decode_status"] == Status.OK).to_numpy()
        timed = rows["prefill_s_per_iteration"].notna().to_numpy()
        for c in cols[:3]:
            out[c] = _medians(rows[good], g[good], n, [c])[c].to_numpy()
        for c in cols[3:]:
            out[c] = _medians(rows[timed], g[timed], n, [c])[c].to_numpy()
        status = Groups(g, n).joined(rows["prefill_decode_status"].to_numpy(dtype=object), ",")
    else:
        out = {c: np.full(n, np.nan) for c in cols}
        status = np.full(n, "", dtype=object)
    out["prefill_decode_status"] = np.where(
        has,
        status,
        np.where(
            training,
            "not-applicable (training)",
            np.where(
                n_ok > 0, "no-prefill-window (measurement.prefill_pass: false)", "point-failed"
            ),
        ),
    ).tolist()
    return out
