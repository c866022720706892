"""Calibrate the validity defaults on the emulated node: false invalids and fault catch rates.

Under realistic behaviour (the default h200-sxm profile, fitted to a measured H200: 1 s averaged
power, counter refreshes every 99.9 ms with jitter, a counter that is not the truth (gain, noise,
publication delay), the H200's energy read latencies) and the schema's measurement
defaults (5 s windows after 2 s of cooldown, a 5 s idle baseline, 10 Hz timeline), in virtual
time (bench/energy_accuracy.py's Bench), with energysweep's own NVML source and the re-check's
Timeline:

- healthy windows (loads: a seeded synthetic bursty rank, steady, a 1 Hz square wave): the
  share each validity check rejects at the default thresholds (false invalids), and the
  re-check deviation's distribution;
- each scripted fault, with an episode covering the whole window and one of 2 s inside it: the
  share of windows each check (or the window's error) catches.

The checks are the verdict's (energysweep.validity.verdict) per window: ``recheck_mismatch``
(|timeline / counter - 1| > validity.max_recheck_deviation), ``window_short`` (window < 50 x the
longer of 0.1 s and the observed counter period), ``counter_stuck`` (delta 0 over >= 2 periods,
or the counter unchanged across the window's samples), ``throttled`` (a throttle reason in the
window's samples), ``idle_unstable`` (idle power std > 5 W), plus ``error`` (the window's
reading raised: counter went backwards, NVML error).

    .venv/bin/python bench/validity_calibration.py           # 40 healthy windows per load (~4 min)
    .venv/bin/python bench/validity_calibration.py --quick   # a test runs this
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pynvml as real  # noqa: E402
from energy_accuracy import EPOCH_NS, Bench, bursty_trace, patterns, square  # noqa: E402

DEFAULTS = {"max_recheck_deviation": 0.1, "min_counter_periods": 50, "counter_period_s": 0.1,
            "power_average_s": 1.0,
            "max_idle_std_w": 5.0, "throttle_mask": 0x8 | 0x20 | 0x40 | 0x80}  # fmt: skip
WINDOW_S, COOLDOWN_S, IDLE_S = 5.0, 2.0, 5.0  # the schema's measurement defaults
FAULTS = ["stuck_counter", "counter_reset", "nvml_error", "throttle"]


def run_windows(pattern, n: int, seed: int, faults=None, episode=None) -> dict:
    """An idle baseline then ``n`` windows on one emulated GPU, every check per window.

    Args:
        faults: a fault kind to inject into every window; ``episode``: "full" (the window and
            more around it) or "partial" (2 s inside it; a counter reset: at a moment in it).
    """
    from energysweep.energy.nvml import NvmlSource
    from energysweep.hw import nvml as hw_nvml

    rng = np.random.default_rng(seed)
    slot = WINDOW_S + 0.5 + COOLDOWN_S + 2.0  # window, alignment waits, cooldown, margin
    t0 = 2.0 + IDLE_S + 1.0  # seconds after the epoch of the first window's planned start
    plan = [t0 + k * slot + rng.uniform(0, 0.5) for k in range(n)]
    lengths = [WINDOW_S + rng.uniform(0, 0.3) for _ in range(n)]
    fault_list = []
    for start, length in zip(plan, lengths, strict=True):
        if faults is None:
            continue
        if episode == "full":  # longer: a stuck counter makes the edges wait for refreshes
            a, d = start - 0.5, length + 4.0
        else:
            a, d = start + 0.5 + rng.uniform(0, length - 3.0), 2.0
        f = {"kind": faults, "gpu": 0, "start_s": a}
        if faults != "counter_reset":
            f["duration_s"] = d
        fault_list.append(f)
    with tempfile.TemporaryDirectory() as tmp:
        b = Bench(Path(tmp), rng, faults=fault_list)
        hw_nvml.pynvml = b.nvml
        source = NvmlSource([b.uuid], clock=lambda: b.t / 1e9, sleep=b.sleep, background=False)
        b.sleep(2.0)
        idle = (b.t, b.t + int(IDLE_S * 1e9))
        b.sleep(IDLE_S)
        windows = []
        for start, length in zip(plan, lengths, strict=True):
            b.sleep(max(0.0, start - (b.t - EPOCH_NS) / 1e9))
            w = {"error": None}
            try:
                source.prepare()
                source.begin()
                w["start"] = b.t
                b.loads.append((b.t, b.t + int(length * 1e9), pattern))
                b.sleep(length)
                w["end"] = b.t
                (r,) = source.end()
                w["counter_j"] = r.energy_mj / 1e3
            except (real.NVMLError, RuntimeError) as exc:
                w["error"] = type(exc).__name__
                w.setdefault("end", b.t)
                source._anchor = None
            windows.append(w)
        b.sleep(2.0)
        return checks(b.timeline_of(), windows, idle)


def checks(timeline, windows, idle) -> dict:
    """Per window, which validity check fails (at the defaults) and the re-check deviation."""
    c = DEFAULTS
    period = max(c["counter_period_s"], np.nan_to_num(timeline.period, nan=0.0))
    idle_std = float(timeline.window(*idle)["power_std_w"])
    out = {k: [] for k in ("recheck_mismatch", "window_short", "counter_stuck", "throttled",
                           "idle_unstable", "error", "any", "deviation")}  # fmt: skip
    for w in windows:
        fails = {"error": w["error"] is not None}
        if w["error"] is None:
            span = int(c["power_average_s"] * 1e9)
            tl = timeline.window(w["start"], w["end"], span)
            unlagged = timeline.window(w["start"], w["end"])["timeline_energy_j"]
            plain = abs(unlagged / w["counter_j"] - 1) if w["counter_j"] else np.inf
            out.setdefault("deviation_unlagged", []).append(plain)
            dur = (w["end"] - w["start"]) / 1e9
            dev = abs(tl["timeline_energy_j"] / w["counter_j"] - 1) if w["counter_j"] else np.inf
            fails["recheck_mismatch"] = bool(dev > c["max_recheck_deviation"])
            fails["window_short"] = dur < c["min_counter_periods"] * period
            fails["counter_stuck"] = bool(tl["counter_stuck"]) or (
                w["counter_j"] == 0 and dur >= 2 * c["counter_period_s"]
            )
            reasons = tl["clock_event_reasons"] or 0
            fails["throttled"] = bool(reasons & c["throttle_mask"])
            out["deviation"].append(dev)
        fails["idle_unstable"] = idle_std > c["max_idle_std_w"]
        for k in out:
            if k != "deviation":
                out[k].append(bool(fails.get(k, False)) if k != "any" else any(fails.values()))
    out["observed_period_s"] = timeline.period
    out["idle_std_w"] = idle_std
    return out


def rate(values) -> str:
    return f"{100 * np.mean(values):.0f}%" if len(values) else "-"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--windows", type=int, default=None)
    args = parser.parse_args(argv)
    n = args.windows or (3 if args.quick else 40)
    trace = bursty_trace(seed=2026)
    loads = {"bursty rank": patterns(trace)["bursty (seeded)"], "steady": lambda x: np.full(
             np.shape(x), 0.8), "square 1 Hz": square(1.0)}  # fmt: skip
    checks_shown = ["recheck_mismatch", "window_short", "counter_stuck", "throttled",
                    "idle_unstable", "error", "any"]  # fmt: skip
    print(f"{n} windows of {WINDOW_S:g}-{WINDOW_S + 0.3:g} s per row; share of windows failing")
    print("\n| windows | " + " | ".join(checks_shown) + " | deviation median / max |")
    print("|---|" + "---|" * (len(checks_shown) + 1))
    healthy_any = []
    for i, (name, load) in enumerate(loads.items()):
        r = run_windows(load, n, seed=i)
        healthy_any += r["any"]
        dev = np.array(r["deviation"])
        print(f"| healthy, {name} | " + " | ".join(rate(r[k]) for k in checks_shown)
              + f" | {np.median(dev):.3f} / {dev.max():.3f} |")  # fmt: skip
        print(
            f"  (observed counter period {r['observed_period_s']:.4f} s, idle std "
            f"{r['idle_std_w']:.2f} W; deviation of the plain integral: median "
            f"{np.median(r['deviation_unlagged']):.3f}, max {np.max(r['deviation_unlagged']):.3f})"
        )
    for fault in FAULTS:
        for episode in ("partial",) if fault == "counter_reset" else ("full", "partial"):
            r = run_windows(loads["bursty rank"], n, seed=100, faults=fault, episode=episode)
            print(f"| {fault}, {episode} | " + " | ".join(rate(r[k]) for k in checks_shown)
                  + " | |")  # fmt: skip
    print(f"\nfalse-invalid rate of healthy windows at the defaults: {rate(healthy_any)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
