"""Window edges aligned to energy counter refreshes ("ticks").

NVML's energy counter changes only when the driver refreshes it (about every 100 ms on
datacenter GPUs). A counter read at a window edge shows the energy up to the *last* refresh, so
up to one period of energy is misplaced at each edge: up to 2% of a 5 s window at a load step,
the physical limit of reading the counter at the edges. Aligning the edges removes it:

- start edge: poll until the counter refreshes twice just before the window (all ranks, then a
  barrier); the start value is the last refresh plus the power between the two refreshes times
  the few ms from that refresh to the edge;
- end edge: poll until the counter refreshes (the reading then holds all of the window's energy
  and the idle GPU's energy since the end edge), and once more; the second refresh gives the
  idle GPU's power, which times the time from the end edge to the first refresh is subtracted.
So both corrections are idle power over less than one period, and every GPU's energy covers the
window's common edges, whatever the phase of its counter.

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
    """The values now, and the first ``count`` refreshes of every GPU's counter: per GPU a list
    of (value, time), the time halfway between the end of the last read of the old value and
    the end of the first read of the new one (``clock()``); shorter where a counter did not
    refresh within ``timeout_s`` of the previous one.

    A refresh seen through a read slower than ``slow_s`` (that read or the one before it, a
    late wake-up before it included) is skipped for the next one, at most
    :data:`SLOW_RETRIES` times per GPU (module docstring).

    Args:
        read: returns the current counter value of every GPU (one list), each value plain or
            as (value, read start, read end).
        slowest: filled (per GPU) with the longest read, in s, behind a refresh it returns
            (with the time lost before it, where its poll woke late).
    """
    last, r0, r1 = _bracketed(read, clock)
    first = last
    n = len(last)
    seen: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    since = [r1[0] if n else clock()] * n
    retries = [0] * n
    worst = [0.0] * n
    while True:
        now = clock()
        pending = [i for i in range(n) if len(seen[i]) < count and now - since[i] < timeout_s]
        if not pending:
            if slowest is not None:
                slowest[:] = worst
            return first, seen
        sleep(poll_s)
        values, t0, t1 = _bracketed(read, clock)
        late = _late(r1, t0, t1, poll_s)
        for i in pending:
            if values[i] != last[i]:
                took = max(r1[i] - r0[i], t1[i] - t0[i] + late)
                if took > slow_s and retries[i] < SLOW_RETRIES:
                    retries[i] += 1  # its time is uncertain by ``took``: wait for the next one
                    continue
                # The refresh happened between the previous read and this one: the midpoint.
                seen[i].append((values[i], (r1[i] + t1[i]) / 2))
                worst[i] = max(worst[i], took)
                since[i] = t1[i]
        last, r0, r1 = values, t0, t1
