"""The derived files of an archive: methods, validity, per-job provenance, code version.

Each is computed from the sweep's own tables (``summary.csv``, ``energy.parquet``,
``environment.parquet``, every ``job.json``) and the validated config (``config.yaml``), and
written into the crate's staging directory by :func:`write_derived`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd

from energysweep.archive.contents import DIFF_FILE, LOCK_DIR, Entry, MissingInput, sha256
from energysweep.tables.shards import POINT_KEYS

EMULATED_PREFIX = "emulated"
# What the emulated GPU node stands in for (docs/emulated-node.md).
EMULATED_WHAT = (
    "the GPU node: NVML's interface (energy counter, power, clocks, limits) served by a model of "
    "a GPU whose load follows the ranks' CPU activity; the ranks computed on CPU. Energy figures "
    "are the model's, never a real GPU's: no emulated row is valid"
)
ALIGNMENT = (
    "window edges after a device synchronize and a barrier on every rank; counter reads "
    "aligned to the counter's refreshes (two refreshes waited at each edge; corrections of "
    "idle power over less than one period)"
)


def emulated_rows(energy: pd.DataFrame) -> int:
    """Rows measured on the emulated GPU node (their energy source says so)."""
    source = energy["energy_source"].fillna("").astype(str)
    return int(source.str.startswith(EMULATED_PREFIX).sum())


def energy_sources(energy: pd.DataFrame) -> pd.DataFrame:
    """Per point and phase: the energy source, method and status of its rows, with counts."""
    keys = [*POINT_KEYS, "phase", "energy_source", "gpu_energy_method", "gpu_energy_status"]
    frame = energy[keys].astype(str)
    return frame.groupby(keys, sort=True).size().rename("rows").reset_index()


def _period_range(summary: pd.DataFrame, column: str) -> dict:
    values = pd.to_numeric(summary.get(column, pd.Series(dtype=float)), errors="coerce").dropna()
    if values.empty:
        return {"min_s": None, "max_s": None, "status": "no GPU energy counter was read"}
    return {"min_s": float(values.min()), "max_s": float(values.max()), "status": "ok"}


def methods(
    config: dict, summary: pd.DataFrame, energy: pd.DataFrame, environment: pd.DataFrame
) -> dict:
    """How the sweep measured: sources, counter period, windows, idle baseline, emulation."""
    m, w = config["measurement"], config["workload"]
    n_emulated = emulated_rows(energy)
    profiles = sorted(
        str(p) for p in environment.get("emulated_gpu_profile", pd.Series()).dropna().unique()
    )
    return {
        "energy_source_per_row": "energy.parquet columns energy_source, gpu_energy_method, "
        "gpu_energy_status (counts per point and phase: methods/energy_sources.csv)",
        "energy_sources": sorted(energy["energy_source"].dropna().astype(str).unique()),
        "gpu_energy_methods": sorted(energy["gpu_energy_method"].dropna().astype(str).unique()),
        "counter_period": {
            "configured": _period_range(summary, "counter_period_s"),
            "observed": _period_range(summary, "observed_counter_period_s"),
        },
        "windows": {
            "min_window_s": m["min_window_s"],
            "min_iterations": w["iterations"],
            "warmup_iterations": w["warmup_iterations"],
            "repetitions": w["repetitions"],
            "cooldown_s": m["cooldown_s"],
            "prefill_pass": m["prefill_pass"],
            "edges": ALIGNMENT,
        },
        "idle_baseline": {
            "idle_baseline_s": m["idle_baseline_s"],
            "settings": {k: v for k, v in m.items() if "idle" in k or "settl" in k},
            "checks": sorted(
                summary.get("idle_check_status", pd.Series()).dropna().astype(str).unique()
            ),
        },
        "power_timeline_hz": m["sampler_hz"],
        "emulated": {
            "any": n_emulated > 0,
            "rows": n_emulated,
            "of_rows": int(len(energy)),
            "profiles": profiles,
            "what": EMULATED_WHAT
            if n_emulated
            else "nothing: no row was measured on the emulated node",
        },
        "measurement": m,
        "validity": config["validity"],
    }


def validity(summary: pd.DataFrame) -> pd.DataFrame:
    """Every point's verdict, as in the summary."""
    cols = [*POINT_KEYS, "valid", "invalid_reasons", "validity_unchecked"]
    return summary[[c for c in cols if c in summary]]


def _distinct(frame: pd.DataFrame, column: str) -> str:
    """The column's distinct non-empty values, sorted and comma-joined ("" when absent)."""
    if column not in frame:
        return ""
    return ",".join(sorted({str(v) for v in frame[column].dropna() if v}))


