"""The power timeline table, ``power.parquet``: schema, clock event reason bits and reader.

Written once per job to ``JobDir.power`` by rank 0 (energy/sampler.py): one row per sample of
each GPU a rank measures, with NVML's power reading (mW), the cumulative energy counter (mJ) and
the clock event (throttle) reason bitmask at a wall-clock time in ns (lines up with the shards'
window edges). Without a GPU, or with ``measurement.sampler_hz: 0``, it holds one row per rank
with ``status`` saying why and null measurements. The sampling rate is in the file's metadata
(``sampler_hz``). The re-check (energysweep.validity.recheck) and the power timeline figure read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    import pandas as pd
# pandas is imported where it is read (reason_names, load_power): every rank imports this module
# for SCHEMA (energy/sampler.py), and a rank that builds no table from rows then never imports
# pandas (pyarrow's Table.from_pylist imports it: rank 0 does, for its shards).

SCHEMA = pa.schema(
    [
        pa.field("job_id", pa.string(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("gpu_uuid", pa.string()),
        pa.field("gpu_index", pa.int32()),
        pa.field("time_ns", pa.int64()),
        pa.field("power_mw", pa.int64()),
        pa.field("energy_counter_mj", pa.int64()),
        # NVML clock event (throttle) reason bitmask at the sample; null where unreadable.
        pa.field("clock_event_reasons", pa.int64()),
        pa.field("status", pa.string(), nullable=False),
        pa.field("detail", pa.string()),
    ]
)

# NVML clock event reason bits (nvmlClocksEventReason*, the real pynvml's values; the unit test
# checks them against pynvml), by the names config key validity.throttle_reasons uses.
CLOCK_EVENT_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clock_setting": 0x100,
}


def reason_names(mask) -> str:
    """``a,b`` names of the clock event reason bits set in ``mask`` ("" for none or null)."""
    import pandas as pd

    if mask is None or (isinstance(mask, float) and np.isnan(mask)) or pd.isna(mask):
        return ""
    m = int(mask)
    return ",".join(n for n, bit in CLOCK_EVENT_REASONS.items() if m & bit)


def load_power(paths: Sequence[str | Path]) -> pd.DataFrame:
    """The measured power samples of ``paths`` (status rows without a sample are dropped).

    A GPU shared by two ranks is sampled by both; a sample is kept once per (job, GPU, time).
    """
    import pandas as pd
    import pyarrow.parquet as pq

    cols = ["job_id", "gpu_uuid", "time_ns", "power_mw", "energy_counter_mj", "clock_event_reasons"]
    frames = []
    for p in paths:
        t = pq.read_table(p)
        if "clock_event_reasons" not in t.column_names:  # written before the column existed
            t = t.append_column("clock_event_reasons", pa.nulls(t.num_rows, pa.int64()))
        frames.append(t.select(cols).to_pandas())
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    power = pd.concat(frames, ignore_index=True)
    power = power[power["gpu_uuid"].notna() & power["time_ns"].notna()]
    return power.drop_duplicates(["job_id", "gpu_uuid", "time_ns"]).reset_index(drop=True)
