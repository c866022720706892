"""The window rule (README, Methodology): when a window starts and ends on every rank.

A window starts and ends after a device sync and a barrier across ranks; it repeats its step until
it lasts at least ``measurement.min_window_s`` *and* ran at least the scenario's minimum
iterations (``workload.iterations``, ``training.steps``). All ranks stop after the same iteration:
the decision uses the shortest elapsed time over ranks, exchanged at chunk boundaries (usually
once). The GPU energy source aligns both edges to its counters' refreshes (energy/ticks.py): before
the start edge every rank waits for its counters' refreshes (``prepare``), then for the other
ranks at a barrier. The barrier blocks, so every rank leaves it at once, and the start edge is
taken right then; a thread of the GPU source watches the counters through the wait, so the edge
extrapolates from the latest refreshes, not from ones the slowest rank's wait left behind. The
end edge reads after the next refreshes.

How every rank's rows of a window are then combined: their totals (tokens, edges, requests) on
rank 0, :mod:`energysweep.measure.combine`; their energy over distinct GPUs, hosts and processes
in the merge, :mod:`energysweep.aggregate.windows`.
"""

from __future__ import annotations

import math

from energysweep import dist
from energysweep.energy import wall_ns
from energysweep.measure.phase_clock import switch
from energysweep.tables.phases import JobPhase


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
    processes=None,
) -> dict:
    """The window rule (module docstring) around ``step(i)``, called once per iteration.

    Why this is long: the edges are one sequence (reads, sync, barrier, alignment, the window,
    and the same in reverse) that reads top to bottom; split, their order would be hidden.

    Args:
        step: runs iteration ``i`` (a batch, an optimizer step).
        min_iters: the fewest iterations of the window.
        synchronize: waits for the rank's device (the window's edges).
        min_window_s: the shortest window (``measurement.min_window_s``).
        clock: monotonic seconds (``time.perf_counter``; a fake clock in tests).
        energy: the rank's GPU energy source; ``host``: its host source; ``cpu``: its CPU timer.
        settings: the rank's GPU settings probe (energysweep.gpu_setting.probe), read right
            before the start edge and right after the end edge, outside the window's energy.
        node: the rank's node energy source (energysweep.energy.node), read at the same
            moments (a Slurm query: too slow to sit inside the window).
        processes: who else computes on the rank's GPUs (measure.gpu_processes), read so too.

    Returns:
        The window's edges (ns, ``start``/``end``), its ``iterations`` and its energy
        (``readings``), ``host`` and CPU-time (``cpu_s``) readings, and the GPU settings read
        at both edges (``settings``), the GPUs' process lists there (``processes``) and the
        start edge's wait for counter refreshes (``align_s``).
    """
    # Rank time (timing.phases_s): edges (syncs, barriers, alignment, reads), then the window.
    previous = switch(JobPhase.EDGES)
    before = settings.read() if settings is not None else None
    procs_before = processes.read() if processes is not None else None
    if node is not None:
        node.begin()
    synchronize()
    dist.barrier()
    # The GPU source waits for its counters' refreshes (energysweep.energy.ticks); the window
    # starts when every rank's has.
    align_s = clock()
    energy.prepare()
    align_s = clock() - align_s
    dist.barrier()  # blocks: every rank leaves it at once (the GPU source watches meanwhile)
    start = wall_ns()
    energy.begin()  # its edge is its call, right after the barrier's end (energy/nvml.py)
    host.begin()
    cpu.begin()
    switch(JobPhase.WINDOW)
    t0 = clock()
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
    switch(JobPhase.EDGES)
    cpu_s = cpu.end()
    host_reading = host.end()
    readings = energy.end()  # waits for the counters' next refreshes, after the edge
    after = settings.read() if settings is not None else None
    procs_after = processes.read() if processes is not None else None
    node_reading = node.end() if node is not None else None
    switch(previous)
    return {
        "start": start,
        "end": end,
        "iterations": it,
        "readings": readings,
        "host": host_reading,
        "cpu_s": cpu_s,
        "settings": (before, after),
        "node": node_reading,
        "align_s": align_s,
        "processes": (procs_before, procs_after),
    }
