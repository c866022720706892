"""Per point: the GPU setting behind it (asked, read back, as a percentage of the GPU's default).

From the shard rows of the point's headline windows (every repetition and GPU, failed points'
rows included): the targets, the median read-backs, each setting's worst status over the rows
(``refused`` > ``not-applied`` > ``unverified`` > ``applied`` / ``unset``) and every detail. The
validity verdict turns a status other than ``applied``/``unset`` into ``cap_not_applied`` or
``clock_not_applied``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from energysweep.tables.phases import HEADLINE_PHASES
from energysweep.tables.shards import POINT_KEYS

# The numeric setting columns a point takes the median of.
NUMERIC_COLUMNS = [
    "gpu_power_limit_target_w",
    "gpu_sm_clock_target_mhz",
    "gpu_mem_clock_target_mhz",
    "gpu_power_limit_w",
    "gpu_default_power_limit_w",
    "gpu_app_sm_clock_mhz",
    "gpu_app_mem_clock_mhz",
    "gpu_default_sm_clock_mhz",
    "gpu_sm_clock_mhz",
]
ROW_COLUMNS = [
    *POINT_KEYS,
    "phase",
    "status",
    *NUMERIC_COLUMNS,
    "gpu_power_limit_status",
    "gpu_clock_status",
    "gpu_setting_detail",
]
WORST = ["unset", "applied", "unverified", "not-applied", "refused"]  # best to worst
NOT_APPLIED = {"unverified", "not-applied", "refused"}
_READ = ("gpu_energy_status", "status")  # a read-back is null where no GPU was read
NULL_STATUS: dict[str, tuple[str, ...]] = {
    "gpu_power_limit_target_w": ("gpu_power_limit_status",),
    "gpu_sm_clock_target_mhz": ("gpu_clock_status",),
    "gpu_mem_clock_target_mhz": ("gpu_clock_status",),
    **{
        c: _READ
        for c in (
            "gpu_power_limit_w",
            "gpu_default_power_limit_w",
            "power_limit_pct_of_default",
            "gpu_app_sm_clock_mhz",
            "gpu_app_mem_clock_mhz",
            "gpu_default_sm_clock_mhz",
            "sm_clock_pct_of_default",
            "gpu_sm_clock_mhz",
        )
    },
}
INFO_COLUMNS = {"gpu_setting_detail"}


def _worst(values: pd.Series) -> str:
    ranks = [WORST.index(v) for v in values.dropna() if v in WORST]
    return WORST[max(ranks)] if ranks else "unset"


def setting_columns(summary: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """The setting columns of every summary point (same index as ``summary``)."""
    head = rows[rows["phase"].isin(HEADLINE_PHASES)]
    ok = head[head["status"].eq("ok")]
    # Read-backs from ok windows where the point has some, else from its failed rows.
    has_ok = ok.groupby(POINT_KEYS, sort=False).size().rename("_n_ok").reset_index()
    head = head.merge(has_ok, on=POINT_KEYS, how="left")
    head = head[head["_n_ok"].isna() | head["status"].eq("ok")]
    by = head.groupby(POINT_KEYS, sort=False)
    med = by[NUMERIC_COLUMNS].median()
    text = pd.DataFrame(
        {
            "gpu_power_limit_status": by["gpu_power_limit_status"].agg(_worst),
            "gpu_clock_status": by["gpu_clock_status"].agg(_worst),
            "gpu_setting_detail": by["gpu_setting_detail"].agg(
                lambda x: "; ".join(sorted({v for v in x.dropna() if v})) or None
            ),
        }
    )
    per = pd.concat([med, text], axis=1).reset_index()
    out = summary[POINT_KEYS].merge(per, on=POINT_KEYS, how="left")
    out.index = summary.index
    out["gpu_power_limit_status"] = out["gpu_power_limit_status"].fillna("unset")
    out["gpu_clock_status"] = out["gpu_clock_status"].fillna("unset")
    with np.errstate(divide="ignore", invalid="ignore"):
        out["power_limit_pct_of_default"] = (
            100.0 * out["gpu_power_limit_w"] / out["gpu_default_power_limit_w"]
        )
        out["sm_clock_pct_of_default"] = (
            100.0 * out["gpu_app_sm_clock_mhz"] / out["gpu_default_sm_clock_mhz"]
        )
    return out.drop(columns=POINT_KEYS)
