"""RAPL host energy from a fake powercap sysfs tree (the layout Linux exposes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from energysweep.energy import rapl
from energysweep.hw import rapl as hw_rapl

MAX_UJ = 262_143_328_850


def zone(path: Path, name: str, energy_uj: int, max_uj: int = MAX_UJ) -> Path:
    path.mkdir(parents=True)
    (path / "name").write_text(f"{name}\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return path


def set_uj(path: Path, value: int) -> None:
    (path / "energy_uj").write_text(f"{value}\n")


@pytest.fixture
def powercap(tmp_path):
    """Two sockets with DRAM subzones, a psys zone and an mmio duplicate (both not counted)."""
    root = tmp_path / "powercap"
    p0 = zone(root / "intel-rapl:0", "package-0", 1_000_000)
    d0 = zone(root / "intel-rapl:0" / "intel-rapl:0:0", "dram", 50_000)
    zone(root / "intel-rapl:0" / "intel-rapl:0:1", "core", 7)
    p1 = zone(root / "intel-rapl:1", "package-1", 2_000_000)
    d1 = zone(root / "intel-rapl:1" / "intel-rapl:1:0", "dram", 60_000)
    psys = zone(root / "intel-rapl:2", "psys", 5)
    mmio = zone(root / "intel-rapl-mmio:0", "package-0", 9)
    return root, {"p0": p0, "p1": p1, "d0": d0, "d1": d1, "psys": psys, "mmio": mmio}


def test_packages_and_dram_summed(powercap):
    root, z = powercap
    src = rapl.make_host_source("auto", local_rank=0, root=root)
    assert src.available and [p.name for p in src.packages] == ["package-0", "package-1"]
    src.begin()
    set_uj(z["p0"], 1_000_000 + 30_000_000)
    set_uj(z["p1"], 2_000_000 + 20_000_000)
    set_uj(z["d0"], 50_000 + 4_000_000)
    set_uj(z["d1"], 60_000 + 1_000_000)
    set_uj(z["psys"], 10**9)  # platform zone: overlaps the packages, never added
    r = src.end()
    assert (r.energy_mj, r.dram_energy_mj, r.status) == (50_000.0, 5_000.0, "measured")
    assert r.method == "rapl-powercap" and "package-0,package-1" in r.detail


def test_counter_wrap_corrected(powercap):
    root, z = powercap
    src = rapl.RaplSource(root)
    set_uj(z["p0"], MAX_UJ - 1_000)
    src.begin()
    set_uj(z["p0"], 4_000)  # wrapped once
    assert src.end().energy_mj == pytest.approx(5.0)


def test_only_local_rank_zero_reads(powercap):
    root, _ = powercap
    r = rapl.make_host_source("rapl", local_rank=1, root=root).end()
    assert (r.energy_mj, r.status) == (None, "not-read")
    assert "local rank 0" in r.detail


def test_missing_rapl_is_unavailable_not_zero(tmp_path):
    src = rapl.make_host_source("auto", local_rank=0, root=tmp_path / "none")
    src.begin()
    r = src.end()
    assert (r.energy_mj, r.dram_energy_mj, r.status) == (None, None, "unavailable")
    assert "no RAPL package zone" in r.detail
    with pytest.raises(RuntimeError, match="host_energy_source is rapl"):
        rapl.make_host_source("rapl", local_rank=0, root=tmp_path / "none")


def test_unreadable_energy_is_unavailable(powercap, monkeypatch):
    # Since Linux 5.10 energy_uj is mode 0400 root (CVE-2020-8694); we may run as root here,
    # so the kernel's answer to an unprivileged read is raised directly.
    root, z = powercap

    def denied(zone):
        raise PermissionError(13, "Permission denied", str(zone.path / "energy_uj"))

    monkeypatch.setattr(hw_rapl.Zone, "read_uj", denied)
    r = rapl.make_host_source("auto", local_rank=0, root=root).end()
    assert r.status == "unavailable" and r.energy_mj is None and "root only" in r.detail


def test_disabled():
    r = rapl.make_host_source("none", local_rank=0).end()
    assert r.status == "unavailable" and "host_energy_source: none" in r.detail
