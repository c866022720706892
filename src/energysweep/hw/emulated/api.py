"""The emulated node behind pynvml's own interface: a module object to use in place of pynvml.

:func:`make_module` builds a module with the real pynvml's constants, structures and error
classes (passed in by energysweep.hw.nvml, the one importer of pynvml) and the functions of
:data:`EMULATED`, each with the real function's parameters, return types and error codes
(contract: tests/unit/test_nvml_contract.py). Every other ``nvml*`` function raises
``NVMLError_FunctionNotFound``, as the real binding does when the driver lacks a symbol.

Session, enumeration and identity live here; readings in api_readings.py, limits and clocks in
api_control.py, the process list in api_processes.py. Handles are real ``c_nvmlDevice_t``
pointers whose address encodes the GPU.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
import time
import types

from energysweep.hw.emulated.api_control import Control
from energysweep.hw.emulated.api_processes import ProcessList
from energysweep.hw.emulated.api_readings import Readings

_HANDLE_BASE = 0x7E5E_0000_0000
_HANDLE_STRIDE = 0x100
UUID_RE = re.compile(
    r"^(GPU|MIG)-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
    r"[0-9a-fA-F]{12}$"
)
PCI_RE = re.compile(r"^([0-9a-fA-F]{4}|[0-9a-fA-F]{8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.[0-7]$")
DRIVER_VERSION = "580.95.05"
CUDA_DRIVER_VERSION = 13000


class Session:
    """nvmlInit/Shutdown, enumeration and identity over one :class:`Node`."""

    def __init__(self, real, node_factory, sleep=time.sleep, environ=None):
        self.real = real
        self._node_factory = node_factory
        self.node = None
        self.sleep = sleep
        self.environ = os.environ if environ is None else environ
        self._inits = 0
        self._lock = threading.Lock()

    # ---------------------------------------------------------------------------- helpers
    def error(self, name: str):
        """The real NVMLError subclass for ``NVML_ERROR_<name>``."""
        return self.real.NVMLError(getattr(self.real, f"NVML_ERROR_{name}"))

    def now(self) -> int:
        return self.node.clock()

    def _need_init(self) -> None:
        if self._inits <= 0 or self.node is None:
            raise self.error("UNINITIALIZED")

    def visible(self) -> list[int]:
        """Node indices this process's NVML lists, in order (allocation under device cgroups,
        less GPUs a ``missing_gpu`` fault removes)."""
        n = self.node
        allocated = list(range(n.settings.gpus))
        cgroup = self.environ.get(CGROUP_ENV)
        if n.settings.device_cgroups and cgroup is not None:
            allocated = [int(x) for x in cgroup.split(",") if x.strip()]
        missing = {f.gpu for f in n.settings.faults_of("missing_gpu", n.host, None)}
        return [i for i in allocated if i not in missing]

    def _handle(self, index: int):
        return ctypes.cast(
            ctypes.c_void_p(_HANDLE_BASE + _HANDLE_STRIDE * (index + 1)), self.real.c_nvmlDevice_t
        )

    def gpu(self, handle) -> int:
        """The node index behind ``handle`` (raises what NVML raises for a bad one or a GPU in
        an ``nvml_error`` episode)."""
        self._need_init()
        try:
            address = ctypes.cast(handle, ctypes.c_void_p).value
        except (ctypes.ArgumentError, TypeError):
            raise self.error("INVALID_ARGUMENT") from None
        offset = (address or 0) - _HANDLE_BASE
        index = offset // _HANDLE_STRIDE - 1
        if offset % _HANDLE_STRIDE or index not in self.visible():
            raise self.error("INVALID_ARGUMENT")
        self._fault(index)
        return index

    def _fault(self, index: int) -> None:
        view = self.node.view(index)
        fault = view.in_episode("nvml_error", self.now())
        if fault is not None:
            raise self.error(fault.error)

    # ---------------------------------------------------------------------------- session
    def nvmlInit(self):
        self.nvmlInitWithFlags(0)

    def ensure_node(self):
        """The node (read at first use), without an NVML session: an owner drives its GPUs
        whether or not NVML works."""
        with self._lock:
            if self.node is None:
                self.node = self._node_factory()
            return self.node

    def nvmlInitWithFlags(self, flags):
        self.ensure_node()
        with self._lock:
            for f in self.node.settings.faults_of("init_error", self.node.host, None):
                if f.episode(self.node.t_s(self.now())) is not None:
                    raise self.error(f.error)
            self._inits += 1

    def nvmlShutdown(self):
        with self._lock:
            self._need_init()
            self._inits -= 1

    def nvmlSystemGetDriverVersion(self):
        self._need_init()
        return DRIVER_VERSION

    def nvmlSystemGetNVMLVersion(self):
        self._need_init()
        return "13." + DRIVER_VERSION

    def nvmlSystemGetCudaDriverVersion(self):
        self._need_init()
        return CUDA_DRIVER_VERSION

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return self.nvmlSystemGetCudaDriverVersion()

    # ---------------------------------------------------------------------------- enumeration
    def nvmlDeviceGetCount(self):
        self._need_init()
        return len(self.visible())

    def nvmlDeviceGetHandleByIndex(self, index):
        self._need_init()
        vis = self.visible()
        if not isinstance(index, int) or not 0 <= index < len(vis):
            raise self.error("INVALID_ARGUMENT")
        self._fault(vis[index])
        return self._handle(vis[index])

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self._need_init()
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        if not isinstance(text, str) or not UUID_RE.match(text):
            raise self.error("INVALID_ARGUMENT")
        for i in self.visible():
            if self.node.gpus[i].uuid.lower() == text.lower():
                self._fault(i)
                return self._handle(i)
        raise self.error("NOT_FOUND")

    def nvmlDeviceGetHandleByPciBusId(self, pciBusId):
        self._need_init()
        text = pciBusId.decode() if isinstance(pciBusId, bytes) else pciBusId
        m = PCI_RE.match(text) if isinstance(text, str) else None
        if m is None:
            raise self.error("INVALID_ARGUMENT")
        for i in self.visible():
            if self.node.gpus[i].bus == int(m.group(2), 16) and int(m.group(1), 16) == 0:
                self._fault(i)
                return self._handle(i)
        raise self.error("NOT_FOUND")

    def nvmlDeviceGetIndex(self, handle):
        return self.visible().index(self.gpu(handle))

    def nvmlDeviceGetMinorNumber(self, handle):
        return self.gpu(handle)

    # ---------------------------------------------------------------------------- identity
    def nvmlDeviceGetUUID(self, handle):
        return self.node.gpus[self.gpu(handle)].uuid

    def nvmlDeviceGetName(self, handle):
        self.gpu(handle)
        return self.node.profile.name

    def nvmlDeviceGetSerial(self, handle):
        return self.node.gpus[self.gpu(handle)].serial

    def nvmlDeviceGetPciInfo_v3(self, handle):
        ident = self.node.gpus[self.gpu(handle)]
        info = self.real.nvmlPciInfo_t()
        info.busIdLegacy = ident.pci_bus_id_legacy
        info.domain, info.bus, info.device = 0, ident.bus, 0
        info.pciDeviceId = self.node.profile.pci_device_id
        info.pciSubSystemId = 0x16C110DE
        info.busId = ident.pci_bus_id
        return info

    def nvmlDeviceGetPciInfo(self, handle):
        return self.nvmlDeviceGetPciInfo_v3(handle)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        self.gpu(handle)
        total = self.node.profile.memory_total_bytes
        if version:
            mem = self.real.c_nvmlMemory_v2_t()
            mem.version, mem.total, mem.reserved = version, total, 0
        else:
            mem = self.real.c_nvmlMemory_t()
            mem.total = total
        mem.free, mem.used = total, 0
        return mem

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        self.gpu(handle)
        return tuple(self.node.profile.compute_capability)

    def nvmlDeviceGetArchitecture(self, device):
        self.gpu(device)
        return getattr(self.real, self.node.profile.architecture)

    def nvmlDeviceGetC2cModeInfoV(self, handle):
        self.gpu(handle)
        raise self.error("NOT_SUPPORTED")  # an SXM board, not a Grace Hopper superchip

    def nvmlDeviceGetMigMode(self, device):
        self.gpu(device)
        return [self.real.NVML_DEVICE_MIG_DISABLE, self.real.NVML_DEVICE_MIG_DISABLE]

    def nvmlDeviceGetPersistenceMode(self, handle):
        self.gpu(handle)
        return self.real.NVML_FEATURE_ENABLED


class EmulatedNvml(Session, Readings, Control, ProcessList):
    """Every emulated call: the methods named like pynvml's functions."""


