"""Re-run an archived sweep on this machine from its crate, beside ``results/``, and compare.

``make reproduce ARCHIVE=<crate>`` (``python -m energysweep.archive.reproduce``): the crate is
read back and checked (:func:`energysweep.archive.readback.open_crate`); its config as run is
written to ``reproduced/<name>-<UTC time>/config/config.yaml`` and the workflow runs there (its own
``results/``; the checkout's ``results/`` is never written); then ``comparison/`` holds the side
by side (:mod:`energysweep.archive.compare`): ``figures.csv`` (every point's figures with CIs,
ratio, overlap), ``points.csv`` (reproduced or not), ``environment.csv`` and ``README.md``.

The locks: every lock a job of the crate ran from must be in the crate, and this machine's
environment built from that lock must have been built from the same file (its stamp's sha256),
else the run is refused naming the lock and the fix, unless ``--allow-other-environments``
(then the difference is in ``environment.csv``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

from energysweep.archive import compare
from energysweep.archive.contents import LOCK_DIR, sha256
from energysweep.archive.readback import Archive, ArchiveError, open_crate

ENV_DIRS = (".venv", ".venv-vllm")
STAMP = "energysweep-env.json"


def installed_locks(workflow: Path) -> dict[str, str]:
    """Lock path -> sha256 of the environments that run here (their stamps, written by make):
    this interpreter's (Snakemake's, which runs the pytorch ranks) and the checkout's."""
    out = {}
    for d in (Path(sys.prefix), *(workflow / e for e in ENV_DIRS)):
        stamp = d / STAMP
        if stamp.is_file():
            rec = json.loads(stamp.read_text())
            out[rec["lock"]] = rec["lock_sha256"]
    return out


def check_locks(archive: Archive, workflow: Path, allow_other: bool) -> list[str]:
    """The locks the crate's jobs ran from against this machine's environments; notes."""
    jobs = pd.read_csv(archive.file("jobs.csv"))
    here = installed_locks(workflow)
    notes: list[str] = []
    errors: list[str] = []
    for lock in sorted({str(v) for v in jobs["env_lock"].dropna()}):
        copy = archive.file(f"{LOCK_DIR}/{Path(lock).name}")
        if not copy.is_file():
            raise ArchiveError(
                f"incomplete archive: the lock {lock} its jobs ran from is missing "
                f"({LOCK_DIR}/{Path(lock).name})"
            )
        want = sha256(copy)
        if here.get(lock) == want:
            notes.append(f"{lock}: this machine's environment is built from the archived lock")
            continue
        got = here.get(lock) or "no environment built from it here"
        msg = f"{lock}: archived sha256 {want[:16]}, here {got[:16] if lock in here else got}"
        (notes if allow_other else errors).append(msg)
    if errors:
        raise ArchiveError(
            "this machine's environments are not the archived ones: "
            + "; ".join(errors)
            + ". Fix: check out the archived commit (code/version.json) and run make venv / make "
            "vllm-env, or pass --allow-other-environments "
            "(REPRODUCE_ARGS=--allow-other-environments) "
            "to re-run anyway with the difference reported"
        )
    return notes


def portable_config(config: dict, workflow: Path) -> dict:
    """The archived config with relative model paths resolved here; a missing one is refused."""
    cfg = json.loads(json.dumps(config))
    for m in cfg["models"]:
        p = str(m["path"])
        if p.startswith("builtin:"):
            continue
        path = Path(p) if Path(p).is_absolute() else workflow / p
        if not path.exists():
            raise ArchiveError(
                f"models[{m['name']}].path: {path} does not exist on this machine; "
                "put the checkpoint there"
            )
        m["path"] = str(path)
    return cfg


def run_sweep(workflow: Path, dest: Path, snakemake: str, timeout_s: float | None) -> None:
    """The workflow on the local profile with ``dest`` as its working directory."""
    argv = [
        snakemake,
        "--snakefile",
        str(workflow / "Snakefile"),
        "--directory",
        str(dest),
        "--profile",
        str(workflow / "profiles" / "local"),
        "--configfile",
        str(dest / "config" / "config.yaml"),
    ]
    env = dict(os.environ, SLURM_CONF=os.environ.get("SLURM_CONF", os.devnull))
    with open(dest / "reproduce.log", "w") as log:
        proc = subprocess.run(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout_s
        )
    if proc.returncode != 0:
        raise RuntimeError(
            f"the re-run failed (exit {proc.returncode}); see {dest / 'reproduce.log'}"
        )


