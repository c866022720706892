"""The contract every stand-in for pynvml keeps: the real module's return types and shapes, units,
and documented error codes.

Return types come from the *real* binding itself: :class:`StubDriver` stands in for the C library
(libnvidia-ml) under the real ``pynvml`` module, so each real Python wrapper runs and returns what
it returns on a GPU (ints from ``c_uint.value``, ``str`` through ``convertStrBytes``, real
structures, lists, tuples). A stand-in's result must have the same shape. Error codes are those
the NVML API reference (nvml.h) documents for each case; units are plausible ranges (a reading in
W where mW is meant fails).
"""

from __future__ import annotations

import ctypes

import pynvml as real

WELL_FORMED_ABSENT_UUID = "GPU-00000000-0000-0000-0000-000000000000"

# function -> arguments after the handle (None: the function takes no handle). The call the
# contract checks: return shape against the real binding, and units.
CALLS: dict[str, tuple | None] = {
    "nvmlDeviceGetCount": None,
    "nvmlSystemGetDriverVersion": None,
    "nvmlSystemGetCudaDriverVersion": None,
    "nvmlDeviceGetUUID": (),
    "nvmlDeviceGetIndex": (),
    "nvmlDeviceGetName": (),
    "nvmlDeviceGetPciInfo_v3": (),
    "nvmlDeviceGetMemoryInfo": (),
    "nvmlDeviceGetTotalEnergyConsumption": (),
    "nvmlDeviceGetPowerUsage": (),
    "nvmlDeviceGetPowerManagementLimit": (),
    "nvmlDeviceGetEnforcedPowerLimit": (),
    "nvmlDeviceGetPowerManagementDefaultLimit": (),
    "nvmlDeviceGetPowerManagementLimitConstraints": (),
    "nvmlDeviceGetClockInfo": (real.NVML_CLOCK_SM,),
    "nvmlDeviceGetMaxClockInfo": (real.NVML_CLOCK_SM,),
    "nvmlDeviceGetApplicationsClock": (real.NVML_CLOCK_SM,),
    "nvmlDeviceGetSupportedMemoryClocks": (),
    "nvmlDeviceGetTemperature": (real.NVML_TEMPERATURE_GPU,),
    "nvmlDeviceGetCudaComputeCapability": (),
    "nvmlDeviceGetArchitecture": (),
    "nvmlDeviceGetCurrentClocksEventReasons": (),
    "nvmlDeviceGetMigMode": (),
    "nvmlDeviceGetFieldValues": ([(real.NVML_FI_DEV_POWER_INSTANT, real.NVML_POWER_SCOPE_GPU)],),
}

# Units: (low, high) of a plausible value, or of each element of a list/tuple result.
UNITS: dict[str, tuple[float, float]] = {
    "nvmlDeviceGetPowerUsage": (10_000, 2_000_000),  # mW
    "nvmlDeviceGetPowerManagementLimit": (50_000, 2_000_000),  # mW
    "nvmlDeviceGetEnforcedPowerLimit": (50_000, 2_000_000),
    "nvmlDeviceGetPowerManagementDefaultLimit": (50_000, 2_000_000),
    "nvmlDeviceGetPowerManagementLimitConstraints": (50_000, 2_000_000),
    "nvmlDeviceGetClockInfo": (100, 5_000),  # MHz
    "nvmlDeviceGetMaxClockInfo": (100, 5_000),
    "nvmlDeviceGetApplicationsClock": (100, 5_000),
    "nvmlDeviceGetSupportedMemoryClocks": (100, 10_000),
    "nvmlDeviceGetTemperature": (0, 120),  # C
    "nvmlDeviceGetCudaComputeCapability": (0, 12),
    "nvmlDeviceGetTotalEnergyConsumption": (0, 2**64 - 1),  # mJ
}

