"""Window edges aligned to counter refreshes (energysweep.energy.ticks, energy/nvml.py) against the
emulated node's exact truth, in virtual time: each window is a load step out of idle, as the
window rule (cooldown, prepare, barrier, begin ... end) makes them."""

from __future__ import annotations

import pytest

import energysweep.energy.ticks as ticks
from energysweep.energy.nvml import NvmlSource
from energysweep.hw import nvml as hw_nvml
from energysweep.hw.emulated.truth import Truth

from emulated_helpers import VirtualJob


def errors_pct(tmp_path, monkeypatch, window_s: float, n: int = 4) -> list[float]:
    job = VirtualJob(tmp_path, 1, [])
    monkeypatch.setattr(hw_nvml, "pynvml", job.nvml)
    source = NvmlSource(job.uuids, clock=lambda: job.clock.t / 1e9, sleep=job.sleep)
    windows = []
    for k in range(n):
        job.sleep(2.0 + 0.013 * k)  # cooldown; edges land anywhere against the refreshes
        source.prepare()
        source.begin()
        start = job.clock.t
        job.busy = True
        job.sleep(window_s)
        job.busy = False
        end = job.clock.t
        (r,) = source.end()
        windows.append((start, end, r.energy_mj))
    job.sleep(1.0)
    job.owner.close()
    truth = Truth.read(tmp_path)
    out = []
    for start, end, mj in windows:
        true = float(truth.energy_mj(job.uuids[0], start, end))
        out.append(100 * (mj - true) / true)
    return out


def test_aligned_windows_match_the_truth(tmp_path, monkeypatch):
    errs = errors_pct(tmp_path, monkeypatch, 5.0)
    assert max(map(abs, errs)) < 0.1, errs  # bench/energy_accuracy.py: 0.09% worst at 5 s
    short = errors_pct(tmp_path / "short", monkeypatch, 0.5)
    assert max(map(abs, short)) < 1.0, short


def test_reading_at_the_edges_misplaces_up_to_a_refresh(tmp_path, monkeypatch):
    """Without alignment (no refresh awaited) the same windows are off by up to a period."""
    monkeypatch.setattr(ticks, "TIMEOUT_S", 0.0)
    errs = errors_pct(tmp_path, monkeypatch, 0.5)
    assert max(map(abs, errs)) > 2.0, errs  # a load step at an edge: up to 100 ms of 500


def test_a_stuck_counter_leaves_the_edge_unaligned_and_says_so(tmp_path, monkeypatch):
    job = VirtualJob(tmp_path, 1, [{"kind": "stuck_counter", "gpu": 0}])
    monkeypatch.setattr(hw_nvml, "pynvml", job.nvml)
    source = NvmlSource(job.uuids, clock=lambda: job.clock.t / 1e9, sleep=job.sleep)
    t0 = job.clock.t
    source.prepare()
    source.begin()
    job.sleep(1.0)
    (r,) = source.end()
    assert r.energy_mj == 0 and "did not refresh within 1.5 s" in r.detail
    assert (job.clock.t - t0) / 1e9 == pytest.approx(1.0 + 2 * ticks.TIMEOUT_S, abs=0.05)
