"""The emulated GPU node through its pynvml surface, on a virtual clock with a given load.

Deterministic: the owner steps at 250 Hz of virtual time with ``FunctionActivity`` loads, and
every NVML call reads at the virtual clock (tests/emulated_helpers.py).
"""

from __future__ import annotations

import numpy as np
import pynvml as real
import pytest

from energysweep.hw import emulated
from energysweep.hw.emulated import Owner, truth
from energysweep.hw.emulated.node import Node, identity

from emulated_helpers import EPOCH_NS, VirtualClock, make_node, run_owner, section, steady


def _gpu0(node, module):
    module.nvmlInit()
    return module.nvmlDeviceGetHandleByIndex(0)


def test_counter_is_mj_refreshed_at_ticks_and_matches_the_truth(tmp_path):
    node, nvml, clock = make_node(tmp_path)
    h = _gpu0(node, nvml)
    clock.sleep(2.0)
    owner = Owner(node, [0], steady(0.5))
    run_owner(owner, clock, 5.0)
    view = node.view(0)
    # the counter moves only at refreshes: constant between two ticks
    ticks = np.diff(
        [
            nvml.nvmlDeviceGetTotalEnergyConsumption(h)
            for _ in range(20)
            if clock.sleep(0.004) is None
        ]
    )
    changes = np.count_nonzero(ticks)
    assert 0 <= changes <= 2
    assert isinstance(nvml.nvmlDeviceGetTotalEnergyConsumption(h), int)
    # a window's counter delta is the true energy between the refreshes before its edges
    a, b = clock.at(3.0), clock.at(6.5)
    clock.t = b
    counter_b = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    clock.t = a
    counter_a = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    clock.t = clock.at(7.0)
    ta, tb = view.tick(a)[1], view.tick(b)[1]
    owner.close()
    t = truth.Truth.read(tmp_path)
    expected = float(t.energy_mj(view.ident.uuid, ta, tb))
    assert counter_b - counter_a == pytest.approx(expected, abs=1.0)  # mJ, floor rounding
    # 385 W (half activity) over 3.5 s, with the edges a refresh off at most
    assert expected == pytest.approx(385 * 3.5 * 1000, rel=0.03)


