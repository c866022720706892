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


def refreshes(
    read,
    count: int,
    clock=time.perf_counter,
    sleep=time.sleep,
    poll_s: float = POLL_S,
    timeout_s: float = TIMEOUT_S,
) -> tuple[list[int], list[list[tuple[int, float]]]]:
    """The values now, and the first ``count`` refreshes of every GPU's counter: per GPU a list
    of (value, time), the time halfway between the last read of the old value and the first of
    the new one (``clock()``); shorter where a counter did not refresh within ``timeout_s`` of
    the previous one.

    Args:
        read: returns the current counter value of every GPU (one list).
    """
    last = list(read())
    first = last
    seen: list[list[tuple[int, float]]] = [[] for _ in last]
    since = [clock()] * len(last)
    before = since[0]
    while True:
        now = clock()
        pending = [
            i for i in range(len(last)) if len(seen[i]) < count and now - since[i] < timeout_s
        ]
        if not pending:
            return first, seen
        sleep(poll_s)
        values = list(read())
        now = clock()
        for i in pending:
            if values[i] != last[i]:
                # The refresh happened between the previous read and this one: the midpoint.
                seen[i].append((values[i], (before + now) / 2))
                since[i] = now
        last, before = values, now
