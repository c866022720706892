"""Per-rank distributed setup and the process audit.

The audit makes the "degree 2, one effective worker" bug impossible: every rank reports who it is,
and rank 0 refuses to measure unless the processes it sees are exactly the layout's world.

What that world is depends on the job's launch mode: its placement
(:class:`energysweep.job.placement.Placement`, computed once on the typed job as
``job.placement``, and passed to every function here). Under
torchrun one process per rank (tp*pp*dp); under direct/mpi one process per DP replica, whose GPU
workers the engine spawns itself. No function guesses a placement when none is passed.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Any

from energysweep.job.backends import BACKENDS
from energysweep.job.layout import ParallelLayout, RankCoords
from energysweep.job.placement import Placement


class LayoutMismatch(RuntimeError):
    """The processes that started do not form the layout the job was created for."""


class JobAborted(RuntimeError):
    """The ranks cannot go on together (a rank failed alone, is stuck or dead): fail the job."""


# A separate gloo group for the per-point failure agreement (see :func:`agree`): its collectives
# never queue behind, or mismatch with, a collective another rank is stuck in on the main group.
_AGREEMENT_GROUP = None
# Messages of gloo's (and NCCL's) communication failures: a timed-out or broken collective. After
# one, the process group is unusable (gloo closes the pairs), so the job cannot go on.
_COMM_FAILURE_MARKS = (
    "Timed out waiting",
    "Connection closed by peer",
    "pair closure",
    "Connection reset by peer",
    "NCCL communicator was aborted",
    "Watchdog caught collective operation timeout",
)


@dataclass
class RankContext:
    """Everything a backend needs to know about the rank it runs on.

    ``dtype``, ``seed`` and ``max_input_tokens`` are the job's (``job.dtype``, ``job.seed``,
    ``job.workload.max_input_tokens``); ``tp_mode`` is how the PyTorch backend shards TP
    (:func:`energysweep.torchpp.tp.apply_tensor_parallel`).
    """

    placement: Placement
    rank: int
    local_rank: int
    world_size: int
    coords: RankCoords
    device: str
    host: str
    pid: int
    model_dir: str
    dtype: str
    seed: int
    max_input_tokens: int
    tp_mode: str = "local"
    mesh: object = None  # torch DeviceMesh with dims ("dp", "pp", "tp") when distributed

    @property
    def layout(self) -> ParallelLayout:
        return self.placement.layout

    def audit(self) -> dict:
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "pid": self.pid,
            "host": self.host,
            "device": self.device,
            "dp_rank": self.coords.dp_rank,
            "pp_rank": self.coords.pp_rank,
            "tp_rank": self.coords.tp_rank,
            "is_writer": self.coords.is_writer,
        }


def env_world() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's environment; (0, 0, 1) without it."""
    return (
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("LOCAL_RANK", 0)),
        int(os.environ.get("WORLD_SIZE", 1)),
    )


