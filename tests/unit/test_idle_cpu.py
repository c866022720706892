"""tests/idle_cpu.py, which runs `make test`'s third session in the kernel's idle CPU class, and
the session sets it runs (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BESIDE_SLURM, ROOT, SPARE_CPU

sys.path.insert(0, str(ROOT / "tests"))
import idle_cpu  # noqa: E402

HELPER = [sys.executable, str(ROOT / "tests" / "idle_cpu.py")]
# This CI kind's (cgroup v1, cpu and cpuacct apart, and a cgroup v2 hierarchy beside them).
V1_CGROUP = "4:memory:/process_api/33a9\n2:cpuacct:/\n1:cpu:/\n0::/\n"
V1_MOUNTS = """\
30 25 0:26 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
32 25 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 25 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V2_CGROUP = "0::/user.slice/session-3.scope\n"
V2_MOUNTS = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_the_cpu_cgroup_is_found_in_either_version():
    assert idle_cpu.cpu_cgroup_dir(V1_CGROUP, V1_MOUNTS) == (Path("/sys/fs/cgroup/cpu"), 1)
    # cpu and cpuacct mounted together, this process in a group of its own
    both = "3:cpu,cpuacct:/ci/job7\n"
    mounts = "32 25 0:28 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
    assert idle_cpu.cpu_cgroup_dir(both, mounts) == (Path("/sys/fs/cgroup/cpu,cpuacct/ci/job7"), 1)
    expected = Path("/sys/fs/cgroup/user.slice/session-3.scope")
    assert idle_cpu.cpu_cgroup_dir(V2_CGROUP, V2_MOUNTS) == (expected, 2)
    # A container's mount holds only its own part of the hierarchy: the groups under its root.
    inner = "0::/docker/abc/sub\n"
    mounts = "29 23 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert idle_cpu.cpu_cgroup_dir(inner, mounts) == (Path("/sys/fs/cgroup/sub"), 2)


def test_no_cpu_hierarchy_says_so():
    with pytest.raises(idle_cpu.Unavailable, match="no cgroup cpu hierarchy"):
        idle_cpu.cpu_cgroup_dir("4:memory:/\n", V1_MOUNTS)
    # the process's group lies outside what is mounted
    with pytest.raises(idle_cpu.Unavailable, match="no cgroup cpu hierarchy"):
        mounts = "1 2 0:1 /docker/abc /sys/fs/cgroup - cgroup2 x rw\n"
        idle_cpu.cpu_cgroup_dir("0::/other\n", mounts)


def test_every_module_is_in_one_session_at_most():
    assert not SPARE_CPU & BESIDE_SLURM
    files = {p.name for p in (ROOT / "tests").glob("*/test_*.py")}
    assert SPARE_CPU | BESIDE_SLURM <= files, (SPARE_CPU | BESIDE_SLURM) - files


def idle_class_here() -> bool:
    """Where `make test` runs its third session in the idle class: CI must (it is root)."""
    proc = subprocess.run([*HELPER, "check"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 and os.environ.get("CI") == "true":
        pytest.fail(f"CI: no idle CPU class: {proc.stdout}")
    return proc.returncode == 0


def test_the_command_and_what_it_starts_run_in_an_idle_group_removed_after():
    if not idle_class_here():
        pytest.skip("no idle CPU class here (not root, or no cpu.idle): make test runs the "
                    "spare-CPU tests after the others")  # fmt: skip
    # a grandchild in a session of its own: still in the group
    code = "import subprocess; subprocess.run(['setsid', 'cat', '/proc/self/cgroup'], check=True)"
    proc = subprocess.run([*HELPER, "run", "--", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    groups = {hid: path for hid, controllers, path in
              (line.split(":", 2) for line in proc.stdout.splitlines())
              if hid == "0" or "cpu" in controllers.split(",")}  # fmt: skip
    group = groups.get(next((h for h in groups if h != "0"), "0"), "")
    assert Path(group).name.startswith(idle_cpu.PREFIX), group
    parent, _ = idle_cpu.cpu_cgroup_dir(
        Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text()
    )
    assert not (parent / Path(group).name).exists()  # removed when the command ended


def test_the_group_is_idle_and_what_outlives_the_command_is_killed_and_named():
    if not idle_class_here():
        pytest.skip("no idle CPU class here (not root, or no cpu.idle)")
    code = "import subprocess; subprocess.Popen(['sleep', '300'], start_new_session=True)"
    proc = subprocess.run([*HELPER, "run", "--", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1 and "killed what outlived" in proc.stdout, proc
    assert "sleep 300" in proc.stdout
    left = subprocess.run(["pgrep", "-f", "^sleep 300$"], capture_output=True, text=True)
    assert left.stdout == ""


def test_the_idle_flag_is_set_on_the_group():
    if not idle_class_here():
        pytest.skip("no idle CPU class here (not root, or no cpu.idle)")
    parent, version = idle_cpu.cpu_cgroup_dir(
        Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text()
    )
    g = idle_cpu.make_group(parent, version, f"{idle_cpu.PREFIX}test-{os.getpid()}")
    try:
        assert (g / "cpu.idle").read_text().strip() == "1"
    finally:
        assert idle_cpu.remove_group(g) == []
    assert not g.exists()


def test_usage_without_a_command():
    proc = subprocess.run([*HELPER, "run"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "idle_cpu.py run -- CMD" in proc.stderr
