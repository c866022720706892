"""`archive` on a real local sweep: the crate read back with ro-crate-py holds every required
file; `reproduce` re-runs it from the crate beside results/ and compares every point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import VENV_BIN, local_sweep, test_env

pytestmark = pytest.mark.integration

# One job (pytorch inference, tp=pp=dp=1), one batch size, two repetitions: the cheapest sweep
# with a CI per point; tp=2 is skipped (more GPUs than max_gpus_per_job), with its reason.
TINY = {
    "scenarios": ["inference"],
    "parallel": {"tp": [1, 2], "pp": [1], "dp": [1], "max_gpus_per_job": 1},
    "workload": {"batch_sizes": [1], "repetitions": 2, "iterations": 1},
    "publication": {"title": "tiny", "license": "https://spdx.org/licenses/CC0-1.0"},
}
TIMEOUT_S = 900


@pytest.fixture(scope="module")
def archived(tmp_path_factory) -> tuple[Path, Path]:
    """(workflow copy, crate) of the TINY sweep after `snakemake archive`."""
    wf, cfg = local_sweep(tmp_path_factory.mktemp("archive"), TINY, "tiny.yaml")
    proc = subprocess.run(
        [str(VENV_BIN / "snakemake"), "--profile", "profiles/local", f"--configfile={cfg}",
         "archive"],
        cwd=wf, env=test_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    crates = list((wf / "results" / "archive").glob("*.crate.zip"))
    assert len(crates) == 1, crates
    # The size is reported on the terminal and in the rule log.
    assert f"{crates[0]}".split("/results/")[-1] in proc.stderr and "bytes" in proc.stderr
    return wf, crates[0]


def test_crate_of_a_real_sweep_holds_every_required_file(archived):
    from rocrate.rocrate import ROCrate

    from energysweep.archive import contents
    from energysweep.archive.readback import entity_path

    wf, crate_zip = archived
    crate = ROCrate(crate_zip)
    root = Path(crate.source)
    ids = {entity_path(e) for e in crate.data_entities} | {crate.mainEntity.id}
    manifest = json.loads((root / "manifest.json").read_text())
    want = [*contents.REQUIRED, *manifest["locks"]]
    want += [f"{j}/{f}" for j in manifest["jobs"] for f in ("job.json", "power.parquet")]
    assert len(manifest["jobs"]) == 1 and "locks/venv.lock" in manifest["locks"]
    assert any(i.startswith("energy.parquet/") for i in ids)
    for dest in want:
        assert dest in ids and (root / dest).is_file(), dest
    assert crate.name == "tiny" and crate.license == "https://spdx.org/licenses/CC0-1.0"
    skipped = pd.read_csv(root / "grid" / "skipped.tsv", sep="\t")
    assert skipped["reason"].notna().all() and len(skipped) > 0
    jobs = pd.read_csv(root / "jobs.csv")
    assert jobs["env_lock_in_crate"].tolist() == ["locks/venv.lock"]
    for f in ("mlenergy.csv", "ai_energy_score.csv", "mlcommons.csv"):
        assert (wf / "results" / "exports" / f).is_file()


def test_reproduce_reruns_from_the_crate_beside_results_and_compares(archived):
    wf, crate_zip = archived
    before = (wf / "results" / "summary.csv").read_bytes()
    proc = subprocess.run(
        [sys.executable, "-m", "energysweep.archive.reproduce", str(crate_zip),
         "--workflow", str(wf), "--snakemake", str(VENV_BIN / "snakemake"),
         "--timeout-s", str(TIMEOUT_S)],
        env=test_env(), capture_output=True, text=True, timeout=TIMEOUT_S + 60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    (dest,) = list((wf / "reproduced").iterdir())
    assert (wf / "results" / "summary.csv").read_bytes() == before  # results/ untouched
    figures = pd.read_csv(dest / "comparison" / "figures.csv")
    points = pd.read_csv(dest / "comparison" / "points.csv")
    env = pd.read_csv(dest / "comparison" / "environment.csv").set_index("field")
    archived_summary = pd.read_csv(wf / "results" / "summary.csv")
    assert len(points) == len(archived_summary) == 1  # every point reported
    tput = figures[figures["figure"] == "output_tokens_per_s"].iloc[0]
    assert tput["comparison_status"] == "ok" and tput["rerun"] > 0
    overlap = tput["archived_ci_low"] <= tput["rerun_ci_high"] and (
        tput["rerun_ci_low"] <= tput["archived_ci_high"]
    )
    assert bool(tput["cis_overlap"]) == overlap
    assert bool(points["reproduced"].iloc[0]) == overlap
    assert points["reproduction_status"].iloc[0] in ("reproduced", "a figure's CIs do not overlap")
    # CPU only: no GPU energy in either, said so (never compared as 0).
    energy = figures[figures["figure"] == "energy_per_output_token_j"].iloc[0]
    assert energy["comparison_status"].startswith("null in both")
    assert not env.loc["gpu_name", "differs"]  # same machine: no GPU model warning
    assert "DIFFERENT GPU MODEL" not in (dest / "comparison" / "README.md").read_text()
    assert "points reproduced" in proc.stdout


def test_reproduce_refuses_an_incomplete_crate_naming_the_lock(archived, tmp_path):
    import zipfile

    wf, crate_zip = archived
    bad = tmp_path / "bad.crate.zip"
    with zipfile.ZipFile(crate_zip) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.infolist():
            if item.filename != "locks/venv.lock":
                zout.writestr(item, zin.read(item.filename))
    proc = subprocess.run(
        [sys.executable, "-m", "energysweep.archive.reproduce", str(bad), "--workflow", str(wf)],
        env=test_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "lock files missing: locks/venv.lock" in proc.stderr
