"""The processes of one measure job as one unit: start, find, and stop all of them.

A job's processes do not share a process group: torchrun starts every rank in a session of its
own (``start_new_session``), and engines spawn workers of their own. What they all share is their
environment, inherited from the measure step: :func:`start` sets ``ENERGYSWEEP_JOB_MARK`` to the
job's id, and :func:`marked` finds every live process that carries it (``/proc/PID/environ``),
wherever it was reparented. :func:`stop` sends SIGTERM to all of them, and SIGKILL after a grace
period to those still alive.

Should the measure step itself be SIGKILLed (no handler runs), the kernel stops the rest: the
launched command gets SIGTERM when the measure step dies (``PR_SET_PDEATHSIG``), torchrun then
stops its ranks, and every rank gets SIGKILL when its launcher dies (:func:`die_with_parent`,
called first thing in ``energysweep.run``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from energysweep.util.proctree import MARK_VAR, ROOT_VAR

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _set_pdeathsig(sig: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def become_subreaper() -> None:
    """Make this process a child subreaper: its descendants whose parent dies are reparented to
    it, not to init, so :func:`descendants` still finds them.

    The job mark cannot find every process: a process that sets its title (vLLM's engine and
    workers, ``setproctitle``) overwrites the memory ``/proc/PID/environ`` shows, mark included.
    A process that starts such a server (the serving client) is a subreaper and stops its
    descendants itself.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def descendants(root: int) -> list[int]:
    """Live (not zombie) descendants of ``root``, parents before children."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields is not None and fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo += children.get(pid, [])
    return out


def reap() -> None:
    """Collect exited children this process adopted as a subreaper (no zombies left behind)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent (its launcher) dies.

    If the parent is already gone (reparented to init), exit now: nobody supervises this rank.
    """
    parent = os.getppid()
    _set_pdeathsig(sig)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def start(argv: list[str], env: dict, log, mark: str) -> subprocess.Popen:
    """Start ``argv`` in a session of its own, marked with ``mark``, output to ``log``.

    Its own session: a terminal's Ctrl-C or a signal to Snakemake's process group reaches only
    the measure step, whose handler then stops the job as a whole (:func:`stop`). The launched
    command is sent SIGTERM by the kernel if the measure step dies without stopping it.
    """
    # The root: the job's processes tell theirs from others' on a GPU (energysweep.util.proctree).
    env = {**env, MARK_VAR: mark, ROOT_VAR: str(os.getpid())}
    return subprocess.Popen(
        argv,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: _set_pdeathsig(signal.SIGTERM),
    )


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` from its third field (state) on; None if the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()  # the comm field may hold spaces and parentheses


def _state(pid: int) -> str | None:
    fields = _stat(pid)
    return None if fields is None else fields[0]


def marked(mark: str) -> list[int]:
    """Pids of live processes (not zombies) whose environment holds ``MARK_VAR=mark``."""
    needle = f"{MARK_VAR}={mark}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ.split(b"\0") and _state(pid) not in (None, "Z", "X"):
            found.append(pid)
    return sorted(found)


def _signal(pids, sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop(proc: subprocess.Popen | None, mark: str, grace_s: float, log=None) -> list[int]:
    """Stop every process of the job: SIGTERM, then SIGKILL after ``grace_s`` seconds.

    Args:
        proc: the launched command (its session leader); None if it may not have started.
        mark: the job's mark (:func:`start`).
        grace_s: how long processes may take to exit after SIGTERM (``limits.kill_grace_s``).
        log: where to say what was stopped.

    Returns:
        The pids that were still alive after the grace period (and were SIGKILLed).
    """

    def running() -> bool:
        return proc is not None and proc.poll() is None

    seen: dict[int, str | None] = {}  # pid: start time

    def alive() -> list[int]:
        pids = set(marked(mark))
        if proc is not None and proc.poll() is None:
            pids.add(proc.pid)
        seen.update({pid: _started(pid) for pid in pids if pid not in seen})
        return sorted(pids)

    pids = alive()
    if pids and log is not None:
        print(
            f"stopping the job's processes {pids}: SIGTERM, SIGKILL after {grace_s:g} s",
            file=log,
            flush=True,
        )
    if proc is not None and running():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = alive()  # running() reaps the launched command as soon as it exits
    killed = pids
    if killed:
        if log is not None:
            print(f"still alive after {grace_s:g} s: SIGKILL to {killed}", file=log, flush=True)
        if proc is not None and running():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        _signal(killed, signal.SIGKILL)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(5.0, grace_s))
    # SIGKILL cannot be ignored; wait (bounded) until the kernel has removed them. The mark alone
    # cannot tell: a process that is exiting has released its memory, and its environment cannot
    # be read (ESRCH), long before it is a zombie (270 ms for a 6 GB process; CI saw a test's
    # process still exiting after marked() was empty).
    deadline = time.monotonic() + 10
    while (marked(mark) or _exiting(seen)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return killed


def _exiting(seen: dict[int, str | None]) -> list[int]:
    """Those of ``seen`` (pid: start time, :func:`_started`) the kernel has not yet made zombies
    or removed; a pid now held by a process started at another time was reused."""
    out = []
    for pid, started in seen.items():
        fields = _stat(pid)
        if fields is not None and fields[0] not in ("Z", "X") and fields[19] == started:
            out.append(pid)
    return out


def _started(pid: int) -> str | None:
    """When ``pid`` started (``/proc/PID/stat`` field 22, clock ticks since boot), None if gone."""
    fields = _stat(pid)
    return None if fields is None else fields[19]


def live_marks() -> set[str]:
    """The marks of every live process (not zombies) on this node that carries one."""
    prefix = f"{MARK_VAR}=".encode()
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry.name}/environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        for var in environ.split(b"\0"):
            if var.startswith(prefix) and _state(int(entry.name)) not in (None, "Z", "X"):
                found.add(var[len(prefix) :].decode(errors="replace"))
    return found