# Documented error codes (NVML API reference, nvml.h), as (case, function, arguments after the
# handle or None for no handle, the NVML_ERROR_ name). "bad-handle" calls with a NULL handle.
ERRORS = [
    ("malformed UUID", "nvmlDeviceGetHandleByUUID", ("GPU-not-a-uuid",), "INVALID_ARGUMENT"),
    ("unknown UUID", "nvmlDeviceGetHandleByUUID", (WELL_FORMED_ABSENT_UUID,), "NOT_FOUND"),
    ("index out of range", "nvmlDeviceGetHandleByIndex", ("count",), "INVALID_ARGUMENT"),
    ("NULL handle", "nvmlDeviceGetUUID", "bad-handle", "INVALID_ARGUMENT"),
    ("unknown clock type", "nvmlDeviceGetClockInfo", (99,), "INVALID_ARGUMENT"),
    ("unknown sensor", "nvmlDeviceGetTemperature", (99,), "INVALID_ARGUMENT"),
    ("limit out of range", "nvmlDeviceSetPowerManagementLimit", (1,), "INVALID_ARGUMENT"),
    (
        "limit without root",
        "nvmlDeviceSetPowerManagementLimit",
        ("default-limit",),
        "NO_PERMISSION",
    ),
    (
        "locked clocks without root",
        "nvmlDeviceSetGpuLockedClocks",
        ("max-clock", "max-clock"),
        "NO_PERMISSION",
    ),
    (
        "graphics clocks at an unknown memory clock",
        "nvmlDeviceGetSupportedGraphicsClocks",
        (1,),
        "NOT_FOUND",
    ),
    ("not a Grace Hopper", "nvmlDeviceGetC2cModeInfoV", (), "NOT_SUPPORTED"),
]
# Calls before nvmlInit raise UNINITIALIZED.
UNINITIALIZED = ["nvmlDeviceGetCount", "nvmlShutdown"]


def shape(value):
    """The type structure of a result: what the contract compares."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, (str, bytes)):
        return type(value).__name__
    if isinstance(value, tuple):
        return ("tuple", tuple(shape(v) for v in value))
    if isinstance(value, list):
        return ("list", shape(value[0]) if value else "empty")
    if isinstance(value, ctypes.Array):
        return ("array", value._type_.__name__)
    if isinstance(value, ctypes.Structure):
        return ("struct", type(value).__name__)
    if isinstance(value, ctypes._Pointer):
        return ("pointer", type(value).__name__)
    return type(value).__name__


class StubDriver:
    """Stands in for libnvidia-ml under the real pynvml: every function succeeds, filling its
    output parameters (numbers 1, strings ``stub``, structures zeroed); list-returning calls
    answer the size query with INSUFFICIENT_SIZE and then two entries, as the library does."""

    LISTS = {"nvmlDeviceGetSupportedMemoryClocks", "nvmlDeviceGetSupportedGraphicsClocks"}
    # Lists of process structures (the real binding turns each into a friendly object).
    PROCESS_LISTS = {"nvmlDeviceGetComputeRunningProcesses_v3"}

    def __getattr__(self, name):
        def fn(*args):
            if name in self.PROCESS_LISTS:
                count = next(a._obj for a in args if type(a).__name__ == "CArgObject")
                if args[-1] is None:
                    count.value = 2
                    return real.NVML_ERROR_INSUFFICIENT_SIZE
                for i, pid in enumerate((4242, 4343)):
                    args[-1][i].pid, args[-1][i].usedGpuMemory = pid, 2**30
                count.value = 2
                return real.NVML_SUCCESS
            if name in self.LISTS:
                count = next(a._obj for a in args if type(a).__name__ == "CArgObject")
                if args[-1] is None:
                    count.value = 2
                    return real.NVML_ERROR_INSUFFICIENT_SIZE
                args[-1][0], args[-1][1] = 1410, 1395
                count.value = 2
                return real.NVML_SUCCESS
            for a in args:
                target = getattr(a, "_obj", None)
                if isinstance(target, ctypes._SimpleCData) and not isinstance(
                    target, ctypes.c_char_p
                ):
                    target.value = 1
                elif isinstance(a, ctypes.Array) and a._type_ is ctypes.c_char:
                    a.value = b"stub"
            return real.NVML_SUCCESS

        return fn


def real_results(monkeypatch) -> dict[str, object]:
    """Every :data:`CALLS` function of the real pynvml, run over :class:`StubDriver`."""
    monkeypatch.setattr(real, "nvmlLib", StubDriver())
    monkeypatch.setattr(real, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(real, "_nvmlLib_refcount", 0)
    real.nvmlInit()
    handle = real.nvmlDeviceGetHandleByIndex(0)
    out = {"nvmlDeviceGetHandleByIndex": handle}
    for name, args in CALLS.items():
        fn = getattr(real, name)
        out[name] = fn() if args is None else fn(handle, *args)
    out[PROCESSES] = real.nvmlDeviceGetComputeRunningProcesses(handle)
    return out


# The process list: checked apart from CALLS (a stand-in lists a process only where one runs).
PROCESSES = "nvmlDeviceGetComputeRunningProcesses"


def process_shape(value) -> tuple:
    """What the contract compares of a process list: entry type and its fields' types."""
    first = value[0]
    fields = ("pid", "usedGpuMemory", "gpuInstanceId", "computeInstanceId")
    return type(first).__name__, tuple((f, type(getattr(first, f)).__name__) for f in fields)
