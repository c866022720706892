"""Write one sweep as a Workflow Run RO-Crate (``results/archive/<name>.crate.zip``).

Written with ro-crate-py (``rocrate``): the workflow (Snakefile, Snakemake) is the main entity,
one ``CreateAction`` is the sweep's run (its config the object, its tables the results), every
file carries its description and sha256, and the root carries the name, description, licence
and authors (config ``publication:``). A sweep with any emulated row says so in the crate's name
and description. :mod:`energysweep.archive.readback` reads it back and checks it.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from energysweep.archive import contents as C
from energysweep.archive.methods import write_derived

TOOL = "energysweep"
ARCHIVE_FORMAT = 1
EMULATED_TAG = "EMULATED"
PROFILES = C.PROFILES


def crate_name(sweep_hash: str, emulated: bool) -> str:
    """The crate's file stem: the sweep's hash, and EMULATED when any row was emulated."""
    return f"energysweep-{sweep_hash}" + (f"-{EMULATED_TAG}" if emulated else "")


def config_emulated(config: dict) -> bool:
    """Whether a sweep's rows are emulated (``measurement.device: emulated``)."""
    return config["measurement"]["device"] == "emulated"


def describe(record: dict, meth: dict, n_jobs: int) -> tuple[str, str]:
    """The crate's title and description; both say EMULATED when any row was."""
    pub = record["config"]["publication"]
    em = meth["emulated"]
    title = pub["title"] or f"energysweep sweep {record['sweep_hash']}"
    text = pub["abstract"] or (
        f"Energy and speed of LLM inference, serving and training: {n_jobs} jobs of the "
        f"energysweep sweep {record['sweep_hash']} (code {record['code_version']})."
    )
    if em["any"]:
        title = f"{title} [{EMULATED_TAG} GPU node: not real GPU energy]"
        text = (
            f"{EMULATED_TAG}: {em['rows']} of {em['of_rows']} rows were measured on the emulated "
            f"GPU node (profiles {', '.join(em['profiles']) or 'unknown'}): {em['what']}. {text}"
        )
    return title, text


def _add_people(crate, pub: dict) -> list:
    from rocrate.model.person import Person

    people = []
    for i, a in enumerate(pub["authors"]):
        ident = a.get("orcid") or f"#author-{i}"
        props = {"name": a["name"]}
        if a.get("affiliation"):
            props["affiliation"] = a["affiliation"]
        people.append(crate.add(Person(crate, ident, properties=props)))
    return people


def _add_files(crate, entries: list[C.Entry]) -> dict[str, object]:
    added = {}
    for e in entries:
        props = {
            "description": e.description,
            "contentSize": e.source.stat().st_size,
            "sha256": C.sha256(e.source),
        }
        if e.dest == C.WORKFLOW_FILE:
            continue
        added[e.dest] = crate.add_file(e.source, dest_path=e.dest, properties=props)
    return added


def _run_times(results: Path) -> tuple[str | None, str | None]:
    import pyarrow.dataset as ds

    table = ds.dataset(results / C.ENERGY_DATASET, partitioning="hive").to_table(
        columns=["window_start_ns", "window_end_ns"]
    )
    start, end = table["window_start_ns"], table["window_end_ns"]
    if start.null_count == len(start):
        return None, None

    def iso(ns) -> str:
        return dt.datetime.fromtimestamp(int(ns) / 1e9, tz=dt.timezone.utc).isoformat()

    import pyarrow.compute as pc

    return iso(pc.min(start).as_py()), iso(pc.max(end).as_py())


