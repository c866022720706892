"""CI's last check (.ci/leftovers.py) sees what a job would leave: a marked process, an engine
segment, a new /dev/shm entry no process uses, a job temp dir. Planted here (unique names, removed
afterwards); other leftovers of a shared machine may be listed too, so only ours are asserted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
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
