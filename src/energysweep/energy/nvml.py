"""GPU energy from NVML's cumulative energy counter, read through :mod:`energysweep.hw.nvml`.

Facts this relies on (see the README's methodology section):
- ``nvmlDeviceGetTotalEnergyConsumption`` is mJ since the driver loaded (Volta and newer); it
  updates about every 100 ms on datacenter GPUs, so a shorter window is flagged ``short-window``.
- GPUs are resolved by UUID, never by CUDA index (NVML numbers them in PCI bus order).
- A counter that goes backwards (driver reload) is an error, not a negative energy.
- The counter refreshes only every ~100 ms: window edges are aligned to its refreshes
  (energysweep.energy.ticks), which removes the up to one period of energy an edge read would
  misplace; the idle GPU's energy between the end edge and the refresh is subtracted.
"""

from __future__ import annotations

import math
import threading
import time

import energysweep.energy.ticks as ticks
from energysweep.energy.base import (
    EnergySource,
    GpuReading,
    wall_ns,
)
from energysweep.hw import nvml as hw_nvml
from energysweep.tables.status import EnergyStatus

METHOD = "nvml-total-energy-counter"
# Below this window length the counter may not have ticked (datacenter update period ~100 ms).
COUNTER_UPDATE_PERIOD_NS = 100_000_000


class CounterWentBackwards(RuntimeError):
    """The energy counter decreased inside a window (driver reload or a wrong device)."""


def window_reading(
    gpu: dict, energy_mj: float | None, duration_ns: int, method: str, source: str
) -> GpuReading:
    """The reading of one GPU (a dict with uuid, index, pci, name) over a window of
    ``duration_ns``; flagged short-window when shorter than the counter's update period."""
    short = duration_ns < COUNTER_UPDATE_PERIOD_NS
    return GpuReading(
        gpu["uuid"],
        gpu["index"],
        gpu["pci"],
        gpu["name"],
        energy_mj,
        EnergyStatus.SHORT_WINDOW if short else EnergyStatus.MEASURED,
        method,
        f"window {duration_ns / 1e6:.1f} ms < counter update period" if short else "",
        source=source,
    )


