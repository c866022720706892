"""Layout -> processes: the argv and environment a measure job starts (never a shell).

Launch modes (energysweep.job.placement.Placement says which a job uses):
- ``torchrun`` one node:   ``torchrun --standalone --nproc-per-node N -m energysweep.run``
  (standalone picks a free port, so concurrent jobs on one node never collide);
- ``torchrun`` many nodes: ``srun --nodes K --ntasks-per-node 1 torchrun --nnodes K
  --nproc-per-node G --rdzv-backend c10d --rdzv-endpoint HEAD:PORT --rdzv-id JOBID``, the port
  derived from the Slurm job id (the default 29400 collides when jobs share a head node);
- ``direct`` (TensorRT-LLM on one node): one process per DP replica, the engine spawns its tp*pp
  GPU workers; dp == 1 is ``python -m energysweep.run``; dp > 1 is ``torchrun --standalone
  --nproc-per-node DP -m energysweep.launch.replica --replica-gpus TP*PP``, which gives each
  replica its own disjoint GPU set (CUDA_VISIBLE_DEVICES) before anything touches CUDA, then
  execs the run;
- ``mpi`` (TensorRT-LLM, a replica larger than a node, dp == 1): ``srun --mpi=pmix --nodes K
  --ntasks-per-node TP*PP/K trtllm-llmapi-launch python -m energysweep.run``; MPI ranks == tp*pp.
vLLM runs under ``torchrun`` like PyTorch, even with one rank: every rank is one vLLM engine with
``distributed_executor_backend="external_launcher"``, which reads RANK/LOCAL_RANK/MASTER_* from
torchrun. Which mode a backend uses is data (energysweep.job.backends).

Ports: concurrent jobs on one node must never share one. torchrun --standalone picks a free port;
a multi-node rendezvous and vLLM's ``VLLM_PORT`` are derived from the Slurm job id (distinct jobs
running together have nearby ids, hence distinct ports), or are a free port outside Slurm.

Everything is an argv list: no value ever passes through a shell.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from energysweep.job.backends import BACKENDS
from energysweep.job.placement import Placement
from energysweep.job.sections import Engine
from energysweep.launch.ports import free_port, rendezvous_port, vllm_port
from energysweep.launch.slurm import expand_hostnames


def backend_env(
    backend: str, slurm_job_id: str | None = None, engine: Engine | None = None
) -> dict[str, str]:
    """Environment variables a backend's processes need, beyond the common ones: its registry
    record's ``rank_env`` (energysweep.job.backends), the engine's port block derived from the
    Slurm job id (a free port outside Slurm) where a value names it.

    Args:
        engine: the job's ``engine`` section (engine backends' jobs carry one).
    """
    rank_env = BACKENDS[backend].rank_env
    if not rank_env:
        return {}
    if engine is None:
        raise ValueError(f"a {backend} job carries the config section `engine` (JobSpec.engine)")
    values = {"cpu_kvcache_gib": f"{float(engine.cpu_kvcache_gib):g}"}
    if any("{engine_port}" in v for _, v in rank_env):
        values["engine_port"] = str(vllm_port(slurm_job_id) if slurm_job_id else free_port())
    return {name: value.format_map(values) for name, value in rank_env}


def replica_visible_devices(
    visible: str | None, local_rank: int, gpus_per_replica: int, local_replicas: int
) -> str:
    """CUDA_VISIBLE_DEVICES of DP replica ``local_rank`` on its node: a contiguous, disjoint slice.

    Args:
        visible: the job's CUDA_VISIBLE_DEVICES (set by Slurm for the allocation), or None for
            all GPUs of the machine (numbered 0..N-1).
        local_rank: the replica's index on this node.
        gpus_per_replica: tp*pp.
        local_replicas: replicas on this node.
    """
    devices = (
        [d.strip() for d in visible.split(",") if d.strip()]
        if visible is not None
        else [str(i) for i in range(gpus_per_replica * local_replicas)]
    )
    need = gpus_per_replica * local_replicas
    if len(devices) < need:
        raise ValueError(
            f"{local_replicas} replicas of {gpus_per_replica} GPUs need {need} GPUs, "
            f"CUDA_VISIBLE_DEVICES={visible!r} has {len(devices)}"
        )
    start = local_rank * gpus_per_replica
    return ",".join(devices[start : start + gpus_per_replica])


def build_argv(
    placement: Placement,
    spec_path: str,
    python: str = sys.executable,
    slurm_job_id: str | None = None,
    head_node: str | None = None,
) -> list[str]:
    """The command that starts every process of one job (its placement decides the launch mode)."""
    entry = ["-m", "energysweep.run", "--spec", str(spec_path)]
    layout, backend = placement.layout, placement.backend
    mode = placement.launch_mode
    if mode == "server":
        if placement.unsupported():
            raise ValueError("; ".join(placement.unsupported()))
        # The serving client: one process; it starts the engine's server (energysweep.launch.
        # server), which spawns the tp*pp*dp workers.
        return [python, *entry]
    if mode == "direct":
        if layout.dp == 1:
            # One replica: one process; the engine spawns its tp*pp GPU workers itself.
            return [python, *entry]
        return [
            python, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(layout.dp),
            "-m", "energysweep.launch.replica", "--replica-gpus", str(layout.ranks_per_replica),
            "--spec", str(spec_path),
        ]  # fmt: skip
    if mode == "mpi":
        return _mpi_argv(placement, python, entry)
    if layout.world_size == 1 and not BACKENDS[backend].torchrun_always:
        # One process: no launcher; run.py sees WORLD_SIZE unset, i.e. 1.
        return [python, *entry]
    if placement.nodes == 1:
        return [
            python, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(layout.world_size), *entry,
        ]  # fmt: skip
    return _multi_node_argv(placement, python, entry, slurm_job_id, head_node)


def _mpi_argv(placement: Placement, python: str, entry: list[str]) -> list[str]:
    """``srun --mpi=pmix ... <launcher> python -m energysweep.run`` (MPI ranks: tp*pp), the
    launcher the backend's record names (``mpi_launcher``: TensorRT-LLM's trtllm-llmapi-launch)."""
    layout, nodes = placement.layout, placement.nodes
    if placement.unsupported():
        raise ValueError(
            f"{placement.backend} cannot run {layout} on nodes of {placement.gpus_per_node} GPUs"
        )
    # The launcher script of the same environment as the interpreter: rank 0 runs our
    # entry point, the other MPI ranks serve as the engine's workers.
    launcher = str(Path(python).with_name(BACKENDS[placement.backend].mpi_launcher))
    return [
        "srun", "--mpi=pmix", "--nodes", str(nodes),
        "--ntasks-per-node", str(layout.ranks_per_replica // nodes), "--kill-on-bad-exit=1",
        launcher, python, *entry,
    ]  # fmt: skip


def _multi_node_argv(
    placement: Placement,
    python: str,
    entry: list[str],
    slurm_job_id: str | None,
    head_node: str | None,
) -> list[str]:
    """One ``torchrun`` per node under ``srun``, c10d rendezvous on the head node."""
    layout, nodes = placement.layout, placement.nodes
    if placement.unsupported():
        raise ValueError(f"{layout} ({layout.world_size} ranks) does not fill {nodes} nodes evenly")
    if not slurm_job_id or not head_node:
        raise ValueError("a multi-node layout needs a Slurm job id and head node")
    per_node = layout.world_size // nodes
    return [
        "srun", "--nodes", str(nodes), "--ntasks-per-node", "1", "--kill-on-bad-exit=1",
        python, "-m", "torch.distributed.run",
        "--nnodes", str(nodes), "--nproc-per-node", str(per_node),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{head_node}:{rendezvous_port(slurm_job_id)}",
        "--rdzv-id", str(slurm_job_id), *entry,
    ]  # fmt: skip


# The thread counts of OpenMP and the BLAS libraries. Snakemake sets each to the *job's* threads
# (snakemake/shell.py); a process of the job gets its own share. A vLLM server's workers are each
# bound to one slice of the job's cores (launch.server.cpu_bind) and took MKL_NUM_THREADS from
# the job: at dp=2 on 2 cores, two MKL threads per one-core worker made every decode step ~70x
# slower (0.22 s against 3 ms per token; CI's serving sweep, 2026-12-01).
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")  # fmt: skip


def build_env(
    backend: str,
    *,
    base: dict | None = None,
    threads: int | None = None,
    slurm_job_id: str | None = None,
    engine: Engine | None = None,
) -> dict:
    """Environment for the processes of a job of ``backend`` (``base``: os.environ if None).

    ``threads`` is each rank's share of the job's cores (OMP_NUM_THREADS and the BLAS libraries'
    counts, :data:`THREAD_VARS`; the ranks also set torch's thread count from it), so the ranks
    of a job, or a server's workers, never oversubscribe its cores.
    ``engine`` is the job's ``engine`` section (engine backends only).
    """
    env = dict(os.environ if base is None else base)
    for name in BACKENDS[backend].rank_env_drop:
        env.pop(name, None)
    env.update(backend_env(backend, slurm_job_id, engine))
    # Checkpoints are local directories (config.check): never wait on the Hugging Face Hub.
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    # CUDA then numbers GPUs as NVML does; GPUs are still resolved by UUID for energy.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["PYTHONUNBUFFERED"] = "1"
    # Ranks import this very package, also under a conda env where it is not installed.
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if threads is not None:
        env.update(dict.fromkeys(THREAD_VARS, str(max(1, threads))))
    return env


def head_node(nodelist: str) -> str:
    """First host of a Slurm nodelist (``scontrol show hostnames``)."""
    return expand_hostnames(nodelist)[0]
