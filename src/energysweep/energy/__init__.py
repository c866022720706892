"""Energy sources behind one interface, and the factory that picks one for a rank.

A source measures *windows* (:class:`~energysweep.energy.base.EnergySource`: ``begin()`` at the
window's start edge, ``end()`` at its end edge). Where nothing could be measured a reading's
energy is ``None`` and its ``status`` says why: never 0. One file per source:

- ``nvml``: NVML's cumulative energy counter per GPU, resolved by UUID (energy/nvml.py);
- ``zeus``: Zeus's ``ZeusMonitor`` windows for the same GPUs (energy/zeus.py);
- ``cross-check``: both for the same window; NVML in ``energy_mj``, Zeus in ``energy_mj_zeus``
  (energy/crosscheck.py);
- ``auto``: NVML where a GPU is in use, otherwise unavailable (recorded, never 0;
  energy/unavailable.py);
- ``none``: nothing measured.
Host energy (RAPL package + DRAM, energy/rapl.py) is a second, per-node source chosen by
``measurement.host_energy_source`` and read by local rank 0 only; a rank's process CPU time is
energy/cputime.py. The hardware itself is read in :mod:`energysweep.hw`.

Counting rule (README, Methodology): every rank reports the GPUs it measured, keyed by UUID;
aggregation sums *distinct* UUIDs per window, so a GPU seen by two ranks counts once.

This module holds the factory (:func:`make_source`) and re-exports the interface's names.
"""

from __future__ import annotations

import os
import time

from energysweep.energy.base import (
    EnergySource,
    GpuReading,
    HostReading,
    SourceUnavailable,
    wall_ns,
)
from energysweep.energy.cputime import CpuTime
from energysweep.energy.unavailable import UnavailableSource

__all__ = [
    "GPU_SOURCES",
    "CpuTime",
    "EnergySource",
    "GpuReading",
    "HostReading",
    "SourceUnavailable",
    "UnavailableSource",
    "make_source",
    "wall_ns",
]

GPU_SOURCES = ("auto", "nvml", "zeus", "cross-check", "none")


def _nvml(gpu_uuids: list[str], clock=None, sleep=None) -> EnergySource:
    from energysweep.energy.nvml import NvmlSource

    if clock is None:
        return NvmlSource(gpu_uuids)
    return NvmlSource(gpu_uuids, clock=clock, sleep=sleep or time.sleep, background=False)


def _zeus(gpu_uuids: list[str]) -> EnergySource:
    from energysweep.energy.zeus import ZeusSource

    return ZeusSource(gpu_uuids)


def make_source(
    kind: str, device: str, gpu_uuids: list[str], clock=None, sleep=None
) -> EnergySource:
    """Factory: the GPU energy source for ``kind`` on a rank that computes on ``device``.

    An explicitly requested source that cannot work raises (the config asked for it); ``auto``
    falls back to an :class:`UnavailableSource` that records why in every row.

    Args:
        kind: one of :data:`GPU_SOURCES` (config key measurement.energy_source).
        device: the torch device string the rank computes on (``cpu``, ``cuda:0``).
        gpu_uuids: the GPUs this rank measures, by UUID (``GPU-…``); none: no GPU energy.
        clock, sleep: a virtual clock (seconds) and its sleep, for tests that drive time: the
            NVML source then waits and stamps its edges on them, with no watching thread.
            None: real time.
    """
    from energysweep.hw import nvml as hw_nvml

    if kind not in GPU_SOURCES:
        raise ValueError(f"measurement.energy_source {kind!r}: expected one of {GPU_SOURCES}")
    if kind == "none":
        return UnavailableSource("energy measurement disabled (measurement.energy_source: none)")
    if not gpu_uuids:  # a CPU rank (on the emulated node, CPU ranks own emulated GPUs)
        if kind != "auto":
            raise RuntimeError(
                f"measurement.energy_source is {kind} but this rank computes on {device!r} "
                "with no GPU; use auto or none, or run on a GPU"
            )
        return UnavailableSource(f"no GPU in use (device={device})", method="nvml")
    try:
        hw_nvml.refuse_mig(os.environ.get("CUDA_VISIBLE_DEVICES"))
    except hw_nvml.MigSlice as exc:
        if kind != "auto":
            raise SourceUnavailable(str(exc)) from exc
        return UnavailableSource(str(exc), method="nvml")
    if kind == "zeus":
        return _zeus(gpu_uuids)
    if kind == "cross-check":
        from energysweep.energy.crosscheck import CrossCheckSource

        return CrossCheckSource(_nvml(gpu_uuids, clock, sleep), _zeus(gpu_uuids))
    try:
        return _nvml(gpu_uuids, clock, sleep)
    except Exception as exc:  # NVMLError subclasses: missing driver, no permission, ...
        if kind == "nvml":
            raise
        what = "GPU not found by NVML" if "NotFound" in type(exc).__name__ else "NVML unavailable"
        return UnavailableSource(f"{what}: {type(exc).__name__}: {exc}", method="nvml")
