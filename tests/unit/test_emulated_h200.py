"""The h200-sxm profile against the H200 it was fitted to (tests/data/h200/, a copy of the probe
in ../shared/data/h200/; reference/real-gpu-h200.md; constants from bench/fit_h200_profile.py).

The recorded step response is replayed: the counter's per-refresh power of the real probe
(8192^2 bf16 matmuls, 1 s on / 1 s off) drives an emulated H200's true power on a virtual
clock, and the emulator's averaged power, counter and instant field are read at the probe's own
read instants and held to what the real GPU reported there.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from energysweep.hw.emulated import Owner
from energysweep.hw.emulated.profiles import PROFILES

from emulated_helpers import EPOCH_NS, make_node, run_owner, steady

DATA = Path(__file__).resolve().parents[1] / "data" / "h200"
H200 = PROFILES["h200-sxm"]
# The real averaged power after the first 125 -> ~715 W step (reference/real-gpu-h200.md).
STEP_S = (0.5, 0.75, 1.0, 1.25)
STEP_W = (227, 407, 517, 587)
# Bounds: one refresh of the step is ~60 W of a 1 s average, and the emulated refresh instants
# follow the real ones only to the jitter; the whole-probe rms is the fit's (20.8 W) with room.
STEP_BOUND_W = 25.0
RMS_BOUND_W = 26.0


def _probe():
    probe = pd.read_csv(DATA / "probe.csv.gz")
    edges = pd.read_csv(DATA / "probe-edges.csv")
    t0, t1, mj = (probe[c].to_numpy() for c in ("t0_ns", "t1_ns", "energy_mj"))
    i = np.flatnonzero(np.diff(mj) != 0) + 1
    at = (t1[i - 1] + t1[i]) // 2  # each refresh: between the read before and the first seeing it
    return probe, edges, at, mj[i]


def _replayed(tmp_path, **overrides):
    """(nvml, handle, shift ns, probe, edges, at): an emulated H200 whose true power is the
    probe's counter power (over the counter's gain), refresh instants on the probe's."""
    probe, edges, at, e = _probe()
    node, nvml, clock = make_node(tmp_path, profile="h200-sxm", counter_jitter_s=0.0, **overrides)
    period = int(round(node.settings.counter_period_s * 1e9))
    shift = EPOCH_NS + 20 * period - int(at[0])  # the first refresh on an emulated one
    clock.t = int(at[0]) + shift
    owner = Owner(node, [0], steady(0.0))
    watts = np.diff(e) / np.diff(at) * 1e6 / node.settings.counter_gain
    owner.replay(at[1:] + shift, watts)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    return nvml, h, clock, shift, probe, edges, at, owner


def test_the_recorded_step_response_replays_within_bounds(tmp_path):
    nvml, h, clock, shift, probe, edges, at, owner = _replayed(tmp_path)
    t1 = probe["t1_ns"].to_numpy()
    inside = (t1 > at[11]) & (t1 < at[-1])  # a whole averaging window of replayed power
    emulated, recorded = [], probe["power_mw"].to_numpy()[inside] / 1e3
    for t in t1[inside]:
        clock.t = int(t) + shift
        emulated.append(nvml.nvmlDeviceGetPowerUsage(h) / 1e3)
    rms = float(np.sqrt(np.mean((np.array(emulated) - recorded) ** 2)))
    assert rms <= RMS_BOUND_W, rms
    on = int(edges.loc[edges["edge"] == "on", "t_ns"].iloc[0])
    for dt, real_w in zip(STEP_S, STEP_W, strict=True):
        read_at = t1[np.searchsorted(t1, on + int(dt * 1e9))]  # the probe's first read then
        clock.t = int(read_at) + shift
        got = nvml.nvmlDeviceGetPowerUsage(h) / 1e3
        assert abs(got - real_w) <= STEP_BOUND_W, (dt, got, real_w)


