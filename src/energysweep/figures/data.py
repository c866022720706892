"""What a figure draws: the summary plus derived columns, validity, and the measured quantity.

A figure asks for a quantity (energy per output token, say) and gets the first one in its chain
that this sweep measured: GPU energy, else host energy (RAPL), else CPU time — each labelled as
what it is, never relabelled as energy, and never a zero for something not measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from energysweep.aggregate.bootstrap import bootstrap_ci
from energysweep.tables.phases import HEADLINE_PHASES, Phase
from energysweep.tables.shards import POINT_KEYS
from energysweep.tables.status import Status

LAYOUT_KEYS = ["tp", "pp", "dp"]
# The GPU setting of a point (a point key since shard schema v4); absent in older tables.
SETTING_KEYS = ["power_limit_w", "gpu_clock"]


def with_setting_keys(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the setting keys as text (a CSV reads ``300`` back as a number), ``unset``
    where a table predates them."""
    return frame.assign(
        **{k: frame[k].astype(str) if k in frame else "unset" for k in SETTING_KEYS}
    )


def setting_label(frame: pd.DataFrame) -> pd.Series:
    """Per row the GPU setting as a reader says it: ``node default`` or ``300 W, medium``."""
    f = with_setting_keys(frame)
    power = f["power_limit_w"].astype(str)
    clock = f["gpu_clock"].astype(str)
    parts = pd.DataFrame(
        {
            "p": power.where(power == "unset", power + " W").replace("unset", ""),
            "c": clock.where(clock != "unset", ""),
        }
    )
    label = parts["p"].str.cat(parts["c"], sep=", ").str.strip(", ")
    return label.where(label != "", "node default")


def is_valid(frame: pd.DataFrame) -> pd.Series:
    """Per row: the ``valid`` verdict (contract 3 of the plan); all valid when the column is absent.

    A CSV round trip gives booleans, ``"True"``/``"False"`` strings or NaN; NaN (no verdict) is
    treated as valid so that a point is only drawn as invalid when something said so.
    """
    if "valid" not in frame:
        return pd.Series(True, index=frame.index)
    v = frame["valid"]
    text = v.astype(str).str.strip().str.lower()
    return ~text.isin(["false", "0", "no"])


def invalid_reasons(frame: pd.DataFrame) -> pd.Series:
    """Per row the reason codes ('' when valid or unknown)."""
    if "invalid_reasons" not in frame:
        return pd.Series("", index=frame.index)
    return frame["invalid_reasons"].fillna("").astype(str)


def _window_tokens(win: pd.DataFrame) -> pd.Series:
    """Tokens a headline window produced: output tokens (generate) or trained on (train)."""
    return win["output_tokens"].where(win["phase"] == Phase.GENERATE.value, win["input_tokens"])


# Derived per-window metric -> (numerator column, label of its unit). Divided by the window's
# tokens (generate: output tokens; train: tokens trained on).
_PER_TOKEN = {
    "cpu_s": "cpu_time_s",
    "host_j": "host_energy_j",
}


