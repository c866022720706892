"""Shards -> merged rows -> one row per window -> one row per grid point.

Counting rule: a window's GPU energy is the sum over its *distinct* GPU UUIDs, so a GPU reported
by two ranks counts once, and every node's GPUs of a multi-node job are included. If any GPU
of the window has no measured energy the window's energy is null (never a partial sum). Host
(RAPL) energy is summed over distinct hosts, each read once by its local rank 0.

Derived, never stored in shards (rows keep gross energy):
- idle-adjusted energy = gross - sum of the window's GPUs' idle power x window duration
  (columns named ``*_idle_adjusted_*``);
- per repetition, prefill energy per iteration from the prefill window and decode energy per
  output token = (generate - prefill energy per iteration) / (output tokens - requests per
  iteration): the prefill pass generates each request's first token;
- training windows (phase ``train``): energy per training token = GPU energy / tokens trained on
  (``input_tokens``, all replicas), training tokens and samples per second, and the window's
  loss; output-token figures stay null for them (``output_token_status`` says why), as training
  figures do for inference points (``training_status``);
- per grid point, the median over ok repetitions and a bootstrap 95% CI of the median
  (:func:`bootstrap_ci`: numpy, fixed seed, 2000 resamples; null with ``ci_status`` when fewer
  than 2 repetitions are ok).

Every null in the summary is explained by a status column (:data:`NULL_STATUS`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from energysweep import shards

POINT_KEYS = ["model", "backend", "scenario", "tp", "pp", "dp", "batch_size"]
WINDOW_KEYS = ["job_id", *POINT_KEYS, "repetition", "phase"]
MEASURED = {"measured", "short-window"}
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CI_LEVEL = 0.95
# The point's figures come from these windows; prefill windows feed the prefill/decode split.
HEADLINE_PHASES = ("generate", "train")

# Summary column -> the status columns that explain a null in it (any non-ok value explains).
_ENERGY = ("gpu_energy_status", "status")
# Training generates no output tokens (output_token_status says so); inference trains on none
# (training_status says so).
_OUTPUT_TOKEN_COLUMNS = (
    "energy_per_output_token_j", "energy_per_output_token_j_ci_low",
    "energy_per_output_token_j_ci_high", "output_tokens_per_s", "output_tokens_per_s_ci_low",
    "output_tokens_per_s_ci_high", "output_tokens_per_window",
    "energy_per_output_token_idle_adjusted_j", "host_energy_per_output_token_j",
    "host_energy_per_output_token_idle_adjusted_j",
)
TRAINING_NULL_STATUS: dict[str, tuple[str, ...]] = {
    "energy_per_train_token_j": ("training_status", *_ENERGY),
    **{c: ("training_status", "ci_status", *_ENERGY) for c in (
        "energy_per_train_token_j_ci_low", "energy_per_train_token_j_ci_high",
    )},
    **{c: ("training_status", "status") for c in ("train_tokens_per_s", "samples_per_s", "loss")},
}
NULL_STATUS: dict[str, tuple[str, ...]] = {
    **{c: _ENERGY for c in (
        "energy_per_output_token_j", "energy_per_request_j", "energy_per_iteration_j",
        "mean_gpu_power_w",
    )},
    **{c: ("ci_status", *_ENERGY) for c in (
        "energy_per_output_token_j_ci_low", "energy_per_output_token_j_ci_high",
        "mean_gpu_power_w_ci_low", "mean_gpu_power_w_ci_high",
    )},
    **{c: ("ci_status", "status") for c in (
        "output_tokens_per_s_ci_low", "output_tokens_per_s_ci_high",
    )},
    **{c: ("status",) for c in (
        "output_tokens_per_s", "window_s", "iterations_per_window", "output_tokens_per_window",
        "cpu_time_s",
    )},
    **{c: ("idle_status", *_ENERGY) for c in (
        "idle_gpu_power_w", "energy_per_output_token_idle_adjusted_j",
        "gpu_energy_idle_adjusted_j",
    )},
    **{c: ("prefill_decode_status", *_ENERGY) for c in (
        "prefill_energy_per_request_j", "decode_energy_per_output_token_j",
        "prefill_energy_fraction",
    )},
    **{c: ("prefill_decode_status", "status") for c in (
        "prefill_s_per_iteration", "decode_output_tokens_per_s",
    )},
    **{c: ("host_energy_status", "status") for c in (
        "host_energy_per_output_token_j", "mean_host_power_w",
    )},
    **{c: ("idle_host_status", "host_energy_status", "status") for c in (
        "host_energy_per_output_token_idle_adjusted_j",
    )},
    "zeus_nvml_energy_ratio": ("zeus_status", *_ENERGY),
    **{c: ("flops_status", "status") for c in ("flops_estimate_per_s",)},
    **{c: ("flops_status", *_ENERGY) for c in ("flops_estimate_per_j",)},
}
for _c in _OUTPUT_TOKEN_COLUMNS:
    NULL_STATUS[_c] = ("output_token_status", *NULL_STATUS[_c])
NULL_STATUS.update(TRAINING_NULL_STATUS)
OK_STATUSES = {"ok", "measured", "counted", "config"}
TRAIN_PHASE = "train"
NOT_TRAINING = "not-applicable (inference: no optimizer steps)"
NO_OUTPUT_TOKENS = "not-applicable (training generates no output tokens)"
# Free-text columns: null means "nothing to report", not "not measured".
INFO_COLUMNS = {"error", "gpu_energy_detail", "host_energy_detail"}


# The merged dataset is partitioned by these columns (hive style: model=m/backend=b/part-0.parquet).
PARTITION_KEYS = ["model", "backend"]


def job_shard_paths(job_records: list[str | Path], shard_names: list[str]) -> list[Path]:
    """Every job's shard paths: its job.json's directory joined with each shard name.

    Raises FileNotFoundError naming the job when a shard is missing (its job.json stands for all
    of the job's outputs in the merge rule, so Snakemake would not notice).
    """
    paths = []
    for record in job_records:
        job_dir = Path(record).parent
        missing = [n for n in shard_names if not (job_dir / n).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{job_dir}: shards {missing} are missing although job.json exists; rerun the "
                f"job (snakemake --forcerun {record})"
            )
        paths += [job_dir / n for n in shard_names]
    return paths


def merge(paths: list[str | Path]) -> pa.Table:
    """Read every shard once, check its schema, and concatenate.

    Reads run on a few threads: pyarrow decodes without the GIL, and per-file open and decode
    (not bytes) is the cost of many small shards (bench/merge_scaling.py).
    """
    if not paths:
        return shards.SCHEMA.empty_table()
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) + 1)) as pool:
        return pa.concat_tables(list(pool.map(shards.read_shard, paths)))


def write_dataset(table: pa.Table, out_dir: str | Path) -> None:
    """Write ``table`` as a hive-partitioned Parquet dataset at ``out_dir``, atomically.

    It is written to a temp directory beside ``out_dir`` and renamed into place, so a reader sees
    the old dataset or the new one, never a half-written one.
    """
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    try:
        if table.num_rows:
            # One chunk per shard made the partitioned write 25x slower (per-batch work).
            ds.write_dataset(
                table.combine_chunks(), tmp, format="parquet", partitioning=PARTITION_KEYS,
                partitioning_flavor="hive", basename_template="part-{i}.parquet",
                existing_data_behavior="overwrite_or_ignore", preserve_order=True,
            )
        else:  # no partitions to write: one empty file keeps the schema readable
            pq.write_table(table, tmp / "part-0.parquet")
        old = out.with_name(f".old-{out.name}-{uuid.uuid4().hex}") if out.exists() else None
        if old:
            os.replace(out, old)
        os.replace(tmp, out)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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
            "measured" if idle_ok
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
        if ok and len(gpus) and zeus_statuses <= MEASURED else np.nan
    )
    idle_statuses = set(gpus["idle_gpu_power_status"]) if len(gpus) else set(
        group["idle_gpu_power_status"]
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
        }
    )


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
    w["host_energy_idle_adjusted_j"] = (
        w["host_energy_j"] - w["idle_host_power_w"] * w["duration_s"]
    )
    w["zeus_nvml_energy_ratio"] = w["gpu_energy_zeus_j"] / w["gpu_energy_j"]
    w["flops_estimate_per_s"] = w["flops_estimate"] / w["duration_s"]
    w["flops_estimate_per_j"] = w["flops_estimate"] / w["gpu_energy_j"]
    # Training windows: input_tokens = tokens trained on and requests = sequences (all replicas).
    train = w["phase"] == TRAIN_PHASE
    w["energy_per_train_token_j"] = (w["gpu_energy_j"] / w["input_tokens"]).where(train)
    w["train_tokens_per_s"] = (w["input_tokens"] / w["duration_s"]).where(train)
    w["samples_per_s"] = (w["requests"] / w["duration_s"]).where(train)
    return w


def bootstrap_ci(
    values, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
    level: float = CI_LEVEL,
) -> tuple[float, float]:
    """Percentile bootstrap CI of the median of ``values`` (NaNs dropped); NaNs if < 2 values."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if len(x) < 2:
        return np.nan, np.nan
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(x, size=(resamples, len(x)), replace=True), axis=1)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(medians, [tail, 100 - tail])
    return float(lo), float(hi)


