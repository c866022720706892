"""Linux RAPL through powercap sysfs (``/sys/class/powercap``): finding and reading the zones.

What is read: every top-level ``intel-rapl:N`` zone named ``package-*`` (one per CPU socket;
the AMD driver exposes the same layout) and its ``dram`` subzone where present. ``psys`` and
the ``intel-rapl-mmio`` duplicates are skipped so nothing is counted twice.

Facts this relies on:
- ``energy_uj`` is cumulative µJ and wraps at ``max_energy_range_uj``; one wrap per window is
  corrected, more cannot be detected (a 262 kJ range wraps after ~20 min at 200 W, far longer
  than a window).
- Since Linux 5.10 (CVE-2020-8694) ``energy_uj`` is readable by root only on most distributions;
  reading it then raises ``PermissionError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

POWERCAP = Path("/sys/class/powercap")


@dataclass
class Zone:
    """One RAPL zone: its sysfs directory, name and counter range."""

    path: Path
    name: str
    max_uj: int

    def read_uj(self) -> int:
        return int((self.path / "energy_uj").read_text().strip())


def find_zones(root: Path = POWERCAP) -> tuple[list[Zone], list[Zone]]:
    """(package zones, dram zones) under ``root``; empty lists where RAPL is not exposed."""
    packages: list[Zone] = []
    drams: list[Zone] = []
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
        packages.append(Zone(top, name, int((top / "max_energy_range_uj").read_text())))
        for sub in sorted(top.glob(f"{top.name}:*")):
            if (sub / "name").is_file() and (sub / "name").read_text().strip() == "dram":
                drams.append(Zone(sub, "dram", int((sub / "max_energy_range_uj").read_text())))
    return packages, drams


def delta_uj(start: int, end: int, max_uj: int) -> int:
    """µJ between two readings of one zone, corrected for one wrap."""
    return end - start if end >= start else end + max_uj - start
