"""The group-by engine of the vectorised aggregation: per-group reductions over numpy arrays.

One group is a window (aggregate.windows) or a grid point (aggregate.points); each reduction
gives what a per-group pandas loop gives, to the last bit (tests/unit/aggregate_reference.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from energysweep.tables.status import EnergyStatus


class Groups:
    """Rows of a frame, in a given order, grouped by a group id: vectorized per-group reductions.

    ``rows`` are positions in the frame (a subset, in the order a per-group loop would see them);
    they are stably ordered by group, so each group's rows stay in that order. Every method takes
    a frame-aligned array and returns one value per group (``n`` groups, empty ones included).
    """

    def __init__(self, gid: np.ndarray, n: int, rows: np.ndarray | None = None):
        rows = np.arange(len(gid)) if rows is None else np.asarray(rows, dtype=np.int64)
        self.rows = rows[np.argsort(gid[rows], kind="stable")]
        self.g = gid[self.rows]
        self.n = n
        self.count = np.bincount(self.g, minlength=n)
        self.start = np.concatenate([[0], np.cumsum(self.count)[:-1]]).astype(np.int64)

    def _take(self, values) -> np.ndarray:
        return np.asarray(values)[self.rows]

    def all(self, mask) -> np.ndarray:
        """Whether ``mask`` holds on every row of the group (True for an empty group)."""
        return np.bincount(self.g, weights=~self._take(mask), minlength=self.n) == 0

    def any(self, mask) -> np.ndarray:
        return np.bincount(self.g, weights=self._take(mask), minlength=self.n) > 0

    def sum(self, values) -> np.ndarray:
        """Sums with NaN as 0, rounded exactly as ``Series.sum`` rounds (numpy pairwise sums)."""
        v = np.nan_to_num(self._take(values).astype(float), nan=0.0)
        # Up to 7 values numpy adds in order, as bincount does; from 8 on it sums pairwise.
        out = np.bincount(self.g, weights=v, minlength=self.n)
        for g in np.flatnonzero(self.count >= 8):
            out[g] = np.add.reduce(v[self.start[g] : self.start[g] + self.count[g]])
        return out

    def sum_all_or_nan(self, values) -> np.ndarray:
        """Per group the sum, or NaN if a value is missing or there is none (never partial)."""
        v = self._take(values).astype(float)
        bad = np.bincount(self.g, weights=np.isnan(v), minlength=self.n) > 0
        return np.where(bad | (self.count == 0), np.nan, self.sum(values))

    def sum_min_count_1(self, values) -> np.ndarray:
        """``Series.sum(min_count=1)``: the sum of the values present, NaN if none is."""
        v = self._take(values).astype(float)
        present = np.bincount(self.g, weights=~np.isnan(v), minlength=self.n)
        return np.where(present > 0, self.sum(values), np.nan)

    def first(self, values) -> np.ndarray:
        """The group's first value (None for an empty group)."""
        out = np.full(self.n, None, dtype=object)
        has = self.count > 0
        out[has] = self._take(values)[self.start[has]]
        return out

    def _distinct(self, values) -> tuple[np.ndarray, np.ndarray]:
        """Distinct non-null (group, value) pairs, sorted by group then value: (groups, values)."""
        codes, uniques = pd.factorize(pd.Series(values), sort=True)  # codes follow value order
        codes = codes[self.rows]
        present = codes >= 0
        m = max(len(uniques), 1)
        pairs = np.unique(self.g[present].astype(np.int64) * m + codes[present])
        return pairs // m, np.asarray(uniques, dtype=object)[pairs % m]

    def nunique(self, values) -> np.ndarray:
        """Distinct non-null values per group."""
        return np.bincount(self._distinct(values)[0], minlength=self.n)

    def joined(self, values, sep: str) -> np.ndarray:
        """``sep.join(sorted(set(non-null values)))`` per group ("" for none)."""
        g, v = self._distinct(values)
        out = np.full(self.n, "", dtype=object)
        counts = np.bincount(g, minlength=self.n)
        starts = np.cumsum(counts) - counts
        single = counts == 1  # most groups: their one value, no join
        out[single] = v[starts[single]]
        for k in np.flatnonzero(counts > 1):
            out[k] = sep.join(v[starts[k] : starts[k] + counts[k]])
        return out

    def status_of(self, values, mask_measured, mask_ok) -> np.ndarray:
        """One status for each group's set of statuses.

        "measured" if all are measured (``mask_measured``), else "short-window" if all are
        accepted (``mask_ok``: measured or short-window), else the one value if there is one,
        else "partial".
        """
        nuniq = self.nunique(values)
        return np.where(
            self.all(mask_measured),
            EnergyStatus.MEASURED,
            np.where(
                self.all(mask_ok),
                EnergyStatus.SHORT_WINDOW,
                np.where(nuniq == 1, self.first(values), EnergyStatus.PARTIAL),
            ),
        ).astype(object)


def values_of(frame: pd.DataFrame, name: str) -> np.ndarray:
    """A column as a numpy array: floats with NaN for nulls, other types as objects."""
    s = frame[name]
    if pd.api.types.is_numeric_dtype(s.dtype) and not pd.api.types.is_bool_dtype(s.dtype):
        return s.to_numpy(dtype=float, na_value=np.nan)
    return s.to_numpy(dtype=object)


def is_in(frame: pd.DataFrame, name: str, values) -> np.ndarray:
    return frame[name].isin(list(values)).to_numpy()


def null_if_empty(strings: np.ndarray) -> list:
    return [s or None for s in strings]
