"""GPU energy through Zeus's ``ZeusMonitor`` windows (``pip install zeus``; optional).

Zeus reads the same NVML energy counter as :mod:`energysweep.energy.nvml`; it is here to
cross-check our reading and for sites that standardise on Zeus. Traps this module closes
(measured with zeus 0.16.0, see README, Methodology):

- With no GPU, ``ZeusMonitor()`` constructs fine and every window is ``0 J``: we report
  *unavailable* instead.
- Zeus indexes GPUs by CUDA index and maps them to NVML through ``CUDA_VISIBLE_DEVICES``,
  which it parses as integers only: ``GPU-…`` UUIDs raise, ``MIG-…`` and empty values give an
  empty monitor. We refuse those settings with a reason, and map Zeus's GPUs back to UUIDs
  through NVML so rows are keyed like every other source. Index order matches only under
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (energysweep.launch.argv.build_env sets it).
- Window edges are ours (device sync + barrier in energysweep.measure.window), so Zeus never syncs:
  ``sync_execution=False``.
"""

from __future__ import annotations

import itertools
import os
import warnings

from energysweep.energy.base import EnergySource, GpuReading, SourceUnavailable, wall_ns
from energysweep.energy.nvml import CounterWentBackwards, window_reading
from energysweep.hw import nvml as hw_nvml

METHOD = "zeus-monitor"


def _check_visible_devices(value: str | None) -> None:
    """Raise SourceUnavailable where Zeus would misread ``CUDA_VISIBLE_DEVICES``."""
    if value is None:
        return
    entries = [e.strip() for e in value.split(",")]
    if not value.strip():
        raise SourceUnavailable("CUDA_VISIBLE_DEVICES is empty: Zeus would monitor no GPU")
    try:
        hw_nvml.refuse_mig(value)
    except hw_nvml.MigSlice as exc:
        raise SourceUnavailable(str(exc)) from exc
    if not all(e.lstrip("-").isdigit() for e in entries):
        raise SourceUnavailable(
            f"CUDA_VISIBLE_DEVICES={value!r} is not a list of integer indices: Zeus 0.16 parses "
            "indices only (use indices with CUDA_DEVICE_ORDER=PCI_BUS_ID, or energy_source nvml)"
        )


class ZeusSource(EnergySource[list[GpuReading]]):
    """One ``ZeusMonitor`` over this rank's GPUs; readings keyed by UUID."""

    name = "zeus"
    _keys = itertools.count()

    def __init__(self, gpu_uuids: list[str]):
        _check_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
        hw_nvml.zeus_sees_this_nvml()  # the emulated node, where the job runs on one
        try:
            from zeus.device.gpu.common import EmptyGPUs
            from zeus.monitor import ZeusMonitor
        except ImportError as exc:
            raise SourceUnavailable(f"zeus is not installed ({exc}); pip install zeus") from exc
        # gpu_indices=[]: no per-GPU setup (no PowerMonitor process); gpus is still populated.
        probe = ZeusMonitor(gpu_indices=[], cpu_indices=[], sync_execution_with="torch")
        if isinstance(probe.gpus, EmptyGPUs) or len(probe.gpus) == 0:
            # Zeus would happily report 0 J for every window here.
            raise SourceUnavailable("Zeus found no GPU (NVML unavailable or no device visible)")
        # Zeus index i is NVML index probe.gpus.gpus[i].gpu_index; NVML gives its UUID.
        with hw_nvml.session():
            uuid_of = {i: hw_nvml.uuid_at(gpu.gpu_index) for i, gpu in enumerate(probe.gpus.gpus)}
            self._gpus = []
            for uuid in gpu_uuids:
                hits = [i for i, u in uuid_of.items() if u == uuid]
                if not hits:
                    raise SourceUnavailable(f"Zeus does not see GPU {uuid} (sees {uuid_of})")
                ident = hw_nvml.identity(hw_nvml.handle_by_uuid(uuid))
                self._gpus.append({**ident, "zeus_index": hits[0], "uuid": uuid})
        self.monitor = ZeusMonitor(
            gpu_indices=[g["zeus_index"] for g in self._gpus],
            cpu_indices=[],
            sync_execution_with="torch",
        )
        self._key: str | None = None
        self._start_ns: int | None = None

    def begin(self) -> None:
        self._key = f"energysweep-{next(self._keys)}"
        self._start_ns = wall_ns()
        self.monitor.begin_window(self._key, sync_execution=False)

    def end(self) -> list[GpuReading]:
        with warnings.catch_warnings():
            # Zeus warns on a 0 J window; we flag short windows ourselves.
            warnings.simplefilter("ignore")
            m = self.monitor.end_window(self._key, sync_execution=False)
        if self._start_ns is None:
            raise RuntimeError("end() without begin()")
        duration = wall_ns() - self._start_ns
        readings = []
        for g in self._gpus:
            joules = m.gpu_energy.get(g["zeus_index"])
            if joules is None:
                raise SourceUnavailable(f"Zeus returned no energy for GPU {g['uuid']}")
            if joules < 0:
                raise CounterWentBackwards(
                    f"Zeus reports {joules} J for {g['uuid']}: the NVML counter went backwards"
                )
            readings.append(window_reading(g, joules * 1e3, duration, METHOD, self.name))
        return readings
