"""The GPU setting behind every window, read back on the rank: its shard columns and its check.

The launcher sets the job's power limit and clocks and records what it did
(energysweep.launch.gpu_guard; the record, energysweep.gpu_setting.record, is named by
``ENERGYSWEEP_GPU_SETTINGS``). On every
rank a :class:`SettingsProbe` reads each of its GPUs' enforced power limit, applications clocks
and current clocks right before a window's start edge and right after its end edge (outside the
window's energy), and every row says what was asked, what was read and whether they agree
(``gpu_power_limit_status`` / ``gpu_clock_status``: unset, applied, refused, not-applied,
unverified). Before each grid point :meth:`SettingsProbe.problems` is agreed across ranks: a
setting that was refused or does not read back fails the point with the reason, and none of its
windows runs (the point is flagged ``cap_not_applied`` / ``clock_not_applied``), so nothing is
ever measured at a setting other than the one its row names.
"""

from __future__ import annotations

import os

from energysweep.gpu_setting import control as gs
from energysweep.gpu_setting.record import RECORD_ENV, SettingsRecord
from energysweep.hw import nvml, nvml_settings
from energysweep.job.gpu_request import GpuRequest
from energysweep.tables.status import SettingStatus

UNSET = SettingStatus.UNSET
# Shard columns this module fills (energysweep.tables.shards), with their not-measured values.
EMPTY: dict[str, float | int | str | None] = {
    "gpu_power_limit_target_w": None,
    "gpu_sm_clock_target_mhz": None,
    "gpu_mem_clock_target_mhz": None,
    "gpu_power_limit_w": None,
    "gpu_power_limit_end_w": None,
    "gpu_default_power_limit_w": None,
    "gpu_app_sm_clock_mhz": None,
    "gpu_app_mem_clock_mhz": None,
    "gpu_default_sm_clock_mhz": None,
    "gpu_sm_clock_mhz": None,
    "gpu_mem_clock_mhz": None,
    "gpu_setting_detail": None,
}


def _or_none(read, handle, scale, *args):
    """``read(handle, *args) * scale``, or None where the GPU does not support the query."""
    try:
        value = read(handle, *args) * scale
    except Exception:
        return None
    return int(value) if scale == 1 else float(value)


# How far a status is from applied (the worst GPU speaks for a failed point's row).
_RANK = {UNSET: 0, gs.APPLIED: 0, gs.UNVERIFIED: 1, gs.NOT_APPLIED: 2, gs.REFUSED: 3}


class SettingNotApplied(RuntimeError):
    """The job's GPU setting is not in effect on some GPU: its points are not measured."""


