"""Every second of a rank accounted for: its wall time split into :class:`JobPhase` phases.

One clock per process (:data:`CLOCK`): the rank is always in exactly one phase, and a switch
closes the current one, so the phases add up to the wall time by construction. Code marks a
phase with ``with during(JobPhase.X):`` (nested: the inner phase holds the time, the outer one
resumes after it) or, inside an event loop where a block cannot wrap the span, ``switch``.
The clock starts at the process's creation (:func:`process_age_s`), so the interpreter's start
and imports are the ``start`` phase. job.json ``timing.phases_s`` is :meth:`PhaseClock.totals`.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

from energysweep.tables.phases import JOB_PHASES, JobPhase

# A stretch of one phase at least this long is printed when it ends (the job's log says where
# a slow job's time went, e.g. ``phase warmup: 17.9 s``).
LOG_AFTER_S = 2.0


def process_age_s() -> float:
    """Seconds since this process was created (0.0 where /proc cannot say)."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            # Field 22 (starttime, clock ticks since boot) follows the ")" of the command name.
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError):
        return 0.0


class PhaseClock:
    """The current phase accrues time until the next switch.

    Args:
        clock: monotonic seconds.
        log: called with a line for each stretch of a phase of :data:`LOG_AFTER_S` or more.
        age_s: how long the process ran before this clock was made (counted as ``phase``).
        phase: the phase it starts in.
    """

    def __init__(self, clock=time.monotonic, age_s: float = 0.0, phase=JobPhase.START, log=None):
        self.clock = clock
        self.log = log
        self.t0 = clock() - age_s
        self._since = self.t0
        self.current = JobPhase(phase)
        self._totals = dict.fromkeys(JOB_PHASES, 0.0)

    def switch(self, phase: JobPhase) -> JobPhase:
        """Enter ``phase`` now; returns the phase that was current."""
        now = self.clock()
        stretch = now - self._since
        self._totals[self.current] += stretch
        if self.log is not None and stretch >= LOG_AFTER_S:
            self.log(f"phase {self.current.value}: {stretch:.1f} s (at {now - self.t0:.1f} s)")
        self._since = now
        previous, self.current = self.current, JobPhase(phase)
        return previous

    @contextmanager
    def during(self, phase: JobPhase):
        """The block's time goes to ``phase``; the phase before it resumes after it."""
        previous = self.switch(phase)
        try:
            yield
        finally:
            self.switch(previous)

    def wall_s(self) -> float:
        return self.clock() - self.t0

    def totals(self) -> dict[str, float]:
        """Seconds per phase (every phase, in report order) up to now; they sum to ``wall_s``."""
        self.switch(self.current)
        return {p.value: self._totals[p] for p in JOB_PHASES}


def _print(line: str) -> None:
    print(line, flush=True)


CLOCK = PhaseClock(age_s=process_age_s(), log=_print)


def during(phase: JobPhase):
    """``with during(JobPhase.X):`` on this process's clock (:data:`CLOCK`)."""
    return CLOCK.during(phase)


def switch(phase: JobPhase) -> JobPhase:
    """Enter ``phase`` on this process's clock; returns the phase that was current."""
    return CLOCK.switch(phase)