def test_counter_and_instant_field_match_the_real_ones(tmp_path):
    """The emulated counter over the probe reads what the real one read (its gain undone and
    redone); the instant field integrates to the real 1.0033 of the counter."""
    nvml, h, clock, shift, probe, _, at, _ = _replayed(tmp_path)
    import pynvml as real

    clock.t = int(at[1]) + shift
    a = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    clock.t = int(at[-1]) + shift
    b = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    _, _, _, e = _probe()
    assert (b - a) / (e[-1] - e[1]) == pytest.approx(1.0, abs=0.002)
    t1 = probe["t1_ns"].to_numpy()
    t1 = t1[(t1 > at[1]) & (t1 < at[-1])]
    inst = []
    for t in t1:
        clock.t = int(t) + shift
        v = nvml.nvmlDeviceGetFieldValues(h, [(real.NVML_FI_DEV_POWER_INSTANT, 0)])[0]
        inst.append(v.value.uiVal / 1e3)
    ratio = np.trapezoid(inst, t1 / 1e9) / ((e[-1] - e[1]) / 1e3)
    assert ratio == pytest.approx(1.0033, abs=0.01)


def test_read_latencies_follow_the_measured_distribution(tmp_path):
    node, nvml, clock = make_node(tmp_path, profile="h200-sxm")
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    taken = []
    for _ in range(3000):
        t = clock()
        nvml.nvmlDeviceGetTotalEnergyConsumption(h)
        taken.append((clock() - t) / 1e9)
    median, p90 = np.quantile(taken, [0.5, 0.9])
    assert 0.0024 <= median <= 0.0029 and 0.005 <= p90 <= 0.0075, (median, p90)
    assert max(taken) <= 0.186
    t = clock()
    nvml.nvmlDeviceGetPowerUsage(h)
    assert (clock() - t) / 1e9 == pytest.approx(2e-6)


def test_idle_without_and_with_a_context_and_hbm_apart(tmp_path):
    """79 W with no CUDA context, 124 W once one is up (an owner attaches), as the counter of
    the real H200 read them (78.7 / 123.9 W: the truth times the counter's gain)."""
    import pynvml as real

    node, nvml, clock = make_node(tmp_path, profile="h200-sxm")
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)

    def counter_w(seconds):
        a = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
        ta = int(node.view(0).tick(clock())[1])  # the refresh it shows (reads take random time)
        if owner is None:
            clock.sleep(seconds)
        else:
            run_owner(owner, clock, seconds)
        b = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
        tb = int(node.view(0).tick(clock())[1])
        return (b - a) / ((tb - ta) / 1e9) / 1e3

    owner = None
    assert counter_w(10.0) == pytest.approx(78.7, abs=0.3)
    owner = Owner(node, [0], steady(0.0))
    run_owner(owner, clock, 0.5)
    assert counter_w(10.0) == pytest.approx(123.9, abs=0.3)
    v = nvml.nvmlDeviceGetFieldValues(h, [(real.NVML_FI_DEV_POWER_INSTANT, 2)])[0]
    assert v.nvmlReturn == real.NVML_SUCCESS and v.value.uiVal == 41_000  # HBM, scope memory


def test_the_counter_is_a_sensor_with_gain_offset_noise_and_delay(tmp_path):
    """Counter delta between two refreshes = gain x true energy between the instants ``delay``
    before them + offset x time + the two refreshes' noise; the truth stays the truth."""
    from energysweep.hw.emulated import physics, truth

    node, nvml, clock = make_node(
        tmp_path, counter_gain=0.98, counter_offset_w=5.0, counter_noise_mj=50.0,
        counter_delay_s=0.02, counter_jitter_s=0.0,
    )  # fmt: skip
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    step = lambda t: 1.0 if t >= clock.at(1.05) else 0.0  # noqa: E731 (a step between refreshes)
    from energysweep.hw import emulated

    owner = Owner(node, [0], emulated.FunctionActivity(step))
    run_owner(owner, clock, 2.0)
    view = node.view(0)
    (ka, ta), (kb, tb) = (view.tick(clock.at(x)) for x in (1.0, 1.3))
    saved = clock.t
    clock.t = int(ta)
    a = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    clock.t = int(tb)
    b = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    clock.t = saved
    owner.close()
    t = truth.Truth.read(tmp_path)
    d = int(0.02e9)
    true = float(t.energy_mj(node.gpus[0].uuid, int(ta) - d, int(tb) - d))
    noise = physics.noise_mj([kb, ka], view.key, 50.0)
    expected = 0.98 * true + 5.0 * (tb - ta) / 1e6 + noise[0] - noise[1]
    assert b - a == pytest.approx(float(expected), abs=1.5)  # mJ: the counter is an integer
    assert abs(noise).max() > 0  # the noise is there (fixed per refresh)
