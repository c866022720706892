"""Window edges aligned to energy counter refreshes ("ticks").

NVML's energy counter changes only when the driver refreshes it (about every 100 ms on
datacenter GPUs). A counter read at a window edge shows the energy up to the *last* refresh, so
up to one period of energy is misplaced at each edge: up to 2% of a 5 s window at a load step,
the physical limit of reading the counter at the edges. Aligning the edges removes it:

- start edge: poll until the counter refreshes twice just before the window (all ranks), and go
  on polling through the barrier that waits for the slowest rank (:class:`Watch` with
  ``latest``); the start value is the latest refresh plus the power between the two latest
  refreshes times the time from that refresh to the edge (less than a period);
- end edge: poll until the counter refreshes (the reading then holds all of the window's energy
  and the idle GPU's energy since the end edge), and once more; the second refresh gives the
  idle GPU's power, which times the time from the end edge to the first refresh is subtracted.
So both corrections are idle power over less than one period, and every GPU's energy covers the
window's common edges, whatever the phase of its counter. (A serving window's load goes on after
its end edge: there the end correction is the load's power, and a span past a skipped refresh is
flagged, energysweep.energy.nvml.)

Cost: waiting for two refreshes at each edge, outside the window. Measured residual and cost:
docs/emulated-node.md, "Accuracy".
"""

from __future__ import annotations

import time

# Poll interval while waiting for a refresh, and how long to wait for one before giving up (a
# stuck counter never refreshes: that window goes on unaligned and the validity checks flag it).
POLL_S = 0.001
TIMEOUT_S = 1.5
# A read of the counter is bracketed by timestamps; the refresh it shows happened between the
# previous read and it, and its time is taken halfway between the two reads' ends (the value is
# the one published when the call returns: taking the reads' middles instead doubled the median
# error of 0.5 s windows on the emulated H200, bench/energy_accuracy.py: 2.5% against 1.4%).
# A read slower than this fraction of the counter period (25 ms at 100 ms; the H200 takes
# 2.8 ms median, 17 ms max idle, 185 ms once under load) leaves that time uncertain by as much:
# its refresh is not used, and the next one is awaited, up to SLOW_RETRIES times; then it is
# used and reported (the verdict's edge_read_slow). So does a poll that wakes late (a process
# descheduled on a busy host): the time between two reads beyond the poll's sleep and the reads
# themselves counts as this read's. Unchecked, one poll woken 70 or 250 ms late at each edge put
# 0.8 s windows up to 0.8% or 3.2% off on the emulated H200 with nothing reported (now < 0.1%:
# tests/unit/test_energy_alignment.py::test_a_poll_that_wakes_late_is_retried_like_a_slow_read).
SLOW_READ_FRACTION = 0.25
COUNTER_PERIOD_S = 0.1
SLOW_READ_S = SLOW_READ_FRACTION * COUNTER_PERIOD_S
SLOW_RETRIES = 2


def _bracketed(read, clock) -> tuple[list[int], list[float], list[float]]:
    """Values, and each value's read start and end: ``read()`` may return (value, t0, t1) per
    GPU (each GPU's read bracketed), or plain values (the whole call brackets each)."""
    t0 = clock()
    values = list(read())
    t1 = clock()
    if values and isinstance(values[0], tuple):
        return [v[0] for v in values], [v[1] for v in values], [v[2] for v in values]
    return values, [t0] * len(values), [t1] * len(values)


def _late(r1: list[float], t0: list[float], t1: list[float], poll_s: float) -> float:
    """Time lost between the previous round of reads (ends ``r1``) and this one (``t0``..``t1``)
    beyond the poll's sleep and the reads themselves: a late wake-up, or a pause between two
    GPUs' reads. A refresh seen in this round happened somewhere in that time too."""
    reads = sum(b - a for a, b in set(zip(t0, t1, strict=True)))  # plain reads: one bracket
    return max(0.0, (max(t1) - max(r1)) - reads - poll_s)


