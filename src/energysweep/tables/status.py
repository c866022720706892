"""The status vocabulary of every table: the one place a status value is spelled.

Two enums, both ``str`` enums (``Status.OK == "ok"``; the value is what the tables store, in
Parquet and CSV alike):

- :class:`Status`: the outcome of a window or a grid point (the shards', windows' and summary's
  ``status``);
- :class:`EnergyStatus`: whether an energy or power figure was measured, and if not why (every
  ``*_energy_status``, ``*_power_status``, ``zeus_status``, ``idle_status`` column, the power
  timeline's and the request log's ``status``/``metrics_status``);
- :class:`SettingStatus`: whether a GPU setting a point asked for is the one it ran at
  (``gpu_power_limit_status``, ``gpu_clock_status``).

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


class SettingStatus(str, Enum):
    """Whether a GPU power limit or clock a point asked for is what it ran at; members in order
    from best to worst (a point's rows speak through their worst)."""

    UNSET = "unset"  # nothing asked: the GPU as the node has it
    APPLIED = "applied"  # read back equal to the target
    UNVERIFIED = "unverified"  # no GPU (or no NVML) to read it back from
    NOT_APPLIED = "not-applied"  # nobody refused, yet the read-back differs from the target
    REFUSED = "refused"  # the setter raised (no permission, invalid value, a site's refusal)

    def __str__(self) -> str:
        return self.value


# A setting that was asked for and is not known to be in effect: the point is flagged
# (cap_not_applied / clock_not_applied) and never measured at the wrong setting.
NOT_IN_EFFECT = (SettingStatus.UNVERIFIED, SettingStatus.NOT_APPLIED, SettingStatus.REFUSED)
