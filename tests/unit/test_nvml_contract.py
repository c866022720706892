"""Both stand-ins for pynvml, the unit tests' fake and the emulated node, keep the real module's
contract: signatures, return types and shapes, units and documented error codes
(tests/nvml_contract.py says where each comes from)."""

from __future__ import annotations

import ctypes
import inspect

import pynvml as real
import pytest

from energysweep.hw.emulated import EMULATED

import fake_pynvml
import nvml_contract as contract
from emulated_helpers import make_node

IMPLEMENTATIONS = ["fake", "emulated"]


@pytest.fixture
def impl(request, tmp_path):
    """(module, names it implements) of one stand-in, with one GPU handle ready."""
    if request.param == "fake":
        return fake_pynvml.make_fake(fake_pynvml.h100s(2)), set(fake_pynvml.FAKED)
    _, module, _ = make_node(tmp_path)
    return module, set(EMULATED)


def _call(module, name, args):
    module.nvmlInit()
    handle = module.nvmlDeviceGetHandleByIndex(0)
    fn = getattr(module, name)
    return fn() if args is None else fn(handle, *args)


@pytest.fixture(scope="module")
def reference():
    with pytest.MonkeyPatch.context() as mp:
        return contract.real_results(mp)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, indirect=True)
def test_signatures_are_the_real_ones(impl):
    module, names = impl
    for name in sorted(names):
        assert hasattr(real, name), f"pynvml.{name} no longer exists"
        ours = list(inspect.signature(getattr(module, name)).parameters)
        theirs = list(inspect.signature(getattr(real, name)).parameters)
        assert ours == theirs, f"{name}: {ours} != real {theirs}"


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, indirect=True)
@pytest.mark.parametrize("name", sorted(contract.CALLS))
def test_return_shapes_and_units_are_the_real_ones(impl, name, reference):
    module, names = impl
    if name not in names:
        assert name not in fake_pynvml.FAKED  # only the fake may lack a call
        return
    value = _call(module, name, contract.CALLS[name])
    assert contract.shape(value) == contract.shape(reference[name]), name
    if name in contract.UNITS:
        low, high = contract.UNITS[name]
        for v in value if isinstance(value, (list, tuple)) else [value]:
            assert low <= v <= high, f"{name} = {value}: not in the unit's range [{low}, {high}]"


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, indirect=True)
def test_handles_and_errors_are_the_real_types(impl, reference):
    module, _ = impl
    module.nvmlInit()
    handle = module.nvmlDeviceGetHandleByIndex(0)
    assert contract.shape(handle) == contract.shape(reference["nvmlDeviceGetHandleByIndex"])
    assert module.NVMLError is real.NVMLError
    with pytest.raises(real.NVMLError) as err:
        module.nvmlDeviceGetHandleByIndex(99)
    assert type(err.value) is type(real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT))


def _error_args(module, args):
    out = []
    for a in args:
        if a == "count":
            out.append(module.nvmlDeviceGetCount())
        elif a == "default-limit":
            out.append(
                module.nvmlDeviceGetPowerManagementDefaultLimit(
                    module.nvmlDeviceGetHandleByIndex(0)
                )
            )
        elif a == "max-clock":
            out.append(
                module.nvmlDeviceGetMaxClockInfo(
                    module.nvmlDeviceGetHandleByIndex(0), real.NVML_CLOCK_SM
                )
            )
        else:
            out.append(a)
    return out


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, indirect=True)
@pytest.mark.parametrize("case", contract.ERRORS, ids=[c[0] for c in contract.ERRORS])
def test_documented_error_codes(impl, case):
    module, names = impl
    _, name, args, code = case
    if name not in names:
        assert name not in fake_pynvml.FAKED
        return
    module.nvmlInit()
    if args == "bad-handle":
        call = lambda: getattr(module, name)(ctypes.cast(None, real.c_nvmlDevice_t))  # noqa: E731
    elif name.startswith("nvmlDeviceGetHandleBy"):
        call = lambda: getattr(module, name)(*_error_args(module, args))  # noqa: E731
    else:
        handle = module.nvmlDeviceGetHandleByIndex(0)
        call = lambda: getattr(module, name)(handle, *_error_args(module, args))  # noqa: E731
    with pytest.raises(real.NVMLError) as err:
        call()
    assert err.value.value == getattr(real, f"NVML_ERROR_{code}"), (
        f"{name}: {type(err.value).__name__}, documented NVML_ERROR_{code}"
    )


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, indirect=True)
@pytest.mark.parametrize("name", contract.UNINITIALIZED)
def test_calls_before_init_are_uninitialized(impl, name):
    module, _ = impl
    with pytest.raises(real.NVMLError) as err:
        getattr(module, name)()
    assert err.value.value == real.NVML_ERROR_UNINITIALIZED


def test_the_emulator_lacks_no_call_the_fake_has():
    """Code tested on the fake (everything energysweep and Zeus call) runs on the emulator."""
    assert set(fake_pynvml.FAKED) <= set(EMULATED)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, indirect=True)
def test_process_list_is_the_real_shape(impl, reference, tmp_path):
    """nvmlDeviceGetComputeRunningProcesses: a list of the real binding's objects (pid,
    usedGpuMemory, instance ids), empty where nothing computes, listing a process that does."""
    import os

    from energysweep.hw.emulated import processes

    module, _ = impl
    registry = {processes.ENV: str(tmp_path / "procs")}
    if hasattr(module, "emulated_driver"):
        module.emulated_driver.environ = registry  # the node's process list, kept apart
    module.nvmlInit()
    handle = module.nvmlDeviceGetHandleByIndex(0)
    assert module.nvmlDeviceGetComputeRunningProcesses(handle) == []
    if hasattr(module, "fake_gpus"):
        module.fake_gpus[0].compute_pids = [os.getpid()]
    else:
        driver = module.emulated_driver  # its node's host, and its environment's registry
        processes.register(
            module.nvmlDeviceGetUUID(handle),
            os.getpid(),
            host=driver.node.host,
            environ=registry,
        )
    listed = module.nvmlDeviceGetComputeRunningProcesses(handle)
    assert [p.pid for p in listed] == [os.getpid()]
    assert contract.process_shape(listed) == contract.process_shape(reference[contract.PROCESSES])
