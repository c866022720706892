"""A job's GPU power limit and clocks: parse, resolve, apply, read back, verify, restore.

The grid axes ``gpu.power_limit_w`` and ``gpu.clock`` (config/config.schema.yaml) ask for a
power limit in W and applications clocks in Slurm's ``--gpu-freq`` vocabulary
(:mod:`energysweep.job.gpu_freq`); a clock resolves on each GPU exactly as Slurm's gpu/nvml plugin
resolves it, so the target a rank verifies is the one Slurm would set.

Who sets what: the launcher (energysweep.launch.gpu_guard) remembers each GPU's settings, sets
what the job may set through NVML (:func:`apply`), and puts the remembered values back when the
job ends however it ends (:func:`restore`). Under Slurm the clocks are Slurm's to set
(``--gpu-freq``); the job only reads them back. Every NVML call goes through
:mod:`energysweep.hw.nvml`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from energysweep.hw import nvml
from energysweep.hw import nvml_settings as ns
from energysweep.job.gpu_freq import ClockSpec, nearest, parse_clock
from energysweep.tables.status import SettingStatus

# Outcomes of a setting on one GPU (shard columns gpu_power_limit_status, gpu_clock_status).
UNSET = SettingStatus.UNSET
APPLIED = SettingStatus.APPLIED
REFUSED = SettingStatus.REFUSED
NOT_APPLIED = SettingStatus.NOT_APPLIED
UNVERIFIED = SettingStatus.UNVERIFIED


def error_text(exc: BaseException) -> str:
    """An NVML error as ``NVMLError_NoPermission (Insufficient Permissions)``."""
    return f"{type(exc).__name__} ({exc})"


def resolve_clock(spec: ClockSpec, handle) -> tuple[int, int]:
    """(memory MHz, SM MHz) ``spec`` resolves to on the GPU ``handle`` (in an NVML session)."""
    mem = nearest(spec.mem, ns.supported_clocks_mhz(handle))
    return mem, nearest(spec.sm, ns.supported_clocks_mhz(handle, mem))


@dataclass
class GpuSetting:
    """One GPU's setting in a job: what it had, what was asked, what happened.

    Written by the launcher into the job's settings record (JSON) which the ranks read; the
    ``previous_*`` values are what :func:`restore` puts back.
    """

    uuid: str
    index: int | None = None
    name: str | None = None
    power_limit_target_w: float | None = None
    sm_clock_target_mhz: int | None = None
    mem_clock_target_mhz: int | None = None
    default_power_limit_w: float | None = None
    default_sm_clock_mhz: int | None = None
    default_mem_clock_mhz: int | None = None
    previous_power_limit_mw: int | None = None
    previous_app_clocks_mhz: list[int] | None = None  # [mem, sm]
    power_limit_status: SettingStatus = UNSET
    clock_status: SettingStatus = UNSET
    detail: list[str] = field(default_factory=list)
    # What this job changed (and so must put back).
    changed_power_limit: bool = False
    changed_clocks: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GpuSetting:
        """The inverse of :meth:`to_dict` (the statuses back as :class:`SettingStatus`)."""
        return cls(**{**data, "power_limit_status": SettingStatus(data["power_limit_status"]),
                      "clock_status": SettingStatus(data["clock_status"])})  # fmt: skip


def _remember(handle, setting: GpuSetting) -> None:
    ident = nvml.identity(handle)
    setting.index, setting.name = ident["index"], ident["name"]
    setting.previous_power_limit_mw = ns.power_limit_mw(handle)
    setting.default_power_limit_w = ns.power_limit_bounds_mw(handle)[0] / 1e3
    setting.previous_app_clocks_mhz = [
        ns.app_clock_mhz(handle, "mem"),
        ns.app_clock_mhz(handle, "sm"),
    ]
    setting.default_mem_clock_mhz = ns.app_clock_mhz(handle, "mem", default=True)
    setting.default_sm_clock_mhz = ns.app_clock_mhz(handle, "sm", default=True)


def _apply_power(handle, s: GpuSetting, watts: float) -> None:
    s.power_limit_target_w = float(watts)
    _, low, high = ns.power_limit_bounds_mw(handle)
    target = round(watts * 1000)
    if not low <= target <= high:
        s.power_limit_status = REFUSED
        s.detail.append(
            f"power limit {watts:g} W is outside this GPU's range {low / 1e3:g}-{high / 1e3:g} W"
        )
        return
    try:
        ns.set_power_limit_mw(handle, target)
    except nvml.NVMLError as exc:
        s.power_limit_status = REFUSED
        s.detail.append(
            f"nvmlDeviceSetPowerManagementLimit({target} mW) refused: {error_text(exc)}"
        )
        return
    s.changed_power_limit = True
    s.power_limit_status = APPLIED


def _apply_clock(handle, s: GpuSetting, spec: ClockSpec, set_it: bool) -> None:
    mem, sm = resolve_clock(spec, handle)
    s.mem_clock_target_mhz, s.sm_clock_target_mhz = mem, sm
    if not set_it:  # Slurm's to set (--gpu-freq): only verified
        s.clock_status = APPLIED
        return
    try:
        ns.set_app_clocks(handle, mem, sm)
    except nvml.NVMLError as exc:
        s.clock_status = REFUSED
        s.detail.append(
            f"nvmlDeviceSetApplicationsClocks(memory {mem}, graphics {sm} MHz) for "
            f"gpu.clock {spec.text!r} refused: {error_text(exc)}"
        )
        return
    s.changed_clocks = True
    s.clock_status = APPLIED


def apply(
    uuids: list[str],
    power_limit_w: float | None,
    clock: str | None,
    set_power: bool = True,
    set_clock: bool = True,
    out: list[GpuSetting] | None = None,
) -> list[GpuSetting]:
    """Remember each GPU's settings, then set the requested ones (in an NVML session).

    Args:
        power_limit_w: the point's ``gpu.power_limit_w`` (None: not changed).
        clock: the point's ``gpu.clock`` (None: not changed).
        set_power: set the power limit here (False: the site's prolog sets it; only verified).
        set_clock: set the clocks here (False: Slurm's ``--gpu-freq`` sets them; verified).
        out: the list to fill, GPU by GPU (so a caller can restore what was set before an
            error on a later GPU); a new list by default.

    Returns:
        One :class:`GpuSetting` per GPU, each read back and verified (:func:`verify`). A refused
        setter is recorded (status ``refused`` with the NVML error), never raised: the job's
        points are then flagged, not measured at the wrong setting.
    """
    spec = parse_clock(clock) if clock is not None else None
    out = [] if out is None else out
    for uuid in uuids:
        s = GpuSetting(uuid=uuid)
        handle = nvml.handle_by_uuid(uuid)
        _remember(handle, s)
        out.append(s)
        if power_limit_w is not None:
            if set_power:
                _apply_power(handle, s, power_limit_w)
            else:
                s.power_limit_target_w = float(power_limit_w)
                s.power_limit_status = APPLIED
        if spec is not None:
            _apply_clock(handle, s, spec, set_clock)
        verify(s, read_back(handle))
    return out


def read_back(handle) -> dict:
    """What the GPU enforces now: power limit (W), applications and current clocks (MHz)."""
    return {
        "power_limit_w": ns.power_limit_mw(handle, enforced=True) / 1e3,
        "app_sm_clock_mhz": ns.app_clock_mhz(handle, "sm"),
        "app_mem_clock_mhz": ns.app_clock_mhz(handle, "mem"),
        "sm_clock_mhz": ns.current_clock_mhz(handle, "sm"),
        "mem_clock_mhz": ns.current_clock_mhz(handle, "mem"),
    }


def mismatches(s: GpuSetting, reading: dict) -> tuple[str | None, str | None]:
    """(power, clock) descriptions of how ``reading`` differs from ``s``'s targets (None: same).

    The power limit must be enforced within 1 W (NVML works in mW); the applications clocks must
    equal the targets exactly (both are supported clocks).
    """
    power = clock = None
    target = s.power_limit_target_w
    if target is not None and abs(reading["power_limit_w"] - target) > 1.0:
        power = f"enforced power limit {reading['power_limit_w']:g} W, asked {target:g} W"
    if s.sm_clock_target_mhz is not None:
        got = (reading["app_sm_clock_mhz"], reading["app_mem_clock_mhz"])
        want = (s.sm_clock_target_mhz, s.mem_clock_target_mhz)
        if got != want:
            clock = (
                f"applications clocks SM {got[0]} / memory {got[1]} MHz, asked "
                f"{want[0]} / {want[1]} MHz"
            )
    return power, clock


def verify(s: GpuSetting, reading: dict) -> None:
    """Mark a setting that nobody refused but that does not read back as ``not-applied``."""
    power, clock = mismatches(s, reading)
    if power and s.power_limit_status == APPLIED:
        s.power_limit_status = NOT_APPLIED
        s.detail.append(power)
    if clock and s.clock_status == APPLIED:
        s.clock_status = NOT_APPLIED
        s.detail.append(clock)


def current(settings: list[GpuSetting]) -> list[dict]:
    """Each GPU's power limit (mW) and applications clocks ([mem, sm] MHz) as read now (in an
    NVML session), in the units of ``GpuSetting.previous_*``."""
    out = []
    for s in settings:
        try:
            h = nvml.handle_by_uuid(s.uuid)
            clocks = [ns.app_clock_mhz(h, "mem"), ns.app_clock_mhz(h, "sm")]
            out.append({"uuid": s.uuid, "power_limit_mw": ns.power_limit_mw(h),
                        "app_clocks_mhz": clocks})  # fmt: skip
        except nvml.NVMLError as exc:
            out.append({"uuid": s.uuid, "error": error_text(exc)})
    return out


def restore(settings: list[GpuSetting]) -> list[str]:
    """Put back what :func:`apply` changed (in an NVML session); returns the problems.

    Every GPU is attempted even if one fails; each result is read back, and a value that does
    not read back as it was is a problem too.
    """
    problems = []
    for s in settings:
        if not (s.changed_power_limit or s.changed_clocks):
            continue
        try:
            handle = nvml.handle_by_uuid(s.uuid)
            # What apply() remembered (a value it could not read is not put back: a problem).
            if s.changed_power_limit and s.previous_power_limit_mw is not None:
                ns.set_power_limit_mw(handle, s.previous_power_limit_mw)
                s.changed_power_limit = ns.power_limit_mw(handle) != s.previous_power_limit_mw
            if s.changed_clocks and s.previous_app_clocks_mhz is not None:
                mem, sm = s.previous_app_clocks_mhz
                # Back at the defaults: a reset, as Slurm does; else the site's own values.
                if [mem, sm] == [s.default_mem_clock_mhz, s.default_sm_clock_mhz]:
                    ns.set_app_clocks(handle, None)
                else:
                    ns.set_app_clocks(handle, mem, sm)
                now = [ns.app_clock_mhz(handle, "mem"), ns.app_clock_mhz(handle, "sm")]
                s.changed_clocks = now != [mem, sm]
        except nvml.NVMLError as exc:
            problems.append(f"{s.uuid}: restore failed: {error_text(exc)}")
            continue
        if s.changed_power_limit or s.changed_clocks:
            problems.append(f"{s.uuid}: restored settings do not read back as they were")
    return problems
