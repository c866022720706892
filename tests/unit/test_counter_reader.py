"""The independent reader of `make gpu-check` (scripts/gpu_check/counter_reader.py): each interval's
energy from 100 Hz reads of a counter that refreshes every 100 ms, against the exact energy."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "counter_reader", ROOT / "scripts/gpu_check/counter_reader.py"
)
reader = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reader)

S = 1_000_000_000  # ns


def power_w(t_ns: float) -> float:
    """Idle 120 W, 700 W between 10 s and 20 s (a window's load)."""
    return 700.0 if 10 * S <= t_ns < 20 * S else 120.0


def true_energy_j(a: float, b: float) -> float:
    """The exact integral of :func:`power_w` over [a, b] ns."""
    load = max(0.0, min(b, 20 * S) - max(a, 10 * S))
    return (120.0 * (b - a - load) + 700.0 * load) / S


def samples(period_ns=100_000_000, jitter=0.02, read_hz=100, seed=0):
    """(t_ns, energy_mj) read at ``read_hz`` of a counter refreshed every ~``period_ns``."""
    rng = random.Random(seed)
    refresh, t = [], 0.0
    while t < 30 * S:
        t += period_ns * (1 + rng.uniform(-jitter, jitter))
        refresh.append(t)
    values, e, last = [], 0.0, 0.0
    for r in refresh:
        e += true_energy_j(last, r) * 1e3
        values.append((r, int(e)))
        last = r
    out, k = [], 0
    for i in range(int(30 * read_hz)):
        t = i * S / read_hz + rng.uniform(0, 2e6)
        while k + 1 < len(values) and values[k + 1][0] <= t:
            k += 1
        out.append((int(t), values[k][1] if values[k][0] <= t else 0))
    return out


@pytest.mark.parametrize("a, b", [(10 * S, 20 * S), (9.53 * S, 20.47 * S), (12.3 * S, 17.8 * S)])
def test_window_energy_within_a_fraction_of_a_percent(a, b):
    """Edges at a load step from idle, or in a steady stretch: as the sweep's windows are (a
    cooldown before each). An edge 30 ms after a step would be charged the step's mix."""
    taus, vals = reader.refreshes(samples())
    got = reader.interval_energy_j(taus, vals, a, b)
    want = true_energy_j(a, b)
    assert got == pytest.approx(want, rel=0.003)


def test_idle_power_and_no_reading_beyond_the_samples():
    taus, vals = reader.refreshes(samples())
    assert reader.interval_energy_j(taus, vals, 2 * S, 7 * S) / 5 == pytest.approx(120, rel=0.003)
    assert reader.interval_energy_j(taus, vals, 25 * S, 31 * S) is None
    assert reader.interval_energy_j(taus, vals, 0, 5 * S) is None  # no refresh interval before


def test_energy_command_adds_the_reading_to_each_interval(tmp_path):
    (tmp_path / "s.csv").write_text(
        "source,gpu_uuid,t_ns,read_ns,energy_mj\n"
        + "".join(f",GPU-1,{t},1000,{e}\n" for t, e in samples())
    )
    (tmp_path / "i.csv").write_text(
        f"source,gpu_uuid,start_ns,end_ns,kind\n,GPU-1,{10 * S},{20 * S},window\n"
        f",GPU-2,{10 * S},{20 * S},window\n"
    )
    args = ["energy", "--samples", str(tmp_path / "s.csv"), "--intervals", str(tmp_path / "i.csv"),
            "--out", str(tmp_path / "o.csv")]  # fmt: skip
    assert reader.main(args) == 0
    rows = (tmp_path / "o.csv").read_text().splitlines()
    assert rows[0].endswith(",independent_j")
    assert float(rows[1].split(",")[-1]) == pytest.approx(7000, rel=0.003)
    assert rows[2].endswith(",")  # a GPU the reader did not read: no figure


def test_it_imports_none_of_energysweeps_energy_code():
    text = (ROOT / "scripts/gpu_check/counter_reader.py").read_text()
    imports = [line.strip() for line in text.splitlines() if "import " in line]
    assert not [i for i in imports if "energysweep" in i and "hw.emulated" not in i]


def test_on_the_h200s_own_reads_it_agrees_with_that_sessions_reader():
    """The H200 run 3's 100 Hz reads (tests/data/h200-run3): windows and idle as that
    session's independent reader found them (median 0.12% / worst 0.51% ours, 0.92% / 1.56%
    Zeus with a -0.79% bias; idle 122.4 / 121.3 W)."""
    import pandas as pd

    data = ROOT / "tests" / "data" / "h200-run3"
    s = pd.read_csv(data / "samples.csv.gz")
    taus, vals = reader.refreshes(list(zip(s["t_ns"], s["energy_mj"], strict=True)))
    w = pd.read_csv(data / "windows.csv")
    got = [
        reader.interval_energy_j(taus, vals, a, b)
        for a, b in zip(w["window_start_ns"], w["window_end_ns"], strict=True)
    ]
    ind = pd.Series(got, dtype=float)
    ours = (w["gpu_energy_mj"] / 1e3 - ind) / ind * 100
    zeus = (w["gpu_energy_mj_zeus"] / 1e3 - ind) / ind * 100
    assert len(w) == 18 and ind.notna().all()
    assert ours.abs().median() == pytest.approx(0.12, abs=0.03) and ours.abs().max() < 0.6
    assert zeus.abs().median() == pytest.approx(0.92, abs=0.1) and zeus.mean() < -0.6
    idle = pd.read_csv(data / "idle.csv")
    watts = [
        reader.interval_energy_j(taus, vals, a, b) / ((b - a) / 1e9)
        for a, b in zip(idle["idle_start_ns"], idle["idle_end_ns"], strict=True)
    ]
    assert watts == pytest.approx([122.4, 121.3], abs=0.5)
