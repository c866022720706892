"""Session fixtures for real Slurm clusters started by ``cluster/slurm-local.sh``.

``slurm_cluster``: the single-node cluster (node ``localhost``). ``slurm_multinode``: a cluster of
2 nodes (``esnode1``, ``esnode2``), one slurmd per network namespace; ``slurm_three_nodes``: the
same with 3. The modes share /etc/slurm and Slurm's ports, so only one runs at a time: one
session-wide :class:`ClusterSwitch` brings up the mode a test asks for (stopping the other first),
whatever order pytest runs the modules in; the conftest also orders the multi-node tests last so
the modes switch as rarely as possible.

A cluster that was running before the session (a developer's) is left running in its mode at the
end; one the tests started is stopped.
"""

from __future__ import annotations

import os
import re
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
MULTINODE_FIXTURES = ("slurm_multinode", "slurm_three_nodes")


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


@dataclass(frozen=True)
class MultiNodeCluster:
    """``slurm-local.sh up --nodes N``: nodes esnode1..N, each 4 CPUs, 8000 MB, 4 fake GPUs."""

    nodes: tuple[str, ...]
    script: Path = SCRIPT
    default_partition: str = "dgx2"
    account: str = "energysweep"
    gpus_per_node: int = 4
    cpus_per_node: int = 4
    mem_mb_per_node: int = 8000
    state: Path = Path(os.environ.get("ENERGYSWEEP_SLURM_STATE", "/var/run/energysweep-slurm"))


def run_script(subcommand: str, timeout_s: float, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``cluster/slurm-local.sh SUBCOMMAND ARGS`` and capture its output."""
    return subprocess.run(
        ["bash", str(SCRIPT), subcommand, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _describe(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


def running_nodes() -> int | None:
    """Nodes of the cluster that is up now (``status``), None if none is fully up."""
    status = run_script("status", QUICK_TIMEOUT_S)
    match = re.search(r"cluster is up \((\d+) node", status.stdout)
    if status.returncode == 0 and match:
        return int(match.group(1))
    return None


def in_ci() -> bool:
    """CI sets CI=true (GitHub Actions, GitLab, ... and `.ci/run`)."""
    return os.environ.get("CI", "").lower() == "true"


def cannot_start(reason: str) -> None:
    """A cluster that cannot start here: a skip on a developer's machine, a failure in CI.

    In CI the Slurm tests are part of what is checked: a machine where the cluster cannot start
    must turn the run red, never green with 13 tests skipped.
    """
    if in_ci():
        pytest.fail(f"{reason} (CI=true: the Slurm tests must run in CI)", pytrace=False)
    pytest.skip(reason)


class ClusterSwitch:
    """Brings up the cluster mode a test needs; remembers what the session found."""

    def __init__(self) -> None:
        self.found: int | None = None
        self.checked: set[int] = set()
        self.current: int | None = None
        self.touched = False

    def start(self) -> None:
        status = run_script("status", QUICK_TIMEOUT_S)
        # Any daemon of ours running means someone (a developer) started it.
        if status.returncode == 0 or "running (pid" in status.stdout:
            self.found = running_nodes() or 1
        self.current = running_nodes()

    def ensure(self, nodes: int) -> None:
        if nodes not in self.checked:
            check = run_script("check", QUICK_TIMEOUT_S, "--nodes", str(nodes))
            if check.returncode != 0:
                cannot_start(f"no local Slurm cluster: {(check.stdout + check.stderr).strip()}")
            self.checked.add(nodes)
        if self.current == nodes:
            return
        self.touched = True
        if self.current is not None or self.found is not None:
            down = run_script("down", DOWN_TIMEOUT_S)
            if down.returncode != 0:
                pytest.fail(f"cluster/slurm-local.sh down failed: {_describe(down)}", pytrace=False)
        self.current = None
        up = run_script("up", UP_TIMEOUT_S, "--nodes", str(nodes))
        if up.returncode != 0:
            run_script("down", DOWN_TIMEOUT_S)
            pytest.fail(
                f"cluster/slurm-local.sh up --nodes {nodes} failed: {_describe(up)}", pytrace=False
            )
        self.current = nodes

    def finish(self) -> None:
        if self.found is not None and (self.current == self.found or not self.touched):
            return  # the developer's cluster, as found
        if self.current is not None or self.touched:
            down = run_script("down", DOWN_TIMEOUT_S)
            if down.returncode != 0:
                pytest.fail(f"cluster/slurm-local.sh down failed: {_describe(down)}", pytrace=False)
        if self.found is not None:
            up = run_script("up", UP_TIMEOUT_S, "--nodes", str(self.found))
            if up.returncode != 0:
                pytest.fail(
                    f"could not restore the {self.found}-node cluster: {_describe(up)}",
                    pytrace=False,
                )


@pytest.fixture(scope="session")
def slurm_switch() -> Iterator[ClusterSwitch]:
    switch = ClusterSwitch()
    switch.start()
    yield switch
    switch.finish()


@pytest.fixture
def slurm_cluster(slurm_switch: ClusterSwitch) -> SlurmCluster:
    """A running single-node local Slurm cluster; skipped only where ``check`` fails."""
    slurm_switch.ensure(1)
    return SlurmCluster()


@pytest.fixture
def slurm_multinode(slurm_switch: ClusterSwitch) -> MultiNodeCluster:
    """A running 2-node cluster (esnode1, esnode2), one slurmd per network namespace."""
    slurm_switch.ensure(2)
    return MultiNodeCluster(nodes=("esnode1", "esnode2"))


@pytest.fixture
def slurm_three_nodes(slurm_switch: ClusterSwitch) -> MultiNodeCluster:
    """A running 3-node cluster (esnode1..3)."""
    slurm_switch.ensure(3)
    return MultiNodeCluster(nodes=("esnode1", "esnode2", "esnode3"))


def order_multinode_last(items: list) -> None:
    """Stable sort: single-node tests, then 2-node, then 3-node ones (fewest mode switches);
    within a mode, tests marked ``last_on_its_cluster`` last (they check a sweep that ran beside
    the tests before them)."""

    def mode(item) -> tuple[int, bool]:
        names = getattr(item, "fixturenames", ())
        nodes = max((i + 1 for i, n in enumerate(MULTINODE_FIXTURES) if n in names), default=0)
        return nodes, item.get_closest_marker("last_on_its_cluster") is not None

    items.sort(key=mode)
