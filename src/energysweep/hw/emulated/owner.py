"""The owner of emulated GPUs: the process whose activity is their load.

An :class:`Owner` samples its activity (by default this process's CPU busy fraction, less the
sampling thread's own) at ``activity_hz``, turns it into true power (hw/emulated/physics.py),
integrates it exactly (power is constant over each sample interval) and appends each sample to
the GPU's shared state, from which every process's emulated NVML reads. On :meth:`Owner.close`
it writes the ground truth of its time as owner, ``truth-gpu<i>-<pid>.parquet`` next to the
state: the cumulative true energy at every sample, so the energy of any window is a lookup
(hw/emulated/truth.py). The measurement code never reads it; tests and the benchmark do.

Activity sources: :class:`ProcessActivity` (default: the owning rank itself),
:class:`PidActivity` (a set of processes, e.g. an inference server's workers),
:class:`FunctionActivity` (a given load pattern, for tests and the benchmark).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np

import energysweep.hw.emulated.physics as physics
import energysweep.hw.emulated.processes as processes
from energysweep.hw.emulated.node import Node
from energysweep.hw.emulated.state import pid_alive

TRUTH_GLOB = "truth-gpu*.parquet"


class ProcessActivity:
    """CPU busy fraction of this process, less the CPU time of the thread that samples it."""

    def __init__(self):
        self._last = None

    def fraction(self, t_prev_ns: int, t_now_ns: int) -> float:
        busy = time.process_time_ns() - time.thread_time_ns()  # on the sampling thread
        last, self._last = self._last, busy
        if last is None or t_now_ns <= t_prev_ns:
            return 0.0
        return (busy - last) / (t_now_ns - t_prev_ns)


class PidActivity:
    """CPU busy fraction of a set of processes (all their threads; ``/proc/<pid>/task``).

    CPU time is kept per thread: an interval counts the growth of every thread seen in the
    previous sample and all of a thread born since in a process seen then. A process first seen
    counts from its next sample (a server that joins the set brings CPU time spent before it),
    and a process or thread that ended drops out (its total no longer offsets the others').

    Each thread's ``schedstat`` stays open and is read again in place (``pread``): a vLLM
    server has a few hundred threads, sampled at ``activity_hz``, and opening each file every
    sample cost 0.45 ms per 60 threads (11% of a core at 250 Hz on this machine; 0.05 ms read
    in place). :meth:`close` closes them (the owner does, on its own close).

    A callable ``pids`` is asked again at most every ``refresh_s`` (0: every sample): finding a
    server's processes scans all of ``/proc`` (0.9 ms with 117 processes on this machine, more
    beside a test suite), too much at 250 Hz. A process that joins is then seen up to
    ``refresh_s`` later, and counts from its next sample as any newcomer; one that ends drops
    out at once (its threads can no longer be read).
    """

    def __init__(self, pids, refresh_s: float = 0.0):
        self.pids = pids  # a list, or a callable returning the current list
        self.refresh_s = refresh_s
        self._pids: list[int] = []
        self._asked: float | None = None  # monotonic time pids() was last asked
        self._last: dict[int, dict[str, int]] | None = None
        self._fds: dict[tuple[int, str], int] = {}  # (pid, thread) -> its open schedstat

    def _current(self) -> list[int]:
        if not callable(self.pids):
            return list(self.pids)
        now = time.monotonic()
        if self._asked is None or now - self._asked >= self.refresh_s:
            self._pids, self._asked = list(self.pids()), now
        return self._pids

    def _threads_ns(self, pid: int) -> dict[str, int] | None:
        """CPU ns of each live thread of ``pid``; None if the process is gone."""
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return None
        out = {}
        for task in tasks:
            fd = self._fds.get((pid, task))
            try:
                if fd is None:
                    path = f"/proc/{pid}/task/{task}/schedstat"
                    fd = self._fds[pid, task] = os.open(path, os.O_RDONLY)
                out[task] = int(os.pread(fd, 128, 0).split()[0])
            except (OSError, ValueError, IndexError):
                self._close((pid, task))  # the thread ended
        return out

    def _close(self, key: tuple[int, str]) -> None:
        fd = self._fds.pop(key, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Close every thread's file."""
        for key in list(self._fds):
            self._close(key)

    def fraction(self, t_prev_ns: int, t_now_ns: int) -> float:
        now = {p: t for p in self._current() if (t := self._threads_ns(p)) is not None}
        seen = {(p, task) for p, threads in now.items() for task in threads}
        for key in self._fds.keys() - seen:  # threads and processes that ended or left the set
            self._close(key)
        last, self._last = self._last, now
        if last is None or t_now_ns <= t_prev_ns:
            return 0.0
        busy = 0
        for pid, threads in now.items():
            before = last.get(pid)
            if before is None:
                continue  # first seen: its CPU time so far is not this interval's
            busy += sum(max(0, ns - before.get(tid, 0)) for tid, ns in threads.items())
        return busy / (t_now_ns - t_prev_ns)