class NvmlSource(EnergySource[list[GpuReading]]):
    """Energy counter deltas, one reading per GPU (by UUID), edges aligned to refreshes.

    Args:
        clock, sleep: monotonic seconds and how to wait (a virtual clock in the benchmark).
        background: between :meth:`prepare` and :meth:`begin` a thread watches the counters
            (:meth:`track`) while the rank blocks at the barrier. False with a virtual clock,
            where the caller calls :meth:`track` itself.
    """

    name = "nvml"

    def __init__(
        self,
        gpu_uuids: list[str],
        clock=time.perf_counter,
        sleep=time.sleep,
        background: bool = True,
    ):
        hw_nvml.init()
        self._open = True
        self._clock, self._sleep, self._background = clock, sleep, background
        self._gpus: list[dict] = []
        for uuid in gpu_uuids:
            handle = hw_nvml.handle_by_uuid(uuid)
            self._gpus.append({**hw_nvml.identity(handle), "handle": handle})
        # A GPU without the counter (pre-Volta) fails here, at setup, not in the first window.
        self._read()
        self._start: list[float] | None = None
        self._start_edge_s: float | None = None  # the start edge on self._clock
        self._raw_start: list[int] = []
        self._unaligned: list[int] = []
        # The start edge's refreshes, watched from prepare() to begin(), by a thread (background).
        self._start_watch: ticks.Watch | None = None
        self._tracker: threading.Thread | None = None
        self._stop_tracking = threading.Event()
        self._tracking_error: BaseException | None = None
        self._missed_s = [0.0] * len(gpu_uuids)  # per GPU: extrapolated past a missed refresh
        self._missed_end_s = [0.0] * len(gpu_uuids)  # the same at the end edge (back in time)
        self._load_after_end = False  # load_goes_on_after_end(): the end span can be a guess
        self._start_ns: int | None = None
        # Per GPU the slowest counter read behind this window's aligned edges, s (energy/ticks).
        self._edge_s = [0.0] * len(self._gpus)
        self.waited_s = 0.0  # time spent waiting for refreshes (the alignment's cost)

    def _read(self) -> list[int]:
        return [hw_nvml.energy_mj(g["handle"]) for g in self._gpus]

    def _read_bracketed(self) -> list[tuple[int, float, float]]:
        """Each GPU's counter with the clock right before and right after its read."""
        out = []
        for g in self._gpus:
            t0 = self._clock()
            value = hw_nvml.energy_mj(g["handle"])
            out.append((value, t0, self._clock()))
        return out

    def _watch(self, count: int, latest: bool = False) -> ticks.Watch:
        """A watch of every GPU's refreshes, polled until each has ``count`` of them."""
        t0 = self._clock()
        watch = ticks.Watch(
            self._read_bracketed,
            count,
            self._clock,
            self._sleep,
            timeout_s=ticks.TIMEOUT_S,
            latest=latest,
        )
        while watch.pending():
            watch.poll()
        self.waited_s += self._clock() - t0
        return watch

    def prepare(self) -> None:
        """Before the start edge: wait for two refreshes of each counter (the second gives the
        GPU's power just before the window), then go on watching them until :meth:`begin`.

        The rank then blocks at the barrier for the slowest rank, and the GPU's power may
        change meanwhile: a thread goes on polling (:meth:`track`), so the start edge
        extrapolates from the latest refreshes. The barrier itself blocks: a rank that polled
        between checks of the barrier left it only when its read in flight returned (the H200
        takes up to 185 ms), and its window started that much after the others'.
        """
        self._start_watch = self._watch(2, latest=True)
        if self._background:
            self._stop_tracking.clear()
            self._tracker = threading.Thread(
                target=self._track_until_begin, name="energysweep-start-edge", daemon=True
            )
            self._tracker.start()

    def _track_until_begin(self) -> None:
        try:
            while not self._stop_tracking.is_set():
                self.track()
        except BaseException as e:  # noqa: BLE001  re-raised by begin(), in the rank's thread
            self._tracking_error = e

    def _stop_tracker(self) -> None:
        """Stop the watching thread (its read in flight returns first)."""
        if self._tracker is not None:
            self._stop_tracking.set()
            self._tracker.join()
            self._tracker = None

    def track(self) -> None:
        """One round of polls of the start edge's watch (:meth:`prepare`'s thread, or the
        caller on a virtual clock)."""
        if self._start_watch is not None:
            self._start_watch.poll()

    def _anchors(self, watch: ticks.Watch) -> list[tuple[int, float | None, float]]:
        """Per GPU (counter at its latest refresh, that refresh's time or None, power in mW)
        from the start edge's watch (:meth:`prepare`, or :meth:`begin` without it)."""
        seen = watch.seen
        self._edge_s = watch.slowest  # a new window's edges
        now = self._read() if any(len(s) < 2 for s in seen) else []
        anchors: list[tuple[int, float | None, float]] = []
        for i, s in enumerate(seen):
            if len(s) < 2:  # no refreshes (stuck counter): the value now, unaligned
                anchors.append((now[i], None, 0.0))
                continue
            (v1, t1), (v2, t2) = s
            anchors.append((v2, t2, (v2 - v1) / (t2 - t1)))
        return anchors

    def begin(self) -> None:
        """The start edge, now: each counter at its latest refresh plus the energy since, at the
        power between its two latest refreshes (less than a period before: they were watched
        through the barrier, :meth:`prepare`). The edge is the moment of the call; a read still
        in flight in the watching thread is awaited after it, and its refresh used if fast.
        Without :meth:`prepare` the refreshes are awaited first, and the edge is after them."""
        if self._start_watch is None:
            self._start_watch = self._watch(2, latest=True)
        now, self._start_ns = self._clock(), wall_ns()
        self._start_edge_s = now
        self._stop_tracker()
        if self._tracking_error is not None:
            error, self._tracking_error = self._tracking_error, None
            raise error
        watch, self._start_watch = self._start_watch, None
        anchor = self._anchors(watch)
        self._raw_start = [v for v, _, _ in anchor]  # counter values: backwards check
        self._start = [v if t is None else v + mw * (now - t) for v, t, mw in anchor]
        self._unaligned = [i for i, (_, t, _) in enumerate(anchor) if t is None]
        self._missed_s = self._missed(watch.seen, now)
        self._edge_s = [max(e, m) for e, m in zip(self._edge_s, self._missed_s, strict=True)]

    @staticmethod
    def _missed(seen: list[list[tuple[int, float]]], now: float) -> list[float]:
        """Per GPU, how far the start value extrapolates (s) where that passes a refresh the
        watch did not use (the latest seen through a slow read, or none seen: the watching
        thread held up, e.g. by a garbage-collection pause): the power over all of that time
        is a guess, so the edge is that uncertain (``edge_read_ms``, the verdict's
        edge_read_slow). 0 where the latest refresh is within a period (+ a slow read)."""
        out = []
        for s in seen:
            if len(s) < 2:
                out.append(0.0)
                continue
            (_, t1), (_, t2) = s
            span = now - t2
            out.append(span if span > (t2 - t1) + ticks.SLOW_READ_S else 0.0)
        return out

    def load_goes_on_after_end(self) -> None:
        self._load_after_end = True

    def _end_values(self, t_end: float) -> tuple[list[float], list[int]]:
        """Each GPU's counter at the end edge: at its first refresh after it, less the idle
        energy from the edge to that refresh (the second refresh gives the idle power); never
        below the counter read at the edge (which holds less than the window's energy).

        Where the watch skipped the first refresh after the edge (seen through a slow read or a
        late poll, energy/ticks.py), the refresh it used is more than a period after the edge.
        After a window whose load stops at the edge the power there is the idle GPU's, and the
        correction holds however long its span (tests/unit/test_energy_alignment.py). Where the
        load goes on (:meth:`load_goes_on_after_end`: a server serves until these counters are
        read) the power from the edge to that refresh is the mean power of the refresh period(s)
        that hold both (the counter read at the edge to the refresh after it), not the power
        after it: a server's power changes from one period to the next (serving windows of
        tests/integration/test_serving_real.py, CI run 81: 365 W from the edge to the refresh,
        88 W after it, 101 ms of the window's energy off with the power after, 8 ms with the
        period's). Past a skipped refresh that mean is a guess: the span is then the edge's
        uncertainty (``edge_read_ms``, the verdict's edge_read_slow), as a start value
        extrapolated past a missed refresh is."""
        watch = self._watch(2)
        at_edge, seen = watch.first, watch.seen
        self._edge_s = [max(a, b) for a, b in zip(self._edge_s, watch.slowest, strict=True)]
        self._missed_end_s = [0.0] * len(seen)
        now = self._read() if any(len(s) < 2 for s in seen) else []
        out = []
        for i, (g, s) in enumerate(zip(self._gpus, seen, strict=True)):
            if len(s) < 2:  # no refresh (stuck counter): the value now, unaligned
                self._unaligned.append(i)
                out.append(float(now[i]))
                continue
            (v1, t1), (v2, t2) = s
            if v2 < v1:
                raise CounterWentBackwards(
                    f"NVML energy counter of {g['uuid']} went from {v1} to {v2} mJ after a "
                    "window (driver reload?); the window is not usable"
                )
            period = t2 - t1
            span = t1 - t_end
            if self._load_after_end:
                # The refresh at or before the edge (whose value the edge read holds) is a whole
                # number of periods before t1: the span's power is the mean over them.
                periods = max(1, math.ceil(span / period))
                edge_mw = (v1 - at_edge[i]) / (periods * period)
                if span > period + ticks.SLOW_READ_S:
                    self._missed_end_s[i] = span
            else:
                edge_mw = (v2 - v1) / period  # the idle GPU's power, after the load stopped
            out.append(max(float(at_edge[i]), v1 - edge_mw * max(0.0, span)))
        return out, at_edge

    def end(self) -> list[GpuReading]:
        if self._start is None or self._start_ns is None or self._start_edge_s is None:
            raise RuntimeError("end() without begin()")
        t_end, duration = self._clock(), wall_ns() - self._start_ns
        window_s = t_end - self._start_edge_s
        stop, at_edge = self._end_values(t_end)
        self._edge_s = [max(e, m) for e, m in zip(self._edge_s, self._missed_end_s, strict=True)]
        readings = []
        for i, (g, a, b) in enumerate(zip(self._gpus, self._start, stop, strict=True)):
            if at_edge[i] < self._raw_start[i]:
                raise CounterWentBackwards(
                    f"NVML energy counter of {g['uuid']} went from {self._raw_start[i]} to "
                    f"{at_edge[i]} mJ inside a window (driver reload?); the window is not usable"
                )
            # The edge corrections (power before the start, idle power after the end) can more
            # than cancel a very short window's energy: no figure then (null with its reason),
            # never a clamped 0. A stuck counter's 0 is a reading (the verdict's counter_stuck).
            delta = float(b - a)
            r = window_reading(g, delta if delta >= 0 else None, duration, METHOD, self.name)
            if delta < 0:
                if r.status != EnergyStatus.SHORT_WINDOW:
                    r.status = EnergyStatus.UNAVAILABLE
                r.detail = "; ".join(
                    filter(None, [r.detail, f"edge corrections leave {delta:.0f} mJ: not resolved"])
                )
            r.edge_read_ms = self._edge_s[i] * 1e3
            r.window_s = window_s
            if self._edge_s[i] > ticks.SLOW_READ_S:
                if self._missed_s[i] >= self._edge_s[i]:
                    slow = f"start value extrapolated {r.edge_read_ms:.1f} ms past a missed refresh"
                elif self._missed_end_s[i] >= self._edge_s[i]:
                    slow = (
                        f"end value extrapolated {r.edge_read_ms:.1f} ms back past a skipped "
                        "refresh"
                    )
                else:
                    slow = f"slow edge read: {r.edge_read_ms:.1f} ms"
                r.detail = "; ".join(filter(None, [r.detail, slow]))
            if i in self._unaligned:
                r.detail = "; ".join(
                    filter(None, [r.detail, f"counter did not refresh within {ticks.TIMEOUT_S} s"])
                )
            readings.append(r)
        return readings

    def close(self) -> None:
        self._stop_tracker()
        if self._open:
            hw_nvml.shutdown()
            self._open = False
