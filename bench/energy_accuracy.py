"""Energy accuracy against ground truth: our methods and the peers', side by side in one run.

Every method measures the same emulated loads on the emulated H100 node (energysweep.hw.emulated,
default profile: 100 ms counter refresh with jitter, 1 s averaged power sampled 25% of the time,
read latency), in virtual time, against the node's exact energy integral:

- ``ours: counter, tick-aligned``: energysweep's NVML source (energy/nvml.py), whose window edges
  wait for a counter refresh (energy/ticks.py); the load starts once the start edge returns;
- ``counter, unaligned``: the same counter read once at each edge (what the source did before);
- ``ours: timeline 10 Hz``: the re-check's figure, the integral of the 10 Hz power timeline with
  NVML's 1 s power averaging undone (energysweep's Timeline, as the merge computes it);
- ``1 Hz power x time``: the power reading polled every second, each reading times the time
  since the previous one (the method the issue names for srt-slurm, InferenceX and the
  vLLM/SGLang --record-power PRs);
- ``Zeus ZeusMonitor``: Zeus 0.16's begin_window/end_window on the same emulated NVML (Zeus's
  ``pynvml`` patched as Zeus's own tests do).

Loads: steady (80% busy), square waves between 10% and 100% busy at 0.2, 1 and 5 Hz, a ramp
(0 to 100% over 10 s, repeated), and a real rank: the CPU activity of a process running the
tiny model's ``generate`` loop, recorded at 250 Hz at the start of the run and replayed. Each
window follows >= 3 s of idle with a random phase, so edges fall anywhere against the counter's
refreshes. Prints median and worst |error| per method x load x window length, and the headline
ratios on its last lines.

    .venv/bin/python bench/energy_accuracy.py            # headline sizes (~10 min)
    .venv/bin/python bench/energy_accuracy.py --quick    # tiny sizes (~20 s; a test runs it)
"""

from __future__ import annotations

import argparse
import json
import subprocess
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
    "1 Hz power x time",
    "Zeus ZeusMonitor",
]
LENGTHS = [0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0]
QUICK_LENGTHS = [0.5, 5.0]
SAMPLE_S = 0.004  # the owner's activity sampling interval (250 Hz)
IDLE_S = 3.0  # idle before each window
EPOCH_NS = 1_750_000_000 * 10**9


def power_average_s() -> float:
    """validity.power_average_s's default (the schema's), as the merge's re-check uses it."""
    import yaml

    schema = yaml.safe_load(node_config.SCHEMA_PATH.read_text())
    return float(schema["properties"]["validity"]["properties"]["power_average_s"]["default"])


def square(hz: float, low: float = 0.1, high: float = 1.0):
    return lambda x: np.where((x * hz) % 1.0 < 0.5, high, low)


def patterns(trace: np.ndarray) -> dict:
    """Load shapes: activity as a function of seconds since the window's start (vectorised)."""
    dur = len(trace) * SAMPLE_S
    return {
        "steady": lambda x: np.full(np.shape(x), 0.8),
        "square 0.2 Hz": square(0.2),
        "square 1 Hz": square(1.0),
        "square 5 Hz": square(5.0),
        "ramp 10 s": lambda x: (np.asarray(x) % 10.0) / 10.0,
        "real rank": lambda x: trace[((np.asarray(x) % dur) / SAMPLE_S).astype(int) % len(trace)],
    }


CHILD = """
import sys, time, tempfile
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from energysweep.sweep.tinymodel import build_tiny_model
torch.set_num_threads(1)
d = build_tiny_model(tempfile.mkdtemp())
tok = AutoTokenizer.from_pretrained(d)
model = AutoModelForCausalLM.from_pretrained(d)
batch = tok(["the quick brown fox"] * 4, return_tensors="pt", padding=True)
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:  # windows of generation with short cooldowns, as a rank runs them
    for _ in range(3):
        model.generate(**batch, max_new_tokens=16, do_sample=False)
    time.sleep(0.3)
"""


