"""The per-request timing table of the engine backends, ``requests.parquet``: its schema.

One row per request the engine served (vLLM, TensorRT-LLM), all replicas, warm-up included;
backends/request_log.py writes it to ``job.outputs.requests`` (a ``JobDir`` path). A row carries
the wall-clock edges of the ``generate`` call it was part of, so it joins to its measured window
by ``window_start_ns <= call_start_ns`` and ``call_end_ns <= window_end_ns``. Nothing unmeasured
is 0: a request without engine metrics has null timings and ``metrics_status = unavailable``.
"""

from __future__ import annotations

# (name, arrow type name, description) — arrow types are built lazily (pyarrow import).
COLUMNS: list[tuple[str, str, str]] = [
    ("job_id", "string", "job run the request belongs to"),
    ("backend", "string", "vllm | tensorrt-llm"),
    ("dp_rank", "int16", "replica that served the request"),
    ("call_index", "int32", "index of the generate call on that replica (warm-up included)"),
    ("batch_size", "int32", "requests submitted together in that call"),
    ("request_index", "int32", "position of the request in its call"),
    ("input_tokens", "int32", "prompt tokens"),
    ("output_tokens", "int32", "generated tokens"),
    ("call_start_ns", "int64", "wall clock before the call, ns since epoch"),
    ("call_end_ns", "int64", "wall clock after the call returned, ns since epoch"),
    ("ttft_s", "float64", "time to first token, s (engine's own figure); null if unavailable"),
    ("tpot_s", "float64", "time per output token after the first, s; null if unavailable"),
    ("metrics_status", "string", "measured | unavailable"),
    ("metrics_source", "string", "which engine field the timings came from"),
]


def schema():
    """:data:`COLUMNS` as a pyarrow schema (every column nullable)."""
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, kind)()) for name, kind, _ in COLUMNS])
