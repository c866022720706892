"""The null policy of the summary: every null is explained by a status column.

:data:`NULL_STATUS` maps each summary column to the status columns that explain a null in it
(any value not in :data:`OK_STATUSES` explains); :func:`unexplained_nulls` lists the nulls that
none explains (the tests and the pipeline test assert there are none).
"""

from __future__ import annotations

import pandas as pd

from energysweep.aggregate.job_time import NULL_STATUS as JOB_TIME_NULL_STATUS
from energysweep.aggregate.serving import NULL_STATUS as SERVING_NULL_STATUS
from energysweep.tables.status import EnergyStatus, SettingStatus, Status

# Summary column -> the status columns that explain a null in it (any non-ok value explains).
_ENERGY = ("gpu_energy_status", "status")
# Training generates no output tokens (output_token_status says so); inference trains on none
# (training_status says so).
# The per-output-token headline figures with their CIs (the report's summary table leads with them).
TOKEN_HEADLINE = (
    "energy_per_output_token_j",
    "energy_per_output_token_j_ci_low",
    "energy_per_output_token_j_ci_high",
    "output_tokens_per_s",
    "output_tokens_per_s_ci_low",
    "output_tokens_per_s_ci_high",
)
_OUTPUT_TOKEN_COLUMNS = (
    *TOKEN_HEADLINE,
    "output_tokens_per_window",
    "energy_per_output_token_idle_adjusted_j",
    "host_energy_per_output_token_j",
    "host_energy_per_output_token_idle_adjusted_j",
)
TRAINING_NULL_STATUS: dict[str, tuple[str, ...]] = {
    "energy_per_train_token_j": ("training_status", *_ENERGY),
    **{
        c: ("training_status", "ci_status", *_ENERGY)
        for c in (
            "energy_per_train_token_j_ci_low",
            "energy_per_train_token_j_ci_high",
        )
    },
    **{c: ("training_status", "status") for c in ("train_tokens_per_s", "samples_per_s", "loss")},
}
NULL_STATUS: dict[str, tuple[str, ...]] = {
    **{
        c: _ENERGY
        for c in (
            "energy_per_output_token_j",
            "energy_per_request_j",
            "energy_per_iteration_j",
            "mean_gpu_power_w",
        )
    },
    **{
        c: ("ci_status", *_ENERGY)
        for c in (
            "energy_per_output_token_j_ci_low",
            "energy_per_output_token_j_ci_high",
            "mean_gpu_power_w_ci_low",
            "mean_gpu_power_w_ci_high",
        )
    },
    **{
        c: ("ci_status", "status")
        for c in (
            "output_tokens_per_s_ci_low",
            "output_tokens_per_s_ci_high",
        )
    },
    **{
        c: ("status",)
        for c in (
            "output_tokens_per_s",
            "window_s",
            "iterations_per_window",
            "output_tokens_per_window",
            "cpu_time_s",
        )
    },
    **{
        c: ("idle_status", *_ENERGY)
        for c in (
            "idle_gpu_power_w",
            "energy_per_output_token_idle_adjusted_j",
            "gpu_energy_idle_adjusted_j",
        )
    },
    **{
        c: ("prefill_decode_status", *_ENERGY)
        for c in (
            "prefill_energy_per_request_j",
            "decode_energy_per_output_token_j",
            "prefill_energy_fraction",
        )
    },
    **{
        c: ("prefill_decode_status", "status")
        for c in (
            "prefill_s_per_iteration",
            "decode_output_tokens_per_s",
        )
    },
    **{
        c: ("host_energy_status", "status")
        for c in (
            "host_energy_per_output_token_j",
            "mean_host_power_w",
        )
    },
    **{
        c: ("idle_host_status", "host_energy_status", "status")
        for c in ("host_energy_per_output_token_idle_adjusted_j",)
    },
    "zeus_nvml_energy_ratio": ("zeus_status", *_ENERGY),
    **{c: ("flops_status", "status") for c in ("flops_estimate_per_s",)},
    **{c: ("flops_status", *_ENERGY) for c in ("flops_estimate_per_j",)},
}
for _c in _OUTPUT_TOKEN_COLUMNS:
    NULL_STATUS[_c] = ("output_token_status", *NULL_STATUS[_c])
NULL_STATUS.update(TRAINING_NULL_STATUS)
NULL_STATUS.update(SERVING_NULL_STATUS)
NULL_STATUS.update(JOB_TIME_NULL_STATUS)
# A status that explains nothing (the value is there): a point, energy or FLOPs count that is ok.
# A setting read back as asked is "applied"; a facility rung with its estimate is "estimated".
OK_STATUSES = {
    Status.OK,
    EnergyStatus.MEASURED,
    SettingStatus.APPLIED,
    "counted",
    "config",
    "estimated",
}
# Free-text columns: null means "nothing to report", not "not measured".
INFO_COLUMNS = {"error", "gpu_energy_detail", "host_energy_detail"}


def unexplained_nulls(
    summary: pd.DataFrame,
    null_status: dict[str, tuple[str, ...]] | None = None,
    info_columns: set[str] | None = None,
) -> list[str]:
    """``column[row]`` for every null in ``summary`` that no status column explains.

    ``null_status``/``info_columns`` default to the aggregate's own (:data:`NULL_STATUS`,
    :data:`INFO_COLUMNS`); :func:`energysweep.results.unexplained_nulls` adds the verdict's.
    """
    null_status = NULL_STATUS if null_status is None else null_status
    info_columns = INFO_COLUMNS if info_columns is None else info_columns
    bad = []
    for col in summary.columns:
        nulls = summary[col].isna()
        if col in info_columns:
            continue
        if not nulls.any():
            continue
        explainers = null_status.get(col)
        if explainers is None:
            bad += [f"{col}[{i}] (no status column)" for i in summary.index[nulls]]
            continue
        for i in summary.index[nulls]:
            if all(str(summary.at[i, s]) in OK_STATUSES for s in explainers if s in summary):
                bad.append(f"{col}[{i}]")
    return bad
