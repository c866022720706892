"""The interface every energy source implements, and the readings and statuses they return.

A source measures *windows*: ``begin()`` at the window's start edge, ``end()`` at its end edge.
GPU sources return one :class:`GpuReading` per GPU they measured, host sources one
:class:`HostReading` per node. Where nothing could be measured a reading's energy is ``None``
and its ``status`` (:class:`energysweep.tables.status.EnergyStatus`) says why: never 0.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Generic, TypeVar

from energysweep.tables.status import EnergyStatus


@dataclass
class GpuReading:
    """Energy of one GPU over one window."""

    gpu_uuid: str | None
    gpu_index: int | None
    gpu_pci_bus_id: str | None
    gpu_name: str | None
    energy_mj: float | None
    status: str
    method: str
    detail: str = ""
    # Cross-check only: Zeus's figure for the same GPU and window.
    energy_mj_zeus: float | None = None
    zeus_status: str = EnergyStatus.NOT_REQUESTED
    # Which source produced the reading (the shard column energy_source).
    source: str = "none"
    # The slowest counter read behind the window's aligned edges, ms (energy/ticks.py); None
    # where the source reads no counter at aligned edges.
    edge_read_ms: float | None = None
    # Seconds from the start edge to the end edge on the source's own clock: the interval the
    # energy covers. None where the source keeps no edges of its own (its caller's clock holds).
    window_s: float | None = None


@dataclass
class HostReading:
    """Energy of one node's CPU packages (and DRAM) over one window."""

    energy_mj: float | None
    dram_energy_mj: float | None
    status: str
    method: str
    detail: str = ""


class SourceUnavailable(RuntimeError):
    """A source cannot measure here (no GPU, no driver, unsupported setup); the text says why."""


ReadingT = TypeVar("ReadingT")


class EnergySource(ABC, Generic[ReadingT]):
    """One instance per rank, reused for every window of a job.

    ``ReadingT`` is what a window gives: ``list[GpuReading]`` for GPU sources, a
    :class:`HostReading` for host sources, CPU seconds for :class:`~.cputime.CpuTime`.
    """

    name = "base"
    available = True

    def prepare(self) -> None:
        """Before the start edge (the window rule calls it, then a barrier, then
        :meth:`begin`): wait for whatever the start reading needs (the NVML source: counter
        refreshes). Default: nothing; :meth:`begin` without it must still work."""

    @abstractmethod
    def begin(self) -> None:
        """Read the counters at the window's start edge."""

    @abstractmethod
    def end(self) -> ReadingT:
        """Read the counters at the window's end edge; the window's reading."""

    def load_goes_on_after_end(self) -> None:
        """Says that the load goes on after each end edge until :meth:`end` returns (a server
        serves until the edge's counters are read): an end correction over more than a counter
        period is then a guess (the NVML source flags it). Default: nothing to change."""

    def close(self) -> None:
        """Release the library handle (idempotent)."""


def wall_ns() -> int:
    """Wall-clock time in ns since the epoch (window bounds must line up across ranks and hosts)."""
    return time.time_ns()
