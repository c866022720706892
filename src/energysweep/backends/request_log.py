"""Per-request timing of the engine backends (vLLM, TensorRT-LLM), written to ``requests.parquet``.

The energy shards keep one schema for every backend; per-request figures that only the engines
report (time to first token, time per output token) go to this separate per-job table instead.
A request row carries the wall-clock edges of the ``generate`` call it was part of, so it joins
to its measured window by ``window_start_ns <= call_start_ns`` and ``call_end_ns <=
window_end_ns`` (calls outside every window are warm-up). Nothing unmeasured is 0: a request
without engine metrics has null timings and ``metrics_status = unavailable``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from energysweep.tables.requests import schema


@dataclass
class RequestRow:
    """One request's row (see COLUMNS)."""

    job_id: str
    backend: str
    dp_rank: int
    call_index: int
    batch_size: int
    request_index: int
    input_tokens: int
    output_tokens: int
    call_start_ns: int
    call_end_ns: int
    ttft_s: float | None
    tpot_s: float | None
    metrics_status: str
    metrics_source: str


def tpot_s(first_token_s: float, last_token_s: float, output_tokens: int) -> float | None:
    """Mean time per output token after the first: ``(last - first) / (n - 1)``; None for n < 2."""
    if output_tokens < 2:
        return None
    return (last_token_s - first_token_s) / (output_tokens - 1)


def write(rows: list[RequestRow], path: str | Path) -> None:
    """Write the rows atomically (temp file + rename) with the fixed schema."""
    from energysweep.tables import requests

    requests.write([{**asdict(r), "scenario": "inference"} for r in rows], path)


def read(path: str | Path):
    """Read a ``requests.parquet`` and check it has exactly this schema."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    if not table.schema.equals(schema(), check_metadata=False):
        raise ValueError(f"{path}: schema differs from energysweep.tables.requests.COLUMNS")
    return table