def jobs_table(
    job_records: dict[str, dict], environment: pd.DataFrame, locks: list[Entry]
) -> pd.DataFrame:
    """One row per job: key, Slurm ids, code version, the lock its ranks ran from."""
    lock_by_hash = {sha256(e.source): e.dest for e in locks}
    rows = []
    for rel, record in sorted(job_records.items()):
        env = environment[environment["job_id"] == record["job_id"]]
        first = env.iloc[0].to_dict() if len(env) else {}
        lock_hash = first.get("env_lock_sha256")
        rows.append(
            {
                "job_dir": rel,
                "job_id": record["job_id"],
                **record["job"],
                "config_hash": record.get("config_hash"),
                "code_version": record.get("code_version"),
                "slurm_job_id": first.get("slurm_job_id"),
                "slurm_partition": first.get("slurm_partition"),
                "slurm_nodelist": first.get("slurm_nodelist"),
                "hosts": _distinct(env, "host"),
                "gpu_names": _distinct(env, "gpu_name"),
                "driver": first.get("driver"),
                "env_lock": first.get("env_lock"),
                "env_lock_sha256": lock_hash,
                # The crate's copy of that lock; null: the job's lock differs from every lock
                # of the checkout archived (it ran from another commit's environment).
                "env_lock_in_crate": lock_by_hash.get(str(lock_hash)),
            }
        )
    return pd.DataFrame(rows)


def check_job_locks(jobs: pd.DataFrame) -> None:
    """Every lock a job ran from must be one the crate holds (same sha256), else refuse."""
    missing = jobs[jobs["env_lock_sha256"].notna() & jobs["env_lock_in_crate"].isna()]
    if len(missing):
        what = "; ".join(
            f"job {r.job_dir} ran from {r.env_lock} sha256 {str(r.env_lock_sha256)[:16]}"
            for r in missing.itertuples()
        )
        raise MissingInput(
            f"cannot archive: the lock file a job ran from is missing: {what}; the checkout's "
            "envs/*.lock differ (archive from the commit the sweep ran from, or rerun the sweep)"
        )


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30, check=True
    ).stdout


def code_version(workflow: Path, job_versions: list[str]) -> tuple[dict, str | None]:
    """The checkout's commit, whether it is dirty, and its diff (None when clean)."""
    try:
        commit = _git(workflow, "rev-parse", "HEAD").strip()
        dirty = bool(_git(workflow, "status", "--porcelain", "--untracked-files=no").strip())
        diff = _git(workflow, "diff", "HEAD", "--binary") if dirty else None
    except (OSError, subprocess.SubprocessError) as exc:
        commit, dirty, diff = None, None, None
        status = f"unknown: not a git checkout or git failed ({exc})"
    else:
        status = "ok"
    short = {v.rsplit("+g", 1)[-1].split(".")[0] for v in job_versions if "+g" in v}
    version = {
        "commit": commit,
        "dirty": dirty,
        "diff": DIFF_FILE if diff else None,
        "status": status,
        "jobs_code_versions": sorted(set(job_versions)),
        # The jobs' commits are the archived checkout's: else the diff is not what they ran.
        "jobs_match_commit": commit is not None and all(commit.startswith(s) for s in short),
    }
    return version, diff


def write_derived(
    stage: Path,
    config: dict,
    results: Path,
    job_records: dict[str, dict],
    locks: list[Entry],
    workflow: Path,
) -> dict:
    """Write methods, validity, jobs and code version into ``stage``; returns the methods."""
    summary = pd.read_csv(results / "summary.csv")
    energy = pd.read_parquet(results / "energy.parquet")
    environment = pd.read_parquet(results / "environment.parquet")
    (stage / "methods").mkdir(parents=True, exist_ok=True)
    (stage / "code").mkdir(parents=True, exist_ok=True)
    meth = methods(config, summary, energy, environment)
    (stage / "methods.json").write_text(json.dumps(meth, indent=1, default=str))
    energy_sources(energy).to_csv(stage / "methods/energy_sources.csv", index=False)
    validity(summary).to_csv(stage / "validity.csv", index=False)
    jobs = jobs_table(job_records, environment, locks)
    check_job_locks(jobs)
    jobs.to_csv(stage / "jobs.csv", index=False)
    versions = [str(r.get("code_version")) for r in job_records.values()]
    version, diff = code_version(workflow, versions)
    version["locks"] = {e.dest: sha256(e.source) for e in locks}
    (stage / "code/version.json").write_text(json.dumps(version, indent=1))
    if diff:
        (stage / DIFF_FILE).write_text(diff)
    return meth


__all__ = ["LOCK_DIR", "write_derived", "methods", "jobs_table", "energy_sources"]
