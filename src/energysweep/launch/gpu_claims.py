"""One job per GPU outside Slurm: each measure job claims GPUs of its own on its node.

Under Slurm the allocation's GPUs are the job's (``CUDA_VISIBLE_DEVICES`` as Slurm set it). On
a workstation or a GPU box without a scheduler, every job would otherwise compute on the first
tp·pp·dp GPUs, whatever else runs there (issue 27: two jobs of one sweep measured one H200 at the
same time and every point said ``ok``). So a local job claims GPUs before its ranks start:

- one lock file per GPU UUID in a node-local directory (:data:`ENV`, default
  :data:`DEFAULT_DIR`), held with an exclusive ``flock`` by the measure step for the job's whole
  life. The kernel drops the lock when the process ends, however it ends (SIGKILL included), so a
  dead job never keeps a GPU;
- the job takes the first free GPUs among those it may use (``CUDA_VISIBLE_DEVICES`` of the step,
  default every GPU of the node) and its ranks see only them (``CUDA_VISIBLE_DEVICES`` = their
  NVML indices, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``);
- while too few are free it waits, saying in the rule log which GPUs it waits for and who holds
  them, at most ``limits.job_timeout_s`` (then the job fails, naming the holders).

The emulated node (measurement.device emulated) is claimed the same way by its GPUs' UUIDs:
the jobs of one local sweep share its GPUs as they would a real node's.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

from energysweep.hw import emulated, nvml

# The node-local directory of the claim files (one per GPU UUID); a test points it at its own.
ENV = "ENERGYSWEEP_GPU_CLAIMS_DIR"
DEFAULT_DIR = "/tmp/energysweep-gpu-claims"
# How often a waiting job tries again, and how often it says that it still waits.
POLL_S = 0.5
LOG_EVERY_S = 60.0


class ClaimTimeout(RuntimeError):
    """Too few GPUs became free within the wait's bound."""


@dataclass(frozen=True)
class Gpu:
    """A GPU a job may claim: its NVML index on the node (PCI bus order) and its UUID."""

    index: int
    uuid: str


def claims_dir(environ=None) -> Path:
    """The node-local directory of the claim files (:data:`ENV`, default :data:`DEFAULT_DIR`)."""
    environ = os.environ if environ is None else environ
    return Path(environ.get(ENV) or DEFAULT_DIR)


def node_gpus(device: str, env: dict) -> list[Gpu]:
    """The GPUs a job on this node may claim, in the order ``CUDA_VISIBLE_DEVICES`` lists them.

    Args:
        device: ``measurement.device``: ``cpu`` claims none; ``emulated`` the emulated node's
            GPUs (``env`` names its state); ``cuda``/``auto`` the GPUs NVML lists (none where
            NVML cannot start: a CPU machine).
        env: the ranks' environment (``CUDA_VISIBLE_DEVICES`` narrows the choice).
    """
    if device == "cpu":
        return []
    if device == "emulated":
        # CUDA indices as the emulated node numbers them (under device cgroups, positions in
        # the allocation), so that CUDA_VISIBLE_DEVICES names the same GPUs.
        node = emulated.node_from_env(env)
        listed = list(range(node.settings.gpus))
        if node.settings.device_cgroups and env.get(emulated.CGROUP_ENV) is not None:
            listed = [int(x) for x in env[emulated.CGROUP_ENV].split(",") if x.strip()]
        position = {node.gpus[i].uuid: k for k, i in enumerate(listed)}
        return [Gpu(position[u], u) for u in emulated.cuda_uuids(env)]
    try:
        with nvml.session():
            every = nvml.all_uuids()
            visible = nvml.resolve_visible_gpus(env.get("CUDA_VISIBLE_DEVICES"))
    except nvml.NVMLError:
        return []
    return [Gpu(every.index(u), u) for u in visible]


def node_gpu_count(measurement: dict) -> int:
    """GPUs of this node a local sweep's jobs can claim (the local profile's ``gpu`` resource):
    the emulated node's ``node_gpus``, none for ``device: cpu``, else NVML's count (0 where
    NVML cannot start: a CPU machine, whose jobs then wait for no GPU).

    Args:
        measurement: the validated config's ``measurement`` section.
    """
    device = measurement["device"]
    if device == "cpu":
        return 0
    if device == "emulated":
        return int(measurement["emulated"]["node_gpus"])
    try:
        with nvml.session():
            return nvml.device_count()
    except nvml.NVMLError:
        return 0


def _holder(path: Path) -> str:
    try:
        return path.read_text().strip() or "?"
    except OSError:
        return "?"


