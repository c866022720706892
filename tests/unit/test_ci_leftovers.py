"""CI's last check (.ci/leftovers.py) sees what a job would leave: a marked process, an engine
segment, a new /dev/shm entry no process uses, a job temp dir. Planted here (unique names, removed
afterwards); other leftovers of a shared machine may be listed too, so only ours are asserted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPT = ROOT / ".ci" / "leftovers.py"


def leftovers(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.timeout(180)
def test_ci_check_lists_what_a_job_would_leave(tmp_path):
    tag = uuid.uuid4().hex[:12]
    snapshot = tmp_path / "before"
    assert leftovers("snapshot", str(snapshot)).returncode == 0
    segment = Path(f"/dev/shm/-test{tag}-tp:0-[0-1]-cpushm_0")
    new = Path(f"/dev/shm/leftover-test-{tag}")
    tmpdir = Path(tempfile.gettempdir()) / f"energysweep-job-test{tag}"
    env = {**os.environ, "ENERGYSWEEP_JOB_MARK": f"test-{tag}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", f"marked-{tag}"], env=env
    )
    try:
        segment.write_bytes(b"\0" * 64)
        new.write_bytes(b"\0" * 64)
        tmpdir.mkdir()
        found = leftovers("check", "--before", str(snapshot))
        assert found.returncode == 1
        lines = found.stderr.splitlines()
        assert any(f"process {proc.pid} of a job" in line for line in lines), lines
        assert f"leftover: engine segment {segment}" in lines
        assert f"leftover: {new}: created since the snapshot, no live process uses it" in lines
        assert f"leftover: job temp dir {tmpdir}" in lines
    finally:
        proc.kill()
        proc.wait(timeout=10)
        segment.unlink(missing_ok=True)
        new.unlink(missing_ok=True)
        tmpdir.rmdir()
    again = leftovers("check", "--before", str(snapshot))
    assert tag not in again.stderr


@pytest.mark.timeout(180)
def test_ci_check_lists_a_process_still_working_in_a_workflow_copy(tmp_path):
    """An orphaned Snakemake of a test's workflow copy carries no job mark (CI run 47 left one):
    any process still working in the checkout or pytest's temp dirs is a leftover, except this
    check and the commands that started it."""
    tag = uuid.uuid4().hex[:12]
    wf = tmp_path / "wf"
    wf.mkdir()
    # An orphan, as the leftover was: started by a shell that exits at once (reparented).
    sleeper = (
        f'"{sys.executable}" -c "import time; time.sleep(120)" {tag} >/dev/null 2>&1 & echo $!'
    )
    pid = int(subprocess.run(["sh", "-c", sleeper], cwd=wf, capture_output=True, text=True,
                             timeout=30).stdout)  # fmt: skip
    try:
        found = leftovers("check", "--tree", str(tmp_path), "--tree", str(ROOT))
        assert found.returncode == 1
        lines = found.stderr.splitlines()
        assert any(f"process {pid} working in {wf} " in line for line in lines), lines
        # pytest works in the checkout too, but it started the check.
        assert not any(f"process {os.getpid()} " in line for line in lines), lines
    finally:
        os.kill(pid, signal.SIGKILL)
    for _ in range(100):  # dead (gone, or a zombie until init reaps it)
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            break
        if state in ("Z", "X"):
            break
        time.sleep(0.1)
    again = leftovers("check", "--tree", str(tmp_path))
    assert tag not in again.stderr and str(wf) not in again.stderr