def write_comparison(archive: Archive, rerun_results: Path, out: Path, notes: list[str]) -> dict:
    """The side by side of the archived and re-run sweeps in ``out``; returns its counts."""
    out.mkdir(parents=True, exist_ok=True)
    pairs = compare.side_by_side(
        pd.read_csv(archive.file("summary.csv")), pd.read_csv(rerun_results / "summary.csv")
    )
    points = compare.point_verdicts(pairs)
    env = compare.environment_diff(
        pd.read_parquet(archive.file("environment.parquet")),
        pd.read_parquet(rerun_results / "environment.parquet"),
    )
    pairs.to_csv(out / "figures.csv", index=False)
    points.to_csv(out / "points.csv", index=False)
    env.to_csv(out / "environment.csv", index=False)
    warning = compare.gpu_model_warning(env)
    rerun_hash = yaml.safe_load((rerun_results / "config.yaml").read_text())["sweep_hash"]
    counts = {
        "points": len(points),
        "compared": int(points["reproduced"].notna().sum()) if len(points) else 0,
        "reproduced": int(points["reproduced"].fillna(False).sum()) if len(points) else 0,
        "gpu_model_warning": warning,
        "same_sweep_hash": rerun_hash == archive.manifest["sweep_hash"],
    }
    lines = [f"# Reproduction of {archive.manifest['name']}", ""]
    if warning:
        lines += [f"**{warning}**", ""]
    lines += [
        f"{counts['reproduced']} of {counts['compared']} compared points reproduced (every "
        "compared figure's 95% CIs overlap); "
        f"{counts['points'] - counts['compared']} of the {counts['points']} points had no figure "
        "with a value and a CI in both: points.csv; every figure: figures.csv.",
        f"Sweep hash: archived {archive.manifest['sweep_hash']}, re-run {rerun_hash}.",
        "",
        "## Environment differences (environment.csv)",
        "",
        *[
            f"- {r.field}: archived {r.archived}; re-run {r.rerun}"
            for r in env[env["differs"]].itertuples()
        ],
        "",
        "## Locks",
        "",
        *[f"- {n}" for n in notes],
    ]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    return counts


def reproduce(
    crate: str | Path,
    workflow: str | Path,
    snakemake: str,
    allow_other: bool = False,
    timeout_s: float | None = None,
) -> Path:
    """Re-run ``crate``'s sweep under ``workflow``/reproduced/ and compare; returns its dir."""
    workflow = Path(workflow).resolve()
    archive = open_crate(crate)
    notes = check_locks(archive, workflow, allow_other)
    config = portable_config(archive.config_record["config"], workflow)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    dest = workflow / "reproduced" / f"{archive.manifest['name']}-{stamp}"
    assert workflow / "results" not in dest.parents, dest  # never inside results/
    (dest / "config").mkdir(parents=True)
    (dest / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    run_sweep(workflow, dest, snakemake, timeout_s)
    counts = write_comparison(archive, dest / "results", dest / "comparison", notes)
    if counts["gpu_model_warning"]:
        print(counts["gpu_model_warning"], file=sys.stderr)
    print(
        f"{counts['reproduced']} of {counts['compared']} compared points reproduced "
        f"({counts['points']} points); "
        f"side by side: {dest / 'comparison'}"
    )
    return dest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("archive", help="the crate (results/archive/<name>.crate.zip)")
    p.add_argument("--workflow", default=".", help="the checkout to run (default: .)")
    p.add_argument("--snakemake", default=str(Path(sys.executable).parent / "snakemake"))
    p.add_argument("--allow-other-environments", action="store_true")
    p.add_argument("--timeout-s", type=float, default=None, help="bound on the whole re-run")
    args = p.parse_args(argv)
    try:
        reproduce(
            args.archive,
            args.workflow,
            args.snakemake,
            args.allow_other_environments,
            args.timeout_s,
        )
    except ArchiveError as exc:
        print(f"make reproduce: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