class _Claims:
    """The lock files this process holds (closed = released)."""

    def __init__(self, directory: Path, label: str):
        self.directory = directory
        self.label = label
        self.fds: dict[str, int] = {}

    def try_take(self, gpu: Gpu) -> bool:
        path = self.directory / f"{gpu.uuid}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:  # another user's file: a read-only descriptor locks as well
            fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise
        with contextlib.suppress(OSError):  # who holds it, for a waiting job's log line
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}: {self.label}\n".encode(), 0)
        self.fds[gpu.uuid] = fd
        return True

    def release(self) -> None:
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the descriptor drops the flock
        self.fds = {}


def _make_dir(directory: Path) -> None:
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # every user's jobs claim on this node
            directory.chmod(0o1777)


@contextlib.contextmanager
def claimed(
    gpus: list[Gpu],
    count: int,
    log,
    timeout_s: float,
    label: str,
    directory: Path | None = None,
    clock=time.monotonic,
    sleep=time.sleep,
):
    """Hold ``count`` of ``gpus`` for the ``with`` block; yields the claimed GPUs.

    Args:
        gpus: the GPUs the job may use (:func:`node_gpus`), in preference order.
        count: how many the job computes on (tp·pp·dp).
        log: the rule log (the claim, and every wait, say what they are about).
        timeout_s: the longest wait for free GPUs.
        label: who claims (the job), written into each claim file.
        directory: the claim files' directory (default :func:`claims_dir`).

    Raises:
        ClaimTimeout: fewer than ``count`` became free within ``timeout_s`` (or the node has
            fewer than ``count``).
    """
    directory = directory or claims_dir()
    if count > len(gpus):
        raise ClaimTimeout(
            f"{label} computes on {count} GPUs but this node has {len(gpus)} it may use "
            f"({', '.join(g.uuid for g in gpus) or 'none'})"
        )
    _make_dir(directory)
    held = _Claims(directory, label)
    t0 = clock()
    said = None
    try:
        while True:
            for g in gpus:
                if len(held.fds) < count and g.uuid not in held.fds:
                    held.try_take(g)
            if len(held.fds) == count:
                break
            busy = {g.uuid: _holder(directory / f"{g.uuid}.lock") for g in gpus}
            busy = {u: h for u, h in busy.items() if u not in held.fds}
            waited = clock() - t0
            if waited >= timeout_s:
                raise ClaimTimeout(
                    f"{label}: {count - len(held.fds)} more GPU(s) did not become free within "
                    f"{timeout_s:g} s (limits.job_timeout_s); held by: "
                    + "; ".join(f"{u} ({h})" for u, h in busy.items())
                )
            if said is None or waited - said >= LOG_EVERY_S:
                print(
                    f"gpu claim: waiting for {count - len(held.fds)} free GPU(s) of "
                    f"{len(gpus)} (claims in {directory}); held by: "
                    + "; ".join(f"{u} ({h})" for u, h in busy.items()),
                    file=log,
                    flush=True,
                )
                said = waited
            # Not holding some while waiting for the rest: two waiting jobs never deadlock.
            held.release()
            sleep(POLL_S)
        mine = [g for g in gpus if g.uuid in held.fds]
        print(
            f"gpu claim: {label} computes on "
            + ", ".join(f"{g.uuid} (index {g.index})" for g in mine)
            + f" after {clock() - t0:.1f} s",
            file=log,
            flush=True,
        )
        yield mine
    finally:
        held.release()


@contextlib.contextmanager
def job_gpus(device: str, count: int, env: dict, log, timeout_s: float, label: str):
    """The ranks' environment for the ``with`` block, with GPUs of their own on a local run.

    Under Slurm (``SLURM_JOB_ID``) the allocation is the job's: ``env`` as it is. Where the node
    has no GPU to claim (``measurement.device: cpu``, a CPU machine) likewise. Otherwise the job
    claims ``count`` GPUs (:func:`claimed`) and ``CUDA_VISIBLE_DEVICES`` names exactly them.
    """
    if os.environ.get("SLURM_JOB_ID") or env.get("SLURM_JOB_ID"):
        yield env
        return
    gpus = node_gpus(device, env)
    if not gpus:
        yield env
        return
    with claimed(gpus, count, log, timeout_s, label) as mine:
        out = dict(env)
        out["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # NVML's order: the indices below are NVML's
        out["CUDA_VISIBLE_DEVICES"] = ",".join(str(g.index) for g in mine)
        yield out
