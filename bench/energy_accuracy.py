"""Energy accuracy against ground truth: our methods and the peers', paired on the same windows.

Every method measures the same windows of the same emulated loads on the default emulated node
(energysweep.hw.emulated, ``h200-sxm``: fitted to a measured H200, a counter that is not the
truth: gain 0.9967, noise, a 7 ms publication delay; averaged power 0.9877 of the truth; energy
reads of 2.6 ms median), in virtual time (machine load does not touch the figures), against the
node's exact energy integral:

- ``ours: counter, tick-aligned``: energysweep's NVML source (energy/nvml.py), whose window edges
  wait for a counter refresh (energy/ticks.py);
- ``counter, unaligned``: the same counter read once at each edge;
- ``ours: timeline 10 Hz``: the re-check's figure, the integral of the 10 Hz power timeline with
  NVML's 1 s power averaging undone (energysweep's Timeline, as the merge computes it), over our
  window's edges;
- ``1 Hz power poller``: a free-running poller reading the power every second (the method of
  srt-slurm, InferenceX and the vLLM/SGLang --record-power PRs); the window's energy is the
  integral of its readings, joined linearly, over the window (readings on both sides of it);
- ``Zeus ZeusMonitor``: Zeus 0.16's begin_window/end_window on the same emulated NVML (Zeus's
  ``pynvml`` patched as Zeus's own tests do).

The methods are paired: each window opens every method's edge in turn (ours after its refresh
wait, then Zeus, the counter read) and closes them in turn, each against the truth over its own
edges. Loads: steady (80% busy), square waves between 10% and 100% busy at 1 and 5 Hz, a ramp
(0 to 100% over 10 s), and a seeded synthetic bursty trace (busy bursts and gaps of random
length, as a rank's decode steps and host work). Each load crosses both edges: it runs from
0.3-1.3 s before the window's start to 0.3-1.3 s after its end (edges fall anywhere against the
counter's refreshes, mid-load: the hard case for edge corrections); windows follow >= 2 s of
idle. Prints median and worst |error| per method x window length, per load, and the headline
figures on its last lines; ``--json`` writes them (tests/integration/test_bench_quick.py holds
the quick mode's headline to its recorded values).

    .venv/bin/python bench/energy_accuracy.py            # headline sizes (~10 min)
    .venv/bin/python bench/energy_accuracy.py --quick    # tiny sizes (~1 min; a test asserts it)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import pynvml as real  # noqa: E402

from energysweep.hw import emulated  # noqa: E402
from energysweep.hw.emulated import node_config  # noqa: E402
from energysweep.hw.emulated.node import Node  # noqa: E402
from energysweep.hw.emulated.truth import Truth  # noqa: E402

METHODS = [
    "ours: counter, tick-aligned",
    "counter, unaligned",
    "ours: timeline 10 Hz",
    "1 Hz power poller",
    "Zeus ZeusMonitor",
]
LENGTHS = [0.5, 1.0, 2.0, 5.0, 10.0, 30.0]
QUICK_LENGTHS = [0.5, 5.0]
SAMPLE_S = 0.004  # the owner's activity sampling interval (250 Hz)
IDLE_S = 2.0  # idle before each load
EPOCH_NS = 1_750_000_000 * 10**9


def power_average_s() -> float:
    """validity.power_average_s's default (the schema's), as the merge's re-check uses it."""
    import yaml

    schema = yaml.safe_load(node_config.SCHEMA_PATH.read_text())
    return float(schema["properties"]["validity"]["properties"]["power_average_s"]["default"])


def square(hz: float, low: float = 0.1, high: float = 1.0):
    return lambda x: np.where((x * hz) % 1.0 < 0.5, high, low)


def bursty_trace(seed: int, seconds: float = 60.0) -> np.ndarray:
    """A rank's activity at 250 Hz, synthetic and seeded: busy bursts (20-200 ms at 60-100%)
    and gaps (5-80 ms at 2-20%), with a 0.3 s pause every ~2 s (a rank's windows of decode
    steps between host work); the same for every run of the benchmark."""
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    n, since_pause = int(seconds / SAMPLE_S), 0.0
    while sum(len(x) for x in out) < n:
        busy, gap = rng.uniform(0.02, 0.2), rng.uniform(0.005, 0.08)
        out.append(np.full(max(1, int(busy / SAMPLE_S)), rng.uniform(0.6, 1.0)))
        out.append(np.full(max(1, int(gap / SAMPLE_S)), rng.uniform(0.02, 0.2)))
        since_pause += busy + gap
        if since_pause > rng.uniform(1.5, 2.5):
            out.append(np.full(int(0.3 / SAMPLE_S), 0.02))
            since_pause = 0.0
    return np.concatenate(out)[:n]


