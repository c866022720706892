"""The serving scenario's columns: a window's serving columns (shards) and its request rows.

Shard rows of other scenarios carry the serving columns null, with ``serving_status`` saying
why (energysweep.measure.rows.not_serving), and ``load = batch``: their points are fixed batches.
"""

from __future__ import annotations

from energysweep.job.sections import Workload
from energysweep.job.spec import LaunchedJob
from energysweep.scenarios.serving.load import CONCURRENCY, LoadPoint, LoadRun, RequestRecord

# Client-side timings: vLLM's request function, at the arrival of each streamed chunk.
REQUEST_SOURCE = "client: vllm.benchmarks request function (streamed chunk arrival times)"
LATENCIES = [f"{m}_p{q}_s" for m in ("ttft", "tpot", "itl", "e2e") for q in (50, 99)]


def serving_columns(point: LoadPoint, run: LoadRun, stats: dict, workload: Workload) -> dict:
    """A serving window's columns (tables/shards.py "Serving" group)."""
    missing = []
    if "queue_samples" not in stats:
        missing.append("queue-unavailable (this server's /metrics is not parsed)")
    elif stats.get("achieved_concurrency") is None:
        missing.append("queue-unavailable (no /metrics sample inside the window)")
    if stats.get("queue_time_missing"):
        missing.append(f"queue-time-unavailable ({stats['queue_time_missing']})")
    if stats.get("server_count_missing"):
        missing.append(f"server-count-unavailable ({stats['server_count_missing']})")
    status = "; ".join(missing) or "ok"
    return {
        "load": point.key,
        "load_mode": point.mode,
        "offered_load": float(point.level),
        "burstiness": (
            None
            if point.mode == CONCURRENCY
            else float(1.0 if point.burstiness is None else point.burstiness)
        ),
        "requests": stats["requests"],
        **{
            k: stats[k]
            for k in (
                "requests_sent",
                "request_errors",
                "requests_cancelled",
                "requests_dropped",
                "arrival_rate_rps",
                "achieved_rate_rps",
                "load_sustained",
                "slo_met_requests",
                *LATENCIES,
            )
        },
        **{
            k: stats.get(k)
            for k in (
                "achieved_concurrency",
                "queue_waiting_mean",
                "queue_waiting_max",
                "queue_time_mean_s",
                "server_requests_completed",
            )
        },
        "ramp_s": run.ramp_s,
        "drain_s": run.drain_s,
        "serving_status": status,
    }


def request_rows(
    job: LaunchedJob,
    cap: int,
    point: LoadPoint | None,
    rep: int,
    run_index: int,
    records: list[RequestRecord],
    phase,
    wall_offset_ns: int | None,
    slo: tuple[float | None, float | None],
) -> list[dict]:
    """requests.parquet rows of one load run (or of the warm-up: ``point`` None).

    ``phase`` is a string, or a function of the record (ramp / window / drain).
    """
    import time

    offset = (
        wall_offset_ns
        if wall_offset_ns is not None
        else (time.time_ns() - int(round(time.perf_counter() * 1e9)))
    )
    ttft_slo, tpot_slo = slo
    rows = []
    for r in records:
        met = None
        if r.success:
            met = (ttft_slo is None or (r.ttft_s is not None and r.ttft_s <= ttft_slo)) and (
                tpot_slo is None or (r.tpot_s or 0.0) <= tpot_slo
            )
        rows.append(
            {
                "job_id": job.job_id,
                "backend": job.key.backend,
                "dp_rank": 0,
                "call_index": run_index,
                "batch_size": cap,
                "request_index": r.index,
                "input_tokens": r.prompt_tokens,
                "output_tokens": r.generated_tokens,
                "call_start_ns": int(round(r.send_s * 1e9)) + offset,
                "call_end_ns": None if r.end_s is None else int(round(r.end_s * 1e9)) + offset,
                "ttft_s": r.ttft_s,
                "tpot_s": r.tpot_s,
                "metrics_status": (
                    "measured" if r.success else "cancelled" if r.cancelled else "failed"
                ),
                "metrics_source": REQUEST_SOURCE,
                "scenario": "serving",
                "load": point.key if point is not None else "warmup",
                "repetition": rep if point is not None else None,
                "request_phase": phase if isinstance(phase, str) else phase(r),
                "e2e_s": r.latency_s,
                "itl_s": list(r.itl_s),
                "success": r.success,
                "error": r.error or None,
                "slo_met": met,
            }
        )
    return rows
