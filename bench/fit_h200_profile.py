"""Fit the emulated ``h200-sxm`` profile to the traces of a real H200 (data/h200/).

Reads the traces recorded on one NVIDIA H200 (driver 580.159.04; reference/real-gpu-h200.md):
``probe.csv.gz`` (an NVML poll as fast as a thread can, each energy read bracketed by t0/t1, while
8192^2 bf16 matmuls ran 1 s on / 1 s off), ``probe-edges.csv`` (the load's on/off instants) and
``samples-run3.csv.gz`` (an independent 100 Hz reader during a sweep, idle with and without a
CUDA context). Prints the constants that hw/emulated/profiles.py holds for ``h200-sxm``, each
with the figure it comes from; profiles.py names this script as their source.

    .venv/bin/python bench/fit_h200_profile.py [--data DIR]   # ~5 s (--quick: the same)

What it fits (and how):
- counter refresh period and jitter: the instants the counter shows a new value (midpoint of the
  read that first shows it and the one before), median interval and half the p10-p90 spread;
- energy read latency: quantiles of t1 - t0 of every energy read (a seeded inverse-CDF sampler
  draws from them, hw/emulated/physics.py::read_latency_s);
- idle power without and with a CUDA context: counter power over the 100 Hz reader's idle
  stretches (instant field below / above 100 W, no load);
- the averaging window of nvmlDeviceGetPowerUsage and its sampled fraction: the window and
  coverage whose emulated reading, driven by the counter's own per-refresh power, best matches
  the recorded averaged power over the whole probe (least squares over a grid);
- the sensors' gains: whole-probe integral of instant / averaged power over the counter's energy;
- counter noise: robust spread of the counter's per-refresh increments at steady idle;
  publication delay: where the counter puts each load-on step against the load's CPU stamp.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# The traces (a copy of ../shared/data/h200/'s probe and run-3 reader, as recorded).
DATA = ROOT / "tests" / "data" / "h200"
QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0)


def load(data: Path):
    import pandas as pd

    probe = pd.read_csv(data / "probe.csv.gz")
    edges = pd.read_csv(data / "probe-edges.csv")
    samples = pd.read_csv(data / "samples-run3.csv.gz")
    return probe, edges, samples


def refreshes(t0: np.ndarray, t1: np.ndarray, energy: np.ndarray):
    """(instant ns, counter mJ) of each refresh seen: midpoint of the bracketing reads."""
    i = np.flatnonzero(np.diff(energy) != 0) + 1
    at = (t1[i - 1] + t1[i]) // 2
    return at, energy[i]


def counter_power(at: np.ndarray, mj: np.ndarray):
    """(interval ends ns, W) of the counter between consecutive refreshes."""
    return at[1:], np.diff(mj) / np.diff(at) * 1e6


def fit_latency(probe) -> dict:
    lat = (probe["t1_ns"] - probe["t0_ns"]).to_numpy() / 1e9
    return {
        "energy_read_latency_q": tuple(
            (q, round(float(np.quantile(lat, q)), 6)) for q in QUANTILES
        ),
        "n_reads": len(lat),
    }


def fit_refresh(probe) -> dict:
    at, _ = refreshes(*(probe[c].to_numpy() for c in ("t0_ns", "t1_ns", "energy_mj")))
    d = np.diff(at) / 1e9
    d = d[d < 0.15]  # a refresh missed between two slow reads is not a period
    p10, p50, p90 = np.quantile(d, [0.1, 0.5, 0.9])
    return {
        "counter_period_s": round(float(p50), 4),
        "counter_jitter_s": round(float((p90 - p10) / 2), 4),
        "n_refreshes": len(d) + 1,
    }


def fit_idle(samples) -> dict:
    """Counter power over 1 s stretches of the 100 Hz reader where every instant reading is
    idle: below 100 W (no context) or 100-140 W (context, nothing running)."""
    t = samples["t_ns"].to_numpy()
    e = samples["energy_mj"].to_numpy()
    inst = samples["inst_mw"].to_numpy() / 1e3
    out = {"no_context": [], "context": []}
    edges = np.arange(t[0], t[-1], int(1e9))
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        m = (t >= a) & (t < b)
        if m.sum() < 50:
            continue
        w = (e[m][-1] - e[m][0]) / ((t[m][-1] - t[m][0]) / 1e9) / 1e3
        if inst[m].max() < 100:
            out["no_context"].append(w)
        elif inst[m].min() > 100 and inst[m].max() < 140:
            out["context"].append(w)
    return {
        "idle_w": round(float(np.median(out["no_context"])), 1),
        "context_idle_w": round(float(np.median(out["context"])), 1),
        "n_idle_s": (len(out["no_context"]), len(out["context"])),
    }


def emulated_average(at, pw, t_read, window_s, coverage, period_s):
    """The averaged reading at ``t_read``: mean power over the sampled part (the last
    ``coverage`` of each refresh period) of the refreshes within the window, with the counter's
    per-refresh power as the true power (piecewise constant between refreshes)."""
    ends = at[1:]  # pw[i] holds over (at[i], at[i + 1]]
    cum = np.concatenate([[0.0], np.cumsum(pw * np.diff(at) / 1e9)])

    def energy(t):
        j = np.clip(np.searchsorted(at, t, side="right") - 1, 0, len(pw) - 1)
        return cum[j] + pw[j] * (t - at[j]) / 1e9

    k = np.searchsorted(ends, t_read, side="right") - 1
    n = max(1, int(round(window_s / period_s)))
    span = coverage * period_s * 1e9
    total = np.zeros(len(t_read))
    for j in range(n):
        tk = ends[np.clip(k - j, 0, len(ends) - 1)]
        total += energy(tk) - energy(tk - span)
    return total / (n * span / 1e9)


def fit_average(probe, period_s: float) -> dict:
    t0, t1, mj = (probe[c].to_numpy() for c in ("t0_ns", "t1_ns", "energy_mj"))
    at, e = refreshes(t0, t1, mj)
    _, pw = counter_power(at, e)
    m = (t1 > at[12]) & (t1 < at[-1])  # readings whose whole window the counter covers
    rec = probe["power_mw"].to_numpy()[m] / 1e3
    best = None
    for window in (0.8, 0.9, 1.0, 1.1, 1.2):
        for coverage in (0.25, 0.5, 0.75, 1.0):
            emu = emulated_average(at, pw, t1[m], window, coverage, period_s)
            rms = float(np.sqrt(np.mean((emu - rec) ** 2)))
            if best is None or rms < best[0]:
                best = (rms, window, coverage)
    return {
        "power_avg_window_s": best[1],
        "power_sample_coverage": best[2],
        "average_fit_rms_w": round(best[0], 1),
    }


def fit_gains(probe) -> dict:
    t = probe["t1_ns"].to_numpy() / 1e9
    counter_j = (probe["energy_mj"].iloc[-1] - probe["energy_mj"].iloc[0]) / 1e3
    inst = np.trapezoid(probe["inst_mw"].to_numpy() / 1e3, t) / counter_j
    avg = np.trapezoid(probe["power_mw"].to_numpy() / 1e3, t) / counter_j
    return {
        "instant_over_counter": round(float(inst), 4),
        "average_over_counter": round(float(avg), 4),
        "probe_s": round(float(t[-1] - t[0]), 2),
    }


def fit_noise(samples, period_s: float) -> dict:
    """Counter noise (mJ, on each published value): the robust spread (1.4826 x MAD) of the
    per-refresh increments at steady context idle, less nothing: the 100 Hz reader sees the
    refresh grid at 100 ms exactly there, so what spread is left is the sensor's (white on the
    published value, so an increment carries it twice: / sqrt 2)."""
    t, e, inst = (samples[c].to_numpy() for c in ("t_ns", "energy_mj", "inst_mw"))
    at, mj = refreshes(t, t, e)
    ends, pw = counter_power(at, mj)
    inst_at = inst[np.clip(np.searchsorted(t, ends), 0, len(t) - 1)] / 1e3
    gap = np.diff(at) / 1e9
    steady = (inst_at > 110) & (inst_at < 135) & (np.abs(gap - period_s) < 0.002)
    d_mj = np.diff(mj)[steady]
    mad = float(np.median(np.abs(d_mj - np.median(d_mj))))
    return {
        "counter_noise_mj": round(1.4826 * mad / np.sqrt(2), 1),
        "at_w": round(float(np.median(pw[steady])), 1),
        "n_increments": int(steady.sum()),
    }


def fit_delay(probe, edges) -> dict:
    """Publication delay (s): at each load-on edge whose refresh interval caught the step part
    way, the step instant the counter implies (interval end less the loaded fraction) minus the
    edge's CPU stamp, median over the edges. An upper bound: it holds the kernel launch too.
    The first edge (load start-up, ~250 ms late) and edges whose step fell on a refresh are
    left out."""
    t0, t1, mj = (probe[c].to_numpy() for c in ("t0_ns", "t1_ns", "energy_mj"))
    at, e = refreshes(t0, t1, mj)
    ends, pw = counter_power(at, e)
    lo, hi = np.median(pw[pw < 200]), np.median(pw[pw > 600])
    lags = []
    for t_on in edges.loc[edges["edge"] == "on", "t_ns"].to_numpy():
        j = int(np.searchsorted(ends, t_on))
        for k in range(j, min(j + 3, len(pw))):
            frac = (pw[k] - lo) / (hi - lo)
            if 0.05 < frac < 0.95:
                lag = (ends[k] - frac * (ends[k] - at[k]) - t_on) / 1e9
                if abs(lag) < 0.05:
                    lags.append(lag)
                break
    return {
        "counter_delay_s": round(float(np.median(lags)), 4) if lags else 0.0,
        "delay_edges": [round(x, 4) for x in lags],
    }


def derive(fits: dict) -> dict:
    """The profile's sensor figures against its truth. The traces hold no independent truth,
    only three sensors that disagree; the emulator takes the instant field (sampled most often)
    as the true power, so the counter reads ``1 / instant_over_counter`` of the truth and the
    averaged power ``average_over_counter`` of the counter. Idle powers are the counter's, so
    the truth's are those over the counter's gain."""
    gain = 1 / fits["instant_over_counter"]
    return {
        "counter_gain": round(gain, 4),
        "average_gain": round(fits["average_over_counter"] * gain, 4),
        "instant_gain": 1.0,
        "true_idle_w": round(fits["idle_w"] / gain, 1),
        "true_context_idle_w": round(fits["context_idle_w"] / gain, 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--quick", action="store_true", help="the same fit (it is quick)")
    args = ap.parse_args(argv)
    probe, edges, samples = load(args.data)
    fits = {}
    fits.update(fit_refresh(probe))
    fits.update(fit_latency(probe))
    fits.update(fit_idle(samples))
    fits.update(fit_average(probe, fits["counter_period_s"]))
    fits.update(fit_gains(probe))
    fits.update(fit_noise(samples, fits["counter_period_s"]))
    fits.update(fit_delay(probe, edges))
    fits.update(derive(fits))
    for k, v in fits.items():
        print(f"{k} = {v}")
    print(
        f"fit_h200_profile: refresh {fits['counter_period_s']} s, idle {fits['true_idle_w']} / "
        f"{fits['true_context_idle_w']} W, counter gain {fits['counter_gain']}, averaged power "
        f"{fits['power_avg_window_s']} s (rms {fits['average_fit_rms_w']} W)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
