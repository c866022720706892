"""The per-request timing table of the engine backends, ``requests.parquet``: its schema.

One row per request the engine served (vLLM, TensorRT-LLM), all replicas, warm-up included;
backends/request_log.py writes it to ``job.outputs.requests`` (a ``JobDir`` path; scenario
inference), and so does the serving client (scenario serving). An inference row carries the
wall-clock edges of the ``generate`` call it was part of, so it joins to its measured window by
``window_start_ns <= call_start_ns`` and ``call_end_ns <= window_end_ns``; a serving row carries
its own send and end times, its load level, repetition and phase (warmup, ramp, window, drain).
Nothing unmeasured is 0: a request without engine metrics has null timings and
``metrics_status = unavailable``; the serving columns are null on inference rows.
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
    ("metrics_status", "string", "measured | unavailable | failed | cancelled (serving drain)"),
    ("metrics_source", "string", "which engine field (or client) the timings came from"),
    ("scenario", "string", "inference | serving"),
    ("load", "string", "serving: the load level (rate=R, concurrency=C) or warmup"),
    ("repetition", "int16", "serving: repetition of the load level; null for warm-up"),
    ("request_phase", "string", "serving: warmup | ramp | window | drain (when it was sent)"),
    ("e2e_s", "float64", "serving: end-to-end latency, s; null if it failed"),
    ("itl_s", "list<float64>", "serving: every inter-token latency of the request, s"),
    ("success", "bool_", "serving: the request completed"),
    ("error", "string", "serving: why it failed"),
    ("slo_met", "bool_", "serving: completed within serving.slo (TTFT and TPOT)"),
]
# Inference requests leave the serving columns null.
SERVING_COLUMNS = [n for n, _, d in COLUMNS if d.startswith("serving")] + ["scenario"]


def schema():
    """:data:`COLUMNS` as a pyarrow schema (every column nullable)."""
    import pyarrow as pa

    def arrow(kind: str):
        if kind.startswith("list<"):
            return pa.list_(getattr(pa, kind[5:-1])())
        return getattr(pa, kind)()

    return pa.schema([(name, arrow(kind)) for name, kind, _ in COLUMNS])


def write(rows: list[dict], path) -> None:
    """Write request rows atomically (temp file + rename) with :func:`schema`; a column a row
    lacks is null (inference rows have no serving columns)."""
    import pyarrow as pa

    from energysweep.tables.io import write_atomic

    write_atomic(pa.Table.from_pylist(rows, schema=schema()), path)