def patterns(trace: np.ndarray) -> dict:
    """Load shapes: activity as a function of seconds since the load's start (vectorised)."""
    dur = len(trace) * SAMPLE_S
    return {
        "steady": lambda x: np.full(np.shape(x), 0.8),
        "square 1 Hz": square(1.0),
        "square 5 Hz": square(5.0),
        "ramp 10 s": lambda x: (np.asarray(x) % 10.0) / 10.0,
        "bursty (seeded)": lambda x: trace[
            ((np.asarray(x) % dur) / SAMPLE_S).astype(int) % len(trace)
        ],
    }


class Bench:
    """One emulated GPU in virtual time: a clock whose sleep advances the owner and runs the
    10 Hz timeline sampler and the free-running 1 Hz poller when due."""

    def __init__(self, tmp: Path, rng: np.random.Generator, **overrides):
        self.t = EPOCH_NS
        section = {**node_config.section_defaults(), **overrides}
        self.node = Node(
            emulated.prepare(tmp, section, EPOCH_NS), tmp, host="bench", clock=lambda: self.t
        )
        self.nvml = emulated.make_module(real, lambda: self.node, sleep=self.sleep, environ={})
        # Read latencies drawn from the profile's distribution, seeded here: the same every run.
        self.nvml.emulated_driver._latency_rng = np.random.default_rng(rng.integers(2**32))
        self.nvml.nvmlInit()
        self.handle = self.nvml.nvmlDeviceGetHandleByIndex(0)
        self.uuid = self.nvml.nvmlDeviceGetUUID(self.handle)
        self.owner = emulated.Owner(self.node, [0], emulated.FunctionActivity(lambda t: 0.0))
        self.rng = rng
        self.loads: list[tuple[int, int, object]] = []  # (start ns, end ns, pattern)
        self.timeline: list[tuple[int, int, int, int]] = []  # time, power, counter, reasons
        self.next_sample = EPOCH_NS + int(rng.uniform(0, 0.1) * 1e9)
        self.next_poll = EPOCH_NS + int(rng.uniform(0, 1.0) * 1e9)
        self.polled: list[tuple[int, int]] = []  # the 1 Hz poller's (time, mW)
        self._in_task = False

    # ---------------------------------------------------------------------------- time
    def activity(self, t_ns: np.ndarray) -> np.ndarray:
        u = np.zeros(len(t_ns))
        for start, end, pattern in self.loads[-1:]:
            inside = (t_ns >= start) & (t_ns < end)
            if inside.any():
                u[inside] = pattern((t_ns[inside] - start) / 1e9)
        return u

    def _advance_owner(self, until: int) -> None:
        last = self.owner._t
        if until - last < int(SAMPLE_S * 1e9):
            return
        n = int((until - last) // int(SAMPLE_S * 1e9))
        jitter = self.rng.uniform(-0.0005, 0.0005, n) * 1e9
        times = last + (np.arange(1, n + 1) * SAMPLE_S * 1e9 + jitter).astype(np.int64)
        times[-1] = min(times[-1], until)
        times = np.maximum.accumulate(times)
        mids = (np.concatenate([[last], times[:-1]]) + times) // 2
        self.owner.advance(times, self.activity(mids))

    def sleep(self, seconds: float) -> None:
        target = self.t + int(round(seconds * 1e9))
        while not self._in_task:
            due = min(self.next_sample, self.next_poll)
            if due > target:
                break
            self._set(due)
            self._task(due)
        self._set(target)

    def _set(self, t: int) -> None:
        self.t = max(self.t, t)
        self._advance_owner(self.t)

    def _task(self, due: int) -> None:
        self._in_task = True
        try:
            if due == self.next_sample:
                self.timeline.append(self._sample())
                self.next_sample += 100_000_000
            if due == self.next_poll:
                try:
                    self.polled.append((self.t, self.nvml.nvmlDeviceGetPowerUsage(self.handle)))
                except real.NVMLError:
                    pass  # a poller skips a failed read
                self.next_poll += 1_000_000_000
        finally:
            self._in_task = False

    def _sample(self) -> tuple[int, int, int, int]:
        """One power-timeline sample, as energysweep's sampler takes it (errors: -1)."""
        out = [self.t]
        for fn in (
            self.nvml.nvmlDeviceGetPowerUsage,
            self.nvml.nvmlDeviceGetTotalEnergyConsumption,
            self.nvml.nvmlDeviceGetCurrentClocksEventReasons,
        ):
            try:
                out.append(fn(self.handle))
            except real.NVMLError:
                out.append(-1)
        return tuple(out)

    def timeline_of(self):
        """energysweep's Timeline (the re-check's engine) over the samples taken so far."""
        from energysweep.validity.timeline import Timeline

        tl = np.array([x for x in self.timeline if x[1] >= 0], dtype=np.int64)
        return Timeline(
            tl[:, 0], tl[:, 1].astype(float), tl[:, 2].astype(float), tl[:, 3].astype(float)
        )

    def poller_j(self, start: int, end: int) -> float:
        """The 1 Hz poller's energy over [start, end]: its readings joined linearly."""
        t, mw = (np.array(c, dtype=float) for c in zip(*self.polled, strict=True))
        grid = np.concatenate([[start], t[(t > start) & (t < end)], [end]])
        return float(np.trapezoid(np.interp(grid, t, mw / 1e3), grid / 1e9))

    def counter(self) -> int:
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)


