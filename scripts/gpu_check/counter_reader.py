"""An independent reader of the GPU energy counter, for ``make gpu-check``: not energysweep's code.

It shares nothing with energysweep's energy sources (energysweep.energy, energysweep.measure): it
talks to NVML through ``pynvml`` itself, in a process of its own, outside the ranks, and works
out each interval's energy its own way. The sweep's figures are then held to it
(energysweep.validity.gpu_check). It is not a ground truth (it reads the same counter), but a
mistake of ours in window edges, alignment or arithmetic shows against it.

``record``: polls every GPU's ``nvmlDeviceGetTotalEnergyConsumption`` at ~100 Hz (the counter
refreshes every ~100 ms on an H100/H200) and writes one CSV row per read (source, gpu_uuid,
t_ns: the middle of the call, read_ns: how long it took, energy_mj) until SIGTERM or ``--max-s``.
With ``--emulated-root DIR`` it reads instead the emulated node of every job running under DIR
(measurement.device emulated: each job has its own node, in ``.staging-<job id>/emulated``);
``source`` is then the job id (the real node's source is empty: one counter for every job).

``energy``: the energy of intervals from those samples. The counter is exact at each refresh,
placed midway between the last read showing the old value and the first showing the new one;
inside the interval it is the difference of the counter at the first and last refresh in it; of
each edge's refresh interval, the part outside the interval is charged at the power of the
refresh interval beyond it (idle before a window's start, idle after its end), the rest counted.

Only the standard library and pynvml (energysweep.hw.emulated for ``--emulated-root`` only).
"""

from __future__ import annotations

import argparse
import bisect
import csv
import signal
import sys
import time
from pathlib import Path

FIELDS = ["source", "gpu_uuid", "t_ns", "read_ns", "energy_mj"]


def _open(nvml, source: str, max_gpus: int | None) -> list[tuple]:
    """(source, gpu_uuid, handle, the module) of the first ``max_gpus`` GPUs ``nvml`` lists."""
    nvml.nvmlInit()
    n = nvml.nvmlDeviceGetCount()
    out = []
    for i in range(n if max_gpus is None else min(n, max_gpus)):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        uuid = nvml.nvmlDeviceGetUUID(h)
        out.append((source, uuid.decode() if isinstance(uuid, bytes) else uuid, h, nvml))
    return out


class EmulatedNodes:
    """The emulated node of every job under ``root`` (found by polling, read while it lasts)."""

    def __init__(self, pynvml, root: Path, max_gpus: int | None):
        self.real, self.root, self.max_gpus = pynvml, root, max_gpus
        self.open: dict[str, list] = {}
        self.gone: set[str] = set()
        self.next_scan = 0.0

    def gpus(self) -> list[tuple]:
        if time.monotonic() >= self.next_scan:
            self.next_scan = time.monotonic() + 0.5
            for d in self.root.glob("**/.staging-*/emulated"):
                job = d.parent.name.removeprefix(".staging-")
                if job in self.open or job in self.gone or not any(d.rglob("*.json")):
                    continue
                try:
                    from energysweep.hw.emulated import ENV, module_from_env

                    mod = module_from_env(self.real, {ENV: str(d.resolve())})
                    self.open[job] = _open(mod, job, self.max_gpus)
                except Exception as exc:  # settings not written yet: try again
                    print(f"counter_reader: {d}: {exc!r}", file=sys.stderr)
        return [g for gpus in self.open.values() for g in gpus]

    def drop(self, job: str) -> None:
        self.open.pop(job, None)
        self.gone.add(job)


