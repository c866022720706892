"""A column of merged rows summarised per summary point (the verdict's one point lookup)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from energysweep.tables.shards import POINT_KEYS


def point_index(frame: pd.DataFrame, summary: pd.DataFrame) -> np.ndarray:
    """Position of each frame row's point in ``summary`` (-1 where none)."""
    keys = (
        summary[POINT_KEYS].reset_index(drop=True).reset_index().rename(columns={"index": "_pos"})
    )
    merged = frame[POINT_KEYS].merge(keys, on=POINT_KEYS, how="left")
    return merged["_pos"].fillna(-1).to_numpy(dtype=np.int64)


def per_point(frame: pd.DataFrame, summary: pd.DataFrame, column: str, how: str) -> np.ndarray:
    """``how`` (median/max/min/any) of ``column`` per summary point; NaN where no row."""
    pos = point_index(frame, summary)
    s = pd.Series(frame[column].to_numpy(), index=pos)
    s = s[s.index >= 0]
    if how == "any":
        out = s.astype(float).groupby(level=0).max()
    else:
        out = s.astype(float).groupby(level=0).agg(how)
    return out.reindex(range(len(summary))).to_numpy(dtype=float)
