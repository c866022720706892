"""The emulated node's ground truth: the exact energy of any window, from the owners' files.

Each owner wrote ``truth-gpu<i>-<pid>.parquet`` (hw/emulated/owner.py): the cumulative true
energy of its GPU at every sample; power is constant between samples, so E(t) joined linearly is
exact. Only tests and the benchmark read this module: the measurement code never does
(tests/unit/test_architecture.py, ``test_only_the_emulator_imports_its_ground_truth``, checks
that no module under src imports it but the emulator's own).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from energysweep.hw.emulated.owner import TRUTH_GLOB


class Truth:
    """Every GPU's true cumulative energy under an emulated state directory, by UUID."""

    def __init__(self, series: dict[str, tuple[np.ndarray, np.ndarray]]):
        self.series = series

    @classmethod
    def read(cls, state_dir: str | Path) -> Truth:
        """All truth files under ``state_dir`` (every host's subdirectory)."""
        import pyarrow.parquet as pq

        parts: dict[str, list] = {}
        for path in sorted(Path(state_dir).rglob(TRUTH_GLOB)):
            t = pq.read_table(path, columns=["gpu_uuid", "time_ns", "energy_mj"]).to_pandas()
            for uuid, g in t.groupby("gpu_uuid"):
                parts.setdefault(uuid, []).append(g)
        series = {}
        for uuid, frames in parts.items():
            import pandas as pd

            g = pd.concat(frames).sort_values("time_ns").drop_duplicates("time_ns")
            series[uuid] = (g["time_ns"].to_numpy(np.int64), g["energy_mj"].to_numpy(float))
        return cls(series)

    @property
    def uuids(self) -> list[str]:
        return sorted(self.series)

    def covers(self, uuid: str, start_ns: int, end_ns: int) -> bool:
        t = self.series.get(uuid, (np.zeros(0, np.int64),))[0]
        return bool(len(t)) and t[0] <= start_ns and end_ns <= t[-1]

    def energy_mj(self, uuid: str, start_ns, end_ns) -> np.ndarray:
        """True energy (mJ) of ``uuid`` over each [start, end] (arrays); NaN outside the truth."""
        t, e = self.series[uuid]
        start = np.asarray(start_ns, dtype=np.int64)
        end = np.asarray(end_ns, dtype=np.int64)
        t0 = t[0]
        tt = (t - t0).astype(np.float64)
        a = np.interp((start - t0).astype(np.float64), tt, e)
        b = np.interp((end - t0).astype(np.float64), tt, e)
        inside = (start >= t[0]) & (end <= t[-1])
        return np.where(inside, b - a, np.nan)

    def windows(self, rows):
        """True energy (mJ) of each row's GPU over its window (a DataFrame with ``gpu_uuid``,
        ``window_start_ns``, ``window_end_ns``): a numpy array aligned with ``rows``."""
        out = np.full(len(rows), np.nan)
        for uuid, idx in rows.groupby("gpu_uuid").indices.items():
            if uuid in self.series:
                sub = rows.iloc[idx]
                out[idx] = self.energy_mj(
                    uuid,
                    sub["window_start_ns"].to_numpy(np.int64),
                    sub["window_end_ns"].to_numpy(np.int64),
                )
        return out
