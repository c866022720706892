"""Which processes compute on which emulated GPU: the node's process list.

A real GPU lists every process with a compute context on it
(``nvmlDeviceGetComputeRunningProcesses``), whichever job or user started it. The emulated node
keeps the same list node-wide, across the jobs of a sweep (each has its own state directory but
the same GPUs: hw/emulated/node.py names a GPU by host and index): one empty file
``<dir>/<host>/<uuid>/<pid>`` per process on a GPU, in the node-local directory :data:`ENV`
names (default :data:`DEFAULT_DIR`). A GPU's owner (a rank, hw/emulated/owner.py) registers
itself while it owns the GPU; a process that is not a job's (a test's "foreign" process)
registers with :func:`register` or ``python -m energysweep.hw.emulated.processes --uuid GPU-...
--seconds S``. Dead processes drop out of the list (their files are removed when it is read).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import time
from pathlib import Path

from energysweep.hw.emulated.state import pid_alive

ENV = "ENERGYSWEEP_EMULATED_PROCESSES_DIR"
DEFAULT_DIR = "/tmp/energysweep-emulated-processes"


def _gpu_dir(uuid: str, host: str | None = None, environ=None) -> Path:
    environ = os.environ if environ is None else environ
    base = Path(environ.get(ENV) or DEFAULT_DIR)
    return base / (host or socket.gethostname()) / uuid


def register(uuid: str, pid: int, host: str | None = None, environ=None) -> Path:
    """Process ``pid`` computes on the emulated GPU ``uuid`` (until it exits or
    :func:`unregister`)."""
    d = _gpu_dir(uuid, host, environ)
    d.mkdir(parents=True, exist_ok=True)
    path = d / str(int(pid))
    path.touch()
    return path


def unregister(uuid: str, pid: int, host: str | None = None, environ=None) -> None:
    with contextlib.suppress(OSError):
        (_gpu_dir(uuid, host, environ) / str(int(pid))).unlink()


def running(uuid: str, host: str | None = None, environ=None) -> list[int]:
    """Live processes on the emulated GPU ``uuid``, oldest pid first."""
    d = _gpu_dir(uuid, host, environ)
    try:
        names = os.listdir(d)
    except OSError:
        return []
    out = []
    for name in names:
        if not name.isdigit():
            continue
        if pid_alive(int(name)):
            out.append(int(name))
        else:
            with contextlib.suppress(OSError):
                (d / name).unlink()
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    """A foreign process: computes (registered) on an emulated GPU for ``--seconds``."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--uuid", required=True, action="append", help="emulated GPU UUID")
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    for uuid in args.uuid:
        register(uuid, os.getpid())
    print("registered", os.getpid(), flush=True)
    try:
        time.sleep(args.seconds)
    finally:
        for uuid in args.uuid:
            unregister(uuid, os.getpid())
    return 0


if __name__ == "__main__":
    sys.exit(main())
