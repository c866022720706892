"""Energy per window against the emulated node's ground truth, for pipeline tests."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from energysweep.hw.emulated.truth import Truth


def against_truth(wf: Path) -> pd.DataFrame:
    """Every GPU row of every job of ``wf``'s results with the true energy of its window.

    Columns added: ``truth_mj`` (the owners' exact integral over the row's window edges),
    ``error_pct`` ((measured - truth) / truth in %) and ``window_s``.
    """
    frames = []
    for job in sorted((Path(wf) / "results" / "shards").glob("**/job.json")):
        rows = pd.read_parquet(job.with_name("shards.parquet"))
        rows = rows[rows["gpu_uuid"].notna() & rows["gpu_energy_mj"].notna()]
        rows = rows.reset_index(drop=True)
        truth = Truth.read(job.with_name("emulated"))
        rows["truth_mj"] = truth.windows(rows)
        frames.append(rows)
    out = pd.concat(frames, ignore_index=True)
    out["error_pct"] = 100 * (out["gpu_energy_mj"] - out["truth_mj"]) / out["truth_mj"]
    out["window_s"] = (out["window_end_ns"] - out["window_start_ns"]) / 1e9
    return out
