"""GPU energy from NVML's cumulative energy counter (nvidia-ml-py, ``import pynvml``).

Facts this relies on (see the README's methodology section):
- ``nvmlDeviceGetTotalEnergyConsumption`` is mJ since the driver loaded (Volta and newer); it
  updates about every 100 ms on datacenter GPUs, so a shorter window is flagged ``short-window``.
- NVML numbers GPUs in PCI bus order and ignores ``CUDA_VISIBLE_DEVICES``; GPUs are therefore
  resolved by UUID, never by CUDA index.
- A counter that goes backwards (driver reload) is an error, not a negative energy.
"""

from __future__ import annotations

import pynvml

from energysweep.energy import (
    STATUS_MEASURED,
    STATUS_SHORT_WINDOW,
    EnergySource,
    GpuReading,
    wall_ns,
)

METHOD = "nvml-total-energy-counter"
# Below this window length the counter may not have ticked (datacenter update period ~100 ms).
COUNTER_UPDATE_PERIOD_NS = 100_000_000


class CounterWentBackwards(RuntimeError):
    """The energy counter decreased inside a window (driver reload or a wrong device)."""


def window_reading(gpu: dict, energy_mj: float, duration_ns: int, method: str,
                   source: str) -> GpuReading:
    """The reading of one GPU (a dict with uuid, index, pci, name) over a window of
    ``duration_ns``; flagged short-window when shorter than the counter's update period."""
    short = duration_ns < COUNTER_UPDATE_PERIOD_NS
    return GpuReading(
        gpu["uuid"], gpu["index"], gpu["pci"], gpu["name"], energy_mj,
        STATUS_SHORT_WINDOW if short else STATUS_MEASURED, method,
        f"window {duration_ns / 1e6:.1f} ms < counter update period" if short else "",
        source=source,
    )


def _str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def resolve_visible_gpus(cuda_visible_devices: str | None) -> list[str]:
    """UUIDs of the GPUs a process may use, in CUDA order, resolved through NVML.

    Args:
        cuda_visible_devices: the value of ``CUDA_VISIBLE_DEVICES`` (None when unset). Entries are
            NVML indices (valid because we set ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, the order NVML
            uses) or ``GPU-…`` UUIDs (a unique prefix is enough, as for CUDA).

    Raises:
        ValueError: for MIG entries (a MIG slice has no energy counter) or entries that match
            no GPU.
    """
    count = pynvml.nvmlDeviceGetCount()
    all_uuids = [
        _str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)
    ]
    if cuda_visible_devices is None:
        return all_uuids
    out = []
    for raw in cuda_visible_devices.split(","):
        entry = raw.strip()
        if not entry:
            continue
        if entry.startswith("MIG-"):
            raise ValueError(
                f"CUDA_VISIBLE_DEVICES entry {entry!r} is a MIG slice: MIG slices have no energy "
                "counter, so GPU energy cannot be measured per slice"
            )
        if entry.startswith("GPU-"):
            matches = [u for u in all_uuids if u.startswith(entry)]
            if len(matches) != 1:
                raise ValueError(
                    f"CUDA_VISIBLE_DEVICES entry {entry!r} matches {len(matches)} GPUs"
                )
            out.append(matches[0])
            continue
        try:
            idx = int(entry)
        except ValueError:
            raise ValueError(
                f"CUDA_VISIBLE_DEVICES entry {entry!r} is neither an index nor a UUID"
            ) from None
        if idx < 0:
            break  # CUDA stops at the first invalid index
        if idx >= count:
            raise ValueError(f"CUDA_VISIBLE_DEVICES index {idx} but NVML sees {count} GPUs")
        out.append(all_uuids[idx])
    return out


class NvmlSource(EnergySource):
    """Energy counter deltas, one reading per GPU (by UUID)."""

    name = "nvml"

    def __init__(self, gpu_uuids: list[str]):
        pynvml.nvmlInit()
        self._open = True
        self._gpus = []
        for uuid in gpu_uuids:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            self._gpus.append(
                {
                    "uuid": _str(pynvml.nvmlDeviceGetUUID(handle)),
                    "index": int(pynvml.nvmlDeviceGetIndex(handle)),
                    "pci": _str(pynvml.nvmlDeviceGetPciInfo_v3(handle).busId),
                    "name": _str(pynvml.nvmlDeviceGetName(handle)),
                    "handle": handle,
                }
            )
        # A GPU without the counter (pre-Volta) fails here, at setup, not in the first window.
        self._read()
        self._start = None
        self._start_ns = None

    def _read(self) -> list[int]:
        return [int(pynvml.nvmlDeviceGetTotalEnergyConsumption(g["handle"])) for g in self._gpus]

    def begin(self) -> None:
        self._start_ns = wall_ns()
        self._start = self._read()

    def end(self) -> list[GpuReading]:
        stop = self._read()
        duration = wall_ns() - self._start_ns
        readings = []
        for g, a, b in zip(self._gpus, self._start, stop, strict=True):
            if b < a:
                raise CounterWentBackwards(
                    f"NVML energy counter of {g['uuid']} went from {a} to {b} mJ inside a window "
                    "(driver reload?); the window is not usable"
                )
            readings.append(window_reading(g, float(b - a), duration, METHOD, self.name))
        return readings

    def close(self) -> None:
        if self._open:
            pynvml.nvmlShutdown()
            self._open = False
