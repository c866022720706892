"""Warm-up until iteration time is steady, before a point's first window.

A fixed count of warm-up iterations is not steady state on a GPU: on the H200, one warm-up
generate left the first window 41% slower than the next two (10.1 s against 7.15 s for 32
iterations of batch 8; ../shared/reference/real-gpu-h200.md), which alone made the point's CI
too wide. Here the warm-up runs unmeasured iterations, each timed between device syncs, until
the last :data:`STEADY_ITERATIONS` took times within :data:`STEADY_TOLERANCE` of their median,
at least ``min_iterations`` of them (``workload.warmup_iterations`` / ``training.warmup_steps``;
0 turns warm-up off) and at most ``max_s`` seconds (``measurement.warmup_max_s``; null: twice
``measurement.min_window_s``). Every rank runs the same iterations: each decision is taken on
what all ranks saw (a rank still unsteady keeps them all going). What it did is recorded per
point (job.json ``timing.warmup``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from energysweep import dist

STEADY_ITERATIONS = 3  # the trailing iterations that must agree
STEADY_TOLERANCE = 0.10  # their spread (max - min) as a fraction of their median


def steady(times: list[float]) -> bool:
    """Whether the last :data:`STEADY_ITERATIONS` iteration times agree within the tolerance."""
    if len(times) < STEADY_ITERATIONS:
        return False
    tail = times[-STEADY_ITERATIONS:]
    mid = statistics.median(tail)
    return mid > 0 and (max(tail) - min(tail)) <= STEADY_TOLERANCE * mid


def max_seconds(warmup_max_s: float | None, min_window_s: float) -> float:
    """The warm-up's bound in s: ``measurement.warmup_max_s``, or twice the window's."""
    return float(warmup_max_s) if warmup_max_s is not None else 2.0 * float(min_window_s)


def warm_up(
    step: Callable[[int], object],
    synchronize: Callable[[], object],
    *,
    min_iterations: int,
    max_s: float,
    clock: Callable[[], float],
    gather: Callable = dist.gather,
) -> dict:
    """Run ``step(i)`` until steady (module docstring); what it did.

    Returns:
        ``iterations`` run, ``seconds`` they took, ``steady`` (False: stopped by ``max_s``),
        ``last_iteration_s`` (this rank's last few iteration times).
    """
    times: list[float] = []
    if min_iterations <= 0:
        return {"iterations": 0, "seconds": 0.0, "steady": None, "last_iteration_s": []}
    synchronize()
    start = clock()
    done = False
    while not done:
        t0 = clock()
        step(len(times))
        synchronize()
        times.append(clock() - t0)
        if len(times) < min_iterations:
            continue
        # One decision on every rank: stop when all are steady, or the slowest ran out of time.
        views = gather((steady(times), clock() - start))
        done = all(s for s, _ in views) or max(e for _, e in views) >= max_s
    return {
        "iterations": len(times),
        "seconds": clock() - start,
        "steady": steady(times),
        "last_iteration_s": [round(t, 6) for t in times[-STEADY_ITERATIONS:]],
    }
