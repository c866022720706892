"""The emulated node across processes: a real owner process drives a GPU that another reads.

The owner is a child process that attaches to GPU 1 and busy-loops, then sleeps, then exits;
this process reads the same GPU through its own emulated pynvml (the node's shared state).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pynvml as real
import pytest

from energysweep.hw import emulated
from energysweep.hw.emulated import truth

from emulated_helpers import section

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import sys, time
import pynvml
from energysweep.hw import emulated
nvml = emulated.module_from_env(pynvml)
owner = emulated.attach(nvml, [sys.argv[1]])
print("attached", flush=True)
t0 = time.time()
while time.time() - t0 < 1.0:
    pass
time.sleep(1.0)
owner.close()
"""


def test_a_rank_process_drives_its_gpu_and_others_read_it(tmp_path):
    emulated.prepare(tmp_path, section(counter_jitter_s=0.0), time.time_ns())
    env = emulated.job_env(
        tmp_path,
        emulated.node_config.read(tmp_path),
        {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src")},
    )
    nvml = emulated.make_module(real, lambda: emulated.node_from_env(env), environ=env)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    uuid = nvml.nvmlDeviceGetUUID(h)
    start = time.time_ns()
    e0 = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, uuid], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "attached"
        time.sleep(0.7)
        busy_power = nvml.nvmlDeviceGetPowerUsage(h)
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
    time.sleep(0.3)
    end = time.time_ns()
    e1 = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    idle_power = nvml.nvmlDeviceGetPowerUsage(h)  # owner gone: idle
    assert busy_power > 90_000  # it followed the child's busy loop (a loaded machine gives less)
    assert idle_power == pytest.approx(70_000, abs=1_000)
    t = truth.Truth.read(tmp_path)
    assert t.uuids == [uuid]  # only the owned GPU has a truth file
    lo, hi = t.series[uuid][0][[0, -1]]
    inside = float(t.energy_mj(uuid, lo, hi))
    # the counter over [start, end]: truth while owned, idle power outside, refreshes at 100 ms
    idle_outside = 70 * ((lo - start) + (end - hi)) / 1e6
    assert e1 - e0 == pytest.approx(inside + idle_outside, abs=700 * 0.1 * 1000 * 2)
    assert inside > 70 * (hi - lo) / 1e6 * 1.2  # the busy second drew more than idle


def test_pid_activity_follows_the_processes_it_is_given():
    """A GPU's load can be other processes (an inference server's workers): their CPU time."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        fractions = {}
        for name, proc in (("busy", busy), ("idle", idle)):
            act = emulated.PidActivity([proc.pid])
            t0 = time.time_ns()
            act.fraction(t0, t0)
            time.sleep(0.5)
            fractions[name] = act.fraction(t0, time.time_ns())
        assert fractions["busy"] > 0.1 and fractions["idle"] < 0.02, fractions
        assert emulated.PidActivity(lambda: []).fraction(0, 1) == 0.0  # none: idle
    finally:
        for proc in (busy, idle):
            proc.kill()
            proc.wait(timeout=10)


# A process that burns the CPU for N loop turns per line read, answers, and blocks until the next.
BURNER = "import sys\nfor n in sys.stdin:\n    sum(range(int(n)))\n    print(flush=True)\n"


def _burn(proc: subprocess.Popen, turns: int) -> None:
    proc.stdin.write(f"{turns}\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "\n"
    _until_blocked(proc.pid)


def _until_blocked(pid: int) -> None:
    """Until the burner waits for its next line (state S): what it runs after its reply (back to
    its read loop) is spent before a test reads its CPU time, never after (on a loaded machine
    the burner could still be on its way when the test read it: 22 us more than the test's own
    reading in CI run 69, where the unit tests ran at nice 19)."""
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "S":
        assert time.monotonic() < deadline, f"process {pid} never blocked on its input"
        time.sleep(0.001)


def _cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])  # its one thread


def test_pid_activity_counts_only_cpu_spent_in_the_interval_as_the_set_changes():
    """A server joining the set brings CPU time spent before it, and a process that ends takes
    its total with it: neither may count (a sum over the set less the previous sum did both)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BURNER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for _ in range(2)
    ]
    a, b = procs
    try:
        _burn(a, 20_000_000)  # a long-running process, now blocked: no CPU from here on
        _burn(b, 2_000_000)
        current = []
        act = emulated.PidActivity(lambda: current)
        act.fraction(0, 0)
        current[:] = [a.pid, b.pid]  # both join, with their CPU time so far
        assert act.fraction(0, 10**9) == 0.0
        before = _cpu_ns(b.pid)
        a.kill()
        a.wait(timeout=10)
        _burn(b, 2_000_000)  # b works while a has ended (a's larger total left the set)
        spent = _cpu_ns(b.pid) - before
        assert spent > 0
        assert act.fraction(0, 10**9) * 1e9 == pytest.approx(spent, rel=1e-6)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_pid_activity_keeps_one_file_per_live_thread_and_closes_the_rest():
    """Each thread's schedstat stays open between samples (read in place), and is closed when
    its process ends or leaves the set, and by close(): a sampler at 250 Hz over a server's
    threads for a whole job must not leak one descriptor per sample or per ended thread."""
    procs = [
        subprocess.Popen([sys.executable, "-c", BURNER], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    a, b = procs
    try:
        before = _open_fds()
        current = [a.pid, b.pid]
        act = emulated.PidActivity(lambda: current)
        act.fraction(0, 0)
        assert _open_fds() == before + 2  # one thread each
        _burn(b, 2_000_000)
        assert act.fraction(0, 10**9) > 0 and _open_fds() == before + 2  # the same files
        a.kill()
        a.wait(timeout=10)
        act.fraction(0, 10**9)
        assert _open_fds() == before + 1  # a's file closed with a
        current[:] = []
        act.fraction(0, 10**9)
        assert _open_fds() == before  # b left the set
        current[:] = [b.pid]
        act.fraction(0, 10**9)
        act.close()
        assert _open_fds() == before
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


def test_pid_activity_asks_for_its_processes_at_most_every_refresh():
    """Finding a server's processes scans /proc: a callable is asked again only after
    ``refresh_s``, while the processes it named are read every sample; 0 asks every time."""
    asked = []

    def pids():
        asked.append(1)
        return [os.getpid()]

    slow = emulated.PidActivity(pids, refresh_s=3600)
    for _ in range(5):
        slow.fraction(0, 10**9)
    sum(range(5_000_000))  # this process works ...
    assert slow.fraction(0, 10**9) > 0 and len(asked) == 1  # ... and is still read
    slow.close()
    asked.clear()
    every = emulated.PidActivity(pids)
    for _ in range(5):
        every.fraction(0, 10**9)
    assert len(asked) == 5
    every.close()
