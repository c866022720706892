"""GPU settings through NVML: power limits and applications clocks (the logic:
energysweep.gpu_setting.control).

Setters
need root or a site that grants them (else NVMLError_NoPermission); a value out of range raises
NVMLError_InvalidArgument. Clocks are the *applications* clocks, which Slurm's --gpu-freq sets.

Every call goes through :mod:`energysweep.hw.nvml`'s ``pynvml`` at call time, so the fake (tests)
and the emulated node (measurement.device emulated) reach it as they reach every reading.
"""

from __future__ import annotations

from energysweep.hw import nvml


def power_limit_mw(handle, enforced: bool = False) -> int:
    """The power limit set on the GPU (mW), or the one it ``enforced`` (the lowest of all caps)."""
    if enforced:
        return int(nvml.pynvml.nvmlDeviceGetEnforcedPowerLimit(handle))
    return int(nvml.pynvml.nvmlDeviceGetPowerManagementLimit(handle))


def power_limit_bounds_mw(handle) -> tuple[int, int, int]:
    """(default, lowest, highest) power limit of the GPU, in mW."""
    low, high = nvml.pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
    return int(nvml.pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle)), int(low), int(high)


def set_power_limit_mw(handle, limit_mw: int) -> None:
    nvml.pynvml.nvmlDeviceSetPowerManagementLimit(handle, int(limit_mw))


def app_clock_mhz(handle, kind: str, default: bool = False) -> int:
    """The applications clock (MHz), ``kind`` "sm" (graphics) or "mem"; or its ``default``."""
    const = nvml.pynvml.NVML_CLOCK_MEM if kind == "mem" else nvml.pynvml.NVML_CLOCK_GRAPHICS
    if default:
        return int(nvml.pynvml.nvmlDeviceGetDefaultApplicationsClock(handle, const))
    return int(nvml.pynvml.nvmlDeviceGetApplicationsClock(handle, const))


def current_clock_mhz(handle, kind: str) -> int:
    """The clock the GPU runs at now (MHz): ``kind`` "sm" or "mem"."""
    const = nvml.pynvml.NVML_CLOCK_MEM if kind == "mem" else nvml.pynvml.NVML_CLOCK_SM
    return int(nvml.pynvml.nvmlDeviceGetClockInfo(handle, const))


def supported_clocks_mhz(handle, mem_mhz: int | None = None) -> list[int]:
    """Supported memory clocks, or with ``mem_mhz`` the graphics clocks at that memory clock."""
    if mem_mhz is None:
        return [int(c) for c in nvml.pynvml.nvmlDeviceGetSupportedMemoryClocks(handle)]
    return [int(c) for c in nvml.pynvml.nvmlDeviceGetSupportedGraphicsClocks(handle, int(mem_mhz))]


def set_app_clocks(handle, mem_mhz: int | None, sm_mhz: int | None = None) -> None:
    """Set the applications clocks; None: back to the defaults (both persist until changed)."""
    if mem_mhz is None:
        nvml.pynvml.nvmlDeviceResetApplicationsClocks(handle)
    elif sm_mhz is None:
        raise ValueError(f"applications clocks: memory {mem_mhz} MHz without an SM clock")
    else:
        nvml.pynvml.nvmlDeviceSetApplicationsClocks(handle, int(mem_mhz), int(sm_mhz))
