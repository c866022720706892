"""Emulated NVML power limits and clocks: the getters, and the privileged setters.

A mixin of :class:`energysweep.hw.emulated.api.EmulatedNvml`. Settings a setter makes persist in
the GPU's shared state until reset (as on a real GPU, until reset or reboot), so every process of
the job, and the GPU's true power, see them: the limit caps true power (``SW_POWER_CAP``), a
locked or application clock lowers dynamic power (hw/emulated/physics.py).

Setters: arguments are checked first (``INVALID_ARGUMENT``; for graphics clocks at a memory
clock the GPU lacks, ``NOT_FOUND`` as nvmlDeviceGetSupportedGraphicsClocks documents), then
permission: ``NO_PERMISSION`` unless ``measurement.emulated.allow_privileged`` (root on a real
node), and a scripted refusal (``refusals``) raises its own error.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import types

    from energysweep.hw.emulated.node import Node


def _uint(value) -> int:
    """``value`` as the C ``unsigned int`` the real binding passes (ctypes.c_uint): a
    non-integer is a TypeError, a negative one wraps around."""
    return operator.index(value) & 0xFFFFFFFF


class Control:
    """Power management limits and clocks of one emulated GPU."""

    # Provided by the class this mixes into (energysweep.hw.emulated.api.Session).
    real: types.ModuleType
    node: Node
    error: Callable[[str], Exception]
    now: Callable[[], int]
    gpu: Callable[[object], int]

    def _store(self, call: str, index: int, **values) -> None:
        """A privileged setter ``call`` of GPU ``index``: refused as the node says, else each of
        ``values`` stored in its shared state."""
        self._privileged(call, index)
        state = self.node.view(index).state
        for name, value in values.items():
            state.set(name, value)

    def _privileged(self, call: str, index: int) -> None:
        s = self.node.settings
        for name, error, gpu in s.refusals:
            if name == call and (gpu is None or gpu == index):
                raise self.error(error)
        if not s.allow_privileged:
            raise self.error("NO_PERMISSION")

    # ---------------------------------------------------------------------------- power limit
    def nvmlDeviceGetPowerManagementLimit(self, handle):
        return self.node.view(self.gpu(handle)).power_limit_mw()

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return self.node.view(self.gpu(handle)).power_limit_mw()

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle):
        self.gpu(handle)
        return int(self.node.profile.default_limit_w * 1000)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle):
        self.gpu(handle)
        p = self.node.profile
        return [int(p.min_limit_w * 1000), int(p.max_limit_w * 1000)]

    def nvmlDeviceSetPowerManagementLimit(self, handle, limit):
        index = self.gpu(handle)
        low, high = self.nvmlDeviceGetPowerManagementLimitConstraints(handle)
        limit = _uint(limit)
        if not low <= limit <= high:
            raise self.error("INVALID_ARGUMENT")
        self._store("nvmlDeviceSetPowerManagementLimit", index, power_limit_mw=limit)

    # ---------------------------------------------------------------------------- clocks
    def _clock(self, index: int, type_, which: str) -> int:
        """SM/graphics, memory or video clock: ``current``, ``max``, ``app`` or ``default``."""
        real, p = self.real, self.node.profile
        view = self.node.view(index)
        if type_ in (real.NVML_CLOCK_SM, real.NVML_CLOCK_GRAPHICS, real.NVML_CLOCK_VIDEO):
            if which == "current":
                return int(view.clocks(self.now())[0])
            if which == "app":
                return view.state.get("app_sm_mhz") or p.max_sm_mhz
            return p.max_sm_mhz
        if type_ == real.NVML_CLOCK_MEM:
            if which in ("current", "app"):
                return view.state.get("app_mem_mhz") or p.mem_mhz[0]
            return p.mem_mhz[0]
        raise self.error("INVALID_ARGUMENT")

    def nvmlDeviceGetClockInfo(self, handle, type):  # noqa: A002 - the real parameter name
        return self._clock(self.gpu(handle), type, "current")

    def nvmlDeviceGetMaxClockInfo(self, handle, type):  # noqa: A002
        return self._clock(self.gpu(handle), type, "max")

    def nvmlDeviceGetApplicationsClock(self, handle, type):  # noqa: A002
        return self._clock(self.gpu(handle), type, "app")

    def nvmlDeviceGetDefaultApplicationsClock(self, handle, type):  # noqa: A002
        return self._clock(self.gpu(handle), type, "default")

    def nvmlDeviceGetSupportedMemoryClocks(self, handle):
        self.gpu(handle)
        return list(self.node.profile.mem_mhz)

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle, memoryClockMHz):
        self.gpu(handle)
        if _uint(memoryClockMHz) not in self.node.profile.mem_mhz:
            raise self.error("NOT_FOUND")
        return self.node.profile.supported_sm_mhz()

    def nvmlDeviceSetGpuLockedClocks(self, handle, minGpuClockMHz, maxGpuClockMHz):
        index = self.gpu(handle)
        p, real = self.node.profile, self.real
        special = {
            real.NVML_CLOCK_LIMIT_ID_TDP: p.max_sm_mhz,
            real.NVML_CLOCK_LIMIT_ID_UNLIMITED: p.max_sm_mhz,
        }
        low = special.get(_uint(minGpuClockMHz), _uint(minGpuClockMHz))
        high = special.get(_uint(maxGpuClockMHz), _uint(maxGpuClockMHz))
        if not p.min_sm_mhz <= low <= high <= p.max_sm_mhz:
            raise self.error("INVALID_ARGUMENT")
        self._store("nvmlDeviceSetGpuLockedClocks", index, locked_min_mhz=low, locked_max_mhz=high)

    def nvmlDeviceResetGpuLockedClocks(self, handle):
        index = self.gpu(handle)
        self._store("nvmlDeviceResetGpuLockedClocks", index, locked_min_mhz=0, locked_max_mhz=0)

    def nvmlDeviceSetApplicationsClocks(self, handle, maxMemClockMHz, maxGraphicsClockMHz):
        index = self.gpu(handle)
        p = self.node.profile
        mem, sm = _uint(maxMemClockMHz), _uint(maxGraphicsClockMHz)
        if mem not in p.mem_mhz or sm not in p.supported_sm_mhz():
            raise self.error("INVALID_ARGUMENT")
        self._store("nvmlDeviceSetApplicationsClocks", index, app_mem_mhz=mem, app_sm_mhz=sm)

    def nvmlDeviceResetApplicationsClocks(self, handle):
        index = self.gpu(handle)
        self._store("nvmlDeviceResetApplicationsClocks", index, app_mem_mhz=0, app_sm_mhz=0)