def test_truth_is_the_exact_integral_of_true_power(tmp_path):
    node, nvml, clock = make_node(tmp_path)
    # 1 s busy, 1 s idle, from 1 s after the epoch
    owner = Owner(
        node,
        [0],
        emulated.FunctionActivity(lambda t: 1.0 if ((t - EPOCH_NS) // 10**9) % 2 else 0.0),
    )
    run_owner(owner, clock, 10.0, hz=200)
    owner.close()
    t = truth.Truth.read(tmp_path)
    uuid = node.gpus[0].uuid
    assert float(t.energy_mj(uuid, clock.at(1.0), clock.at(2.0))) == pytest.approx(700_000)
    assert float(t.energy_mj(uuid, clock.at(2.0), clock.at(3.0))) == pytest.approx(70_000)
    assert float(t.energy_mj(uuid, clock.at(1.5), clock.at(5.5))) == pytest.approx(
        0.5 * 700_000 + 70_000 + 700_000 + 70_000 + 0.5 * 700_000
    )
    assert np.isnan(t.energy_mj(uuid, clock.at(9.0), clock.at(11.0)))  # beyond the truth


def test_power_reading_is_a_lagging_one_second_average(tmp_path):
    node, nvml, clock = make_node(tmp_path, power_sample_coverage=1.0, counter_jitter_s=0.0)
    h = _gpu0(node, nvml)
    owner = Owner(
        node, [0], emulated.FunctionActivity(lambda t: 1.0 if t > EPOCH_NS + 3 * 10**9 else 0.0)
    )
    run_owner(owner, clock, 3.0)
    assert nvml.nvmlDeviceGetPowerUsage(h) == pytest.approx(70_000, abs=1)
    run_owner(owner, clock, 0.5)
    assert nvml.nvmlDeviceGetPowerUsage(h) == pytest.approx(385_000, rel=0.05)  # half-way
    run_owner(owner, clock, 1.0)
    assert nvml.nvmlDeviceGetPowerUsage(h) == pytest.approx(700_000, abs=1)
    fields = nvml.nvmlDeviceGetFieldValues(
        h, [(real.NVML_FI_DEV_POWER_INSTANT, real.NVML_POWER_SCOPE_GPU)]
    )
    assert fields[0].nvmlReturn == real.NVML_SUCCESS and fields[0].value.uiVal == 700_000


def test_an_unowned_gpu_reads_idle_and_its_owner_exit_returns_it_to_idle(tmp_path):
    node, nvml, clock = make_node(tmp_path)
    nvml.nvmlInit()
    h1 = nvml.nvmlDeviceGetHandleByIndex(1)
    e0 = nvml.nvmlDeviceGetTotalEnergyConsumption(h1)
    clock.sleep(10.0)
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(h1) - e0 == pytest.approx(700_000, abs=7_100)
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(h1) == real.nvmlClocksEventReasonGpuIdle
    owner = Owner(node, [1], steady(1.0), pid=2**22 + 12345)  # a pid that is not running
    run_owner(owner, clock, 2.0)
    busy = nvml.nvmlDeviceGetTotalEnergyConsumption(h1)
    clock.sleep(10.0)  # its owner is gone: idle power from its last sample on
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(h1) - busy == pytest.approx(700_000, abs=71_000)


def _counter_series(nvml, h, owner, clock, seconds, step=0.04):
    out = []
    for _ in range(int(seconds / step)):
        run_owner(owner, clock, step)
        out.append((clock(), nvml.nvmlDeviceGetTotalEnergyConsumption(h)))
    return out


def test_stuck_counter_fault_freezes_the_counter_for_its_episode(tmp_path):
    fault = {"kind": "stuck_counter", "gpu": 0, "start_s": 2.0, "duration_s": 3.0}
    node, nvml, clock = make_node(tmp_path, faults=[fault])
    h = _gpu0(node, nvml)
    owner = Owner(node, [0], steady(0.0))
    series = _counter_series(nvml, h, owner, clock, 7.0)
    during = [c for t, c in series if clock.at(2.1) <= t < clock.at(5.0)]
    after = [c for t, c in series if t >= clock.at(5.2)]
    assert len(set(during)) == 1
    assert after[0] > during[0] and after == sorted(after)
    # The episode's energy is lost for good: it resumes from the frozen value, so from the
    # episode's start to 7 s it counts only the 2 s after the episode (idle: 70 W).
    assert series[-1][1] - during[0] == pytest.approx(70_000 * 2.0, abs=70_000 * 0.25)


def test_counter_reset_fault_restarts_the_counter_near_zero(tmp_path):
    node, nvml, clock = make_node(
        tmp_path, faults=[{"kind": "counter_reset", "gpu": 0, "start_s": 2.0}]
    )
    h = _gpu0(node, nvml)
    owner = Owner(node, [0], steady(0.0))
    run_owner(owner, clock, 1.9)
    before = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    run_owner(owner, clock, 1.0)
    after = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert before > 10**9 and 0 <= after < 100_000  # went backwards: a driver reload


def test_nvml_error_fault_raises_on_that_gpu_during_its_episode_only(tmp_path):
    node, nvml, clock = make_node(
        tmp_path,
        faults=[
            {
                "kind": "nvml_error",
                "gpu": 1,
                "start_s": 1.0,
                "duration_s": 1.0,
                "error": "GPU_IS_LOST",
            }
        ],
    )
    nvml.nvmlInit()
    h0, h1 = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    clock.t = clock.at(1.5)
    with pytest.raises(real.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetTotalEnergyConsumption(h1)
    nvml.nvmlDeviceGetTotalEnergyConsumption(h0)
    clock.t = clock.at(2.5)
    nvml.nvmlDeviceGetTotalEnergyConsumption(h1)


def test_missing_gpu_fault_hides_it_from_nvml(tmp_path):
    node, nvml, clock = make_node(tmp_path, node_gpus=4, faults=[{"kind": "missing_gpu", "gpu": 2}])
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 3
    listed = [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(3)]
    assert node.gpus[2].uuid not in listed
    with pytest.raises(real.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleByUUID(node.gpus[2].uuid)


def test_init_error_fault_makes_nvml_fail(tmp_path):
    node, nvml, clock = make_node(
        tmp_path, faults=[{"kind": "init_error", "error": "DRIVER_NOT_LOADED"}]
    )
    with pytest.raises(real.NVMLError_DriverNotLoaded):
        nvml.nvmlInit()


def test_throttle_episode_sets_hw_slowdown_and_lowers_power(tmp_path):
    node, nvml, clock = make_node(
        tmp_path, faults=[{"kind": "throttle", "gpu": 0, "start_s": 1.0, "duration_s": 1.0}]
    )
    h = _gpu0(node, nvml)
    owner = Owner(node, [0], steady(1.0))
    run_owner(owner, clock, 1.5)
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(h) & real.nvmlClocksEventReasonHwSlowdown
    assert nvml.nvmlDeviceGetClockInfo(h, real.NVML_CLOCK_SM) == 990
    assert node.view(0).last_power_w() == pytest.approx(70 + 630 / 8)
    run_owner(owner, clock, 1.0)
    assert not nvml.nvmlDeviceGetCurrentClocksEventReasons(h) & 0x8
    assert node.view(0).last_power_w() == pytest.approx(700)


def test_power_limit_setter_needs_privilege_checks_range_and_caps_power(tmp_path):
    node, nvml, clock = make_node(tmp_path)
    h = _gpu0(node, nvml)
    with pytest.raises(real.NVMLError_NoPermission):
        nvml.nvmlDeviceSetPowerManagementLimit(h, 300_000)
    node2, nvml2, clock2 = make_node(tmp_path / "root", allow_privileged=True)
    h2 = _gpu0(node2, nvml2)
    with pytest.raises(real.NVMLError_InvalidArgument):
        nvml2.nvmlDeviceSetPowerManagementLimit(h2, 100_000)  # below the 200 W minimum
    nvml2.nvmlDeviceSetPowerManagementLimit(h2, 300_000)
    assert nvml2.nvmlDeviceGetPowerManagementLimit(h2) == 300_000
    assert nvml2.nvmlDeviceGetEnforcedPowerLimit(h2) == 300_000
    owner = Owner(node2, [0], steady(1.0))
    run_owner(owner, clock2, 1.0)
    assert node2.view(0).last_power_w() == pytest.approx(300.0)
    assert nvml2.nvmlDeviceGetCurrentClocksEventReasons(h2) & real.nvmlClocksEventReasonSwPowerCap
    assert nvml2.nvmlDeviceGetClockInfo(h2, real.NVML_CLOCK_SM) < 1980


def test_refusals_and_clock_setters(tmp_path):
    node, nvml, clock = make_node(
        tmp_path,
        allow_privileged=True,
        refusals=[{"call": "nvmlDeviceSetGpuLockedClocks", "error": "NOT_SUPPORTED"}],
    )
    h = _gpu0(node, nvml)
    with pytest.raises(real.NVMLError_NotSupported):
        nvml.nvmlDeviceSetGpuLockedClocks(h, 990, 990)
    mem = nvml.nvmlDeviceGetSupportedMemoryClocks(h)
    assert mem == [2619]
    sm = nvml.nvmlDeviceGetSupportedGraphicsClocks(h, mem[0])
    assert sm[0] == 1980 and 990 in sm
    with pytest.raises(real.NVMLError_NotFound):
        nvml.nvmlDeviceGetSupportedGraphicsClocks(h, 1234)
    with pytest.raises(real.NVMLError_InvalidArgument):
        nvml.nvmlDeviceSetApplicationsClocks(h, 2619, 991)
    nvml.nvmlDeviceSetApplicationsClocks(h, 2619, 990)
    assert nvml.nvmlDeviceGetApplicationsClock(h, real.NVML_CLOCK_SM) == 990
    owner = Owner(node, [0], steady(1.0))
    run_owner(owner, clock, 0.5)
    assert node.view(0).last_power_w() == pytest.approx(70 + 630 / 8)
    nvml.nvmlDeviceResetApplicationsClocks(h)
    run_owner(owner, clock, 0.5)
    assert node.view(0).last_power_w() == pytest.approx(700)


def test_gpus_have_distinct_identities_per_node_and_stable_ones_per_index():
    a = [identity("esnode1", i) for i in range(8)]
    b = [identity("esnode2", i) for i in range(8)]
    assert len({g.uuid for g in a + b}) == 16
    assert identity("esnode1", 3) == a[3]
    assert [g.pci_bus_id for g in a] == sorted(g.pci_bus_id for g in a)  # NVML: PCI bus order


def test_device_cgroups_number_only_the_allocation(tmp_path):
    node, nvml, clock = make_node(tmp_path, device_cgroups=True)
    env = emulated.job_env(
        tmp_path, node.settings, {"SLURM_STEP_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "2,3"}
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env[emulated.CGROUP_ENV] == "2,3"
    nvml2 = emulated.make_module(real, lambda: node, sleep=clock.sleep, environ=env)
    nvml2.nvmlInit()
    assert nvml2.nvmlDeviceGetCount() == 2
    h = nvml2.nvmlDeviceGetHandleByIndex(0)
    assert nvml2.nvmlDeviceGetUUID(h) == node.gpus[2].uuid
    assert nvml2.nvmlDeviceGetIndex(h) == 0
    with pytest.raises(real.NVMLError_NotFound):  # outside the job's cgroup
        nvml2.nvmlDeviceGetHandleByUUID(node.gpus[0].uuid)


def test_readings_stay_exact_when_the_shared_ring_wraps(tmp_path):
    resolved = emulated.prepare(tmp_path, section(), EPOCH_NS)
    clock = VirtualClock()
    node = Node(resolved, tmp_path, host="n", clock=clock, capacity=4000)
    owner = Owner(
        node,
        [0],
        emulated.FunctionActivity(lambda t: 1.0 if ((t - EPOCH_NS) // 10**9) % 2 else 0.0),
    )
    run_owner(owner, clock, 30.0, hz=200)  # 6000 samples through a ring of 4000
    view = node.view(0)
    assert len(view.state.segments()) == 2
    t = np.array([clock.at(s) for s in (21.0, 22.0, 25.5, 29.9)])
    e = view.energy_mj(t)
    assert e[1] - e[0] == pytest.approx(700_000)  # 21-22 s: busy
    assert e[2] - e[1] == pytest.approx(70_000 + 700_000 + 70_000 + 0.5 * 700_000)
    owner.close()
    assert truth.Truth.read(tmp_path).energy_mj(node.gpus[0].uuid, t[0], t[3]) == pytest.approx(
        e[3] - e[0]
    )


def test_a_refresh_shows_at_its_instant_whatever_the_owner_thread_does(tmp_path):
    """Counter visibility follows wall time (issue 31.2): while the owner's samples lag behind
    a refresh (a descheduled rank), readers see that refresh at its instant all the same, at
    the power the GPU held; the owner's late sample keeps to what they saw, so the reading never
    changes within a period and the truth is what the counter showed."""
    node, nvml, clock = make_node(tmp_path, counter_jitter_s=0.0)
    h = _gpu0(node, nvml)
    load = {"u": 1.0}
    owner = Owner(node, [0], emulated.FunctionActivity(lambda t: load["u"]))
    run_owner(owner, clock, 1.048, hz=250)  # samples up to ~1.048 s; refreshes at 1.0, 1.1
    before = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    clock.t = clock.at(1.15)  # past the 1.1 s refresh, the owner still at ~1.048 s
    seen = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert seen - before == pytest.approx(700 * 100, abs=1)  # 100 ms at 700 W, in mJ
    load["u"] = 0.0  # the rank went idle while its sampling thread was away
    owner.step(clock())
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(h) == seen  # unchanged by the late sample
    clock.t = clock.at(1.2)
    owner.step(clock())
    owner.close()
    t = truth.Truth.read(tmp_path)
    true = float(t.energy_mj(node.gpus[0].uuid, clock.at(1.0), clock.at(1.1)))
    assert seen - before == pytest.approx(true, abs=1)
