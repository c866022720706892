"""NVML through nvidia-ml-py (``import pynvml``): the only module in src that imports it.

Owns the NVML session (init/shutdown), GPU identity by UUID, the one MIG refusal, the readings
(energy counter, power, clocks and clock event reasons, the processes on a GPU) and the
environment snapshot queries.
Handle-based calls need a session (between :func:`init` and :func:`shutdown`).

Facts this relies on (README, Methodology):
- NVML numbers GPUs in PCI bus order and ignores ``CUDA_VISIBLE_DEVICES``; GPUs are therefore
  resolved by UUID, never by CUDA index.
- A MIG slice has no energy counter of its own: it is refused (:func:`refuse_mig`), not guessed.

Tests replace the module attribute ``pynvml`` with a fake built from the real module
(tests/fake_pynvml.py, installed by the ``fake_nvml`` fixture); every function here looks it up
at call time, so the fake reaches every caller.

``measurement.device: emulated`` (docs/emulated-node.md): where the launcher names an emulated
node's state directory in the environment (``ENERGYSWEEP_EMULATED_NVML``), ``pynvml`` is that
node's module (energysweep.hw.emulated), built from the real one; everything above reads it
through these same functions, and :func:`label` marks what it measured.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import pynvml

from energysweep.hw import emulated as _emulated

# The real module: its constants, structures and errors build the emulated one.
_REAL = pynvml
if os.environ.get(_emulated.ENV):
    pynvml = _emulated.module_from_env(_REAL)

# The base class of every NVML error (the fake and the emulator raise the real classes).
NVMLError = _REAL.NVMLError


# ---------------------------------------------------------------------------- session
def init() -> None:
    """Start an NVML session; raises an ``NVMLError`` subclass without a driver."""
    pynvml.nvmlInit()


def shutdown() -> None:
    """End a session started by :func:`init` (NVML counts nested sessions)."""
    pynvml.nvmlShutdown()


@contextlib.contextmanager
def session():
    """An NVML session for the ``with`` block."""
    pynvml.nvmlInit()
    try:
        yield
    finally:
        pynvml.nvmlShutdown()


# ---------------------------------------------------------------------------- emulated node
def emulated() -> bool:
    """Whether ``pynvml`` is an emulated node (measurement.device emulated)."""
    return hasattr(pynvml, "emulated_driver")


def label(text: str | None) -> str | None:
    """``text`` (a method or source name) marked ``emulated:`` on the emulated node: every row
    measured there says so."""
    if text is None or not emulated() or text.startswith("emulated:"):
        return text
    return f"emulated:{text}"


@contextlib.contextmanager
def for_job(environ: dict):
    """NVML as a job's ranks see it, for the ``with`` block: the emulated node ``environ`` names
    (measurement.device emulated: the launcher's own process has no such variable, its ranks
    do), else this process's NVML."""
    global pynvml
    if emulated() or not environ.get(_emulated.ENV):
        yield
        return
    saved, pynvml = pynvml, _emulated.module_from_env(_REAL, environ=environ)
    try:
        yield
    finally:
        pynvml = saved


def emulated_profile() -> str | None:
    """The emulated node's GPU profile (for the environment record), None on real NVML."""
    return _emulated.node_config.read(os.environ[_emulated.ENV]).profile if emulated() else None


def attach(uuids: list[str], pids=None):
    """This process's activity drives the emulated GPUs ``uuids`` (their owner) until the
    returned object's ``close()``, which writes their ground truth; None on real NVML.

    Args:
        pids: the processes whose CPU activity is the load (default: this one).
    """
    if not emulated() or not uuids:
        return None
    return _emulated.attach(pynvml, uuids, pids)


def zeus_sees_this_nvml() -> None:
    """Point Zeus at the emulated node (no-op on real NVML), as Zeus's own tests patch it:
    ``zeus.device.gpu.nvidia.pynvml``, its availability check, and its GPU singleton."""
    if not emulated():
        return
    import zeus.device.gpu as zeus_gpu
    import zeus.device.gpu.nvidia as zeus_nvidia

    module = pynvml

    def available() -> bool:
        try:
            module.nvmlInit()
        except NVMLError:
            return False
        return True

    zeus_nvidia.pynvml = module
    zeus_gpu.nvml_is_available = available
    zeus_gpu._gpus = None


