"""The window rule, and the merge of every rank's rows of one window (README, Methodology).

A window starts and ends after a device sync and a barrier across ranks; it repeats its step until
it lasts at least ``measurement.min_window_s`` *and* ran at least the scenario's minimum
iterations (``workload.iterations``, ``training.steps``). All ranks stop after the same iteration:
the decision uses the shortest elapsed time over ranks, exchanged at chunk boundaries (usually
once).
"""

from __future__ import annotations

import math

from energysweep import dist
from energysweep.energy import wall_ns
from energysweep.tables.phases import Phase


def measure_window(
    step,
    min_iters: int,
    synchronize,
    *,
    min_window_s: float,
    clock,
    energy,
    host,
    cpu,
    settings=None,
    node=None,
) -> dict:
    """The window rule (module docstring) around ``step(i)``, called once per iteration.

    Args:
        step: runs iteration ``i`` (a batch, an optimizer step).
        min_iters: the fewest iterations of the window.
        synchronize: waits for the rank's device (the window's edges).
        min_window_s: the shortest window (``measurement.min_window_s``).
        clock: monotonic seconds (``time.perf_counter``; a fake clock in tests).
        energy: the rank's GPU energy source; ``host``: its host source; ``cpu``: its CPU timer.
        settings: the rank's GPU settings probe (energysweep.measure.settings), read right
            before the start edge and right after the end edge, outside the window's energy.
        node: the rank's node energy source (energysweep.energy.node), read at the same
            moments (a Slurm query: too slow to sit inside the window).

    Returns:
        The window's edges (ns, ``start``/``end``), its ``iterations`` and its energy
        (``readings``), ``host`` and CPU-time (``cpu_s``) readings, and the GPU settings read
        at both edges (``settings``).
    """
    before = settings.read() if settings is not None else None
    if node is not None:
        node.begin()
    synchronize()
    dist.barrier()
    start = wall_ns()
    t0 = clock()
    energy.begin()
    host.begin()
    cpu.begin()
    it, target = 0, min_iters
    while True:
        while it < target:
            step(it)
            it += 1
        elapsed = min(dist.gather(clock() - t0))  # the same decision on every rank
        if elapsed >= min_window_s:
            break
        per_iter = elapsed / it
        more = (min_window_s - elapsed) / per_iter * 1.05 if per_iter > 0 else it
        target = it + max(1, math.ceil(more))
    synchronize()
    dist.barrier()
    end = wall_ns()
    readings = energy.end()
    host_reading = host.end()
    cpu_s = cpu.end()
    after = settings.read() if settings is not None else None
    node_reading = node.end() if node is not None else None
    return {
        "start": start,
        "end": end,
        "iterations": it,
        "readings": readings,
        "host": host_reading,
        "cpu_s": cpu_s,
        "settings": (before, after),
        "node": node_reading,
    }


def _sum_or_none(values) -> int | None:
    values = [v for v in values if v is not None]
    return sum(values) if values else None


def finalize_window(rows_by_rank: list[list[dict]]) -> list[dict]:
    """Merge ranks' rows of one repetition; per phase, window totals are summed over ranks.

    Per-rank token counts are only non-zero on writers; the window total is their sum. The
    FLOPs estimate is 2 * parameters * (input + output tokens) of the window (all GPUs).
    """
    rows = [r for rank_rows in rows_by_rank for r in rank_rows]
    for phase in sorted({r["phase"] for r in rows}):
        phase_rows = [r for r in rows if r["phase"] == phase]
        ok = [r for r in phase_rows if r["status"] == "ok"]
        if not ok:
            continue
        per_rank = {r["rank"]: (r["input_tokens"], r["output_tokens"]) for r in ok}
        tin = _sum_or_none(v[0] for v in per_rank.values())
        tout = _sum_or_none(v[1] for v in per_rank.values())
        params = ok[0]["model_parameters"]
        flops = None
        if params is not None and phase in (Phase.GENERATE, Phase.PREFILL):
            flops = 2.0 * params * ((tin or 0) + (tout or 0))
        elif params is not None and phase == Phase.TRAIN and tin is not None:
            flops = 6.0 * params * tin  # forward + backward: ~6 FLOPs per parameter per token
        update = {
            "input_tokens": tin,
            "output_tokens": tout,
            "window_start_ns": min(r["window_start_ns"] for r in ok),
            "window_end_ns": max(r["window_end_ns"] for r in ok),
            "requests": ok[0]["global_batch_size"] * ok[0]["iterations"],
            "flops_estimate": flops,
        }
        for r in phase_rows:
            r.update(update)
    return rows
