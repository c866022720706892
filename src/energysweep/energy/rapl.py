"""Host energy from Linux RAPL through powercap sysfs (``/sys/class/powercap``).

What is read: every top-level ``intel-rapl:N`` zone named ``package-*`` (one per CPU socket;
the AMD driver exposes the same layout) and its ``dram`` subzone where present. ``psys`` and
the ``intel-rapl-mmio`` duplicates are skipped so nothing is counted twice. Only local rank 0
of each node reads it (the counters are per node), see :func:`make_host_source`.

Facts this relies on:
- ``energy_uj`` is cumulative µJ and wraps at ``max_energy_range_uj``; one wrap per window is
  corrected, more cannot be detected (a 262 kJ range wraps after ~20 min at 200 W, far longer
  than a window).
- Since Linux 5.10 (CVE-2020-8694) ``energy_uj`` is readable by root only on most distributions;
  a permission error is *unavailable*, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from energysweep.energy import STATUS_MEASURED, STATUS_NOT_READ, STATUS_UNAVAILABLE, wall_ns

POWERCAP = Path("/sys/class/powercap")
METHOD = "rapl-powercap"
HOST_SOURCES = ("auto", "rapl", "none")


@dataclass
class HostReading:
    """Energy of one node's CPU packages (and DRAM) over one window."""

    energy_mj: float | None
    dram_energy_mj: float | None
    status: str
    method: str
    detail: str = ""


@dataclass
class _Zone:
    path: Path
    name: str
    max_uj: int

    def read_uj(self) -> int:
        return int((self.path / "energy_uj").read_text().strip())


def find_zones(root: Path = POWERCAP) -> tuple[list[_Zone], list[_Zone]]:
    """(package zones, dram zones) under ``root``; empty lists where RAPL is not exposed."""
    packages, drams = [], []
    if not root.is_dir():
        return packages, drams
    for top in sorted(root.glob("intel-rapl:*")):
        if top.name.count(":") != 1 or not (top / "name").is_file():
            continue
        if not top.name.split(":")[1].isdigit():
            continue
        name = (top / "name").read_text().strip()
        if not name.startswith("package"):
            continue  # psys (platform) overlaps the packages
        packages.append(_Zone(top, name, int((top / "max_energy_range_uj").read_text())))
        for sub in sorted(top.glob(f"{top.name}:*")):
            if (sub / "name").is_file() and (sub / "name").read_text().strip() == "dram":
                drams.append(_Zone(sub, "dram", int((sub / "max_energy_range_uj").read_text())))
    return packages, drams


def _delta_uj(start: int, end: int, max_uj: int) -> int:
    return end - start if end >= start else end + max_uj - start


class RaplSource:
    """Package (+ DRAM) energy of this node over a window."""

    name = "rapl"
    available = True

    def __init__(self, root: Path = POWERCAP):
        self.packages, self.drams = find_zones(Path(root))
        if not self.packages:
            raise FileNotFoundError(f"no RAPL package zone under {root}")
        # Read once now so a permission problem surfaces at setup, not in the first window.
        self._read()
        self._start = None
        self._start_ns = None

    def _read(self) -> tuple[list[int], list[int]]:
        return [z.read_uj() for z in self.packages], [z.read_uj() for z in self.drams]

    def begin(self) -> None:
        self._start_ns = wall_ns()
        self._start = self._read()

    def end(self) -> HostReading:
        pkg_end, dram_end = self._read()
        pkg_start, dram_start = self._start
        pkg = sum(
            _delta_uj(a, b, z.max_uj)
            for z, a, b in zip(self.packages, pkg_start, pkg_end, strict=True)
        )
        dram = sum(
            _delta_uj(a, b, z.max_uj)
            for z, a, b in zip(self.drams, dram_start, dram_end, strict=True)
        )
        names = ",".join(z.name for z in self.packages)
        return HostReading(
            pkg / 1e3,
            dram / 1e3 if self.drams else None,
            STATUS_MEASURED,
            METHOD,
            f"zones {names}" + (" + dram" if self.drams else "; no dram zone"),
        )

    def close(self) -> None:
        pass


class UnavailableHostSource:
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
            STATUS_UNAVAILABLE, "host energy disabled (measurement.host_energy_source: none)"
        )
    if local_rank != 0:
        return UnavailableHostSource(STATUS_NOT_READ, "read by local rank 0 of this host")
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
        return UnavailableHostSource(STATUS_UNAVAILABLE, reason)