# ---------------------------------------------------------------------------- identity
def text(value) -> str:
    """An NVML string (bytes in older nvidia-ml-py) as ``str``."""
    return value.decode() if isinstance(value, bytes) else str(value)


def device_count() -> int:
    return pynvml.nvmlDeviceGetCount()


def uuid_at(index: int) -> str:
    """UUID of the GPU at NVML ``index`` (PCI bus order)."""
    return text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index)))


def all_uuids() -> list[str]:
    """UUIDs of every GPU NVML sees, in NVML (PCI bus) order."""
    return [uuid_at(i) for i in range(device_count())]


def handle_by_uuid(uuid: str):
    return pynvml.nvmlDeviceGetHandleByUUID(uuid)


def device_index(handle) -> int:
    return int(pynvml.nvmlDeviceGetIndex(handle))


def identity(handle) -> dict:
    """``{"uuid", "index", "pci", "name"}`` of one GPU (the columns every energy row carries)."""
    return {
        "uuid": text(pynvml.nvmlDeviceGetUUID(handle)),
        "index": device_index(handle),
        "pci": text(pynvml.nvmlDeviceGetPciInfo_v3(handle).busId),
        "name": text(pynvml.nvmlDeviceGetName(handle)),
    }


def driver_version() -> str:
    return text(pynvml.nvmlSystemGetDriverVersion())


def cuda_uuid(device) -> str:
    """UUID (``GPU-…``) of a CUDA device (an index or ``torch.device``) as torch reports it."""
    import torch

    uuid = str(torch.cuda.get_device_properties(device).uuid)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def gpu_uuids(device: str, local_rank: int = 0) -> list[str]:
    """UUID of the GPU a rank computes on, from torch (never by index: NVML order differs).

    On the emulated node the rank computes on a CPU and owns the emulated CUDA device
    ``local_rank`` (of the ones ``CUDA_VISIBLE_DEVICES`` shows), named as CUDA would name it:
    without NVML, so a node whose NVML fails still knows which GPU a rank has.

    Args:
        device: the rank's torch device string (``cpu`` gives no GPU, ``cuda:1`` one).
    """
    if emulated():
        visible = _emulated.cuda_uuids()
        return [visible[local_rank % len(visible)]] if visible else []
    if not device.startswith("cuda"):
        return []
    import torch

    return [cuda_uuid(torch.device(device))]


def torch_uuids() -> list[str] | None:
    """UUIDs of the CUDA devices torch sees (None where torch has no CUDA; on the emulated node,
    the emulated CUDA devices)."""
    if emulated():
        return _emulated.cuda_uuids()
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return [cuda_uuid(i) for i in range(torch.cuda.device_count())]


class MigSlice(ValueError):
    """``CUDA_VISIBLE_DEVICES`` names a MIG slice, which has no energy counter."""


def refuse_mig(cuda_visible_devices: str | None) -> None:
    """The one MIG refusal: raise :class:`MigSlice` where ``CUDA_VISIBLE_DEVICES`` names slices.

    NVML's energy counter belongs to the whole GPU; a slice has none, so energy per slice cannot
    be measured and is refused rather than attributed.
    """
    slices = [e.strip() for e in (cuda_visible_devices or "").split(",")]
    slices = [e for e in slices if e.startswith("MIG-")]
    if slices:
        raise MigSlice(
            f"CUDA_VISIBLE_DEVICES names MIG slices ({', '.join(slices)}): MIG slices have no "
            "energy counter, so GPU energy cannot be measured per slice"
        )


