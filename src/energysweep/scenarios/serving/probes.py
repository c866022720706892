"""What a serving window reads besides the energy counters: the server's CPU time, queue, count.

- :class:`ServerCpuTime`: user + system CPU seconds of every process of the server (not of the
  client) over a window, from ``/proc/PID/stat``; a process that exits inside the window loses
  its share (the server's processes live as long as the server);
- :func:`parse_metrics`: the server's Prometheus ``/metrics`` text, each wanted series summed
  over its label sets (one per engine of a DP server);
- :func:`metrics_url`: where to read it: only the wanted series, where the server filters;
- :class:`QueueSamples`: /metrics gauges sampled during a load run (requests running in the
  engine, requests waiting in its queue), summarised over a window;
- :func:`server_count`: the requests the server itself completed inside a window (its counter
  read at both edges), a cross-check of the client's own count.

Which series a backend's server exports is its registry record's (energysweep.job.backends
``server_metrics``); a backend with none records its queue columns and its count as unavailable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

from energysweep.energy.base import EnergySource, wall_ns
from energysweep.job.backends import backend
from energysweep.util.http import http_get


def metrics_names(backend_name: str) -> dict[str, str] | None:
    """``{key: series}`` of the backend's /metrics (its registry record's ``server_metrics``:
    running, waiting, queue-time sum and count, requests completed); None where its server's
    are not parsed."""
    return backend(backend_name).metrics_names()


def _ticks(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)


class ServerCpuTime(EnergySource[float]):
    """CPU seconds of a process set over a window (``pids()`` is asked at both edges).

    ``read_ns`` holds the wall time (ns) of the last begin's and end's reads: the interval the
    CPU seconds are over, just inside the energy window (scenarios/serving/edges.py).
    """

    name = "server-cpu-time"

    def __init__(self, pids: Callable[[], list[int]]) -> None:
        self.pids = pids
        self._start: dict[int, int] = {}
        self._hz = os.sysconf("SC_CLK_TCK")
        self.read_ns: list[int | None] = [None, None]

    def _snapshot(self) -> tuple[int, dict[int, int]]:
        pids = self.pids()  # a scan of /proc: before the stamp, so the stamp is the reads'
        return wall_ns(), {p: t for p in pids if (t := _ticks(p)) is not None}

    def begin(self) -> None:
        at, self._start = self._snapshot()
        self.read_ns = [at, None]

    def end(self) -> float:
        at, now = self._snapshot()
        self.read_ns[1] = at
        return sum(t - self._start.get(p, 0) for p, t in now.items()) / self._hz


def _series(spec: str) -> tuple[str, dict[str, set[str]]]:
    """A wanted series: its name and label filters (``name{label=~"a|b"}``: label a or b)."""
    name, _, rest = spec.partition("{")
    filters: dict[str, set[str]] = {}
    for item in filter(None, rest.rstrip("}").split(",")):
        label, _, values = item.partition("=~")
        filters[label.strip()] = set(values.strip().strip('"').split("|"))
    return name.strip(), filters


def _labels(head: str) -> dict[str, str]:
    _, _, rest = head.partition("{")
    return dict(re.findall(r'(\w+)="([^"]*)"', rest))


def parse_metrics(text: str, wanted: dict[str, str]) -> dict[str, float]:
    """``{key: value}`` for each ``wanted`` series (key -> metric name, optionally with label
    filters: ``name{label=~"a|b"}``), summed over its label sets (those the filters pass); a
    series absent from ``text`` is left out."""
    specs: dict[str, list[tuple[str, dict[str, set[str]]]]] = {}
    for key, spec in wanted.items():
        name, filters = _series(spec)
        specs.setdefault(name, []).append((key, filters))
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0].strip()
        for key, filters in specs.get(name, ()):
            labels = _labels(head) if filters else {}
            if any(labels.get(k) not in v for k, v in filters.items()):
                continue
            try:
                out[key] = out.get(key, 0.0) + float(value)
            except ValueError:
                continue
    return out


def metrics_url(base_url: str, wanted: dict[str, str]) -> str:
    """The address of the server's /metrics to read ``wanted`` from: only those series where it
    serves them alone, else all of them.

    Prometheus' Python client serves only the series named by ``name[]`` parameters (vLLM mounts
    it at ``/metrics/``; its exact ``/metrics`` route ignores them). The full text of a vLLM
    server is ~50 KB, 4 ms of its API server's CPU per read here (11-15 ms with four busy
    processes beside it), the filtered one 0.6 ms (1.6-3 ms): every read during a window is the
    server's work (its CPU time, its GPU's activity), and a read at an edge answers sooner. The
    filtered address is taken where it gives every series the full one does, in less text (asked
    once, at the server's start: a server that ignores the filter, or serves none at
    ``/metrics/``, is read whole).
    """
    full = f"{base_url}/metrics"
    names = sorted({_series(spec)[0] for spec in wanted.values()})
    filtered = f"{base_url}/metrics/?{urlencode([('name[]', n) for n in names])}"
    status, text = http_get(full, timeout_s=5)
    if status != 200:
        return full
    fstatus, ftext = http_get(filtered, timeout_s=5)
    if fstatus != 200 or len(ftext) >= len(text):
        return full
    if set(parse_metrics(ftext, wanted)) >= set(parse_metrics(text, wanted)):
        return filtered
    return full


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


def queue_time_mean_s(opened: dict | None, closed: dict | None) -> tuple[float | None, str | None]:
    """Mean server-side queue time of the requests the engine scheduled inside the window, from
    the histogram's sum and count read at both edges, and why it is None when it is:
    ``(seconds, reason)``."""
    if not opened or not closed:
        return None, "/metrics not readable at an edge"
    try:
        count = closed["queue_time_count"] - opened["queue_time_count"]
        total = closed["queue_time_sum"] - opened["queue_time_sum"]
    except KeyError:
        return None, "no queue-time histogram in /metrics"
    if count <= 0:
        return None, "the engine scheduled no request inside the window"
    return total / count, None


# The longest a /metrics read may take from its edge for the server's count to stand for the
# window: a server too busy to answer within it counts requests that ended after the edge.
SERVER_COUNT_MAX_READ_S = 0.1


def server_count(opened: dict | None, closed: dict | None, wanted: dict | None):
    """Requests the server itself counts as completed between the window's edges (its /metrics
    counter read at both; ``read_s``: how long after its edge each read answered), and why it is
    None when it is: ``(count, reason)``."""
    if wanted is None or "requests_completed" not in wanted:
        return None, "this server's /metrics is not parsed"
    if not opened or not closed:
        return None, "/metrics not readable at an edge"
    if "requests_completed" not in opened or "requests_completed" not in closed:
        return None, f"no {_series(wanted['requests_completed'])[0]} in /metrics"
    slow = max(opened.get("read_s", 0.0), closed.get("read_s", 0.0))
    if slow > SERVER_COUNT_MAX_READ_S:
        return None, (
            f"/metrics answered {1e3 * slow:.0f} ms after an edge "
            f"(> {1e3 * SERVER_COUNT_MAX_READ_S:.0f} ms)"
        )
    return int(round(closed["requests_completed"] - opened["requests_completed"])), None