class SettingsProbe:
    """Reads back one rank's GPU settings (see the module docstring)."""

    def __init__(self, gpu: GpuRequest | None, uuids: list[str], environ=None):
        """
        Args:
            gpu: the job's setting (``job.gpu``; None: the job sets nothing).
            uuids: the rank's GPUs.
            environ: where :data:`RECORD_ENV` is looked up (default ``os.environ``).
        """
        self.request = gpu
        self.uuids = list(uuids)
        self.record = launched_record(gpu, environ)
        self.launched = {g.uuid: g for g in (self.record.gpus if self.record else [])}
        self._session = False
        self._handles: dict[str, object] = {}
        # uuid -> (default power limit W, default applications SM clock MHz): every row's
        # setting can then be given as a percentage of its GPU's default.
        self.defaults: dict[str, tuple[float | None, int | None]] = {}
        if self.uuids:
            try:
                nvml.init()
                self._session = True
                self._handles = {u: nvml.handle_by_uuid(u) for u in self.uuids}
            except Exception:  # no NVML: nothing to read back (unverified, never guessed)
                self._handles = {}
        for uuid, handle in self._handles.items():
            self.defaults[uuid] = (
                _or_none(lambda h: nvml_settings.power_limit_bounds_mw(h)[0], handle, 1e-3),
                _or_none(lambda h: nvml_settings.app_clock_mhz(h, "sm", default=True), handle, 1),
            )

    def read(self) -> dict[str, dict | None]:
        """Per GPU UUID what it enforces now (energysweep.gpu_setting.control.read_back)."""
        out: dict[str, dict | None] = {}
        for uuid in self.uuids:
            try:
                out[uuid] = gs.read_back(self._handles[uuid])
            except Exception:  # a failed read is a missing reading, not a guessed one
                out[uuid] = None
        return out

    def _target(self, uuid: str) -> gs.GpuSetting | None:
        return self.launched.get(uuid)

    def problems(self) -> list[str]:
        """Why the job's setting is not in effect on this rank's GPUs now (empty: it is)."""
        if not self.request:
            return []
        if self.record is None:
            return ["the job's GPU settings record is missing (the launcher did not set them)"]
        if self.record.error:
            return [self.record.error]
        if not self.uuids:
            return ["this rank has no GPU to set or verify"]
        problems = []
        now = self.read()
        for uuid in self.uuids:
            s = self._target(uuid)
            if s is None:
                problems.append(f"{uuid}: not in the job's GPU settings record")
                continue
            if _refused(s):
                problems.append(f"{uuid}: {'; '.join(s.detail)}")
                continue
            reading = now[uuid]
            if reading is None:
                problems.append(f"{uuid}: its settings could not be read back")
                continue
            power, clock = gs.mismatches(s, reading)
            problems += [f"{uuid}: {m}" for m in (power, clock) if m]
        return problems

    def columns(self, uuid: str | None, begin: dict | None, end: dict | None) -> dict:
        """The setting columns of a row for GPU ``uuid`` read back at a window's edges."""
        cols = dict(EMPTY)
        s = self._target(uuid) if uuid else None
        rb, re_ = (begin or {}).get(uuid), (end or {}).get(uuid)
        default_w, default_mhz = self.defaults.get(uuid, (None, None)) if uuid else (None, None)
        cols.update(gpu_default_power_limit_w=default_w, gpu_default_sm_clock_mhz=default_mhz)
        if s is not None:
            cols.update(
                gpu_power_limit_target_w=s.power_limit_target_w,
                gpu_sm_clock_target_mhz=s.sm_clock_target_mhz,
                gpu_mem_clock_target_mhz=s.mem_clock_target_mhz,
            )
        if rb is not None:
            cols.update(
                gpu_power_limit_w=rb["power_limit_w"],
                gpu_app_sm_clock_mhz=rb["app_sm_clock_mhz"],
                gpu_app_mem_clock_mhz=rb["app_mem_clock_mhz"],
            )
        if re_ is not None:
            cols.update(
                gpu_power_limit_end_w=re_["power_limit_w"],
                gpu_sm_clock_mhz=re_["sm_clock_mhz"],
                gpu_mem_clock_mhz=re_["mem_clock_mhz"],
            )
        power, clock, detail = self._statuses(uuid, s, [r for r in (rb, re_) if r is not None])
        cols.update(gpu_power_limit_status=power, gpu_clock_status=clock)
        cols["gpu_setting_detail"] = "; ".join(detail) or None
        return cols

    def point_columns(self) -> dict:
        """The setting columns of a failed point's row (no GPU reading): this rank's worst GPU.

        A point failed because its setting is not in effect says so here: the statuses and
        details of the GPU whose setting is furthest from applied, read back now.
        """
        if not self.uuids:
            return self.columns(None, None, None)
        now = self.read()
        every = [self.columns(u, now, now) for u in self.uuids]
        worst = max(
            every, key=lambda c: _RANK[c["gpu_power_limit_status"]] + _RANK[c["gpu_clock_status"]]
        )
        details = sorted({c["gpu_setting_detail"] for c in every if c["gpu_setting_detail"]})
        return {**worst, "gpu_setting_detail": "; ".join(details) or None}

    def _statuses(self, uuid, s, readings) -> tuple[str, str, list[str]]:
        req = self.request
        asked = (
            req is not None and req.power_limit_w is not None,
            req is not None and req.clock is not None,
        )
        if not any(asked):
            return UNSET, UNSET, []
        if s is None or not readings:
            why = (self.record.error if self.record else None) or (
                "no GPU on this row to read back" if uuid is None else "not read back"
            )
            return (
                gs.UNVERIFIED if asked[0] else UNSET,
                gs.UNVERIFIED if asked[1] else UNSET,
                [why],
            )
        power, clock = s.power_limit_status, s.clock_status
        detail = list(s.detail)
        for r in readings:
            p_bad, c_bad = gs.mismatches(s, r)
            if p_bad and power == gs.APPLIED:
                power, detail = gs.NOT_APPLIED, [*detail, p_bad]
            if c_bad and clock == gs.APPLIED:
                clock, detail = gs.NOT_APPLIED, [*detail, c_bad]
        return power, clock, detail

    def close(self) -> None:
        if self._session:
            nvml.shutdown()
            self._session = False


def launched_record(gpu: GpuRequest | None, environ=None) -> SettingsRecord | None:
    """The launcher's record of the job's setting (:data:`RECORD_ENV`), None where the job sets
    nothing or no record is named."""
    path = (os.environ if environ is None else environ).get(RECORD_ENV)
    return SettingsRecord.load(path) if path and gpu else None


def refusals(record: SettingsRecord | None, uuids: list[str]) -> list[str]:
    """What the launcher's ``record`` already says cannot be in effect on GPUs ``uuids`` (its
    error, a setting refused or not read back when it was set); empty: nothing yet. A part of
    :meth:`SettingsProbe.problems` that reads no GPU and never changes during the job: a rank
    knows it before its model loads (energysweep.run)."""
    if record is None:
        return []
    if record.error:
        return [record.error]
    launched = {g.uuid: g for g in record.gpus}
    return [
        f"{uuid}: {'; '.join(s.detail)}"
        for uuid in uuids
        if (s := launched.get(uuid)) is not None and _refused(s)
    ]


def _refused(setting: gs.GpuSetting) -> bool:
    """The launcher's record says a setting of this GPU was refused or did not read back."""
    statuses = (setting.power_limit_status, setting.clock_status)
    return gs.REFUSED in statuses or gs.NOT_APPLIED in statuses
