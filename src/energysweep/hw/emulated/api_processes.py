"""Emulated NVML process list: ``nvmlDeviceGetComputeRunningProcesses`` (and its versions).

A mixin of :class:`energysweep.hw.emulated.api.EmulatedNvml`. The list is the node's
(hw/emulated/processes.py): every process registered on the GPU, this job's or not, as the real
call lists every process with a compute context. Each entry is what the real binding returns:
an object with ``pid``, ``usedGpuMemory`` (bytes), ``gpuInstanceId`` and ``computeInstanceId``
(0xFFFFFFFF without MIG).
"""

from __future__ import annotations

import energysweep.hw.emulated.processes as processes

# Memory each listed process holds on the GPU (the emulator models none: a fixed figure).
USED_MEMORY_BYTES = 512 * 2**20
_NO_INSTANCE = 0xFFFFFFFF


class ProcessList:
    """nvmlDeviceGetComputeRunningProcesses (_v2, _v3)."""

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        index = self.gpu(handle)
        self._read_latency()
        out = []
        for pid in processes.running(
            self.node.gpus[index].uuid, host=self.node.host, environ=self.environ
        ):
            info = self.real.c_nvmlProcessInfo_t()
            info.pid, info.usedGpuMemory = pid, USED_MEMORY_BYTES
            info.gpuInstanceId = info.computeInstanceId = _NO_INSTANCE
            out.append(self.real.nvmlStructToFriendlyObject(info))
        return out

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle):
        return self.nvmlDeviceGetComputeRunningProcesses(handle)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle):
        return self.nvmlDeviceGetComputeRunningProcesses(handle)
