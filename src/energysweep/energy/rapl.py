"""Host energy from Linux RAPL (package + DRAM zones, read through :mod:`energysweep.hw.rapl`).

Only local rank 0 of each node reads it (the counters are per node), see
:func:`make_host_source`. An unreadable counter (root only since Linux 5.10, CVE-2020-8694) or
a machine without RAPL is *unavailable*, never 0.
"""

from __future__ import annotations

from pathlib import Path

from energysweep.energy.base import (
    EnergySource,
    HostReading,
    wall_ns,
)
from energysweep.hw.rapl import POWERCAP, delta_uj, find_zones
from energysweep.tables.status import EnergyStatus

METHOD = "rapl-powercap"
HOST_SOURCES = ("auto", "rapl", "none")


class RaplSource(EnergySource[HostReading]):
    """Package (+ DRAM) energy of this node over a window."""

    name = "rapl"
    available = True

    def __init__(self, root: Path = POWERCAP):
        self.packages, self.drams = find_zones(Path(root))
        if not self.packages:
            raise FileNotFoundError(f"no RAPL package zone under {root}")
        # Read once now so a permission problem surfaces at setup, not in the first window.
        self._read()
        self._start: tuple[list[int], list[int]] | None = None
        self._start_ns: int | None = None

    def _read(self) -> tuple[list[int], list[int]]:
        return [z.read_uj() for z in self.packages], [z.read_uj() for z in self.drams]

    def begin(self) -> None:
        self._start_ns = wall_ns()
        self._start = self._read()

    def end(self) -> HostReading:
        if self._start is None or self._start_ns is None:
            raise RuntimeError("end() without begin()")
        pkg_end, dram_end = self._read()
        pkg_start, dram_start = self._start
        pkg = sum(
            delta_uj(a, b, z.max_uj)
            for z, a, b in zip(self.packages, pkg_start, pkg_end, strict=True)
        )
        dram = sum(
            delta_uj(a, b, z.max_uj)
            for z, a, b in zip(self.drams, dram_start, dram_end, strict=True)
        )
        names = ",".join(z.name for z in self.packages)
        return HostReading(
            pkg / 1e3,
            dram / 1e3 if self.drams else None,
            EnergyStatus.MEASURED,
            METHOD,
            f"zones {names}" + (" + dram" if self.drams else "; no dram zone"),
        )

    def close(self) -> None:
        pass


class UnavailableHostSource(EnergySource[HostReading]):
    """Host energy not read here; every window says why."""

    name = "none"
    available = False

    def __init__(self, status: str, reason: str):
        self.status = status
        self.reason = reason

    def begin(self) -> None:
        pass

    def end(self) -> HostReading:
        return HostReading(None, None, self.status, METHOD, self.reason)

    def close(self) -> None:
        pass


def make_host_source(kind: str, local_rank: int, root: Path = POWERCAP):
    """The host energy source of one rank: RAPL on local rank 0 where readable.

    Args:
        kind: ``auto`` (RAPL where readable, else unavailable), ``rapl`` (fail if not
            readable), or ``none`` (config key measurement.host_energy_source).
        local_rank: the rank's index on its node; only local rank 0 reads the node's counters.
        root: the powercap sysfs directory (tests pass a fake tree).
    """
    if kind not in HOST_SOURCES:
        raise ValueError(f"measurement.host_energy_source {kind!r}: expected one of {HOST_SOURCES}")
    if kind == "none":
        return UnavailableHostSource(
            EnergyStatus.UNAVAILABLE, "host energy disabled (measurement.host_energy_source: none)"
        )
    if local_rank != 0:
        return UnavailableHostSource(EnergyStatus.NOT_READ, "read by local rank 0 of this host")
    try:
        return RaplSource(root)
    except (OSError, ValueError) as exc:
        if kind == "rapl":
            raise RuntimeError(
                f"measurement.host_energy_source is rapl but RAPL is not readable here: {exc} "
                "(needs /sys/class/powercap/intel-rapl:*/energy_uj readable; often root only)"
            ) from exc
        reason = (
            f"RAPL energy_uj not readable ({exc.strerror or exc}); root only since Linux 5.10"
            if isinstance(exc, PermissionError) and exc.filename
            else f"RAPL not available: {exc}"
        )
        return UnavailableHostSource(EnergyStatus.UNAVAILABLE, reason)