def zeus_monitor(nvml):
    """Zeus 0.16's ZeusMonitor over the emulated NVML, patched as Zeus's own tests patch it."""
    import os

    import zeus.device.gpu as zeus_gpu
    import zeus.device.gpu.nvidia as zeus_nvidia
    from zeus.monitor import ZeusMonitor

    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    os.environ.pop("ZEUSD_SOCK_PATH", None)
    zeus_nvidia.pynvml = nvml
    zeus_gpu.nvml_is_available = lambda: True
    zeus_gpu._gpus = None
    return ZeusMonitor(gpu_indices=[0], cpu_indices=[], sync_execution_with="torch")


def paired_window(b: Bench, source, zeus, pattern, length: float, key: str) -> dict:
    """One window of a load that crosses both edges, measured by every method in turn: each
    method's (start, end) and energy (J); ours waits for refreshes at its edges (prepare, then
    the end read) as the window rule drives it."""
    b.sleep(IDLE_S + b.rng.uniform(0, 1))
    b.loads.append((b.t, b.t + 10**15, pattern))  # its end is set at the window's end
    b.sleep(b.rng.uniform(0.3, 1.3))  # the load runs before the window opens
    source.waited_s = 0.0
    source.prepare()
    source.begin()
    edges = {METHODS[0]: [b.t]}
    zeus.begin_window(key, sync_execution=False)
    edges["Zeus ZeusMonitor"] = [b.t]
    c0 = b.counter()
    edges["counter, unaligned"] = [b.t]
    b.sleep(length)
    b.loads[-1] = (b.loads[-1][0], b.t + int(b.rng.uniform(0.3, 1.3) * 1e9), pattern)
    c1 = b.counter()  # closed in the reverse order: each edge is its own read's instant
    edges["counter, unaligned"].append(b.t)
    z = zeus.end_window(key, sync_execution=False).gpu_energy[0]
    edges["Zeus ZeusMonitor"].append(b.t)
    edges[METHODS[0]].append(b.t)
    (reading,) = source.end()  # waits for the next refreshes, after its edge
    joules = {
        METHODS[0]: reading.energy_mj / 1e3,
        "Zeus ZeusMonitor": z,
        "counter, unaligned": (c1 - c0) / 1e3,
    }
    return {"edges": edges, "joules": joules, "wait_s": source.waited_s}


def run_pattern(name: str, pattern, lengths, reps: int, seed: int) -> list[dict]:
    """Every window of one load shape on a fresh emulated GPU; errors against its truth."""
    from energysweep.energy.nvml import NvmlSource
    from energysweep.hw import nvml as hw_nvml

    with tempfile.TemporaryDirectory() as tmp:
        b = Bench(Path(tmp), np.random.default_rng(seed))
        zeus = zeus_monitor(b.nvml)
        hw_nvml.pynvml = b.nvml  # energysweep's NVML layer reads this node, in virtual time
        source = NvmlSource([b.uuid], clock=lambda: b.t / 1e9, sleep=b.sleep, background=False)
        windows = [
            (length, paired_window(b, source, zeus, pattern, length, f"{name}-{length}-{r}"))
            for length in lengths
            for r in range(reps)
        ]
        b.sleep(3.0)  # the timeline and the poller cover the last window
        b.owner.close()
        truth = Truth.read(tmp)
        timeline = b.timeline_of()
        span = int(power_average_s() * 1e9)  # the re-check's undoing of NVML's averaging
        rows = []
        for length, w in windows:
            start, end = w["edges"][METHODS[0]]
            measured = {m: (w["edges"][m][0], w["edges"][m][1], j) for m, j in w["joules"].items()}
            measured["ours: timeline 10 Hz"] = (
                start, end, float(timeline.window(start, end, span)["timeline_energy_j"])
            )  # fmt: skip
            measured["1 Hz power poller"] = (start, end, b.poller_j(start, end))
            for method, (a, z, joules) in measured.items():
                true_j = float(truth.energy_mj(b.uuid, a, z)) / 1e3
                rows.append(
                    {
                        "pattern": name,
                        "length_s": length,
                        "method": method,
                        "error_pct": 100 * (joules - true_j) / true_j,
                        "wait_s": w["wait_s"] if method == METHODS[0] else None,
                    }
                )
        return rows


