"""Which processes belong to a measure job: its mark and its root, read from ``/proc``.

The launcher (energysweep.launch.procs) starts the job's command with :data:`MARK_VAR` (the
job's id) and :data:`ROOT_VAR` (the measure step's pid) in its environment; every process of the
job inherits both. A process belongs to the job when it descends from the root or carries the
mark (a process that set its title may have lost its environment; one reparented away from the
root still carries it).
"""

from __future__ import annotations

import os
from pathlib import Path

MARK_VAR = "ENERGYSWEEP_JOB_MARK"
ROOT_VAR = "ENERGYSWEEP_JOB_ROOT_PID"


def parent(pid: int) -> int | None:
    """The parent of ``pid``; None where it is gone or not visible here."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])  # the comm field may hold spaces and ")"


def visible(pid: int) -> bool:
    """Whether ``pid`` exists in this process's pid namespace."""
    return Path(f"/proc/{pid}").exists()


def descends_from(pid: int, root: int) -> bool:
    """Whether ``pid`` is ``root`` or one of its descendants (following parents up)."""
    seen = set()
    while pid and pid not in seen:
        if pid == root:
            return True
        seen.add(pid)
        nxt = parent(pid)
        if nxt is None:
            return False
        pid = nxt
    return False


def carries(pid: int, name: str, value: str) -> bool:
    """Whether ``pid``'s environment holds ``name=value`` (False where unreadable)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{name}={value}".encode() in environ.split(b"\0")


def of_job(pid: int, environ=None) -> bool:
    """Whether ``pid`` belongs to this process's measure job (its root's tree, or its mark);
    outside a launched job, only this process and its descendants."""
    environ = os.environ if environ is None else environ
    if pid == os.getpid():
        return True
    root = environ.get(ROOT_VAR)
    if descends_from(pid, int(root) if root and root.isdigit() else os.getpid()):
        return True
    mark = environ.get(MARK_VAR)
    return bool(mark) and carries(pid, MARK_VAR, mark)
