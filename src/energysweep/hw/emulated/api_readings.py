"""Emulated NVML readings: energy counter, power, field values, temperature, clock event reasons.

A mixin of :class:`energysweep.hw.emulated.api.EmulatedNvml` (``self.gpu(handle)`` checks the
handle and raises the faults; ``self.node`` is the node). Each reading call takes the node's
read latency, then reads the GPU's sensors at that instant (hw/emulated/node.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import energysweep.hw.emulated.physics as physics

if TYPE_CHECKING:
    from energysweep.hw.emulated.node import Node


class Readings:
    """nvmlDeviceGetTotalEnergyConsumption, GetPowerUsage, GetFieldValues and the like."""

    # Provided by the class this mixes into (energysweep.hw.emulated.api.Session).
    node: Node
    sleep: Callable[[float], object]

    def _read_latency(self) -> None:
        latency = self.node.settings.read_latency_s
        if latency > 0:
            self.sleep(latency)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        index = self.gpu(handle)
        self._read_latency()
        return int(self.node.view(index).counter_mj(self.now()))

    def nvmlDeviceGetPowerUsage(self, handle):
        index = self.gpu(handle)
        self._read_latency()
        return int(round(self.node.view(index).power_w(self.now()) * 1000))

    def nvmlDeviceGetFieldValues(self, handle, fieldIds):
        """Power fields (``NVML_FI_DEV_POWER_INSTANT`` / ``_AVERAGE``, GPU scope); every other
        field comes back with ``nvmlReturn`` NOT_SUPPORTED, as on a GPU that lacks it."""
        index = self.gpu(handle)
        real = self.real
        values = (real.c_nvmlFieldValue_t * len(fieldIds))()
        self._read_latency()
        now = self.now()
        view = self.node.view(index)
        period = self.node.settings.counter_period_s
        for i, field in enumerate(fieldIds):
            fid, scope = field if isinstance(field, (tuple, list)) else (field, 0)
            v = values[i]
            v.fieldId, v.scopeId = fid, scope
            v.timestamp = now // 1000
            v.latencyUsec = int(self.node.settings.read_latency_s * 1e6)
            power_fields = (real.NVML_FI_DEV_POWER_INSTANT, real.NVML_FI_DEV_POWER_AVERAGE)
            if fid not in power_fields or scope != real.NVML_POWER_SCOPE_GPU:
                v.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
                continue
            window = period if fid == real.NVML_FI_DEV_POWER_INSTANT else None
            v.nvmlReturn = real.NVML_SUCCESS
            v.valueType = real.NVML_VALUE_TYPE_UNSIGNED_INT
            v.value.uiVal = int(round(view.power_w(now, window) * 1000))
        return values

    def nvmlDeviceGetTemperature(self, handle, sensor):
        index = self.gpu(handle)
        if sensor != self.real.NVML_TEMPERATURE_GPU:
            raise self.error("INVALID_ARGUMENT")
        return physics.temperature_c(self.node.profile, self.node.view(index).last_power_w())

    def nvmlDeviceGetTemperatureV(self, handle, sensor, version=None):
        if version is not None and version != self.real.nvmlTemperature_v1:
            raise self.error("ARGUMENT_VERSION_MISMATCH")
        return self.nvmlDeviceGetTemperature(handle, sensor)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        index = self.gpu(handle)
        return self.node.view(index).clocks(self.now())[1]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return self.nvmlDeviceGetCurrentClocksEventReasons(handle)

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle):
        self.gpu(handle)
        return physics.SUPPORTED_REASONS
