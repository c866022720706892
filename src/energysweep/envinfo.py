"""Environment snapshot: what a figure needs to be traced to its software, hardware and job."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path

from energysweep import __version__

PACKAGES = [
    "torch", "transformers", "accelerate", "vllm", "tensorrt_llm", "zeus", "nvidia-ml-py",
    "snakemake", "snakemake-executor-plugin-slurm", "pyarrow", "numpy",
]
SLURM_VARS = [
    "SLURM_JOB_ID", "SLURM_JOB_PARTITION", "SLURM_JOB_NODELIST", "SLURM_NNODES",
    "SLURM_GPUS_ON_NODE", "SLURM_STEP_GPUS", "SLURM_JOB_ACCOUNT", "SLURM_CPUS_PER_TASK",
]


def code_version(repo: str | Path | None = None) -> str:
    """``<package version>+g<commit>[.dirty]``; ``+unknown`` outside a git checkout."""
    repo = Path(repo or Path(__file__).resolve().parents[2])
    try:
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"{__version__}+unknown"
    return f"{__version__}+g{commit}" + (".dirty" if dirty else "")


def package_versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
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


def gpu_snapshot(uuids: list[str]) -> list[dict]:
    """Per-GPU identity and state via NVML; empty when NVML is unavailable."""
    if not uuids:
        return []
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    out = []
    try:
        for uuid in uuids:
            h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            info = {"uuid": uuid}
            for key, fn in {
                "name": lambda: pynvml.nvmlDeviceGetName(h),
                "pci_bus_id": lambda: pynvml.nvmlDeviceGetPciInfo_v3(h).busId,
                "memory_total_bytes": lambda: pynvml.nvmlDeviceGetMemoryInfo(h).total,
                "power_limit_mw": lambda: pynvml.nvmlDeviceGetPowerManagementLimit(h),
                "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(
                    h, pynvml.NVML_TEMPERATURE_GPU
                ),
                "compute_capability": lambda: list(pynvml.nvmlDeviceGetCudaComputeCapability(h)),
                "driver": pynvml.nvmlSystemGetDriverVersion,
            }.items():
                try:
                    value = fn()
                    info[key] = value.decode() if isinstance(value, bytes) else value
                except Exception as exc:  # one unsupported query must not lose the rest
                    info[key] = None
                    info[f"{key}_error"] = type(exc).__name__
            out.append(info)
    finally:
        pynvml.nvmlShutdown()
    return out


def snapshot(gpu_uuids: list[str] | None = None) -> dict:
    """Software, host and scheduler facts of this process's environment."""
    try:
        import torch

        cuda = torch.version.cuda
        cuda_ok = torch.cuda.is_available()
    except ImportError:
        cuda, cuda_ok = None, False
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "packages": package_versions(),
        "torch_cuda": cuda,
        "cuda_available": cuda_ok,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER"),
        "slurm": slurm_env(),
        "gpus": gpu_snapshot(gpu_uuids or []),
    }
