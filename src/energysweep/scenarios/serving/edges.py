"""A serving window's two edges: what the client reads at its open and at its close.

Each edge is a :data:`.load.Edge`: run in a worker thread while the event loop goes on serving
the load (energysweep.scenarios.serving.load), it calls ``mark`` once, at the edge, and that
stamp is the window's edge for the requests as for the energy. Around the stamp, as
energysweep.measure.window does for the other scenarios:

- open: the GPU settings, the GPUs' process lists and node energy are read, and the GPU
  counters' refreshes awaited (``energy.prepare``, energy/ticks.py), *before* the edge;
  then the GPU counters' start, the stamp, the host energy and the server's CPU time;
- close: the server's CPU time and the host energy, the stamp, then the GPU counters (their next
  refreshes, after the edge); the GPU settings, process lists and node energy after.

The GPU counters are read next to the stamp at both edges (the headline figure's window is the
requests' one); the host energy and the server's CPU time just inside it. The load's event loop
runs beside this thread, so anything read between the stamp and the GPU counters would widen
the gap between them by its own time and by every switch to the loop.

The server's /metrics counters (its completed requests, its queue-time histogram) are read at
each stamp in a thread of their own, so that both reads leave the same delay after their edge
(the GPU counters' wait at the close would otherwise put the close read ~0.2 s late).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

from energysweep.energy import wall_ns
from energysweep.measure.phase_clock import switch
from energysweep.tables.phases import JobPhase


class WindowEdges:
    """The edges of one load run's window: ``open`` and ``close`` (module docstring).

    ``monitor`` is the rank's monitor (settings, node, energy, host), ``server_cpu`` the
    server's CPU time (:class:`.probes.ServerCpuTime`), ``read_counters()`` the server's
    /metrics counters (None when unreadable).
    """

    def __init__(self, monitor, server_cpu, read_counters):
        self.m = monitor
        self.server_cpu = server_cpu
        self.read_counters = read_counters
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="serving-metrics")

    def _counters_now(self) -> Future:
        """The server's counters, read from now in the metrics thread; ``read_s`` is how long
        after this call they were read (the count's uncertainty: probes.server_count)."""
        t0 = time.perf_counter()

        def read() -> dict | None:
            counters = self.read_counters()
            if counters is not None:
                counters = {**counters, "read_s": time.perf_counter() - t0}
            return counters

        return self._pool.submit(read)

    def open(self, mark) -> dict:
        m = self.m
        switch(JobPhase.EDGES)  # job.json timing.phases_s: ramp, edges, window, edges, drain
        settings = m.settings.read()
        processes = m.processes.read()  # who else computes on the GPUs (the gpu_shared check)
        m.node.begin()
        m.energy.prepare()  # waits for the counters' refreshes: the loop serves meanwhile
        mark()
        start = wall_ns()
        switch(JobPhase.WINDOW)
        m.energy.begin()  # its edge is its call, with the mark (a read in flight comes after)
        counters = self._counters_now()
        m.host.begin()
        self.server_cpu.begin()
        return {
            "wall_ns": start,
            "metrics": counters.result(),
            "settings": settings,
            "processes": processes,
        }

    def close(self, mark) -> dict:
        m = self.m
        cpu_s = self.server_cpu.end()
        host = m.host.end()
        mark()
        end = wall_ns()
        switch(JobPhase.EDGES)
        counters = self._counters_now()
        readings = m.energy.end()  # waits for the counters' next refreshes, after the edge
        closed = {
            "wall_ns": end,
            "readings": readings,
            "host": host,
            "cpu_s": cpu_s,
            "metrics": counters.result(),
            "settings": m.settings.read(),
            "processes": m.processes.read(),
            "node": m.node.end(),
        }
        switch(JobPhase.DRAIN)
        return closed

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
