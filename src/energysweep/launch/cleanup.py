"""What a job creates outside its processes: named per job, removed on every exit path.

A job's processes are stopped as one unit (:mod:`energysweep.launch.procs`). What they create
outside themselves outlives them unless someone removes it:

- **shared-memory segments** in ``/dev/shm``. vLLM's CPU communicator names its segments from the
  process group alone under torchrun (``external_launcher`` derives ``VLLM_DIST_IDENT`` from
  ``env://``: every tp >= 2 job on a node would use ``-tp:0-[0-1]-cpushm_<rank>``, and a killed
  job's segments made every later one fail with errno 17, EEXIST). The vLLM backend gives them the
  job's identity (:func:`energysweep.job.names.segment_prefix`, applied by
  ``energysweep.backends.vllm_backend.name_segments_per_job``). Any other segment the job's
  processes map or hold open (Python's ``psm_*`` blocks, named semaphores) is recorded while
  the job runs (:class:`Tracker`).
- **temp files, sockets and directories**: every process of a one-node job gets ``TMPDIR`` =
  :func:`energysweep.job.names.tmpdir`, a directory of the job's own (torchrun's logs, vLLM's
  IPC sockets, Python's ``tempfile``), removed as a whole.

:func:`release` removes all of it once the job's processes are gone, on every exit path of the
measure step (success, failure, timeout, stop signal). A measure step that is SIGKILLed runs no
code, so the next job that starts on the node runs :func:`sweep_stale` first: it removes what a
dead job left, with one line per item in that job's rule log.

Stale means no live process maps the segment or holds it open (``/proc/*/maps``,
``/proc/*/fd``) and, for a segment or directory named after a job, that the job is gone: no live
process carries its mark and no measure step holds its temp dir's lock (:func:`claim`; the kernel
drops the lock when the step dies). A segment of a live job is never touched, nor one of another
user (only files of this user are candidates).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

from energysweep.job import names as job_names
from energysweep.job.names import ID_CHARS, PREFIX, job_of
from energysweep.launch import procs

SHM = Path("/dev/shm")
# vLLM's CPU communicator (``<ident>-<group>-[<ranks>]-cpushm_<rank>``) under any ident: also
# the segments of an engine that did not get a job's name (another tool, an older energysweep).
ENGINE_SEGMENT = re.compile(r"-cpushm_\d+$")
RECORD = "segments.txt"  # in the job's temp dir: what the tracker saw, for a later sweep
LOCK = ".lock"  # in the job's temp dir: held by the measure step while the job runs


def claim(job_id: str, base: str | Path | None = None) -> tuple[Path, int]:
    """Create the job's temp dir with its lock held: ``(dir, fd of the lock)``.

    Made under a temporary name and renamed, so a sweep never sees the directory unlocked while
    its job starts. Close the fd (:func:`release`) to give it up.
    """
    final = job_names.tmpdir(job_id, base)
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    fd = os.open(work / LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.replace(work, final)
    return final, fd


def _locked(tmpdir: Path) -> bool:
    """Does a live measure step hold ``tmpdir``'s lock?"""
    try:
        fd = os.open(tmpdir / LOCK, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def live_jobs() -> set[str]:
    """The job-id parts (:data:`ID_CHARS`) of every live job's mark on this node."""
    return {mark[:ID_CHARS] for mark in procs.live_marks()}


def shm_in_use(pids=None, shm: Path = SHM) -> set[str]:
    """Names in ``shm`` that the given processes (default: every live one) map or hold open.

    By name and by inode: a POSIX named semaphore (``sem_open``; Python multiprocessing's
    ``sem.mp-*``, vLLM's executor lock) is made under a temporary name, mapped, linked to its
    own name and unlinked under the first: /proc/PID/maps shows ``sem.XXXXXX (deleted)``, of
    the same inode as ``sem.mp-*``.
    """
    if pids is None:
        pids = [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]
    where = f"{shm}/"
    try:
        st_dev = os.stat(shm).st_dev
    except OSError:
        return set()
    device = f"{os.major(st_dev):02x}:{os.minor(st_dev):02x}"  # as /proc/PID/maps writes it
    used: set[str] = set()
    inodes: set[int] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    i = line.find(f" {where}")
                    if i >= 0:
                        used.add(line[i + len(where) + 1 :].rstrip("\n").removesuffix(" (deleted)"))
                        fields = line[:i].split()  # address, perms, offset, device, inode
                        if len(fields) == 5 and fields[3] == device and fields[4].isdigit():
                            inodes.add(int(fields[4]))
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith(where):
                        used.add(target[len(where) :].removesuffix(" (deleted)"))
                        inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
    if inodes:
        with contextlib.suppress(OSError):
            used |= {e.name for e in os.scandir(shm) if e.inode() in inodes}
    return used


def _unlink(shm: Path, name: str, why: str, log) -> bool:
    try:
        (shm / name).unlink()
    except (FileNotFoundError, PermissionError):
        return False
    print(f"cleanup: removed shared-memory segment {shm}/{name} ({why})", file=log, flush=True)
    return True


def _recorded(tmpdir: Path) -> set[str]:
    try:
        return set((tmpdir / RECORD).read_text().split("\n")) - {""}
    except OSError:
        return set()


def release(
    job_id: str, tracked: set[str], tmpdir: Path | None, lock_fd: int | None, log, shm: Path = SHM
) -> None:
    """Remove what the job created, once its processes are gone (every exit path).

    Its engine segments (by name), the segments its processes were seen to use (``tracked``) that
    no live process uses now, and its temp dir, whose lock (``lock_fd``) is given up last.
    """
    prefix = job_names.segment_prefix(job_id)
    names = {n for n in _listdir(shm) if n.startswith(prefix)} | tracked
    if tmpdir is not None:
        names |= _recorded(tmpdir)
    used = shm_in_use(shm=shm) if names else set()
    for name in sorted(names - used):
        _unlink(shm, name, "left by this job", log)
    if tmpdir is not None:
        shutil.rmtree(tmpdir, ignore_errors=True)
    if lock_fd is not None:
        os.close(lock_fd)


def _mine(path: Path) -> list[str]:
    """Names in ``path`` owned by this user."""
    uid, names = os.getuid(), []
    for name in _listdir(path):
        with contextlib.suppress(OSError):
            if os.lstat(path / name).st_uid == uid:
                names.append(name)
    return names


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def sweep_stale(log, tmp_base: str | Path | None = None, shm: Path = SHM) -> list[str]:
    """Remove what dead jobs left on this node (before a job starts); one log line per item.

    Candidates: segments named after a job or by vLLM's CPU communicator, job temp dirs and the
    segments recorded in them (:mod:`energysweep.job.names`). Removed only when stale: no live
    process maps or holds the segment, and its job is gone.

    Returns:
        What was removed (segment names and directories).
    """
    base = Path(tmp_base or tempfile.gettempdir())
    dirs = [base / n for n in _mine(base) if n.startswith(f"{PREFIX}job-")]
    alive = live_jobs() | {job_of(d.name) for d in dirs if _locked(d)}
    dirs = [d for d in dirs if job_of(d.name) not in alive]
    candidates = {
        n
        for n in _mine(shm)
        if (n.startswith(PREFIX) or ENGINE_SEGMENT.search(n)) and job_of(n) not in alive
    }
    for d in dirs:
        candidates |= _recorded(d)
    removed = []
    if candidates:
        used = shm_in_use(shm=shm)
        for name in sorted(candidates - used):
            if _unlink(shm, name, "stale: no live process maps it; its job is gone", log):
                removed.append(name)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
        print(f"cleanup: removed the temp dir {d} of a job that is gone", file=log, flush=True)
        removed.append(str(d))
    return removed


class Tracker:
    """Records the ``/dev/shm`` names a job's processes map or hold open, while it runs.

    Polls every ``interval_s`` on a daemon thread (a scan of /proc: a few ms, rare enough not to
    weigh on the ranks' cores); each new name is appended to the job temp dir's record, so that
    a sweep after a SIGKILLed measure step still knows it. The engine segments named after the
    job need no tracking: they are found by name.
    """

    def __init__(self, mark: str, tmpdir: Path | None, interval_s: float = 5.0, shm: Path = SHM):
        self.mark, self.tmpdir, self.interval_s, self.shm = mark, tmpdir, interval_s, shm
        self.names: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shm-tracker", daemon=True)

    def start(self) -> Tracker:
        self._thread.start()
        return self

    def poll(self) -> None:
        new = shm_in_use(procs.marked(self.mark), self.shm) - self.names
        if new:
            self.names |= new
            if self.tmpdir is not None:
                with contextlib.suppress(OSError), open(self.tmpdir / RECORD, "a") as f:
                    f.write("".join(f"{n}\n" for n in sorted(new)))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def stop(self) -> set[str]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        return self.names