def _from_windows(summary: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Median and bootstrap CI per point of per-window CPU time and host energy per token.

    The summary has these only as medians without a CI (or not at all for training), so they
    are derived here from the same windows the summary came from, with the same CI method.
    """
    head = windows[windows["phase"].isin(HEADLINE_PHASES) & windows["status"].eq(Status.OK)]
    if head.empty:
        return summary
    head = with_setting_keys(head)
    head = head.assign(_tokens=_window_tokens(head).astype(float))
    head = head[head["_tokens"] > 0]
    per = {
        "cpu_s": head["cpu_time_s"].astype(float) / head["_tokens"],
        "host_j": head["host_energy_j"].astype(float) / head["_tokens"]
        if "host_energy_j" in head
        else pd.Series(np.nan, index=head.index),
        "train_tps": (head["input_tokens"].astype(float) / head["duration_s"]).where(
            head["phase"] == Phase.TRAIN.value
        ),
    }
    rows = []
    for key, g in head.groupby(POINT_KEYS, sort=False):
        rec = dict(zip(POINT_KEYS, key, strict=True))
        for name, series in per.items():
            x = series.loc[g.index].to_numpy(dtype=float)
            x = x[~np.isnan(x)]
            rec[name] = float(np.median(x)) if len(x) else np.nan
            rec[f"{name}_lo"], rec[f"{name}_hi"] = bootstrap_ci(x)
        rows.append(rec)
    derived = pd.DataFrame(rows)
    out = summary.merge(derived, on=POINT_KEYS, how="left")
    train = out["scenario"].eq("training")
    out["cpu_s_per_output_token"] = out["cpu_s"].where(~train)
    out["cpu_s_per_train_token"] = out["cpu_s"].where(train)
    out["host_energy_per_train_token_j"] = out["host_j"].where(train)
    for suffix, src in (("_ci_low", "_lo"), ("_ci_high", "_hi")):
        out[f"cpu_s_per_output_token{suffix}"] = out[f"cpu_s{src}"].where(~train)
        out[f"cpu_s_per_train_token{suffix}"] = out[f"cpu_s{src}"].where(train)
        out[f"host_energy_per_train_token_j{suffix}"] = out[f"host_j{src}"].where(train)
        out[f"host_energy_per_output_token_j{suffix}"] = out[f"host_j{src}"].where(~train)
        if f"train_tokens_per_s{suffix}" not in summary:
            out[f"train_tokens_per_s{suffix}"] = out[f"train_tps{src}"].where(train)
    return out.drop(
        columns=[
            c
            for c in out
            if c
            in {
                "cpu_s",
                "cpu_s_lo",
                "cpu_s_hi",
                "host_j",
                "host_j_lo",
                "host_j_hi",
                "train_tps",
                "train_tps_lo",
                "train_tps_hi",
            }
        ]
    )


def prepare(summary: pd.DataFrame, windows: pd.DataFrame | None = None) -> pd.DataFrame:
    """The summary with what the figures need added.

    Adds ``world_size`` (tp*pp*dp), ``global_batch`` (batch size per replica x dp),
    ``valid_point`` (see :func:`is_valid`) and the per-token fallbacks: ``cpu_s_per_output_token``,
    ``cpu_s_per_train_token``, ``host_energy_per_train_token_j`` — with bootstrap CIs when the
    per-window table (``aggregate.windows`` of energy.parquet) is given, else from the summary's
    medians (ratios of medians, no CI).
    """
    s = with_setting_keys(summary.copy())
    if s.empty:
        return s
    s["gpu_setting"] = setting_label(s)
    s["world_size"] = s["tp"] * s["pp"] * s["dp"]
    s["global_batch"] = s["batch_size"] * s["dp"]
    s["valid_point"] = is_valid(s)
    s["invalid_reasons_text"] = invalid_reasons(s)
    if "scenario" not in s:
        s["scenario"] = "inference"
    if windows is not None and len(windows):
        s = _from_windows(s, windows)
    train = s["scenario"].eq("training")

    def col(name):
        return s[name] if name in s else pd.Series(np.nan, index=s.index)

    if "cpu_s_per_output_token" not in s:
        s["cpu_s_per_output_token"] = (col("cpu_time_s") / col("output_tokens_per_window")).where(
            ~train
        )
    if "cpu_s_per_train_token" not in s:
        tokens = col("train_tokens_per_s") * col("window_s")
        s["cpu_s_per_train_token"] = (col("cpu_time_s") / tokens).where(train)
    if "host_energy_per_train_token_j" not in s:
        s["host_energy_per_train_token_j"] = (
            col("mean_host_power_w") / col("train_tokens_per_s")
        ).where(train)
    return s


@dataclass(frozen=True)
class Quantity:
    """One drawable quantity: its column, CI columns (if any) and an honest axis label."""

    column: str
    label: str
    what: str  # "GPU energy" | "host energy (RAPL)" | "CPU time" | "throughput"
    is_energy: bool
    ci: tuple[str, str] | None = None
    note: str | None = None  # shown in the figure when a fallback replaced the headline

    def ci_of(self, frame: pd.DataFrame) -> tuple[pd.Series, pd.Series] | None:
        if self.ci is None or not all(c in frame for c in self.ci):
            return None
        return frame[self.ci[0]], frame[self.ci[1]]


# Per scenario, most wanted first: (column, axis label, what it is, is energy).
_ENERGY_CHAIN = {
    "inference": [
        ("energy_per_output_token_j", "GPU energy per output token [J]", "GPU energy", True),
        (
            "host_energy_per_output_token_j",
            "host energy (RAPL, CPU package) per output token [J]",
            "host energy (RAPL)",
            True,
        ),
        ("cpu_s_per_output_token", "CPU time per output token [s] — not energy", "CPU time", False),
    ],
    "training": [
        ("energy_per_train_token_j", "GPU energy per training token [J]", "GPU energy", True),
        (
            "host_energy_per_train_token_j",
            "host energy (RAPL, CPU package) per training token [J]",
            "host energy (RAPL)",
            True,
        ),
        (
            "cpu_s_per_train_token",
            "CPU time per training token [s] — not energy",
            "CPU time",
            False,
        ),
    ],
}
_THROUGHPUT = {
    "inference": ("output_tokens_per_s", "output tokens / s (all replicas)"),
    "training": ("train_tokens_per_s", "training tokens / s (global batch)"),
}


def _ci_cols(frame: pd.DataFrame, column: str) -> tuple[str, str] | None:
    lo, hi = f"{column}_ci_low", f"{column}_ci_high"
    return (lo, hi) if lo in frame and hi in frame else None


def _why_no_gpu_energy(rows: pd.DataFrame) -> str:
    details = sorted(set(rows.get("gpu_energy_detail", pd.Series(dtype=object)).dropna()))
    statuses = sorted(set(rows.get("gpu_energy_status", pd.Series(dtype=object)).dropna()))
    why = "; ".join(details) or ", ".join(statuses) or "no energy reading"
    return why if len(why) <= 110 else why[:107] + "..."


def energy_quantity(rows: pd.DataFrame, scenario: str) -> Quantity | None:
    """The energy-per-token quantity to draw for ``rows`` of ``scenario``, or None if nothing.

    GPU energy when any row has it; otherwise host energy; otherwise CPU time per token, with a
    note saying GPU energy was not measured and why (from ``gpu_energy_detail``).
    """
    for i, (column, label, what, is_energy) in enumerate(_ENERGY_CHAIN[scenario]):
        if column in rows and rows[column].notna().any():
            note = None
            if i > 0:
                note = f"GPU energy not measured ({_why_no_gpu_energy(rows)}): showing {what}" + (
                    "" if is_energy else ", which is not energy"
                )
            return Quantity(column, label, what, is_energy, _ci_cols(rows, column), note)
    return None


def throughput_quantity(rows: pd.DataFrame, scenario: str) -> Quantity | None:
    column, label = _THROUGHPUT[scenario]
    if column not in rows or not rows[column].notna().any():
        return None
    return Quantity(column, label, "throughput", False, _ci_cols(rows, column))
