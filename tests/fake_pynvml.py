"""A fake ``pynvml`` for machines without a GPU, built from the real module.

Constants and error classes are the real module's (``pynvml.NVMLError(code)`` builds the real
subclass); only the functions we call are replaced. The ``fake_nvml`` fixture (tests/conftest.py)
installs it as ``energysweep.hw.nvml.pynvml``, the one place src imports pynvml. The contract test
``tests/unit/test_nvml.py::test_fake_matches_real_api`` fails if a faked function disappears from,
or changes its parameters in, the real pynvml; ``test_everything_energysweep_calls_is_faked``
fails if src calls a function the fake lacks.
"""

from __future__ import annotations

import ctypes
import math
import re
import time
import types
from dataclasses import dataclass, field

import pynvml as real

# What NVML accepts as a UUID (anything else is NVML_ERROR_INVALID_ARGUMENT, not NOT_FOUND).
UUID_RE = re.compile(r"^(GPU|MIG)-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_HANDLE_BASE = 0x7F5E_0000_0000

FAKED = [
    "nvmlInit",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetPowerUsage",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlSystemGetCudaDriverVersion",
    # The sampler and preflight: why clocks are below maximum.
    "nvmlDeviceGetCurrentClocksEventReasons",
    # Zeus calls these while it sets up its GPUs.
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetC2cModeInfoV",
    # Power limits and applications clocks (gpu.power_limit_w, gpu.clock).
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceSetPowerManagementLimit",
    "nvmlDeviceGetApplicationsClock",
    "nvmlDeviceGetDefaultApplicationsClock",
    "nvmlDeviceGetSupportedMemoryClocks",
    "nvmlDeviceGetSupportedGraphicsClocks",
    "nvmlDeviceSetApplicationsClocks",
    "nvmlDeviceResetApplicationsClocks",
    # Who computes on a GPU (the gpu_shared check at every window's edges).
    "nvmlDeviceGetComputeRunningProcesses",
]

# H100 SXM figures (energy reference, "Emulating a GPU node"): power limit range and clocks.
DEFAULT_LIMIT_MW = 700_000
LIMIT_RANGE_MW = (200_000, 700_000)
MEM_CLOCKS_MHZ = [2619]
SM_CLOCKS_MHZ = list(range(1980, 344, -15))  # 1980, 1965, ..., 345 (as NVML lists: descending)


@dataclass
class FakeGpu:
    uuid: str
    pci_bus_id: str
    name: str = "NVIDIA H100 80GB HBM3"
    energy_mj: int = 1_000_000
    power_mw: int = 300_000
    supports_energy: bool = True
    temperature_c: int = 40
    # An NVML clock event reason bitmask (real nvmlClocksEventReason* values).
    clock_event_reasons: int = 0
    # When set, the energy counter advances by itself, as the driver's does: every
    # counter_period_s it adds the energy of that period at counter_rate_mw (default power_mw),
    # counted from when the fake module was made. counter_stuck freezes it.
    counter_period_s: float | None = None
    counter_rate_mw: int | None = None
    counter_stuck: bool = False
    # Settings, as a privileged caller left them (they persist, as on a real GPU). 0 = default.
    power_limit_mw: int = DEFAULT_LIMIT_MW
    app_sm_mhz: int = 0
    app_mem_mhz: int = 0
    # Whether setters are allowed (root), and setters refused anyway: {function name: NVML code}.
    privileged: bool = False
    refuse: dict = field(default_factory=dict)
    # Another cap below the set limit (e.g. a thermal or system cap): the enforced limit.
    external_cap_mw: int | None = None
    # Processes with a compute context on the GPU (pids), as nvmlDeviceGetComputeRunningProcesses
    # lists them; None: the call is not supported (NVML_ERROR_NOT_SUPPORTED).
    compute_pids: list | None = field(default_factory=list)


def _handle(index: int):
    """A real ``c_nvmlDevice_t`` (what the real binding returns) whose address names the GPU."""
    return ctypes.cast(ctypes.c_void_p(_HANDLE_BASE + 0x100 * (index + 1)), real.c_nvmlDevice_t)


def _index(handle) -> int | None:
    try:
        address = ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (ctypes.ArgumentError, TypeError):
        return None
    offset = address - _HANDLE_BASE
    return offset // 0x100 - 1 if offset > 0 and offset % 0x100 == 0 else None


def make_fake(gpus: list[FakeGpu], init_error: int | None = None) -> types.ModuleType:
    """A module object that behaves like pynvml for ``gpus`` (in PCI bus order, as NVML lists).

    Args:
        gpus: the devices; tests change ``gpu.energy_mj`` to move the counter.
        init_error: an NVML_ERROR_* code that ``nvmlInit`` raises (e.g. LIBRARY_NOT_FOUND).
    """
    mod = types.ModuleType("pynvml")
    for name in dir(real):
        if name.startswith(("NVML", "NVMLError")) or name == "NVMLError":
            setattr(mod, name, getattr(real, name))
    state = {"init": 0, "t0": time.monotonic()}
    mod.fake_gpus = gpus

    def need_init():
        if state["init"] <= 0:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)

    def gpu(handle):
        need_init()
        index = _index(handle)
        if index is None or not 0 <= index < len(gpus):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpus[index]

    def nvmlInit():
        if init_error is not None:
            raise real.NVMLError(init_error)
        state["init"] += 1

    def nvmlShutdown():
        need_init()
        state["init"] -= 1

    def nvmlDeviceGetCount():
        need_init()
        return len(gpus)

    def nvmlDeviceGetHandleByIndex(index):
        need_init()
        if not 0 <= index < len(gpus):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return _handle(index)

    def nvmlDeviceGetHandleByUUID(uuid):
        need_init()
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        if not isinstance(uuid, str) or not UUID_RE.match(uuid):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        for i, g in enumerate(gpus):
            if g.uuid == uuid:
                return _handle(i)
        raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetTotalEnergyConsumption(handle):
        g = gpu(handle)
        if not g.supports_energy:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        if g.counter_period_s is None or g.counter_stuck:
            return g.energy_mj
        ticks = math.floor((time.monotonic() - state["t0"]) / g.counter_period_s)
        rate = g.power_mw if g.counter_rate_mw is None else g.counter_rate_mw
        return g.energy_mj + int(ticks * g.counter_period_s * rate)

    def nvmlDeviceGetTemperature(handle, sensor):
        g = gpu(handle)
        if sensor != real.NVML_TEMPERATURE_GPU:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return g.temperature_c

    def clock_type(type_) -> None:
        if type_ not in (
            real.NVML_CLOCK_SM,
            real.NVML_CLOCK_GRAPHICS,
            real.NVML_CLOCK_MEM,
            real.NVML_CLOCK_VIDEO,
        ):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetMaxClockInfo(handle, type):  # noqa: A002 - real parameter name
        gpu(handle)
        clock_type(type)
        return 2619 if type == real.NVML_CLOCK_MEM else 1980

    def nvmlDeviceGetArchitecture(device):
        gpu(device)
        return real.NVML_DEVICE_ARCH_HOPPER

    def nvmlDeviceGetC2cModeInfoV(handle):
        gpu(handle)
        raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)  # not a Grace Hopper superchip

    def nvmlDeviceGetClockInfo(handle, type):  # noqa: A002 - real parameter name
        g = gpu(handle)
        clock_type(type)
        if type == real.NVML_CLOCK_MEM:
            return g.app_mem_mhz or MEM_CLOCKS_MHZ[0]
        return g.app_sm_mhz or SM_CLOCKS_MHZ[0]

    def privileged(g, name):
        if name in g.refuse:
            raise real.NVMLError(g.refuse[name])
        if not g.privileged:
            raise real.NVMLError(real.NVML_ERROR_NO_PERMISSION)

    def nvmlDeviceSetPowerManagementLimit(handle, limit):
        g = gpu(handle)
        if not LIMIT_RANGE_MW[0] <= limit <= LIMIT_RANGE_MW[1]:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        privileged(g, "nvmlDeviceSetPowerManagementLimit")
        g.power_limit_mw = int(limit)

    def nvmlDeviceGetEnforcedPowerLimit(handle):
        g = gpu(handle)
        return min(g.power_limit_mw, g.external_cap_mw or g.power_limit_mw)

    def app_clock(handle, type, default):  # noqa: A002
        g = gpu(handle)
        if type == real.NVML_CLOCK_MEM:
            return MEM_CLOCKS_MHZ[0] if default else (g.app_mem_mhz or MEM_CLOCKS_MHZ[0])
        if type in (real.NVML_CLOCK_GRAPHICS, real.NVML_CLOCK_SM):
            return SM_CLOCKS_MHZ[0] if default else (g.app_sm_mhz or SM_CLOCKS_MHZ[0])
        raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetSupportedGraphicsClocks(handle, memoryClockMHz):
        gpu(handle)
        if memoryClockMHz not in MEM_CLOCKS_MHZ:
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        return list(SM_CLOCKS_MHZ)

    def nvmlDeviceSetApplicationsClocks(handle, maxMemClockMHz, maxGraphicsClockMHz):
        g = gpu(handle)
        if maxMemClockMHz not in MEM_CLOCKS_MHZ or maxGraphicsClockMHz not in SM_CLOCKS_MHZ:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        privileged(g, "nvmlDeviceSetApplicationsClocks")
        g.app_mem_mhz, g.app_sm_mhz = int(maxMemClockMHz), int(maxGraphicsClockMHz)

    def nvmlDeviceResetApplicationsClocks(handle):
        g = gpu(handle)
        privileged(g, "nvmlDeviceResetApplicationsClocks")
        g.app_mem_mhz = g.app_sm_mhz = 0

    def nvmlDeviceGetMemoryInfo(handle, version=None):
        gpu(handle)
        mem = real.c_nvmlMemory_t()  # the real structure, as the real binding returns
        mem.total, mem.free, mem.used = 80 * 2**30, 80 * 2**30, 0
        return mem

    def nvmlDeviceGetPciInfo_v3(handle):
        info = real.nvmlPciInfo_t()
        info.busId = gpu(handle).pci_bus_id
        return info

    def nvmlDeviceGetComputeRunningProcesses(handle):
        g = gpu(handle)
        if g.compute_pids is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        out = []
        for pid in g.compute_pids:
            info = real.c_nvmlProcessInfo_t()  # the real structure, as the binding converts it
            info.pid, info.usedGpuMemory = pid, 2**30
            info.gpuInstanceId = info.computeInstanceId = 0xFFFFFFFF
            out.append(real.nvmlStructToFriendlyObject(info))
        return out

    funcs = {
        "nvmlDeviceGetComputeRunningProcesses": nvmlDeviceGetComputeRunningProcesses,
        "nvmlInit": nvmlInit,
        "nvmlShutdown": nvmlShutdown,
        "nvmlDeviceGetCount": nvmlDeviceGetCount,
        "nvmlDeviceGetHandleByIndex": nvmlDeviceGetHandleByIndex,
        "nvmlDeviceGetHandleByUUID": nvmlDeviceGetHandleByUUID,
        "nvmlDeviceGetUUID": lambda handle: gpu(handle).uuid,
        "nvmlDeviceGetIndex": lambda handle: (gpu(handle), _index(handle))[1],
        "nvmlDeviceGetName": lambda handle: gpu(handle).name,
        "nvmlDeviceGetPciInfo_v3": nvmlDeviceGetPciInfo_v3,
        "nvmlDeviceGetTotalEnergyConsumption": nvmlDeviceGetTotalEnergyConsumption,
        "nvmlDeviceGetPowerUsage": lambda handle: gpu(handle).power_mw,
        "nvmlSystemGetDriverVersion": lambda: (need_init(), "580.95.05")[1],
        "nvmlDeviceGetMemoryInfo": nvmlDeviceGetMemoryInfo,
        "nvmlDeviceGetPowerManagementLimit": lambda handle: gpu(handle).power_limit_mw,
        "nvmlDeviceGetClockInfo": nvmlDeviceGetClockInfo,
        "nvmlDeviceGetTemperature": nvmlDeviceGetTemperature,
        "nvmlDeviceGetCudaComputeCapability": lambda handle: (gpu(handle), (9, 0))[1],
        "nvmlDeviceGetEnforcedPowerLimit": nvmlDeviceGetEnforcedPowerLimit,
        "nvmlDeviceGetMaxClockInfo": nvmlDeviceGetMaxClockInfo,
        "nvmlSystemGetCudaDriverVersion": lambda: (need_init(), 13000)[1],
        "nvmlDeviceGetArchitecture": nvmlDeviceGetArchitecture,
        "nvmlDeviceGetCurrentClocksEventReasons": lambda handle: gpu(handle).clock_event_reasons,
        "nvmlDeviceGetC2cModeInfoV": nvmlDeviceGetC2cModeInfoV,
        "nvmlDeviceGetPowerManagementDefaultLimit": lambda handle: (
            gpu(handle),
            DEFAULT_LIMIT_MW,
        )[1],
        "nvmlDeviceGetPowerManagementLimitConstraints": lambda handle: (
            gpu(handle),
            list(LIMIT_RANGE_MW),
        )[1],
        "nvmlDeviceSetPowerManagementLimit": nvmlDeviceSetPowerManagementLimit,
        "nvmlDeviceGetApplicationsClock": lambda handle, type: app_clock(handle, type, False),
        "nvmlDeviceGetDefaultApplicationsClock": lambda handle, type: app_clock(handle, type, True),
        "nvmlDeviceGetSupportedMemoryClocks": lambda handle: (gpu(handle), list(MEM_CLOCKS_MHZ))[1],
        "nvmlDeviceGetSupportedGraphicsClocks": nvmlDeviceGetSupportedGraphicsClocks,
        "nvmlDeviceSetApplicationsClocks": nvmlDeviceSetApplicationsClocks,
        "nvmlDeviceResetApplicationsClocks": nvmlDeviceResetApplicationsClocks,
    }
    assert sorted(funcs) == sorted(FAKED)
    for name, fn in funcs.items():
        setattr(mod, name, fn)
    return mod


def h100s(n: int) -> list[FakeGpu]:
    """``n`` fake GPUs with distinct UUIDs and PCI bus ids (PCI order)."""
    return [
        FakeGpu(
            uuid=f"GPU-{i:08x}-1111-2222-3333-{i:012x}",
            pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
        )
        for i in range(n)
    ]
