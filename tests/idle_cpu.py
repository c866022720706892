"""Runs a command in the kernel's idle CPU class, where it takes only CPU time nothing else wants.

`make test` runs two pytest sessions side by side on 2 cores, and both wait at once now and then
(Slurm scheduling, cooldowns, idle baselines, collective timeouts): ~14% of the cores sat idle
(issue 28's note). A third session of tests that hold no timing bound and start nothing that has
a deadline (tests/conftest.py, SPARE_CPU) runs in a cgroup whose ``cpu.idle`` is 1: the
scheduler gives its tasks a CPU only where no other task wants one, and a waking task of the two
sessions preempts them at once, so those sessions keep the contention their timing bounds were
calibrated under. (A third session at normal weight moved emulated window edges past their truth
bounds, and ``nice`` 19 did not hold for children that start sessions of their own: a cgroup
holds every descendant, whatever its session; docs/development.md.)

    python tests/idle_cpu.py check          # exit 0 where an idle group can be made, else 1 and why
    python tests/idle_cpu.py run -- CMD...  # CMD's exit status; 75 (and why) where none can be

Linux only, and root (or a delegated cgroup): cgroup v1's ``cpu`` hierarchy or cgroup v2 with the
``cpu`` controller, and a kernel with ``cpu.idle`` (5.15+). The group is a child of this process's
own cpu cgroup, named after this process, and removed when the command ends; any process of the
command still in it then is killed and named (nothing a test starts may outlive it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

NO_IDLE_GROUP = 75  # EX_TEMPFAIL: `run` could not make the group and ran nothing
PREFIX = "energysweep-idle-"


class Unavailable(Exception):
    """No idle CPU group can be made here; the message says why."""


def cpu_cgroup_dir(proc_cgroup: str, mountinfo: str) -> tuple[Path, int]:
    """(the directory of this process's cpu cgroup, the cgroup version) from the text of
    /proc/self/cgroup and /proc/self/mountinfo: cgroup v1's ``cpu`` hierarchy where one is
    mounted, else the cgroup v2 one. A mount of part of a hierarchy (a container's) holds the
    groups under its root."""
    paths: dict[int, str] = {}
    for line in proc_cgroup.splitlines():
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and controllers == "":
            paths[2] = path
        elif "cpu" in controllers.split(","):
            paths[1] = path
    for version in (1, 2):
        if version not in paths:
            continue
        for line in mountinfo.splitlines():
            fields = line.split()
            sep = fields.index("-")
            root, point, fstype, options = fields[3], fields[4], fields[sep + 1], fields[-1]
            if fstype != ("cgroup" if version == 1 else "cgroup2"):
                continue
            if version == 1 and "cpu" not in options.split(","):
                continue
            rel = os.path.relpath(paths[version], root)
            if not rel.startswith(".."):
                return Path(point) / rel if rel != "." else Path(point), version
    raise Unavailable("no cgroup cpu hierarchy holds this process (/proc/self/mountinfo)")


def make_group(parent: Path, version: int, name: str) -> Path:
    """The child group ``name`` of ``parent`` with cpu.idle 1."""
    if version == 2:
        enabled = (parent / "cgroup.subtree_control").read_text().split()
        if "cpu" not in enabled:
            raise Unavailable(f"the cpu controller is not enabled for {parent}'s children")
    if not (parent / "cpu.idle").exists() and version == 1:
        raise Unavailable(f"{parent} has no cpu.idle (a kernel before 5.15)")
    group = parent / name
    try:
        group.mkdir()
    except OSError as exc:
        raise Unavailable(f"cannot make {group}: {exc.strerror}") from exc
    try:
        (group / "cpu.idle").write_text("1\n")
    except OSError as exc:
        group.rmdir()
        raise Unavailable(f"cannot set {group}/cpu.idle: {exc.strerror}") from exc
    return group


def group_pids(group: Path) -> list[int]:
    return [int(p) for p in (group / "cgroup.procs").read_text().split()]


def remove_group(group: Path, timeout_s: float = 10.0) -> list[str]:
    """Kill what is still in ``group`` (named in the result), then remove it."""
    left = []
    for pid in group_pids(group):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            os.kill(pid, signal.SIGKILL)
            left.append(f"{pid}: {cmd.strip()[:200]}")
        except (OSError, ProcessLookupError):
            pass
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            group.rmdir()
            return left
        except OSError:  # EBUSY until the killed processes are gone
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def prepare() -> Path:
    """The idle group for this process's command, or Unavailable."""
    if not sys.platform.startswith("linux"):
        raise Unavailable("not Linux")
    parent, version = cpu_cgroup_dir(
        Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text()
    )
    return make_group(parent, version, f"{PREFIX}{os.getpid()}")


def run(argv: list[str]) -> int:
    try:
        group = prepare()
    except (Unavailable, OSError) as exc:
        print(f"idle_cpu: no idle CPU class here: {exc}", file=sys.stderr)
        return NO_IDLE_GROUP
    procs = str(group / "cgroup.procs")

    def enter() -> None:  # in the child, before exec: the command and all it starts are in it
        with open(procs, "w") as f:
            f.write(str(os.getpid()))

    try:
        child = subprocess.Popen(argv, preexec_fn=enter)  # noqa: PLW1509 (no threads here)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda s, _f: child.send_signal(s))
        rc = child.wait()
    finally:
        left = remove_group(group)
    if left:
        print(f"idle_cpu: killed what outlived `{' '.join(argv)}`:", *left, sep="\n  ")
        return rc or 1
    return rc


def main(argv: list[str]) -> int:
    if argv[:1] == ["check"]:
        try:
            remove_group(prepare())
        except (Unavailable, OSError) as exc:
            print(f"no idle CPU class here: {exc}")
            return 1
        return 0
    if argv[:2] == ["run", "--"] and argv[2:]:
        return run(argv[2:])
    print(__doc__.split("\n\n")[2], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