def build(
    results: Path, workflow: Path, job_jsons: list[Path], stage: Path, name: str
) -> tuple[Any, dict]:
    """The crate of the sweep in ``results`` (derived files staged in ``stage``)."""
    from rocrate.rocrate import ROCrate

    record = yaml.safe_load(
        C._need(results / "config.yaml", "the config as run", "run the sweep first").read_text()
    )
    entries = C.result_entries(results) + C.energy_entries(results)
    job_records = {
        Path(j).parent.resolve().relative_to(results.resolve()).as_posix(): json.loads(
            Path(j).read_text()
        )
        for j in job_jsons
    }
    entries += C.job_entries(results, job_jsons)
    locks = C.lock_entries(workflow)
    meth = write_derived(stage, record["config"], results, job_records, locks, workflow)
    if meth["emulated"]["any"] and EMULATED_TAG not in name:
        raise ValueError(
            f"crate name {name} does not say {EMULATED_TAG} but {meth['emulated']['rows']} rows "
            "were measured on the emulated GPU node"
        )
    derived = [C.Entry(d, stage / d, t) for d, t in C.DERIVED_FILES.items() if d != "manifest.json"]
    if (stage / C.DIFF_FILE).exists():
        derived.append(C.Entry(C.DIFF_FILE, stage / C.DIFF_FILE, "git diff HEAD of the dirty tree"))
    workflow_files = C.workflow_entries(workflow)
    all_entries = entries + locks + derived + workflow_files
    manifest = {
        "tool": TOOL,
        "archive_format": ARCHIVE_FORMAT,
        "name": name,
        "sweep_hash": record["sweep_hash"],
        "code_version": record["code_version"],
        "emulated": meth["emulated"]["any"],
        "jobs": sorted(job_records),
        "locks": [e.dest for e in locks],
        "files": sorted([e.dest for e in all_entries] + ["manifest.json"]),
    }
    (stage / "manifest.json").write_text(json.dumps(manifest, indent=1))
    all_entries.append(
        C.Entry("manifest.json", stage / "manifest.json", C.DERIVED_FILES["manifest.json"])
    )

    # RO-Crate 1.1: the version the Workflow Run Crate 0.5 profile is written for.
    crate = ROCrate(version="1.1")
    title, text = describe(record, meth, len(job_records))
    crate.name, crate.description = title, text
    pub = record["config"]["publication"]
    if pub["license"]:
        crate.license = pub["license"]
    people = _add_people(crate, pub)
    if people:
        crate.creator = people
    if pub["keywords"]:
        crate.keywords = list(pub["keywords"])
    wf = crate.add_workflow(
        workflow / C.WORKFLOW_FILE, dest_path=C.WORKFLOW_FILE, main=True, lang="snakemake"
    )
    wf["name"] = "energysweep"
    wf["version"] = record["code_version"]
    files = _add_files(crate, all_entries)
    for pid in PROFILES:
        crate.root_dataset.append_to("conformsTo", {"@id": pid})
    _add_run(crate, wf, files, results, people, name)
    return crate, manifest


def _add_run(crate, wf, files: dict, results: Path, people: list, name: str) -> None:
    start, end = _run_times(results)
    props: dict[str, object] = {"name": f"Run of the energysweep workflow: {name}"}
    if start:
        props["startTime"], props["endTime"] = start, end
    if people:
        props["agent"] = {"@id": people[0].id}
    result = [
        f
        for d, f in files.items()
        if not d.startswith(("locks/", "rules/", "code/")) and d != "config.yaml"
    ]
    crate.add_action(wf, object=[files["config.yaml"]], result=result, properties=props)


def write(
    results: str | Path, workflow: str | Path, job_jsons: list, out: str | Path, name: str
) -> dict:
    """Write the crate of ``results`` to ``out`` (a zip, atomically); returns its manifest."""
    from energysweep.tables.io import atomic_path

    results, workflow, out = Path(results), Path(workflow), Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix="energysweep-archive-"))
    try:
        crate, manifest = build(results, workflow, [Path(j) for j in job_jsons], stage, name)
        with atomic_path(out) as tmp:
            crate.write_zip(tmp)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return manifest


def archive(
    results: str | Path, workflow: str | Path, job_jsons: list, out: str | Path, name: str
) -> list[str]:
    """Write the crate and read it back (checked); returns the lines to report (size first)."""
    from energysweep.archive import readback

    write(results, workflow, job_jsons, out, name)
    back = readback.open_crate(out)
    return [
        readback.size_report(out, back),
        f"{back.manifest['name']}: every required file present, sha256 as recorded, "
        "Workflow Run Crate entities present (mainEntity, CreateAction, profiles)",
    ]