def resolve_visible_gpus(cuda_visible_devices: str | None) -> list[str]:
    """UUIDs of the GPUs a process may use, in CUDA order, resolved through NVML (in a session).

    Args:
        cuda_visible_devices: the value of ``CUDA_VISIBLE_DEVICES`` (None when unset). Entries are
            NVML indices (valid because we set ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, the order NVML
            uses) or ``GPU-…`` UUIDs (a unique prefix is enough, as for CUDA).

    Raises:
        ValueError: for MIG entries (:class:`MigSlice`) or entries that match no GPU.
    """
    all_ = all_uuids()
    count = len(all_)
    if cuda_visible_devices is None:
        return all_
    out = []
    for raw in cuda_visible_devices.split(","):
        entry = raw.strip()
        if not entry:
            continue
        refuse_mig(entry)
        if entry.startswith("GPU-"):
            matches = [u for u in all_ if u.startswith(entry)]
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
        out.append(all_[idx])
    return out


# ---------------------------------------------------------------------------- readings
def energy_mj(handle) -> int:
    """The cumulative energy counter (mJ since the driver loaded; Volta and newer)."""
    return int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))


def power_mw(handle) -> int:
    """The power reading (mW; a ~1 s moving average on Ampere-except-GA100 and newer)."""
    return int(pynvml.nvmlDeviceGetPowerUsage(handle))


def clock_event_reasons(handle) -> int:
    """Why clocks are below maximum: an ``nvmlClocksEventReason*`` bitmask."""
    return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))


def compute_pids(handle) -> list[int]:
    """Processes with a compute context on the GPU (every user's and job's: NVML lists them
    node-wide; pids as the driver's pid namespace numbers them)."""
    return [int(p.pid) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]


def sm_clock_mhz(handle) -> int:
    return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))


def max_sm_clock_mhz(handle) -> int:
    return int(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM))


# ---------------------------------------------------------------------------- snapshot
# (key, pynvml function, pynvml constants passed after the handle, post-processing).
GPU_QUERIES = [
    ("index", "nvmlDeviceGetIndex", (), int),
    ("name", "nvmlDeviceGetName", (), None),
    ("pci_bus_id", "nvmlDeviceGetPciInfo_v3", (), lambda v: v.busId),
    ("memory_total_bytes", "nvmlDeviceGetMemoryInfo", (), lambda v: int(v.total)),
    ("power_limit_mw", "nvmlDeviceGetPowerManagementLimit", (), int),
    ("enforced_power_limit_mw", "nvmlDeviceGetEnforcedPowerLimit", (), int),
    ("sm_clock_mhz", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",), int),
    ("mem_clock_mhz", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_MEM",), int),
    ("max_sm_clock_mhz", "nvmlDeviceGetMaxClockInfo", ("NVML_CLOCK_SM",), int),
    ("max_mem_clock_mhz", "nvmlDeviceGetMaxClockInfo", ("NVML_CLOCK_MEM",), int),
    ("temperature_c", "nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU",), int),
    ("compute_capability", "nvmlDeviceGetCudaComputeCapability", (), list),
]
SYSTEM_QUERIES = [
    ("driver", "nvmlSystemGetDriverVersion"),
    ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion"),
]


def _decoded(value):
    """bytes from older nvidia-ml-py as str; any other value (numbers, structs) unchanged."""
    return value.decode() if isinstance(value, bytes) else value


def gpu_snapshot(uuids: list[str]) -> list[dict]:
    """Per-GPU identity and state via NVML, by UUID; empty when NVML is unavailable.

    A query a GPU does not support leaves that key ``None`` and adds ``<key>_error``.
    """
    if not uuids:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:
        return []
    out = []
    try:
        system = {}
        for key, fn in SYSTEM_QUERIES:
            try:
                system[key] = _decoded(getattr(pynvml, fn)())
            except Exception as exc:
                system[key], system[f"{key}_error"] = None, type(exc).__name__
        for uuid in uuids:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            except Exception as exc:
                out.append({"uuid": uuid, "error": type(exc).__name__, **system})
                continue
            info: dict[str, Any] = {"uuid": uuid}
            for key, fn, consts, post in GPU_QUERIES:
                try:  # one unsupported query must not lose the rest
                    args = [getattr(pynvml, c) for c in consts]
                    value = _decoded(getattr(pynvml, fn)(handle, *args))
                    info[key] = post(value) if post else value
                except Exception as exc:
                    info[key], info[f"{key}_error"] = None, type(exc).__name__
            out.append({**info, **system})
    finally:
        pynvml.nvmlShutdown()
    return out
