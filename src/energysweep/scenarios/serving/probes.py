"""What a serving window reads besides the energy counters: the server's CPU time and its queue.

- :class:`ServerCpuTime`: user + system CPU seconds of every process of the server (not of the
  client) over a window, from ``/proc/PID/stat``; a process that exits inside the window loses
  its share (the server's processes live as long as the server);
- :func:`parse_metrics`: the server's Prometheus ``/metrics`` text, each wanted series summed
  over its label sets (one per engine of a DP server);
- :class:`QueueSamples`: /metrics gauges sampled during a load run (requests running in the
  engine, requests waiting in its queue), summarised over a window.

Which series a backend's server exports is its registry record's (energysweep.job.backends
``server_metrics``); a backend with none records its queue columns as unavailable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from energysweep.energy.base import EnergySource
from energysweep.job.backends import backend


def metrics_names(backend_name: str) -> dict[str, str] | None:
    """``{key: series}`` of the backend's /metrics (its registry record's ``server_metrics``:
    running, waiting, queue-time sum and count); None where its server's are not parsed."""
    return backend(backend_name).metrics_names()


def _ticks(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)


class ServerCpuTime(EnergySource[float]):
    """CPU seconds of a process set over a window (``pids()`` is asked at both edges)."""

    name = "server-cpu-time"

    def __init__(self, pids):
        self.pids = pids
        self._start: dict[int, int] = {}
        self._hz = os.sysconf("SC_CLK_TCK")

    def _snapshot(self) -> dict[int, int]:
        return {p: t for p in self.pids() if (t := _ticks(p)) is not None}

    def begin(self) -> None:
        self._start = self._snapshot()

    def end(self) -> float:
        now = self._snapshot()
        return sum(t - self._start.get(p, 0) for p, t in now.items()) / self._hz


def parse_metrics(text: str, wanted: dict[str, str]) -> dict[str, float]:
    """``{key: value}`` for each ``wanted`` series (key -> metric name), summed over its label
    sets; a series absent from ``text`` is left out."""
    names = {v: k for k, v in wanted.items()}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0].strip()
        if name in names:
            try:
                out[names[name]] = out.get(names[name], 0.0) + float(value)
            except ValueError:
                continue
    return out


@dataclass
class QueueSamples:
    """(monotonic s, running, waiting) samples of one load run."""

    samples: list[tuple[float, float, float]] = field(default_factory=list)

    def add(self, t: float, values: dict[str, float]) -> None:
        if "running" in values and "waiting" in values:
            self.samples.append((t, values["running"], values["waiting"]))

    def window(self, lo: float, hi: float) -> dict:
        """Mean running (achieved concurrency), mean and max waiting over [lo, hi]."""
        inside = [s for s in self.samples if lo <= s[0] <= hi]
        if not inside:
            return {
                "achieved_concurrency": None,
                "queue_waiting_mean": None,
                "queue_waiting_max": None,
                "queue_samples": 0,
            }
        n = len(inside)
        return {
            "achieved_concurrency": sum(s[1] for s in inside) / n,
            "queue_waiting_mean": sum(s[2] for s in inside) / n,
            "queue_waiting_max": max(s[2] for s in inside),
            "queue_samples": n,
        }


def queue_time_mean_s(opened: dict | None, closed: dict | None) -> float | None:
    """Mean server-side queue time of the requests the engine scheduled inside the window, from
    the histogram's sum and count read at both edges; None without both readings."""
    if not opened or not closed:
        return None
    try:
        count = closed["queue_time_count"] - opened["queue_time_count"]
        total = closed["queue_time_sum"] - opened["queue_time_sum"]
    except KeyError:
        return None
    return total / count if count > 0 else None