def record_rank_trace(seconds: float) -> np.ndarray:
    """CPU activity of a real inference loop (the tiny model's generate) at 250 Hz."""
    import os

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(seconds + 2)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        if child.stdout.readline().strip() != "ready":
            sys.exit("the rank-trace process did not start")
        act = emulated.PidActivity([child.pid])
        t = time.time_ns()
        act.fraction(t, t)
        out = []
        for _ in range(int(seconds / SAMPLE_S)):
            time.sleep(SAMPLE_S)
            now = time.time_ns()
            out.append(min(1.0, act.fraction(t, now)))
            t = now
    finally:
        child.kill()
        child.wait(timeout=30)
    return np.array(out)


class Bench:
    """One emulated H100 in virtual time: a clock whose sleep advances the owner and runs the
    10 Hz timeline sampler and the 1 Hz poller when due."""

    def __init__(self, tmp: Path, rng: np.random.Generator, **overrides):
        self.t = EPOCH_NS
        section = {**node_config.section_defaults(), **overrides}
        self.node = Node(
            emulated.prepare(tmp, section, EPOCH_NS), tmp, host="bench", clock=lambda: self.t
        )
        self.nvml = emulated.make_module(real, lambda: self.node, sleep=self.sleep, environ={})
        self.nvml.nvmlInit()
        self.handle = self.nvml.nvmlDeviceGetHandleByIndex(0)
        self.uuid = self.nvml.nvmlDeviceGetUUID(self.handle)
        self.owner = emulated.Owner(self.node, [0], emulated.FunctionActivity(lambda t: 0.0))
        self.rng = rng
        self.loads: list[tuple[int, int, object]] = []  # (start ns, end ns, pattern)
        self.timeline: list[tuple[int, int, int, int]] = []  # time, power, counter, reasons
        self.next_sample = EPOCH_NS + int(rng.uniform(0, 0.1) * 1e9)
        self.poll: list | None = None  # 1 Hz poller: [next due ns, last ns, joules]
        self._in_task = False

    # ---------------------------------------------------------------------------- time
    def activity(self, t_ns: np.ndarray) -> np.ndarray:
        u = np.zeros(len(t_ns))
        for start, end, pattern in self.loads[-2:]:
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
            due = min(self.next_sample, self.poll[0] if self.poll else self.next_sample)
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
            if self.poll and due == self.poll[0]:
                self._poll_read()
                self.poll[0] += 1_000_000_000
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

    def _poll_read(self) -> None:
        power = self.nvml.nvmlDeviceGetPowerUsage(self.handle)
        self.poll[2] += power / 1e3 * (self.t - self.poll[1]) / 1e9
        self.poll[1] = self.t

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


def window_unaligned(b: Bench, pattern, length: float, zeus, key: str) -> dict:
    """One window measured by every unaligned method: edges are read, then the load runs."""
    b.sleep(IDLE_S + b.rng.uniform(0, 1))
    zeus.begin_window(key, sync_execution=False)
    c0 = b.counter()
    b.poll = [b.t + 1_000_000_000, b.t, 0.0]
    start = b.t
    b.loads.append((start, start + int(length * 1e9), pattern))
    b.sleep(length)
    end = b.t
    c1 = b.counter()
    b._poll_read()
    polled = b.poll[2]
    b.poll = None
    z = zeus.end_window(key, sync_execution=False).gpu_energy[0]
    return {
        "start": start,
        "end": end,
        "counter, unaligned": (c1 - c0) / 1e3,
        "1 Hz power x time": polled,
        "Zeus ZeusMonitor": z,
    }


def window_aligned(b: Bench, source, pattern, length: float) -> dict:
    """One window measured by energysweep's NVML source (energy/nvml.py), as the window rule
    drives it: each edge waits for two counter refreshes (tick alignment, energy/ticks.py)."""
    b.sleep(IDLE_S + b.rng.uniform(0, 1))
    source.waited_s = 0.0
    source.prepare()  # the window rule: prepare, barrier, begin
    source.begin()
    start = b.t
    b.loads.append((start, start + int(length * 1e9), pattern))
    b.sleep(length)
    end = b.t
    (reading,) = source.end()
    return {
        "start": start,
        "end": end,
        METHODS[0]: reading.energy_mj / 1e3,
        "wait_s": source.waited_s,
    }