def table(rows: list[dict], lengths, by_pattern: bool) -> str:
    """Markdown: median / worst |error| (%) per method (and load) x window length."""
    import pandas as pd

    df = pd.DataFrame(rows)
    df["abs"] = df["error_pct"].abs()
    keys = ["pattern", "method"] if by_pattern else ["method"]
    head = "| " + " | ".join(keys) + " | " + " | ".join(f"{x:g} s" for x in lengths) + " |"
    lines = [head, "|" + "---|" * (len(keys) + len(lengths))]
    groups = df.groupby(keys, sort=False)
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        cells = []
        for length in lengths:
            a = g[g["length_s"] == length]["abs"]
            cells.append(f"{a.median():.2f} / {a.max():.2f}" if len(a) else "-")
        lines.append("| " + " | ".join(key) + " | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def headline(rows: list[dict]) -> dict:
    """The figures the benchmark exists for, per method: median and worst |error| (%) at each
    window length (the quick mode's are asserted by tests/integration/test_bench_quick.py)."""
    import pandas as pd

    df = pd.DataFrame(rows)
    df["abs"] = df["error_pct"].abs()
    out = {}
    for (method, length), g in df.groupby(["method", "length_s"]):
        out.setdefault(method, {})[f"{length:g}"] = {
            "median": round(float(g["abs"].median()), 4),
            "worst": round(float(g["abs"].max()), 4),
            "signed_mean": round(float(g["error_pct"].mean()), 4),
        }
    waits = df.loc[df["method"] == METHODS[0], "wait_s"].dropna() * 1e3
    out["alignment_wait_ms"] = {"mean": round(float(waits.mean())), "max": round(waits.max())}
    return out


def headline_lines(head: dict) -> list[str]:
    ours, polled = head[METHODS[0]], head["1 Hz power poller"]
    lengths = sorted(ours, key=float)
    long = [x for x in lengths if float(x) >= 5]
    ratios = [
        f"{x} s {polled[x]['median'] / ours[x]['median']:.0f}x"
        for x in lengths
        if float(x) <= 10 and ours[x]["median"] > 0
    ]
    wait = head["alignment_wait_ms"]
    return [
        f"alignment cost per window (both edges): mean {wait['mean']} ms, max {wait['max']} ms",
        "1 Hz poller / ours, median |error| at windows <= 10 s: " + ", ".join(ratios),
        f"energy_accuracy: ours worst |error| {max(ours[x]['worst'] for x in long):.3f}% at "
        f"windows >= 5 s (median {min(ours[x]['median'] for x in long):.3f}%-"
        f"{max(ours[x]['median'] for x in long):.3f}%), against the truth, counter gain included",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a test runs this)")
    parser.add_argument("--reps", type=int, default=None, help="windows per load and length")
    parser.add_argument("--json", help="write the headline figures and every window's errors")
    args = parser.parse_args(argv)
    lengths = QUICK_LENGTHS if args.quick else LENGTHS
    reps = args.reps or (3 if args.quick else 12)
    t0 = time.time()
    trace = bursty_trace(seed=2026)
    rows = []
    for i, (name, pattern) in enumerate(patterns(trace).items()):
        rows += run_pattern(name, pattern, lengths, reps, seed=i)
    print(f"{reps} windows per load and length, median / worst |error| in % of the true energy")
    print("\nAll loads:\n" + table(rows, lengths, by_pattern=False))
    print("\nPer load:\n" + table(rows, lengths, by_pattern=True))
    head = headline(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"headline": head, "windows": rows}))
    print(f"\n({time.time() - t0:.0f} s)")
    for line in headline_lines(head):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
