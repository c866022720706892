"""How the ranks' rows of one window combine on rank 0, before its shard is written.

Every rank reports a window with rows of its own (one per GPU it measured). :func:`combine_ranks`
(energysweep.run) gives them the window's totals: its token counts are summed over ranks (only
each replica's writer counts tokens, so the sum is every replica's work), its edges are the
earliest start and the earliest end over ranks (every rank leaves a barrier when it completes:
the first timestamp after it is the edge, a later one is a rank descheduled after it), its
requests are global batch x iterations, and its FLOPs estimate follows from those. These window
totals are stored in every row of the shard. A rank late out of a barrier has its lateness in its
rows' ``gpu_edge_read_max_ms``. The merge then sums energy per window over distinct GPUs, hosts
and processes (:mod:`energysweep.aggregate.windows`).

Rank-side and pure Python: a rank imports no aggregation code for it. (Through
``energysweep.aggregate`` every rank imported the merge, the bootstrap and pandas before its
first window: 0.2 s of its start-up. Rank 0 still imports pandas later, when it builds its first
shard: pyarrow's ``Table.from_pylist`` imports it. bench/job_overhead.py saw no change in the
default sweep's wall, 2.71x before and 2.73x after in one run: within its noise.)
"""

from __future__ import annotations

from energysweep.tables.phases import Phase
from energysweep.tables.status import Status


def _sum_or_none(values) -> int | None:
    values = [v for v in values if v is not None]
    return sum(values) if values else None


def combine_ranks(rows_by_rank: list[list[dict]]) -> list[dict]:
    """Every rank's rows of one repetition, with the window totals (the module docstring).

    Per phase, over the ok rows: tokens summed over ranks, edges min/min, requests, and the FLOPs
    estimate: 2 * parameters * (input + output tokens) for inference, 6 * parameters * tokens for
    training (forward + backward), of the window (all GPUs).
    """
    rows = [r for rank_rows in rows_by_rank for r in rank_rows]
    for phase in sorted({r["phase"] for r in rows}):
        phase_rows = [r for r in rows if r["phase"] == phase]
        ok = [r for r in phase_rows if r["status"] == Status.OK]
        if not ok:
            continue
        per_rank = {r["rank"]: (r["input_tokens"], r["output_tokens"]) for r in ok}
        tin = _sum_or_none(v[0] for v in per_rank.values())
        tout = _sum_or_none(v[1] for v in per_rank.values())
        params = ok[0]["model_parameters"]
        flops = None
        if params is not None and phase in (Phase.GENERATE, Phase.PREFILL):
            flops = 2.0 * params * (tin + tout) if tin is not None and tout is not None else None
        elif params is not None and phase == Phase.TRAIN and tin is not None:
            flops = 6.0 * params * tin
        update = {
            "input_tokens": tin,
            "output_tokens": tout,
            "window_start_ns": min(r["window_start_ns"] for r in ok),
            "window_end_ns": min(r["window_end_ns"] for r in ok),
            "requests": ok[0]["global_batch_size"] * ok[0]["iterations"],
            "flops_estimate": flops,
        }
        for r in ok:
            _count_rank_lateness(r, update["window_start_ns"], update["window_end_ns"])
        for r in phase_rows:
            r.update(update)
    return rows


def _count_rank_lateness(row: dict, start_ns: int, end_ns: int) -> None:
    """A rank that left a barrier after another (descheduled on a busy host) took its edge
    late: its GPUs' energy starts after the window's start, or runs past its end, by that time.
    Like a slow counter read, that leaves the row's energy uncertain by as much:
    ``gpu_edge_read_max_ms`` holds the larger of the two, and above a quarter of the counter
    period the verdict says ``edge_read_slow`` (energysweep.validity.shared). Rows with no
    counter read at aligned edges stay null."""
    if row.get("gpu_edge_read_max_ms") is None:
        return
    late_ms = ((row["window_start_ns"] - start_ns) + (row["window_end_ns"] - end_ns)) / 1e6
    row["gpu_edge_read_max_ms"] = max(row["gpu_edge_read_max_ms"], late_ms)