def record(args) -> int:
    """Poll the counters at ``args.hz`` until SIGTERM/SIGINT or ``args.max_s``."""
    import pynvml

    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    if args.emulated_root:
        nodes = EmulatedNodes(pynvml, Path(args.emulated_root), args.gpus)
        gpus, drop = nodes.gpus, nodes.drop
    else:
        fixed = _open(pynvml, "", args.gpus)
        gpus, drop = (lambda: fixed), (lambda _: None)
    period, failed = 1.0 / args.hz, set()
    end = time.monotonic() + args.max_s
    with open(args.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        next_t, flushed = time.monotonic(), time.monotonic()
        while not stop and time.monotonic() < end:
            for source, uuid, h, nvml in gpus():
                t0 = time.time_ns()
                try:
                    e = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
                except Exception as exc:  # an emulated job ended (its state removed)
                    if not source and uuid not in failed:
                        failed.add(uuid)
                        print(f"counter_reader: {uuid}: {exc!r}", file=sys.stderr)
                    drop(source)
                    continue
                t1 = time.time_ns()
                w.writerow([source, uuid, (t0 + t1) // 2, t1 - t0, int(e)])
            if time.monotonic() - flushed > 1.0:
                f.flush()
                flushed = time.monotonic()
            next_t += period
            if next_t < time.monotonic() - period:  # a slow read (185 ms seen): no catch-up burst
                next_t = time.monotonic()
            time.sleep(max(0.0, next_t - time.monotonic()))
    return 0


# ---------------------------------------------------------------------------- energy
def refreshes(samples: list[tuple[int, int]]) -> tuple[list[float], list[int]]:
    """(time_ns, energy_mj) of each counter refresh seen in time-ordered ``samples``
    (t_ns, energy_mj): midway between the last read of the old value and the first of the new."""
    taus, values = [], []
    for (t_prev, e_prev), (t, e) in zip(samples, samples[1:], strict=False):
        if e != e_prev:
            taus.append((t_prev + t) / 2)
            values.append(e)
    return taus, values


def interval_energy_j(taus: list[float], values: list[int], a: int, b: int) -> float | None:
    """Energy in J over [a, b] ns (module docstring); None where the samples do not reach two
    refresh intervals beyond each edge."""
    i = bisect.bisect_left(taus, a)  # first refresh at or after a
    j = bisect.bisect_right(taus, b) - 1  # last refresh at or before b
    if i < 2 or j + 2 >= len(taus) or j < i:
        return None

    def power(k: int) -> float:  # mJ/ns over the refresh interval (taus[k-1], taus[k]]
        return (values[k] - values[k - 1]) / (taus[k] - taus[k - 1])

    inside = values[j] - values[i]
    e_start = values[i] - values[i - 1]
    start = e_start - (a - taus[i - 1]) * power(i - 1)
    e_end = values[j + 1] - values[j]
    end = e_end - (taus[j + 1] - b) * power(j + 2)
    return (inside + min(max(start, 0.0), e_start) + min(max(end, 0.0), e_end)) / 1e3


def energy(args) -> int:
    """Adds ``independent_j`` to each interval of ``args.intervals`` (source, gpu_uuid,
    start_ns, end_ns, ...) and writes them to ``args.out``."""
    series: dict[tuple[str, str], list[tuple[int, int]]] = {}
    with open(args.samples, newline="") as f:
        for row in csv.DictReader(f):
            key = (row["source"], row["gpu_uuid"])
            series.setdefault(key, []).append((int(row["t_ns"]), int(row["energy_mj"])))
    refs = {k: refreshes(sorted(v)) for k, v in series.items()}
    with open(args.intervals, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(args.out, "w", newline="") as f:
        fields = [*(rows[0].keys() if rows else []), "independent_j"]
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for row in rows:
            ref = refs.get((row["source"], row["gpu_uuid"]))
            got = None
            if ref:
                got = interval_energy_j(*ref, int(row["start_ns"]), int(row["end_ns"]))
            w.writerow({**row, "independent_j": "" if got is None else repr(got)})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="poll the energy counters into a CSV")
    r.add_argument("--out", required=True)
    r.add_argument("--hz", type=float, default=100.0)
    r.add_argument("--max-s", type=float, default=900.0, help="stop after this long whatever")
    r.add_argument("--gpus", type=int, default=None, help="read the first N GPUs only")
    r.add_argument("--emulated-root", default=None, help="read the emulated jobs under DIR")
    e = sub.add_parser("energy", help="each interval's energy from the samples")
    e.add_argument("--samples", required=True)
    e.add_argument("--intervals", required=True)
    e.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    return record(args) if args.cmd == "record" else energy(args)


if __name__ == "__main__":
    sys.exit(main())