def run_pattern(name: str, pattern, lengths, reps: int, seed: int) -> list[dict]:
    """Every window of one load shape on a fresh emulated GPU; errors against its truth."""
    from energysweep.energy.nvml import NvmlSource
    from energysweep.hw import nvml as hw_nvml

    with tempfile.TemporaryDirectory() as tmp:
        b = Bench(Path(tmp), np.random.default_rng(seed))
        zeus = zeus_monitor(b.nvml)
        hw_nvml.pynvml = b.nvml  # energysweep's NVML layer reads this node, in virtual time
        source = NvmlSource([b.uuid], clock=lambda: b.t / 1e9, sleep=b.sleep)
        windows = []
        for length in lengths:
            for r in range(reps):
                windows.append(
                    (
                        "unaligned",
                        length,
                        window_unaligned(b, pattern, length, zeus, f"{name}-{length}-{r}"),
                    )
                )
                windows.append(("aligned", length, window_aligned(b, source, pattern, length)))
        b.sleep(2.0)  # the timeline covers the last window
        b.owner.close()
        truth = Truth.read(tmp)
        timeline = b.timeline_of()
        rows = []
        for kind, length, w in windows:
            true_j = float(truth.energy_mj(b.uuid, w["start"], w["end"])) / 1e3
            measured = {k: v for k, v in w.items() if k in METHODS}
            if kind == "unaligned":
                # The re-check's figure: NVML's power averaging undone (validity.power_average_s).
                span = int(power_average_s() * 1e9)
                measured["ours: timeline 10 Hz"] = float(
                    timeline.window(w["start"], w["end"], span)["timeline_energy_j"]
                )
            for method, joules in measured.items():
                rows.append(
                    {
                        "pattern": name,
                        "length_s": length,
                        "method": method,
                        "error_pct": 100 * (joules - true_j) / true_j,
                        "wait_s": w.get("wait_s"),
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


def headline(rows: list[dict]) -> list[str]:
    import pandas as pd

    df = pd.DataFrame(rows)
    df["abs"] = df["error_pct"].abs()
    ours = df[df["method"] == METHODS[0]]
    polled = df[df["method"] == "1 Hz power x time"]
    long_ours = ours[ours["length_s"] >= 5]["abs"]
    short = [x for x in sorted(df["length_s"].unique()) if x <= 10]
    ratios = []
    for x in short:
        o = ours[ours["length_s"] == x]["abs"].median()
        p = polled[polled["length_s"] == x]["abs"].median()
        ratios.append(p / o if o > 0 else float("inf"))
    waits = ours["wait_s"].dropna() * 1e3
    return [
        f"alignment cost per window (both edges): mean {waits.mean():.0f} ms, "
        f"max {waits.max():.0f} ms",
        "1 Hz polling / ours, median |error| at windows <= 10 s: "
        + ", ".join(f"{x:g} s {r:.0f}x" for x, r in zip(short, ratios, strict=True)),
        f"energy_accuracy: ours worst |error| {long_ours.max():.3f}% at windows >= 5 s (median "
        f"{long_ours.median():.3f}%); 1 Hz polling's median error >= {min(ratios):.0f}x ours at "
        "windows <= 10 s",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a test runs this)")
    parser.add_argument("--reps", type=int, default=None, help="windows per load and length")
    parser.add_argument("--trace-s", type=float, default=None, help="real-rank trace length")
    parser.add_argument("--json", help="write every window's errors here")
    args = parser.parse_args(argv)
    lengths = QUICK_LENGTHS if args.quick else LENGTHS
    reps = args.reps or (2 if args.quick else 20)
    t0 = time.time()
    trace = record_rank_trace(args.trace_s or (2.0 if args.quick else 20.0))
    print(f"real-rank trace: {len(trace)} samples, mean activity {trace.mean():.2f}")
    rows = []
    for i, (name, pattern) in enumerate(patterns(trace).items()):
        rows += run_pattern(name, pattern, lengths, reps, seed=i)
    print(f"{reps} windows per load and length, median / worst |error| in % of the true energy")
    print("\nAll loads:\n" + table(rows, lengths, by_pattern=False))
    print("\nPer load:\n" + table(rows, lengths, by_pattern=True))
    if args.json:
        Path(args.json).write_text(json.dumps(rows))
    print(f"\n({time.time() - t0:.0f} s)")
    for line in headline(rows):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
