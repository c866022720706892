"""Emulated NVML readings: energy counter, power, field values, temperature, clock event reasons.

A mixin of :class:`energysweep.hw.emulated.api.EmulatedNvml` (``self.gpu(handle)`` checks the
handle and raises the faults; ``self.node`` is the node). Each reading call takes the node's
read latency, then reads the GPU's sensors at that instant (hw/emulated/node.py). On a profile
with a measured latency distribution (h200-sxm) each energy read draws its latency from it
(seeded per process) and power and field reads take the profile's fast latency.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

import energysweep.hw.emulated.physics as physics

if TYPE_CHECKING:
    from energysweep.hw.emulated.node import Node


class Readings:
    """nvmlDeviceGetTotalEnergyConsumption, GetPowerUsage, GetFieldValues and the like."""

    # Provided by the class this mixes into (energysweep.hw.emulated.api.Session).
    node: Node
    sleep: Callable[[float], object]
    _latency_rng: np.random.Generator | None = None

    def _latency_s(self, energy: bool) -> float:
        s = self.node.settings
        if not s.energy_read_latency_q:
            return s.read_latency_s
        if not energy:
            fast = self.node.profile.fast_read_latency_s
            return s.read_latency_s if fast is None else fast
        if self._latency_rng is None:
            self._latency_rng = np.random.default_rng([s.seed, os.getpid()])
        return physics.latency_s(s.energy_read_latency_q, float(self._latency_rng.random()))

    def _read_latency(self, energy: bool = False) -> None:
        latency = self._latency_s(energy)
        if latency > 0:
            self.sleep(latency)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        index = self.gpu(handle)
        self._read_latency(energy=True)
        return int(self.node.view(index).counter_mj(self.now()))

    def nvmlDeviceGetPowerUsage(self, handle):
        index = self.gpu(handle)
        self._read_latency()
        return int(round(self.node.view(index).power_w(self.now()) * 1000))

    def nvmlDeviceGetFieldValues(self, handle, fieldIds):
        """Power fields (``NVML_FI_DEV_POWER_INSTANT`` / ``_AVERAGE``, GPU scope, and memory
        scope where the profile reports HBM power apart); every other field comes back with
        ``nvmlReturn`` NOT_SUPPORTED, as on a GPU that lacks it."""
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
            v.latencyUsec = int(self._latency_s(False) * 1e6)
            power_fields = (real.NVML_FI_DEV_POWER_INSTANT, real.NVML_FI_DEV_POWER_AVERAGE)
            memory = self.node.profile.memory_idle_w
            scopes = (real.NVML_POWER_SCOPE_GPU,) + (
                () if memory is None else (real.NVML_POWER_SCOPE_MEMORY,)
            )
            if fid not in power_fields or scope not in scopes:
                v.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
                continue
            window = period if fid == real.NVML_FI_DEV_POWER_INSTANT else None
            v.nvmlReturn = real.NVML_SUCCESS
            v.valueType = real.NVML_VALUE_TYPE_UNSIGNED_INT
            watts = memory if scope == real.NVML_POWER_SCOPE_MEMORY else view.power_w(now, window)
            v.value.uiVal = int(round(watts * 1000))
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