def choose_device(requested: str, local_rank: int) -> str:
    """``auto`` -> cuda:<local_rank> when CUDA works, else cpu; ``cuda`` without a GPU fails.

    ``emulated``: the rank computes on the CPU; its GPU is an emulated one (energysweep.hw.nvml
    ``gpu_uuids``), whose power follows this rank's activity.
    """
    import torch

    if requested in ("cpu", "emulated"):
        return "cpu"
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        return f"cuda:{local_rank % count}"
    if requested == "cuda":
        raise RuntimeError(
            "measurement.device is cuda but torch sees no CUDA device "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    return "cpu"


def init(placement: Placement, device: str, timeout_s: float) -> tuple[int, int, int]:
    """Check the launcher started the placement's world, then start the process group.

    Every collective of the job (main group, the device mesh's TP/PP/DP groups, the agreement
    group) then fails after ``timeout_s`` (``limits.collective_timeout_s``) instead of waiting
    forever for a rank that is stuck or dead.

    Raises:
        LayoutMismatch: WORLD_SIZE differs from the launcher processes the backend's launch mode
            expects (e.g. one process where two were asked).
    """
    rank, local_rank, world = env_world()
    layout, backend = placement.layout, placement.backend
    mode = placement.launch_mode
    expected, _ = placement.processes
    if world != expected:
        raise LayoutMismatch(
            f"layout {layout} ({backend}, launch {mode}) expects world size {expected} but the "
            f"launcher started world size {world} (WORLD_SIZE={os.environ.get('WORLD_SIZE')!r}); "
            "refusing to measure"
        )
    # vLLM's external_launcher reuses this group; left to create its own it fails under torchrun
    # with dp > 1 (gloo `rank < size`), so its ranks always get one, even a world of 1.
    if world > 1 or (BACKENDS[backend].torchrun_always and mode == "torchrun"):
        import torch.distributed as dist

        # Under direct/mpi the GPUs belong to the engine's workers: our processes only
        # coordinate window edges and gather rows, on the CPU.
        on_gpu = device.startswith("cuda") and mode == "torchrun"
        pg_backend = "nccl" if on_gpu else "gloo"
        kwargs: dict[str, Any] = {}
        if pg_backend == "nccl":
            import torch

            # Object collectives (all_gather_object) use the current device; device_id binds
            # the NCCL communicator to it eagerly.
            torch.cuda.set_device(torch.device(device))
            kwargs["device_id"] = torch.device(device)
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(pg_backend, timeout=timeout, **kwargs)
        # Groups created later without a timeout (init_device_mesh's TP/PP/DP groups) take
        # c10d's module default (30 min), not the default group's: make it ours.
        from torch.distributed import distributed_c10d

        distributed_c10d.default_pg_timeout = timeout
        distributed_c10d.default_pg_nccl_timeout = timeout
        global _AGREEMENT_GROUP
        _AGREEMENT_GROUP = dist.new_group(backend="gloo", timeout=timeout)
    return rank, local_rank, world


def agree(obj) -> list:
    """Every rank's ``obj`` (all_gather_object) on the agreement group; ``[obj]`` outside one.

    Used once per grid point whatever happened in it, so a rank whose point failed meets the
    others here, not in the collective they wait in. Fails after the collective timeout if a rank
    never arrives (stuck in a collective of the main group, hung, or dead).
    """
    import torch.distributed as dist

    if _AGREEMENT_GROUP is None or not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=_AGREEMENT_GROUP)
    return out


def is_communication_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failed collective (timeout, peer gone): the job cannot go on."""
    import torch.distributed as dist

    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc)
    return any(mark in text for mark in _COMM_FAILURE_MARKS)


def make_context(
    placement: Placement,
    device: str,
    *,
    model_dir: str,
    dtype: str,
    seed: int,
    max_input_tokens: int,
    tp_mode: str = "local",
) -> RankContext:
    """This rank's context (and, under torchrun with world > 1, its ("dp", "pp", "tp") mesh)."""
    rank, local_rank, world = env_world()
    layout = placement.layout
    ctx = RankContext(
        placement=placement,
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        coords=placement.coords(rank),
        device=device,
        host=socket.gethostname(),
        pid=os.getpid(),
        model_dir=model_dir,
        dtype=dtype,
        seed=seed,
        max_input_tokens=max_input_tokens,
        tp_mode=tp_mode,
    )
    if world > 1 and placement.launch_mode == "torchrun":
        from torch.distributed.device_mesh import init_device_mesh

        ctx.mesh = init_device_mesh(
            "cuda" if device.startswith("cuda") else "cpu",
            (layout.dp, layout.pp, layout.tp),
            mesh_dim_names=("dp", "pp", "tp"),
        )
    return ctx


def gather(obj) -> list:
    """all_gather_object, or ``[obj]`` outside a process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    """Wait for every rank (a no-op outside a process group)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def check_world(audits: list[dict], placement: Placement) -> None:
    """Rank 0's check: distinct processes == expected launchers, ranks 0..N-1 once, coords agree.

    Raises:
        LayoutMismatch: naming what the layout expects and what was observed.
    """
    procs = {(a["host"], a["pid"]) for a in audits}
    ranks = sorted(a["rank"] for a in audits)
    layout, backend = placement.layout, placement.backend
    mode = placement.launch_mode
    expected, gpu_workers = placement.processes
    if len(procs) != expected or ranks != list(range(expected)):
        raise LayoutMismatch(
            f"layout {layout} ({backend}, launch {mode}) expects {expected} distinct processes "
            f"with ranks 0..{expected - 1} ({gpu_workers} GPU workers), observed {len(procs)} "
            f"processes with ranks {ranks}"
        )
    for a in audits:
        c = placement.coords(a["rank"])
        if (a["dp_rank"], a["pp_rank"], a["tp_rank"]) != (c.dp_rank, c.pp_rank, c.tp_rank):
            raise LayoutMismatch(f"rank {a['rank']} reports coords that disagree with {layout}")


def destroy() -> None:
    global _AGREEMENT_GROUP
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _AGREEMENT_GROUP = None
