"""Session fixture for a real single-node Slurm cluster started by ``cluster/slurm-local.sh``.

Import ``slurm_cluster`` from a conftest (``from slurm_fixtures import slurm_cluster``) or load this
module as a plugin (``pytest -p slurm_fixtures`` with ``tests/integration`` on ``sys.path``).

The fixture starts the cluster when it is not running and stops it at the end of the session only
if it started it, so a developer's running cluster survives the test run.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "cluster" / "slurm-local.sh"

# A cold `up` on a clean machine runs apt-get update + install (~25 s seen here, slower mirrors
# take minutes); a warm one takes ~5 s.
UP_TIMEOUT_S = 480
DOWN_TIMEOUT_S = 180
QUICK_TIMEOUT_S = 60


@dataclass(frozen=True)
class SlurmCluster:
    """What the local cluster offers; values match ``cluster/templates/slurm.conf``."""

    script: Path = SCRIPT
    node: str = "localhost"
    default_partition: str = "dgx2"
    partitions: tuple[str, ...] = ("dgx2", "gpu")
    account: str = "energysweep"
    gpus_per_node: int = 4
    cpus_per_node: int = 8
    mem_mb_per_node: int = 16000
    state: Path = Path(os.environ.get("ENERGYSWEEP_SLURM_STATE", "/var/run/energysweep-slurm"))


def run_script(subcommand: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run ``cluster/slurm-local.sh SUBCOMMAND`` and capture its output."""
    return subprocess.run(
        ["bash", str(SCRIPT), subcommand],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _describe(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A running local Slurm cluster; skipped only where ``slurm-local.sh check`` fails."""
    check = run_script("check", QUICK_TIMEOUT_S)
    if check.returncode != 0:
        pytest.skip(f"no local Slurm cluster: {(check.stdout + check.stderr).strip()}")

    status = run_script("status", QUICK_TIMEOUT_S)
    # Any daemon of ours running means someone (a developer) started it: leave it running after.
    already_running = status.returncode == 0 or "running (pid" in status.stdout

    up = run_script("up", UP_TIMEOUT_S)
    if up.returncode != 0:
        if not already_running:
            run_script("down", DOWN_TIMEOUT_S)
        pytest.fail(f"cluster/slurm-local.sh up failed: {_describe(up)}", pytrace=False)

    yield SlurmCluster()

    if not already_running:
        down = run_script("down", DOWN_TIMEOUT_S)
        if down.returncode != 0:
            pytest.fail(f"cluster/slurm-local.sh down failed: {_describe(down)}", pytrace=False)