# Environment variable naming the node indices of a job's allocation under device cgroups.
CGROUP_ENV = "ENERGYSWEEP_EMULATED_ALLOCATION"

EMULATED = sorted(
    name
    for cls in (Session, Readings, Control, ProcessList)
    for name in vars(cls)
    if name.startswith("nvml")
)


def make_module(real, node_factory, sleep=time.sleep, environ=None) -> types.ModuleType:
    """A module that behaves like ``real`` (pynvml) over the node ``node_factory()`` returns.

    Args:
        real: the real pynvml module (its constants, structures and errors are used).
        node_factory: builds the :class:`~energysweep.hw.emulated.node.Node` at the first
            ``nvmlInit`` (settings are read then, not at import).
        sleep: how read latency passes (a virtual clock's in tests and the benchmark).
        environ: the process environment (device cgroup allocation); default ``os.environ``.
    """
    mod = types.ModuleType("pynvml", "energysweep's emulated GPU node behind pynvml's interface")
    driver = EmulatedNvml(real, node_factory, sleep, environ)

    def missing(name):
        def fn(*args, **kwargs):
            raise real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)

        fn.__name__ = name
        return fn

    for name in dir(real):
        value = getattr(real, name)
        # Driver calls (not the binding's struct helpers) are the emulator's or missing.
        if (
            name.startswith("nvml")
            and isinstance(value, types.FunctionType)
            and "FriendlyObject" not in name
        ):
            setattr(mod, name, missing(name))
        elif not name.startswith("__"):
            setattr(mod, name, value)
    # setattr: attributes a ModuleType is not declared to have.
    setattr(mod, "_nvmlGetFunctionPointer", missing("_nvmlGetFunctionPointer"))  # noqa: B010
    for name in EMULATED:
        setattr(mod, name, getattr(driver, name))
    setattr(mod, "emulated_driver", driver)  # noqa: B010 (as above)
    return mod
