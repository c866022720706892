"""Layout -> processes: the argv and environment a measure job starts, and running it.

Launch modes (the backend table in energysweep.grid says which a backend uses):
- ``torchrun`` one node:   ``torchrun --standalone --nproc-per-node N -m energysweep.run``
  (standalone picks a free port, so concurrent jobs on one node never collide);
- ``torchrun`` many nodes: ``srun --nodes K --ntasks-per-node 1 torchrun --nnodes K
  --nproc-per-node G --rdzv-backend c10d --rdzv-endpoint HEAD:PORT --rdzv-id JOBID``, the port
  derived from the Slurm job id (the default 29400 collides when jobs share a head node);
- ``direct``: one process (the backend spawns its own workers).

Everything is an argv list: no value ever passes through a shell.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from energysweep.config import config_hash
from energysweep.envinfo import code_version
from energysweep.grid import BACKENDS, ParallelLayout

PORT_BASE = 15000
PORT_SPAN = 15000  # [15000, 30000): below the Linux ephemeral range (32768+)


def rendezvous_port(job_id: str | int) -> int:
    """A port for this job's rendezvous, derived from the (Slurm) job id."""
    return PORT_BASE + int(job_id) % PORT_SPAN


def build_argv(
    layout: ParallelLayout,
    backend: str,
    spec_path: str,
    gpus_per_node: int,
    python: str = sys.executable,
    slurm_job_id: str | None = None,
    head_node: str | None = None,
) -> list[str]:
    """The command that starts every process of one job."""
    entry = ["-m", "energysweep.run", "--spec", str(spec_path)]
    mode = BACKENDS[backend]["launch"]
    if mode == "direct" or layout.world_size == 1:
        # One process: no launcher; run.py sees WORLD_SIZE unset, i.e. 1.
        return [python, *entry]
    nodes = layout.nodes(gpus_per_node)
    if nodes == 1:
        return [
            python, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(layout.world_size), *entry,
        ]
    if layout.world_size % nodes:
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
    ]


def build_env(layout: ParallelLayout, base: dict | None = None, threads: int | None = None) -> dict:
    """Environment for the job's processes."""
    env = dict(os.environ if base is None else base)
    # CUDA then numbers GPUs as NVML does; GPUs are still resolved by UUID for energy.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["PYTHONUNBUFFERED"] = "1"
    # Ranks import this very package, also under a conda env where it is not installed.
    src = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(max(1, threads))
    return env


def head_node(nodelist: str) -> str:
    """First host of a Slurm nodelist (``scontrol show hostnames``)."""
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout.split()
    return out[0]


def _paths(outputs) -> list[str]:
    if isinstance(outputs, dict):
        return [p for v in outputs.values() for p in _paths(v)]
    if isinstance(outputs, (list, tuple)):
        return [p for v in outputs for p in _paths(v)]
    return [outputs]


def _restage(outputs, staging: Path, base: Path):
    """The same structure with every path moved under ``staging`` (relative to ``base``)."""
    if isinstance(outputs, dict):
        return {k: _restage(v, staging, base) for k, v in outputs.items()}
    if isinstance(outputs, (list, tuple)):
        return [_restage(v, staging, base) for v in outputs]
    return str(staging / Path(outputs).resolve().relative_to(base))


def run_job(spec: dict, spec_path: str | Path, log, cpus: int, gpus_per_node: int,
            timeout_s: float | None = None) -> None:
    """Write the spec, start the job's processes, and publish its outputs only if all succeeded.

    The ranks write into a hidden staging directory next to the outputs; the files move to their
    final names (job.json last) only after every process exited 0. A job that fails or is killed
    (scancel, SIGKILL of a rank, node failure) therefore leaves no shard under a name that
    aggregation reads.
    """
    layout = ParallelLayout(spec["job"]["tp"], spec["job"]["pp"], spec["job"]["dp"])
    # The hash covers what determines this job's numbers (not where its outputs go), so rows of
    # jobs that ran the same settings share it; the code version is read where the job runs.
    settings = {k: v for k, v in spec.items() if k not in ("outputs", "job_id")}
    spec = {
        **spec,
        "job_id": spec.get("job_id") or uuid.uuid4().hex,
        "config_hash": config_hash(settings),
        "code_version": code_version(),
    }
    final = spec["outputs"]
    base = Path(spec_path).resolve().parent
    staging = base / f".staging-{spec['job_id']}"
    spec["outputs"] = _restage(final, staging, base)
    slurm_id = os.environ.get("SLURM_JOB_ID")
    head = None
    if layout.nodes(gpus_per_node) > 1 and os.environ.get("SLURM_JOB_NODELIST"):
        head = head_node(os.environ["SLURM_JOB_NODELIST"])
    argv = build_argv(layout, spec["job"]["backend"], str(spec_path), gpus_per_node,
                      slurm_job_id=slurm_id, head_node=head)
    spec["launch_argv"] = argv
    base.mkdir(parents=True, exist_ok=True)
    Path(spec_path).write_text(json.dumps(spec, indent=2))
    ranks_here = layout.world_size // layout.nodes(gpus_per_node)
    env = build_env(layout, threads=cpus // max(1, ranks_here))
    print("launch:", json.dumps(argv), file=log, flush=True)
    try:
        proc = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"job {spec['job']} failed: {argv[0]} exited {proc.returncode}")
        staged, targets = _paths(spec["outputs"]), _paths(final)
        missing = [s for s in staged if not Path(s).exists()]
        if missing:
            raise RuntimeError(f"job {spec['job']} exited 0 but did not write {missing}")
        # job.json last: its presence marks a complete job.
        pairs = sorted(zip(staged, targets, strict=True), key=lambda st: st[1].endswith("job.json"))
        for src, dst in pairs:
            Path(dst).parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
