"""What a sweep's archive holds: every file, where it comes from, and what it is.

:func:`gather` lists the files of one sweep (``results/`` and the checkout it ran from) as
:class:`Entry` rows; :data:`REQUIRED` is the list a crate must hold whatever the sweep (the
crate's reader and the tests walk it), and each job adds its record and power timeline
(:func:`job_entries`). Derived tables the crate adds (per-job provenance, energy sources per
point, the validity verdicts, the code version) are written by :mod:`energysweep.archive.methods`
into a staging directory first.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from energysweep.job.files import JobDir

# The profiles the crate conforms to (its root's conformsTo).
PROFILES = {
    "https://w3id.org/ro/wfrun/process/0.5": "Process Run Crate",
    "https://w3id.org/ro/wfrun/workflow/0.5": "Workflow Run Crate",
    "https://w3id.org/workflowhub/workflow-ro-crate/1.0": "Workflow RO-Crate",
}
# Crate path -> (results-relative source, description). Always in a crate.
RESULT_FILES: dict[str, tuple[str, str]] = {
    "config.yaml": (
        "config.yaml",
        "The validated config as run (defaults filled), its sweep_hash and code version",
    ),
    "grid/jobs.tsv": ("grid/jobs.tsv", "The resolved grid: one row per job (layout)"),
    "grid/skipped.tsv": ("grid/skipped.tsv", "Grid points not run, each with its reason"),
    "summary.csv": (
        "summary.csv",
        "One row per grid point: medians, bootstrap CIs, validity verdict",
    ),
    "validation.parquet": (
        "validation.parquet",
        "Re-check: every window's counter energy against its power timeline",
    ),
    "stages.csv": ("stages.csv", "Energy and CPU time per pipeline stage"),
    "environment.parquet": ("environment.parquet", "The environment table: one row per (job, GPU)"),
    "report.html": ("report.html", "The sweep's report (figures and tables)"),
    "exports/mlenergy.csv": ("exports/mlenergy.csv", "ML.ENERGY-style table (docs/exports.md)"),
    "exports/ai_energy_score.csv": (
        "exports/ai_energy_score.csv",
        "AI Energy Score units, batch-1 inference (docs/exports.md)",
    ),
    "exports/mlcommons.csv": (
        "exports/mlcommons.csv",
        "MLCommons proposed LLM energy fields (docs/exports.md)",
    ),
}
ENERGY_DATASET = "energy.parquet"
# Written by energysweep.archive.methods into the staging directory.
DERIVED_FILES: dict[str, str] = {
    "manifest.json": "What this crate is (tool, format, sweep, name) and every file it must hold",
    "methods.json": "Energy sources, counter period, window settings, idle baseline, emulation",
    "methods/energy_sources.csv": "Energy source, method and status per point and phase, counted",
    "validity.csv": "The validity verdict of every point (valid, invalid_reasons)",
    "jobs.csv": "Per job: key, Slurm ids, code version, environment lock and its hash",
    "code/version.json": "The code version: commit, dirty or not, and the jobs' recorded versions",
}
# The workflow the sweep ran (the crate's main entity) and its rules.
WORKFLOW_FILE = "Snakefile"
LOCK_DIR = "locks"
DIFF_FILE = "code/dirty.diff"
# Every crate holds these (besides the energy dataset, the locks and each job's files).
REQUIRED = (*RESULT_FILES, *DERIVED_FILES, WORKFLOW_FILE)
JOB_FILES = ("job_json", "power")


@dataclass(frozen=True)
class Entry:
    """One file of the crate: its path there, where it comes from, what it is."""

    dest: str
    source: Path
    description: str


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class MissingInput(FileNotFoundError):
    """A file the archive needs is not there; the message names it and the fix."""


def _need(path: Path, what: str, fix: str) -> Path:
    if not path.exists():
        raise MissingInput(f"cannot archive: {what} {path} is missing; {fix}")
    return path


def result_entries(results: Path) -> list[Entry]:
    """The sweep's tables, report and exports from ``results``."""
    out = []
    for dest, (rel, description) in RESULT_FILES.items():
        fix = (
            "build the report first (make run builds it; or snakemake --report results/report.html)"
            if rel == "report.html"
            else "run the sweep first (make run, or snakemake with your profile)"
        )
        out.append(Entry(dest, _need(results / rel, "the sweep's", fix), description))
    return out


def energy_entries(results: Path) -> list[Entry]:
    """Every file of the merged energy dataset (``energy.parquet/model=…/…``)."""
    top = _need(results / ENERGY_DATASET, "the energy dataset", "run the sweep first")
    files = sorted(p for p in top.rglob("*") if p.is_file())
    if not files:
        raise MissingInput(f"cannot archive: {top} holds no file; rerun the merge")
    return [
        Entry(f"{ENERGY_DATASET}/{p.relative_to(top).as_posix()}", p, "Energy rows (Parquet part)")
        for p in files
    ]


def job_entries(results: Path, job_jsons: list[Path]) -> list[Entry]:
    """Each job's record (job.json: environment, Slurm ids, code version) and power timeline."""
    out = []
    for job_json in job_jsons:
        job = JobDir.of(job_json)
        rel = Path(job_json).parent.resolve().relative_to(results.resolve()).as_posix()
        out.append(
            Entry(
                f"{rel}/job.json",
                _need(Path(job.job_json), "the job record", "rerun the job"),
                "The job record: key, environment, Slurm ids, code version",
            )
        )
        out.append(
            Entry(
                f"{rel}/power.parquet",
                _need(Path(job.power), "the power timeline", "rerun the job"),
                "The job's power timeline (sampled GPU power and energy counter)",
            )
        )
    return out


def lock_entries(workflow: Path) -> list[Entry]:
    """The environments' lock files (``envs/*.lock``) of the checkout the sweep ran from."""
    locks = sorted((workflow / "envs").glob("*.lock"))
    if not locks:
        raise MissingInput(
            f"cannot archive: no lock file (envs/*.lock) in {workflow}; "
            "archive from the checkout the sweep ran from (make lock writes them)"
        )
    return [
        Entry(f"{LOCK_DIR}/{p.name}", p, f"Lock file of the {p.stem} environment") for p in locks
    ]


def workflow_entries(workflow: Path) -> list[Entry]:
    """The Snakefile (the crate's main entity) and its rule files."""
    out = [
        Entry(
            WORKFLOW_FILE,
            _need(workflow / WORKFLOW_FILE, "the workflow", "archive from the checkout"),
            "The energysweep workflow",
        )
    ]
    out += [
        Entry(f"rules/{p.name}", p, "A rule file of the workflow")
        for p in sorted((workflow / "rules").glob("*.smk"))
    ]
    return out
