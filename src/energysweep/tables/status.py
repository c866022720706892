"""The status vocabulary of every table: the one place a status value is spelled.

Two enums, both ``str`` enums (``Status.OK == "ok"``; the value is what the tables store, in
Parquet and CSV alike):

- :class:`Status`: the outcome of a window or a grid point (the shards', windows' and summary's
  ``status``);
- :class:`EnergyStatus`: whether an energy or power figure was measured, and if not why (every
  ``*_energy_status``, ``*_power_status``, ``zeus_status``, ``idle_status`` column, the power
  timeline's and the request log's ``status``/``metrics_status``).

Nothing unmeasured is 0: a null figure always has one of these beside it.
"""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    """A window's or a grid point's outcome."""

    OK = "ok"
    OOM = "oom"  # the point ran out of memory on every rank
    ERROR = "error"  # the point failed on every rank (the error column says how)
    PARTIAL = "partial"  # summary: some of the point's repetitions are ok, not all

    def __str__(self) -> str:
        return self.value


class EnergyStatus(str, Enum):
    """Whether an energy or power figure was measured."""

    MEASURED = "measured"
    # The counter moved less often than the window was long: the value may read 0 J or one tick.
    SHORT_WINDOW = "short-window"
    UNAVAILABLE = "unavailable"
    # Zeus columns of rows whose source is not cross-check (nothing was asked of Zeus).
    NOT_REQUESTED = "not-requested"
    # Host energy columns of ranks other than local rank 0 (the host is read once per node).
    NOT_READ = "not-read"
    # Job-level measurements (idle baseline, host energy) that a scenario does not take.
    NOT_MEASURED = "not-measured"
    # The idle baseline with measurement.idle_baseline_s 0.
    SKIPPED = "skipped"
    # A window or point some of whose GPUs (or hosts) have a figure and some not.
    PARTIAL = "partial"
    # The power timeline with measurement.sampler_hz 0.
    DISABLED = "disabled"
    # A power sample whose reading failed.
    ERROR = "error"

    def __str__(self) -> str:
        return self.value


# A figure that counts: measured, or measured over a window shorter than the counter's period.
ACCEPTED = (EnergyStatus.MEASURED, EnergyStatus.SHORT_WINDOW)
