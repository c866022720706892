"""The sweep's archive (energysweep.archive): what the crate holds, read back with ro-crate-py,
and the refusals of a bad archive, on a small synthetic sweep; the side by side of a re-run."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from archive_results import make_results
from rocrate.rocrate import ROCrate

from energysweep.archive import compare, contents
from energysweep.archive.contents import MissingInput
from energysweep.archive.crate import EMULATED_TAG, archive, crate_name
from energysweep.archive.readback import ArchiveError, entity_path, open_crate

PUBLICATION = {
    "title": "Tiny sweep",
    "license": "https://spdx.org/licenses/CC-BY-4.0",
    "authors": [{"name": "Ada Lovelace", "orcid": "https://orcid.org/0000-0002-1825-0097"}],
}


def _archive(tmp_path, emulated=False, **kw) -> tuple[Path, Path]:
    results, workflow, jobs = make_results(tmp_path, emulated=emulated, **kw)
    name = crate_name("abcdef0123456789", emulated)
    out = results / "archive" / f"{name}.crate.zip"
    archive(results, workflow, jobs, out, name)
    return out, results


@pytest.fixture(scope="module")
def crate_zip(tmp_path_factory) -> Path:
    return _archive(tmp_path_factory.mktemp("crate"), publication=PUBLICATION)[0]


def test_crate_read_back_holds_every_required_file(crate_zip):
    crate = ROCrate(crate_zip)
    ids = {entity_path(e) for e in crate.data_entities} | {crate.mainEntity.id}
    root = Path(crate.source)
    jobs = json.loads((root / "manifest.json").read_text())["jobs"]
    want = [
        *contents.REQUIRED,
        "energy.parquet/model=tiny/part-0.parquet",
        "locks/venv.lock",
        "locks/vllm-cpu.lock",
    ]
    want += [f"{j}/{f}" for j in jobs for f in ("job.json", "power.parquet")]
    assert len(jobs) == 2
    for dest in want:
        assert dest in ids, dest
        assert (root / dest).is_file(), dest
    assert crate.mainEntity.id == "Snakefile"
    run = next(e for e in crate.contextual_entities if "CreateAction" in e.type)
    assert run["instrument"].id == "Snakefile" and run["object"][0].id == "config.yaml"


def test_crate_carries_publication_methods_and_per_job_provenance(crate_zip):
    crate = ROCrate(crate_zip)
    assert crate.name == "Tiny sweep" and EMULATED_TAG not in crate.name
    assert crate.license == "https://spdx.org/licenses/CC-BY-4.0"
    assert [p.get("name") for p in crate.creator] == ["Ada Lovelace"]
    root = Path(crate.source)
    methods = json.loads((root / "methods.json").read_text())
    assert methods["energy_sources"] == ["nvml"] and not methods["emulated"]["any"]
    assert methods["counter_period"]["configured"]["min_s"] == 0.1
    assert methods["windows"]["min_window_s"] == 0.5
    assert methods["idle_baseline"]["idle_baseline_s"] == 0.5
    jobs = pd.read_csv(root / "jobs.csv")
    assert list(jobs["slurm_job_id"].astype(str)) == ["4242", "4242"]
    assert set(jobs["env_lock_in_crate"]) == {"locks/venv.lock"}
    version = json.loads((root / "code/version.json").read_text())
    assert len(version["commit"]) == 40 and version["dirty"] is False
    assert version["locks"]["locks/venv.lock"] == jobs["env_lock_sha256"][0]
    assert (root / "summary.csv").read_bytes() == (
        crate_zip.parents[1] / "summary.csv"
    ).read_bytes()


def test_emulated_sweep_says_so_in_name_and_description(tmp_path):
    out, _ = _archive(tmp_path, emulated=True)
    assert out.name.endswith(f"-{EMULATED_TAG}.crate.zip")
    crate = ROCrate(out)
    assert EMULATED_TAG in crate.name and crate.description.startswith(EMULATED_TAG)
    assert json.loads((Path(crate.source) / "manifest.json").read_text())["emulated"] is True


def test_emulated_rows_under_a_name_that_hides_them_are_refused(tmp_path):
    results, workflow, jobs = make_results(tmp_path, emulated=True)
    with pytest.raises(ValueError, match="does not say EMULATED"):
        archive(results, workflow, jobs, results / "x.crate.zip", "energysweep-abc")


def test_dirty_tree_ships_its_diff(tmp_path):
    results, workflow, jobs = make_results(tmp_path)
    (workflow / "Snakefile").write_text('include: "rules/x.smk"\n# changed\n')
    archive(results, workflow, jobs, results / "d.crate.zip", "d")
    with zipfile.ZipFile(results / "d.crate.zip") as zf:
        assert "+# changed" in zf.read(contents.DIFF_FILE).decode()
        assert json.loads(zf.read("code/version.json"))["dirty"] is True


def test_missing_report_and_foreign_lock_are_named(tmp_path):
    results, workflow, jobs = make_results(tmp_path)
    (results / "report.html").unlink()
    with pytest.raises(MissingInput, match="report.html is missing"):
        archive(results, workflow, jobs, results / "r.crate.zip", "r")
    (results / "report.html").write_text("<html/>")
    (workflow / "envs" / "venv.lock").write_text("another lock\n")
    with pytest.raises(MissingInput, match="lock file a job ran from is missing.*envs/venv.lock"):
        archive(results, workflow, jobs, results / "r.crate.zip", "r")


def _rewrite(src: Path, dst: Path, drop: str | None = None, change: str | None = None) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            if item.filename == drop:
                continue
            data = zin.read(item.filename)
            zout.writestr(item, data + b"x" if item.filename == change else data)
    return dst


@pytest.mark.parametrize(
    ("drop", "change", "message"),
    [
        ("summary.csv", None, "incomplete archive: missing summary.csv"),
        ("locks/venv.lock", None, "lock files missing: locks/venv.lock"),
        (
            "shards/model~tiny/backend~pytorch/scenario~training/tp~1/pp~1/dp~1/power.parquet",
            None,
            "missing shards/.*training.*/power.parquet",
        ),
        ("manifest.json", None, "a crate from another tool"),
        ("ro-crate-metadata.json", None, "not an RO-Crate"),
        (None, "summary.csv", "altered archive: .*summary.csv"),
    ],
)
def test_bad_archive_is_refused_naming_what_is_wrong(crate_zip, tmp_path, drop, change, message):
    bad = _rewrite(crate_zip, tmp_path / "bad.zip", drop, change)
    with pytest.raises(ArchiveError, match=message):
        open_crate(bad)


def test_corrupt_or_foreign_files_are_refused(crate_zip, tmp_path):
    truncated = tmp_path / "t.zip"
    truncated.write_bytes(crate_zip.read_bytes()[: crate_zip.stat().st_size // 2])
    with pytest.raises(ArchiveError, match="corrupt"):
        open_crate(truncated)
    with pytest.raises(ArchiveError, match="no such archive"):
        open_crate(tmp_path / "none.zip")
    other = ROCrate()
    other.add_file(crate_zip.parents[1] / "summary.csv", dest_path="data.csv")
    other.write_zip(tmp_path / "other.zip")
    with pytest.raises(ArchiveError, match="a crate from another tool: it holds no energysweep"):
        open_crate(tmp_path / "other.zip")


def _summary(values: dict[int, tuple[float, float, float]]) -> pd.DataFrame:
    rows = []
    for bs, (v, lo, hi) in values.items():
        rows.append(
            {
                "model": "m",
                "backend": "pytorch",
                "scenario": "inference",
                "tp": 1,
                "pp": 1,
                "dp": 1,
                "power_limit_w": "unset",
                "gpu_clock": "unset",
                "batch_size": bs,
                "load": "batch",
                "output_tokens_per_s": v,
                "output_tokens_per_s_ci_low": lo,
                "output_tokens_per_s_ci_high": hi,
            }
        )
    return pd.DataFrame(rows)


def test_side_by_side_marks_points_whose_cis_overlap_reproduced():
    archived = _summary({1: (10.0, 9.0, 11.0), 4: (40.0, 39.0, 41.0), 8: (80.0, 79.0, 81.0)})
    rerun = _summary({1: (10.5, 10.0, 12.0), 4: (45.0, 44.0, 46.0)})
    pairs = compare.side_by_side(archived, rerun).set_index("batch_size")
    assert pairs.loc[1, "cis_overlap"] is True
    assert pairs.loc[1, "ratio_rerun_over_archived"] == pytest.approx(1.05)
    assert pairs.loc[4, "cis_overlap"] is False
    assert pairs.loc[8, "comparison_status"] == "point missing from the re-run"
    points = compare.point_verdicts(compare.side_by_side(archived, rerun)).set_index("batch_size")
    assert list(points["reproduced"]) == [True, False, False]
    nothing = _summary({1: (float("nan"), float("nan"), float("nan"))})
    verdict = compare.point_verdicts(compare.side_by_side(nothing, nothing)).iloc[0]
    assert pd.isna(verdict["reproduced"])
    assert verdict["reproduction_status"].startswith("nothing to compare")


def test_environment_diff_says_a_different_gpu_model_loudly():
    a = pd.DataFrame(
        {"gpu_name": ["NVIDIA H100 80GB HBM3"], "driver": ["550"], "torch_version": ["2.13.0"]}
    )
    b = pd.DataFrame({"gpu_name": ["NVIDIA H200"], "driver": ["550"], "torch_version": ["2.14.0"]})
    diff = compare.environment_diff(a, b).set_index("field")
    assert diff.loc["gpu_name", "differs"] and diff.loc["torch_version", "differs"]
    assert not diff.loc["driver", "differs"]
    warning = compare.gpu_model_warning(diff.reset_index())
    assert "DIFFERENT GPU MODEL" in warning and "NVIDIA H200" in warning
    assert compare.gpu_model_warning(compare.environment_diff(a, a)) is None


def test_reproduce_refuses_other_environments_unless_allowed(crate_zip, tmp_path):
    from energysweep.archive import reproduce

    back = open_crate(crate_zip)
    wf = tmp_path / "checkout"
    (wf / ".venv").mkdir(parents=True)
    lock = back.file("locks/venv.lock")
    stamp = {"lock": "envs/venv.lock", "lock_sha256": contents.sha256(lock)}
    (wf / ".venv" / reproduce.STAMP).write_text(json.dumps(stamp))
    assert "built from the archived lock" in reproduce.check_locks(back, wf, False)[0]
    stamp["lock_sha256"] = "f" * 64
    (wf / ".venv" / reproduce.STAMP).write_text(json.dumps(stamp))
    with pytest.raises(ArchiveError, match="envs/venv.lock: archived sha256 .*, here ffff"):
        reproduce.check_locks(back, wf, False)
    assert "here ffff" in reproduce.check_locks(back, wf, True)[0]


def test_reproduce_refuses_a_checkpoint_missing_here(tmp_path):
    from energysweep.archive import reproduce

    cfg = {"models": [{"name": "big", "path": "models/big"}, {"name": "t", "path": "builtin:tiny"}]}
    with pytest.raises(ArchiveError, match=r"models\[big\].path: .*models/big does not exist"):
        reproduce.portable_config(cfg, tmp_path)
    (tmp_path / "models" / "big").mkdir(parents=True)
    out = reproduce.portable_config(cfg, tmp_path)
    assert out["models"][0]["path"] == str(tmp_path / "models" / "big")