def prefill_decode(win: pd.DataFrame) -> pd.DataFrame:
    """Per (job, point, repetition): the prefill/decode split from a generate and a prefill window.

    Returns one row per generate window with the split's columns and ``prefill_decode_status``.
    """
    keys = ["job_id", *POINT_KEYS, "repetition"]
    gen = win[win["phase"] == "generate"].set_index(keys)
    pre = win[win["phase"] == "prefill"].set_index(keys)
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
    status = pd.Series("ok", index=gen.index, dtype=object)
    no_energy = ~gen["gpu_energy_status"].isin(MEASURED) | ~pre["gpu_energy_status"].isin(MEASURED)
    status[no_energy] = "energy-unavailable"
    status[(g_iter - p_iter) < 0] = "decode-negative (prefill per iteration >= generate)"
    status[g_time <= p_time] = "decode-time-not-positive"
    status[~(decode_tokens_iter > 0)] = "no-decode-tokens (output_tokens is 1)"
    status[pre["status"].ne("ok")] = "no-prefill-window"
    status[gen["status"].ne("ok")] = "point-failed"
    out["prefill_decode_status"] = status
    return out.reset_index()


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
        for metric in ("energy_per_output_token_j", "output_tokens_per_s", "mean_gpu_power_w",
                       "energy_per_train_token_j"):
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
            if len(split) else pd.DataFrame()
        )
        if len(pd_rows):
            good = pd_rows[pd_rows["prefill_decode_status"] == "ok"]
            for c in ("prefill_energy_per_request_j", "decode_energy_per_output_token_j",
                      "prefill_energy_fraction"):
                row[c] = _median(good[c])
            timed = pd_rows[pd_rows["prefill_s_per_iteration"].notna()]
            row["prefill_s_per_iteration"] = _median(timed["prefill_s_per_iteration"])
            row["decode_output_tokens_per_s"] = _median(timed["decode_output_tokens_per_s"])
            row["prefill_decode_status"] = ",".join(sorted(set(pd_rows["prefill_decode_status"])))
        else:
            for c in ("prefill_energy_per_request_j", "decode_energy_per_output_token_j",
                      "prefill_energy_fraction", "prefill_s_per_iteration",
                      "decode_output_tokens_per_s"):
                row[c] = np.nan
            row["prefill_decode_status"] = (
                "not-applicable (training)" if training
                else "no-prefill-window (measurement.prefill_pass: false)" if n_ok
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
                "idle_host_status": ",".join(sorted(set(ok["idle_host_status"])))
                or "unavailable",
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
        rows.append(row)
    return pd.DataFrame(rows)


def unexplained_nulls(summary: pd.DataFrame) -> list[str]:
    """``column[row]`` for every null in ``summary`` that no status column explains."""
    bad = []
    for col in summary.columns:
        nulls = summary[col].isna()
        if col in INFO_COLUMNS:
            continue
        if not nulls.any():
            continue
        explainers = NULL_STATUS.get(col)
        if explainers is None:
            bad += [f"{col}[{i}] (no status column)" for i in summary.index[nulls]]
            continue
        for i in summary.index[nulls]:
            if all(str(summary.at[i, s]) in OK_STATUSES for s in explainers if s in summary):
                bad.append(f"{col}[{i}]")
    return bad


def environment_table(job_json_paths: list[str | Path]) -> pd.DataFrame:
    """Every job's environment (job.json) as one row per (job, GPU); join on ``job_id``."""
    from energysweep.envinfo import environment_rows

    rows = []
    for p in job_json_paths:
        rows += environment_rows(json.loads(Path(p).read_text()))
    return pd.DataFrame(rows)


def aggregate(
    paths: list[str | Path], energy_out: str | Path, summary_out: str | Path,
    jobs: list[str | Path] | None = None, environment_out: str | Path | None = None,
) -> None:
    """Merge shards into ``energy_out`` (a hive-partitioned Parquet dataset, see
    :func:`write_dataset`) and write the per-point ``summary_out`` (CSV).

    With ``jobs`` (job.json paths) and ``environment_out``, also write the environment table.
    """
    table = merge(paths)
    write_dataset(table, energy_out)
    summary = summarize(windows(table.to_pandas()))
    tmp = Path(summary_out).with_suffix(".csv.tmp")
    summary.to_csv(tmp, index=False)
    tmp.replace(summary_out)
    if jobs is not None and environment_out is not None:
        env = environment_table(jobs)
        shards.write_atomic(pa.Table.from_pandas(env, preserve_index=False), environment_out)
