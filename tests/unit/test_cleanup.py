"""What a job leaves outside its processes (energysweep.launch.cleanup).

- a stale segment left on purpose (no live process maps it, its job gone) is removed by the sweep
  that runs before a job starts, with a line in the log; a segment that a live process maps, one
  of a live job (its temp dir's lock held) and a file of no job are kept;
- a dead job's temp dir goes, with the segments recorded in it; a live job's stays;
- release removes a job's own segments by name and its temp dir; the tracker records the segments
  a marked process maps.
The segments live in a directory of the test's own standing in for /dev/shm (the same rules:
mapped by a live process per /proc/*/maps, held open per /proc/*/fd), so a test on a shared machine
never sweeps another's /dev/shm; the real /dev/shm is swept by the real vLLM jobs of
tests/integration/test_vllm_real.py.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from energysweep.job import names as job_names
from energysweep.launch import cleanup, procs


@pytest.fixture
def shm(tmp_path):
    d = tmp_path / "shm"
    d.mkdir()
    return d


@pytest.fixture
def names(shm):
    """Makes segment files in ``shm``."""

    def make(name: str, size: int = 4096) -> str:
        (shm / name).write_bytes(b"\0" * size)
        return name

    return make


def job_id() -> str:
    return uuid.uuid4().hex


def holder(path: Path, env: dict | None = None) -> subprocess.Popen:
    """A live process that maps ``path`` and waits (until killed)."""
    code = (
        "import mmap, sys, time\nf = open(sys.argv[1], 'r+b')\n"
        "m = mmap.mmap(f.fileno(), 0)\nf.close()\nprint('mapped', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout.readline().strip() == "mapped"
    return proc


def semaphore_holder(shm: Path, name: str, env: dict | None = None) -> subprocess.Popen:
    """A live process holding ``name`` in ``shm`` as glibc's sem_open makes a POSIX named
    semaphore (Python multiprocessing's ``sem.mp-*``): a temporary file, mapped, linked to its
    name and unlinked under the first, so /proc/PID/maps shows only ``sem.XXXXXX (deleted)``."""
    code = (
        "import mmap, os, sys, time\nd, name = sys.argv[1:]\ntmp = os.path.join(d, 'sem.Xq3Zr1')\n"
        "f = open(tmp, 'w+b')\nf.write(bytes(32))\nf.flush()\nm = mmap.mmap(f.fileno(), 0)\n"
        "f.close()\nos.link(tmp, os.path.join(d, name))\nos.unlink(tmp)\n"
        "print('mapped', flush=True)\ntime.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(shm), name], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout.readline().strip() == "mapped"
    return proc


@pytest.mark.timeout(60)
def test_a_named_semaphore_is_seen_in_use_by_its_inode_and_released_with_its_job(shm, tmp_path):
    """vLLM's executor lock (a spawn-context multiprocessing Lock) is such a semaphore: a server
    whose engine is force-killed leaves it, and only its inode ties it to the processes."""
    job = job_id()
    tmpdir, fd = cleanup.claim(job, tmp_path)
    proc = semaphore_holder(shm, "sem.mp-test1234", env={**os.environ, procs.MARK_VAR: job})
    tracker = cleanup.Tracker(job, tmpdir, interval_s=0.05, shm=shm).start()
    try:
        assert "sem.mp-test1234" in cleanup.shm_in_use([proc.pid], shm)
        assert "sem.mp-test1234" in cleanup.shm_in_use(shm=shm)
        deadline = time.monotonic() + 10
        while "sem.mp-test1234" not in tracker.names and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        tracked = tracker.stop()
    assert "sem.mp-test1234" in tracked
    assert "sem.mp-test1234" not in cleanup.shm_in_use(shm=shm)  # its holder is gone
    cleanup.release(job, tracked, tmpdir, fd, io.StringIO(), shm)
    assert not (shm / "sem.mp-test1234").exists()


@pytest.mark.timeout(60)
def test_sweep_removes_a_stale_segment_logs_it_and_keeps_live_ones(names, shm, tmp_path):
    dead, live, locked = job_id(), job_id(), job_id()
    stale = names(f"{job_names.segment_prefix(dead)}-tp:0-[0-1]-cpushm_0")
    # vLLM's own name, as a job without per-job names leaves it (no live process maps it).
    engine = names(f"-test{dead[:8]}-tp:0-[0-1]-cpushm_1")
    mapped = names(f"{job_names.segment_prefix(live)}-tp:0-[0-1]-cpushm_0")
    of_locked = names(f"{job_names.segment_prefix(locked)}-tp:0-[0-1]-cpushm_0")
    foreign = names(f"not-a-job-{dead[:8]}")
    tmpdir, fd = cleanup.claim(locked, tmp_path)
    proc = holder(shm / mapped)
    try:
        log = io.StringIO()
        removed = cleanup.sweep_stale(log, tmp_path, shm)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        os.close(fd)
    assert sorted(removed) == sorted([stale, engine])
    assert not (shm / stale).exists() and not (shm / engine).exists()
    assert (shm / mapped).exists() and (shm / of_locked).exists() and (shm / foreign).exists()
    assert tmpdir.is_dir()  # its job is live: the lock is held
    lines = log.getvalue().splitlines()
    assert (
        f"cleanup: removed shared-memory segment {shm}/{stale} (stale: no live process "
        "maps it; its job is gone)" in lines
    )
    assert len(lines) == 2


@pytest.mark.timeout(60)
def test_a_segment_of_a_live_job_is_kept_even_when_unmapped(names, shm, tmp_path):
    """A job whose process is alive (its mark) may not have mapped its segment yet."""
    live = job_id()
    name = names(f"{job_names.segment_prefix(live)}-tp:0-[0-1]-cpushm_1")
    env = {**os.environ, procs.MARK_VAR: live}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    try:
        deadline = time.monotonic() + 10
        while not procs.marked(live) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cleanup.sweep_stale(io.StringIO(), tmp_path, shm) == []
        assert (shm / name).exists()
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.timeout(60)
def test_dead_jobs_temp_dir_goes_with_the_segments_recorded_in_it(names, shm, tmp_path):
    dead = job_id()
    tmpdir, fd = cleanup.claim(dead, tmp_path)
    recorded = names(f"psm_test{dead[:8]}")  # a name no rule would know: only the record says
    (tmpdir / cleanup.RECORD).write_text(f"{recorded}\n")
    os.close(fd)  # the measure step died: the kernel drops its lock
    log = io.StringIO()
    removed = cleanup.sweep_stale(log, tmp_path, shm)
    assert sorted(removed) == sorted([recorded, str(tmpdir)])
    assert not tmpdir.exists() and not (shm / recorded).exists()
    assert f"cleanup: removed the temp dir {tmpdir} of a job that is gone" in log.getvalue()


@pytest.mark.timeout(60)
def test_release_removes_the_jobs_segments_and_temp_dir_and_the_tracker_sees_mappings(
    names, shm, tmp_path
):
    job = job_id()
    tmpdir, fd = cleanup.claim(job, tmp_path)
    own = names(f"{job_names.segment_prefix(job)}-pp:1-[0-1]-cpushm_0")
    seen = names(f"psm_test{job[:8]}")
    proc = holder(shm / seen, env={**os.environ, procs.MARK_VAR: job})
    tracker = cleanup.Tracker(job, tmpdir, interval_s=0.05, shm=shm).start()
    try:
        deadline = time.monotonic() + 10
        while seen not in tracker.names and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        tracked = tracker.stop()
    assert seen in tracked and seen in (tmpdir / cleanup.RECORD).read_text().split()
    log = io.StringIO()
    cleanup.release(job, tracked, tmpdir, fd, log, shm)
    assert not (shm / own).exists() and not (shm / seen).exists() and not tmpdir.exists()
    assert f"{shm}/{own} (left by this job)" in log.getvalue()


def test_names_are_per_job_and_short_enough_for_sockets():
    a, b = job_id(), job_id()
    assert job_names.segment_prefix(a) != job_names.segment_prefix(b)
    # vLLM's IPC socket in the temp dir: "<dir>/<uuid4>" must fit AF_UNIX's 107 bytes.
    assert len(f"{job_names.tmpdir(a, '/tmp')}/{uuid.uuid4()}") < 100