class FunctionActivity:
    """A given load: ``fn(t_ns)`` -> busy fraction, taken at the middle of each sample
    interval (a pattern whose steps fall on sample instants is then followed exactly)."""

    def __init__(self, fn):
        self.fn = fn

    def fraction(self, t_prev_ns: int, t_now_ns: int) -> float:
        return float(self.fn((t_prev_ns + t_now_ns) // 2))


class Owner:
    """This process drives the GPUs ``indices`` of ``node`` with ``activity``."""

    def __init__(self, node: Node, indices: list[int], activity=None, pid: int | None = None):
        self.node = node
        self.views = [node.view(i) for i in indices]
        self.activity = activity or ProcessActivity()
        self.pid = pid or os.getpid()
        self.prof = node.profile
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        now = node.clock()
        self._truth: dict[int, list[tuple]] = {}
        self._energy: dict[int, float] = {}
        self._last: dict[int, tuple[int, float, float, int]] = {}  # (t, W, MHz, reasons)
        self._count: dict[int, int] = {}  # the state's sample count after this owner's append
        self._idle_w = physics.owned_idle_w(self.prof)  # a context is up while it owns
        for v in self.views:
            prev = v.state.get("owner_pid")
            if prev and prev != self.pid and pid_alive(prev):
                raise RuntimeError(
                    f"emulated GPU {v.ident.uuid} is already owned by process {prev}"
                )
            with v.state.lock():
                e0 = float(v.energy_mj(now, alive=False))  # idle since the last sample
                v.state.set("owner_pid", self.pid)
                v.state.set("attach_ns", now)
                # The node's process list (nvmlDeviceGetComputeRunningProcesses) shows the owner.
                processes.register(v.ident.uuid, self.pid, host=node.host)
                self._append(
                    v,
                    np.array([now]),
                    np.array([e0]),
                    np.array([self.prof.idle_w]),
                    np.array([self.prof.idle_sm_mhz]),
                    np.array([physics.GPU_IDLE]),
                )
        self._t = now

    def _append(self, v, t, e, p, clock, reasons) -> None:
        v.state.append(t, e, p, clock, reasons)
        self._truth.setdefault(v.index, []).append(
            (t.astype(np.int64), np.asarray(e, float), np.asarray(p, float))
        )
        self._energy[v.index] = float(e[-1])
        self._last[v.index] = (int(t[-1]), float(p[-1]), float(clock[-1]), int(reasons[-1]))
        self._count[v.index] = v.state.get("count")

    def _sync(self, v) -> None:
        """Take in the hold samples readers appended since this owner's last append (under the
        state's lock): the truth and the next interval start from them."""
        new = v.state.since(self._count[v.index])
        if len(new["t_ns"]):
            self._truth[v.index].append(
                (new["t_ns"].astype(np.int64), new["energy_mj"], new["power_w"])
            )
            self._energy[v.index] = float(new["energy_mj"][-1])
            self._last[v.index] = (
                int(new["t_ns"][-1]), float(new["power_w"][-1]), float(new["clock_mhz"][-1]),
                int(new["reasons"][-1]),
            )  # fmt: skip

    def step(self, now_ns: int | None = None) -> None:
        """One sample: the activity since the last one sets every owned GPU's power."""
        with self._lock:
            now = self.node.clock() if now_ns is None else now_ns
            if now <= self._t:
                return
            u = self.activity.fraction(self._t, now)
            self.advance(np.array([now], dtype=np.int64), np.array([u]))

    def advance(self, t_ns: np.ndarray, activity: np.ndarray) -> None:
        """Samples at times ``t_ns`` (increasing, after the last) with the activities over the
        interval before each: the bulk form of :meth:`step` (the benchmark's virtual time)."""
        t_all = np.asarray(t_ns, dtype=np.int64)
        u_all = np.broadcast_to(np.asarray(activity, dtype=float), t_all.shape)
        for v in self.views:
            with v.state.lock():
                self._sync(v)
                keep = t_all > self._last[v.index][0]  # a reader's hold may be newer
                if not keep.any():
                    continue
                t, u = t_all[keep], u_all[keep]
                slow = np.zeros(len(t), dtype=bool)
                if self.node.settings.faults_of("throttle", self.node.host, v.index):
                    slow = np.array([v.in_episode("throttle", int(x)) is not None for x in t])
                p, clock, reasons = physics.true_power(
                    self.prof, u, v.cap_mhz(), v.power_limit_mw() / 1e3, slow, self._idle_w
                )
                self._integrate(v, t, p, clock, reasons)
            self._record_anchors(v, int(t[-1]))
        self._t = int(t_all[-1])

    def replay(self, t_ns: np.ndarray, power_w: np.ndarray) -> None:
        """Samples of a given true power (W over the interval before each time): a recorded
        trace replayed (tests/unit/test_emulated_h200.py), clocks at their maximum."""
        t = np.asarray(t_ns, dtype=np.int64)
        for v in self.views:
            with v.state.lock():
                self._sync(v)
                self._integrate(v, t, np.asarray(power_w, float), self.prof.max_sm_mhz, 0)
        self._t = int(t[-1])

    def _integrate(self, v, t, p, clock, reasons) -> None:
        p = np.broadcast_to(p, t.shape).astype(np.float64)
        dt = np.diff(np.concatenate([[self._last[v.index][0]], t]))
        e = self._energy[v.index] + np.cumsum(p * dt / 1e6)  # W * ns / 1e6 = mJ
        self._append(v, t, e, p, np.broadcast_to(clock, t.shape), np.broadcast_to(reasons, t.shape))
        self._record_anchors(v, int(t[-1]))

    def _record_anchors(self, v, now: int) -> None:
        """E at the refresh before each counter fault's latest start, once (readers use it
        when that refresh is older than the shared history)."""
        for slot, f in enumerate(self.node.settings.faults):
            if f.kind not in ("counter_reset", "stuck_counter") or not f.applies(
                self.node.host, v.index
            ):
                continue
            start = f.last_start(self.node.t_s(now))
            if start is None or v.state.anchor(slot)[0] == start[0] + 1:
                continue
            start_ns = self.node.settings.epoch_ns + int(round(start[1] * 1e9))
            v.state.set_anchor(slot, start[0], float(v.sensor_mj(*v.tick(start_ns))))

    # ---------------------------------------------------------------------------- thread
    def start(self) -> Owner:
        """Sample on a daemon thread at the node's ``activity_hz`` until :meth:`close`."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="emulated-gpu-owner", daemon=True
            )
            self._thread.start()
        return self

    def _loop(self) -> None:
        period = 1.0 / self.node.settings.activity_hz
        self.activity.fraction(self._t, self._t)  # baseline on this thread
        next_t = time.monotonic() + period
        while not self._stop.wait(max(0.0, next_t - time.monotonic())):
            self.step()
            next_t = max(next_t + period, time.monotonic() - period)  # never spin to catch up

    def close(self) -> list[Path]:
        """Stop sampling (one last sample), release the GPUs, write the truth files."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
            self._thread = None
            self.step()
        if hasattr(self.activity, "close"):
            self.activity.close()
        paths = []
        for v in self.views:
            if v.state.get("owner_pid") == self.pid:
                v.state.set("owner_pid", 0)
            processes.unregister(v.ident.uuid, self.pid, host=self.node.host)
            paths.append(self._write_truth(v))
        return paths

    def _write_truth(self, v) -> Path:
        import pyarrow as pa
        import pyarrow.parquet as pq

        chunks = self._truth.get(v.index, [])
        t, e, p = (
            [np.concatenate([c[i] for c in chunks])] if chunks else [np.zeros(0)] for i in range(3)
        )
        n = len(t[0])
        table = pa.table(
            {
                "host": pa.array([self.node.host] * n, pa.string()),
                "gpu_index": pa.array(np.full(n, v.index), pa.int32()),
                "gpu_uuid": pa.array([v.ident.uuid] * n, pa.string()),
                "time_ns": pa.array(t[0].astype(np.int64), pa.int64()),
                "energy_mj": pa.array(e[0], pa.float64()),
                "power_w": pa.array(p[0], pa.float64()),
            }
        )
        path = v.state.path.with_name(f"truth-gpu{v.index}-{self.pid}.parquet")
        tmp = path.with_suffix(".parquet.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, path)
        return path
