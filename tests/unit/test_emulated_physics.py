"""The emulated GPU's power model and sensor timing (hw/emulated/physics.py), as pure functions."""

from __future__ import annotations

import numpy as np
import pynvml as real
import pytest

from energysweep.hw.emulated import physics
from energysweep.hw.emulated.profiles import PROFILES

H100 = PROFILES["h100-sxm"]


def test_reason_bits_are_nvmls():
    assert physics.GPU_IDLE == real.nvmlClocksEventReasonGpuIdle
    assert (
        physics.APPLICATIONS_CLOCKS_SETTING == real.nvmlClocksEventReasonApplicationsClocksSetting
    )
    assert physics.SW_POWER_CAP == real.nvmlClocksEventReasonSwPowerCap
    assert physics.HW_SLOWDOWN == real.nvmlClocksEventReasonHwSlowdown


def test_power_runs_from_idle_to_busy_with_activity():
    p, clock, reasons = physics.true_power(H100, [0.0, 0.5, 1.0], H100.max_sm_mhz, 700, False)
    assert p.tolist() == pytest.approx([70.0, 385.0, 700.0])
    assert clock.tolist() == [H100.idle_sm_mhz, 1980, 1980]
    assert reasons.tolist() == [physics.GPU_IDLE, 0, 0]


def test_power_limit_caps_true_power_and_lowers_the_clock():
    p, clock, reasons = physics.true_power(H100, 1.0, H100.max_sm_mhz, 300, False)
    assert float(p) == pytest.approx(300.0)
    assert int(reasons) == physics.SW_POWER_CAP
    # cubic model: (300 - 70) / 630 of dynamic power at f = 1980 * cbrt(230 / 630)
    assert 1980 * np.cbrt(230 / 630) - 15 < float(clock) <= 1980 * np.cbrt(230 / 630)


def test_a_lower_clock_scales_dynamic_power_cubically():
    p, clock, reasons = physics.true_power(H100, 1.0, 990, 700, False)
    assert float(p) == pytest.approx(70 + 630 / 8)
    assert float(clock) == 990
    assert int(reasons) == physics.APPLICATIONS_CLOCKS_SETTING


def test_a_throttle_episode_halves_the_clock():
    p, clock, reasons = physics.true_power(H100, 1.0, H100.max_sm_mhz, 700, True)
    assert float(clock) == 990
    assert float(p) == pytest.approx(70 + 630 / 8)
    assert int(reasons) & physics.HW_SLOWDOWN


def test_refresh_ticks_are_jittered_ordered_and_reproducible():
    period, jitter, epoch = 100_000_000, 5_000_000, 10**18
    k = np.arange(2000)
    ticks = physics.tick_ns(k, epoch, period, jitter, key=123)
    gaps = np.diff(ticks)
    assert gaps.min() >= period - 2 * jitter and gaps.max() <= period + 2 * jitter
    assert gaps.std() > 0  # jittered
    assert (physics.tick_ns(k, epoch, period, jitter, key=123) == ticks).all()
    assert (physics.tick_ns(k, epoch, period, jitter, key=124) != ticks).any()
    # last_tick finds, for any instant, the refresh at or before it
    t = epoch + np.arange(0, 10**11, 7_777_777)
    kk, tk = physics.last_tick(t, epoch, period, jitter, key=123)
    assert (tk <= t).all()
    assert (physics.tick_ns(kk + 1, epoch, period, jitter, key=123) > t).all()


def test_power_reading_averages_only_the_sampled_part_of_each_period():
    # E(t) of 100 W during the last quarter of each 100 ms period, 0 W otherwise.
    period = 100_000_000

    def energy(t):
        t = np.asarray(t, dtype=np.int64)
        whole, rest = np.divmod(t, period)
        return (whole * 25 + np.clip(rest - 75_000_000, 0, None) / 1e6) * 100  # mJ at 100 W

    seen = physics.power_reading_w(energy, 50, 0, period, 0, 1, 1_000_000_000, 0.25)
    blind = physics.power_reading_w(
        lambda t: energy(np.asarray(t) - 50_000_000), 50, 0, period, 0, 1, 1_000_000_000, 0.25
    )
    full = physics.power_reading_w(energy, 50, 0, period, 0, 1, 1_000_000_000, 1.0)
    assert float(seen) == pytest.approx(100.0)  # every busy moment sampled
    assert float(blind) == pytest.approx(0.0)  # busy only where the sensor does not look
    assert float(full) == pytest.approx(25.0)  # the true mean
