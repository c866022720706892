"""After `make test` and `make run`: does the machine hold anything a job or a test cluster left?

Checked independently of the code under test (no energysweep import), from /proc, /dev/shm,
/sys and `ip`, as a person would look:

- processes: a live process whose environment carries a job mark (ENERGYSWEEP_JOB_MARK), or that
  works in this checkout or in pytest's temp dirs (a workflow copy's orphaned Snakemake carries
  no mark: CI run 47 left one), other than this check, the commands that started it and their
  children;
- shared memory: an engine segment of a job (vLLM's CPU communicator: ``*-cpushm_<rank>``) or any
  entry of /dev/shm created since ``--before`` that no live process maps or holds open;
- temp dirs: a job's own temp dir (``energysweep-job-*`` in the temp dir);
- Slurm: a slurmctld, slurmd or slurmdbd process, or a daemon whose pid file lies in the local
  cluster's state dir (cluster/slurm-local.sh);
- network: a namespace ``esnode*``, the bridge ``esbr0`` or a link ``esveth*`` (the multi-node
  cluster's).

Usage: ``python .ci/leftovers.py snapshot FILE`` before, ``python .ci/leftovers.py check
--before FILE`` after. Exit 1 and one line per leftover when anything is left.
"""

from __future__ import annotations

import argparse
import getpass
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

MARK = b"ENERGYSWEEP_JOB_MARK="
SHM = Path("/dev/shm")
ENGINE_SEGMENT = re.compile(r"-cpushm_\d+$")
SLURM_DAEMONS = ("slurmctld", "slurmd", "slurmdbd")
SLURM_STATE = Path(os.environ.get("ENERGYSWEEP_SLURM_STATE", "/var/run/energysweep-slurm"))


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def live_pids() -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = _read(f"/proc/{entry.name}/stat").decode(errors="replace")
            if stat and stat.rpartition(")")[2].split()[0] not in ("Z", "X"):
                pids.append(int(entry.name))
    return pids


def _cmdline(pid: int) -> str:
    return _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace")[:200]


def marked_pids(pids: list[int]) -> list[int]:
    return [
        pid
        for pid in pids
        if any(v.startswith(MARK) for v in _read(f"/proc/{pid}/environ").split(b"\0"))
    ]


def work_trees() -> list[Path]:
    """Where `make test` and `make run` run processes: this checkout (the working directory: .ci/run
    starts in it) and pytest's temp dirs (workflow copies, test clusters), named as pytest names
    them."""
    return [Path.cwd().resolve(), Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}"]


def _parent(pid: int) -> int:
    stat = _read(f"/proc/{pid}/stat").decode(errors="replace")
    return int(stat.rpartition(")")[2].split()[1]) if stat else 0


def this_check(pids: list[int]) -> set[int]:
    """This process, the ones that started it (.ci/run's shell, make, a terminal) and their
    children (a pipeline's `tee`): an orphan is reparented away from them."""
    ancestors, pid = set(), os.getpid()
    while pid > 1 and pid not in ancestors:
        ancestors.add(pid)
        pid = _parent(pid)
    return ancestors | {p for p in pids if _parent(p) in ancestors}


def stray_processes(pids: list[int], trees: list[Path], skip: set[int]) -> list[str]:
    """Live processes, other than ``skip``, whose working directory lies in one of ``trees``."""
    left = []
    for pid in pids:
        if pid in skip:
            continue
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            continue
        if any(cwd == tree or tree in cwd.parents for tree in trees):
            left.append(f"process {pid} working in {cwd} ({_cmdline(pid)})")
    return left


def shm_in_use(pids: list[int]) -> set[str]:
    """Names in /dev/shm mapped or held open by a live process."""
    used, inodes = set(), set()
    for pid in pids:
        for line in _read(f"/proc/{pid}/maps").decode(errors="replace").splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                used.add(parts[5][len("/dev/shm/") :].removesuffix(" (deleted)"))
                inodes.add(parts[4])
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/dev/shm/"):
                    used.add(target[len("/dev/shm/") :].removesuffix(" (deleted)"))
                    inodes.add(str(os.stat(f"/proc/{pid}/fd/{fd}").st_ino))
            except OSError:
                continue
    # A named semaphore (sem_open: sem.mp-*) is mapped under the temporary name it was made as,
    # deleted once linked to its own: the same inode.
    for entry in os.scandir(SHM):
        if str(entry.inode()) in inodes:
            used.add(entry.name)
    return used


def segments(before: set[str], pids: list[int]) -> list[str]:
    used = shm_in_use(pids)
    left = []
    for name in sorted(os.listdir(SHM)):
        if ENGINE_SEGMENT.search(name):
            left.append(
                f"engine segment /dev/shm/{name}"
                + (" (still mapped by a live process)" if name in used else "")
            )
        elif name not in before and name not in used:
            left.append(f"/dev/shm/{name}: created since the snapshot, no live process uses it")
    return left


def temp_dirs() -> list[str]:
    tmp = Path(tempfile.gettempdir())
    return [f"job temp dir {p}" for p in sorted(tmp.glob("energysweep-job-*"))]


def slurm(pids: list[int]) -> list[str]:
    left = [
        f"Slurm daemon {pid} ({_cmdline(pid)})"
        for pid in pids
        if _read(f"/proc/{pid}/comm").decode().strip() in SLURM_DAEMONS
    ]
    for pidfile in sorted(SLURM_STATE.glob("*.pid")) if SLURM_STATE.is_dir() else []:
        text = _read(str(pidfile)).decode().strip()
        if text.isdigit() and int(text) in pids:
            left.append(f"daemon {text} of the local cluster ({pidfile})")
    return left


def network() -> list[str]:
    left = []
    try:
        out = subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    left += [
        f"network namespace {line.split()[0]}"
        for line in out.splitlines()
        if line.startswith("esnode")
    ]
    links = os.listdir("/sys/class/net") if os.path.isdir("/sys/class/net") else []
    left += [f"network link {n}" for n in sorted(links) if n == "esbr0" or n.startswith("esveth")]
    return left


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("snapshot").add_argument("file", type=Path)
    check = sub.add_parser("check")
    check.add_argument("--before", type=Path, help="a snapshot taken before the run")
    check.add_argument(
        "--tree",
        type=Path,
        action="append",
        help="a directory no process may still work in (default: this checkout, pytest's temp)",
    )
    args = ap.parse_args(argv)
    if args.cmd == "snapshot":
        args.file.write_text("\n".join(sorted(os.listdir(SHM))) + "\n")
        return 0
    before = set(args.before.read_text().split()) if args.before else set(os.listdir(SHM))
    pids = live_pids()
    marked = marked_pids(pids)
    left = [
        *(f"process {pid} of a job ({_cmdline(pid)})" for pid in marked),
        *stray_processes(
            pids, [t.resolve() for t in args.tree or work_trees()], this_check(pids) | set(marked)
        ),
        *segments(before, pids),
        *temp_dirs(),
        *slurm(pids),
        *network(),
    ]
    for item in left:
        print(f"leftover: {item}", file=sys.stderr)
    print(f"leftovers after the run: {len(left)}")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