class Watch:
    """Every GPU's counter refreshes as they are seen, one round of reads per :meth:`poll`.

    A refresh's time is halfway between the end of the last read of the old value and the end
    of the first read of the new one (``clock()``). A GPU is *pending* until it has ``count``
    refreshes, or until its counter has not refreshed for ``timeout_s`` (a stuck counter). A
    refresh of a pending GPU seen through a slow read (that read or the one before it, a late
    wake-up before it included, over ``slow_s``) is skipped for the next one, at most
    :data:`SLOW_RETRIES` times (module docstring); then it is used, and its read reported in
    :attr:`slowest`.

    With ``latest``, a GPU that has its ``count`` refreshes goes on being watched: each newer
    refresh replaces the oldest, and one seen through a slow read is skipped (the older ones
    stand). The start edge uses it: the refreshes it extrapolates from are then the latest ones
    before the edge, however long the other ranks keep this one at the barrier (the GPU's power
    may change meanwhile, and its rank is no longer polling it but waiting).

    Args:
        read: returns the current counter value of every GPU (one list), each value plain or
            as (value, read start, read end).
    """

    def __init__(
        self,
        read,
        count: int,
        clock=time.perf_counter,
        sleep=time.sleep,
        poll_s: float = POLL_S,
        timeout_s: float = TIMEOUT_S,
        slow_s: float = SLOW_READ_S,
        latest: bool = False,
    ):
        self._read, self._clock, self._sleep = read, clock, sleep
        self.count, self.poll_s, self.timeout_s, self.slow_s = count, poll_s, timeout_s, slow_s
        self.latest = latest
        self.last, self.r0, self.r1 = _bracketed(read, clock)
        self.first = self.last  # the values when the watch began
        n = len(self.last)
        # Per GPU: its refreshes (value, time) and the read behind each, s.
        self.seen: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        self._took: list[list[float]] = [[] for _ in range(n)]
        self._since = [self.r1[0] if n else clock()] * n
        self._retries = [0] * n

    def pending(self) -> list[int]:
        """The GPUs still waiting for refreshes (fewer than ``count``, counter not stuck)."""
        now = self._clock()
        return [
            i
            for i, s in enumerate(self.seen)
            if len(s) < self.count and now - self._since[i] < self.timeout_s
        ]

    @property
    def slowest(self) -> list[float]:
        """Per GPU the longest read, in s, behind a refresh it keeps (with the time lost before
        it, where its poll woke late)."""
        return [max(t, default=0.0) for t in self._took]

    def poll(self) -> None:
        """Wait ``poll_s``, read every GPU, and record the refreshes seen (class docstring)."""
        watched = set(self.pending())
        if self.latest:
            watched |= {i for i, s in enumerate(self.seen) if len(s) >= self.count}
        self._sleep(self.poll_s)
        values, t0, t1 = _bracketed(self._read, self._clock)
        late = _late(self.r1, t0, t1, self.poll_s)
        for i in sorted(watched):
            if values[i] == self.last[i]:
                continue
            took = max(self.r1[i] - self.r0[i], t1[i] - t0[i] + late)
            if took > self.slow_s:
                if len(self.seen[i]) >= self.count:
                    continue  # a newer refresh, imprecisely timed: the ones kept stand
                if self._retries[i] < SLOW_RETRIES:
                    self._retries[i] += 1  # its time is uncertain by ``took``: wait for the next
                    continue
            # The refresh happened between the previous read and this one: the midpoint.
            self.seen[i].append((values[i], (self.r1[i] + t1[i]) / 2))
            self._took[i].append(took)
            del self.seen[i][: -self.count], self._took[i][: -self.count]
            self._since[i] = t1[i]
        self.last, self.r0, self.r1 = values, t0, t1


def refreshes(
    read,
    count: int,
    clock=time.perf_counter,
    sleep=time.sleep,
    poll_s: float = POLL_S,
    timeout_s: float = TIMEOUT_S,
    slow_s: float = SLOW_READ_S,
    slowest: list[float] | None = None,
) -> tuple[list[int], list[list[tuple[int, float]]]]:
    """The values now, and the first ``count`` refreshes of every GPU's counter (a
    :class:`Watch` polled until no GPU is pending): per GPU a list of (value, time); shorter
    where a counter did not refresh within ``timeout_s`` of the previous one.

    Args:
        slowest: filled (per GPU) with :attr:`Watch.slowest`.
    """
    watch = Watch(read, count, clock, sleep, poll_s, timeout_s, slow_s)
    while watch.pending():
        watch.poll()
    if slowest is not None:
        slowest[:] = watch.slowest
    return watch.first, watch.seen
