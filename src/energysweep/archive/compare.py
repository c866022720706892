"""An archived sweep and its re-run side by side: every point's figures, and the environments.

:func:`side_by_side` pairs the two summaries' points (the point keys), and for every figure the
summary gives a CI for (``<figure>_ci_low`` / ``_ci_high``) puts both values with their CIs,
the ratio re-run / archived, and whether the CIs overlap (``cis_overlap``: null, with
``comparison_status`` saying why, where either figure or CI is missing). A point is
``reproduced`` when at least one figure was compared and every compared figure's CIs overlap.
:func:`environment_diff` lists what differs between the two environment tables (GPU model,
driver, versions, locks, code); a different GPU model is flagged first and said loudly.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from energysweep.tables.shards import POINT_KEYS

# Environment columns compared (environment.parquet), the GPU model first.
GPU_MODEL = "gpu_name"
ENV_FIELDS = (
    GPU_MODEL,
    "driver",
    "cuda_driver_version",
    "torch_cuda",
    "cpu_model",
    "env_lock",
    "env_lock_sha256",
    "code_version",
    "emulated_gpu_profile",
)


def figures(summary: pd.DataFrame) -> list[str]:
    """The summary's figures that carry a CI (``<figure>_ci_low`` and ``_ci_high``)."""
    return [
        c[: -len("_ci_low")]
        for c in summary.columns
        if c.endswith("_ci_low") and f"{c[: -len('_ci_low')]}_ci_high" in summary
    ]


def _keyed(summary: pd.DataFrame) -> pd.DataFrame:
    s = summary.copy()
    for k in POINT_KEYS:
        s[k] = s[k].astype(str)
    return s.set_index(POINT_KEYS)


MISSING = "point missing from the re-run"


def _status(values: list, present: bool) -> str:
    a, a_lo, a_hi, r, r_lo, r_hi = values
    if not present:
        return MISSING
    if pd.isna(a) and pd.isna(r):
        return (
            "null in both (not measured or not applicable: the summaries' status columns say why)"
        )
    if pd.isna(a) or pd.isna(r):
        return "measured in only one"
    if any(pd.isna(v) for v in (a_lo, a_hi, r_lo, r_hi)):
        return "no CI (fewer than 2 ok repetitions)"
    return "ok"


def side_by_side(archived: pd.DataFrame, rerun: pd.DataFrame) -> pd.DataFrame:
    """One row per (point, figure): both values with CIs, ratio, ``cis_overlap``, status."""
    a, r = _keyed(archived), _keyed(rerun)
    rows = []
    for key in a.index:
        present = key in r.index
        for fig in figures(archived):
            vals = [a.at[key, fig], a.at[key, f"{fig}_ci_low"], a.at[key, f"{fig}_ci_high"]]
            if present and fig in r:
                vals += [r.at[key, fig], r.at[key, f"{fig}_ci_low"], r.at[key, f"{fig}_ci_high"]]
            else:
                vals += [np.nan] * 3
            status = _status(vals, present=present)
            overlap = None
            if status == "ok":
                overlap = bool(vals[1] <= vals[5] and vals[4] <= vals[2])
            ratio = vals[3] / vals[0] if status == "ok" and vals[0] != 0 else np.nan
            rows.append(
                {
                    **dict(zip(POINT_KEYS, key, strict=True)),
                    "figure": fig,
                    "archived": vals[0],
                    "archived_ci_low": vals[1],
                    "archived_ci_high": vals[2],
                    "rerun": vals[3],
                    "rerun_ci_low": vals[4],
                    "rerun_ci_high": vals[5],
                    "ratio_rerun_over_archived": ratio,
                    "cis_overlap": overlap,
                    "comparison_status": status,
                }
            )
    out = pd.DataFrame(rows)
    for k in POINT_KEYS if len(out) else ():
        out[k] = out[k].astype(archived[k].dtype)  # the keys were compared as text
    return out


def point_verdicts(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per point: figures compared, figures whose CIs overlap, and ``reproduced`` (null, with
    ``reproduction_status`` saying so, where no figure could be compared)."""
    if pairs.empty:
        return pd.DataFrame(
            columns=[
                *POINT_KEYS,
                "figures_compared",
                "figures_agree",
                "reproduced",
                "reproduction_status",
            ]  # fmt: skip
        )
    compared = pairs["comparison_status"] == "ok"
    agree = pairs["cis_overlap"].fillna(False).astype(bool) & compared
    missing = pairs["comparison_status"] == MISSING
    per = (
        pairs.assign(compared=compared, agree=agree, missing=missing)
        .groupby(POINT_KEYS, sort=True)
        .agg(
            figures_compared=("compared", "sum"),
            figures_agree=("agree", "sum"),
            missing=("missing", "any"),
        )
        .reset_index()
    )
    compared_any = per["figures_compared"] > 0
    agreed = compared_any & (per["figures_agree"] == per["figures_compared"])
    decided = compared_any | per["missing"]
    per["reproduced"] = pd.Series(agreed, dtype="boolean").where(decided, pd.NA)
    per["reproduction_status"] = np.select(
        [per["missing"], agreed, compared_any],
        [MISSING, "reproduced", "a figure's CIs do not overlap"],
        "nothing to compare (no figure with a value and a CI in both)",
    )
    per = per.drop(columns="missing")
    return per


def _values(env: pd.DataFrame, field: str) -> str:
    if field not in env:
        return "(not recorded)"
    vals = sorted({str(v) for v in env[field].dropna()})
    return ", ".join(vals) if vals else "(none)"


def environment_diff(archived: pd.DataFrame, rerun: pd.DataFrame) -> pd.DataFrame:
    """Every compared environment field: both values, whether they differ (GPU model first)."""
    version_cols = sorted(c for c in set(archived) | set(rerun) if c.endswith("_version"))
    fields = list(dict.fromkeys([*ENV_FIELDS, *version_cols]))
    rows = []
    for f in fields:
        av, rv = _values(archived, f), _values(rerun, f)
        rows.append({"field": f, "archived": av, "rerun": rv, "differs": av != rv})
    return pd.DataFrame(rows)


def gpu_model_warning(diff: pd.DataFrame) -> str | None:
    """The loud line when the GPU model differs; None when it is the same."""
    row = diff[diff["field"] == GPU_MODEL].iloc[0]
    if not row["differs"]:
        return None
    return (
        f"!!! DIFFERENT GPU MODEL: archived on {row['archived']}, re-run on {row['rerun']}. "
        "Energy figures of different GPU models are not expected to agree. !!!"
    )
