"""Read an archive back with ro-crate-py and check it holds what an energysweep crate must.

:func:`open_crate` refuses, naming what is wrong and the fix: a file that is not a zip or whose
members fail their CRC (corrupt), a zip without ``ro-crate-metadata.json`` (not an RO-Crate), a
crate without energysweep's ``manifest.json`` (a crate from another tool), a crate missing any
file of :data:`energysweep.archive.contents.REQUIRED`, a job's files or a lock (incomplete), and
a file whose sha256 is not the one recorded (altered).
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from energysweep.archive import contents as C

METADATA = "ro-crate-metadata.json"


class ArchiveError(ValueError):
    """The archive cannot be used; the message names what is missing or wrong."""


@dataclass
class Archive:
    """A crate read back: its ro-crate-py object, the extracted directory and its manifest."""

    crate: Any
    root: Path
    manifest: dict

    @property
    def config_record(self) -> dict:
        import yaml

        return yaml.safe_load((self.root / "config.yaml").read_text())

    def file(self, dest: str) -> Path:
        return self.root / dest


def _check_zip(path: Path) -> None:
    if not path.is_file():
        raise ArchiveError(
            f"{path}: no such archive (make archive writes results/archive/*.crate.zip)"
        )
    if not zipfile.is_zipfile(path):
        raise ArchiveError(
            f"{path}: corrupt or not an archive: not a zip file (truncated or another format)"
        )
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
            names = set(zf.namelist())
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise ArchiveError(f"{path}: corrupt archive: {exc}") from exc
    if bad is not None:
        raise ArchiveError(f"{path}: corrupt archive: member {bad} fails its CRC check")
    if METADATA not in names:
        raise ArchiveError(f"{path}: not an RO-Crate: the zip holds no {METADATA}")
    if "manifest.json" not in names:
        raise ArchiveError(
            f"{path}: a crate from another tool: it holds no energysweep manifest.json "
            "(make archive writes one with every energysweep crate)"
        )


def _manifest(root: Path, path: Path) -> dict:
    try:
        manifest = json.loads((root / "manifest.json").read_text())
    except ValueError as exc:
        raise ArchiveError(f"{path}: manifest.json is not JSON ({exc})") from exc
    if manifest.get("tool") != "energysweep":
        raise ArchiveError(
            f"{path}: a crate from another tool: manifest.json names tool "
            f"{manifest.get('tool')!r}, not energysweep"
        )
    return manifest


def entity_path(entity) -> str:
    """A data entity's path in the crate: its id, percent-decoded (ro-crate-py encodes ``=``,
    spaces and the like in ids; the zip holds the plain names)."""
    return unquote(entity.id)


def missing_files(crate, root: Path, manifest: dict) -> list[str]:
    """Every required file, job file and lock the crate lacks (on disk or in its metadata)."""
    listed = {entity_path(e) for e in crate.data_entities} | {C.WORKFLOW_FILE}
    want = list(C.REQUIRED)
    want += [f"{j}/{f}" for j in manifest.get("jobs", []) for f in ("job.json", "power.parquet")]
    want += list(manifest.get("locks", []))
    if not manifest.get("locks"):
        want.append(f"{C.LOCK_DIR}/*.lock (no lock listed)")
    want += list(manifest.get("files", []))
    out = []
    for dest in dict.fromkeys(want):
        if not (root / dest).is_file() or (dest != "manifest.json" and dest not in listed):
            out.append(dest)
    return out


def altered_files(crate, root: Path) -> list[str]:
    """Files whose sha256 differs from the one the crate records."""
    out = []
    for e in crate.data_entities:
        want = e.properties().get("sha256")
        path = root / entity_path(e)
        if want and path.is_file() and C.sha256(path) != want:
            out.append(entity_path(e))
    return out


def _ids(value) -> list[str]:
    """The ids of a property's value: an entity, a ``{"@id": ...}``, a string, or a list."""
    items = value if isinstance(value, list) else [] if value is None else [value]
    return [
        i.id if hasattr(i, "id") else i["@id"] if isinstance(i, dict) else str(i) for i in items
    ]


def profile_issues(crate) -> list[str]:
    """What the Workflow Run Crate profile requires and the crate lacks (its MUSTs we write).

    roc-validator would check this against the profile's SHACL shapes, but it fetches the
    RO-Crate JSON-LD context from w3id.org at run time, which an offline machine cannot.
    """
    issues = []
    root = crate.root_dataset
    main = crate.mainEntity
    if main is None or "ComputationalWorkflow" not in main.type:
        issues.append("root mainEntity is not a ComputationalWorkflow")
    elif main.get("programmingLanguage") is None:
        issues.append("the main workflow has no programmingLanguage")
    conforms = set(_ids(root.get("conformsTo")))
    issues += [f"root conformsTo lacks {p}" for p in C.PROFILES if p not in conforms]
    actions = [e for e in crate.contextual_entities if "CreateAction" in e.type]
    if not actions:
        issues.append("no CreateAction (the run)")
    elif main is not None and not any(main.id in _ids(a.get("instrument")) for a in actions):
        issues.append("no CreateAction has the main workflow as its instrument")
    return issues


def open_crate(path: str | Path) -> Archive:
    """Read ``path`` back with ro-crate-py and check it; raises :class:`ArchiveError`."""
    from rocrate.rocrate import ROCrate

    path = Path(path)
    _check_zip(path)
    try:
        crate = ROCrate(path)
    except Exception as exc:  # ro-crate-py raises several types on a malformed crate
        raise ArchiveError(
            f"{path}: ro-crate-py cannot read it: {type(exc).__name__}: {exc}"
        ) from exc
    root = Path(crate.source)
    manifest = _manifest(root, path)
    missing = missing_files(crate, root, manifest)
    if missing:
        locks = [m for m in missing if m.startswith(C.LOCK_DIR)]
        what = f"; lock files missing: {', '.join(locks)}" if locks else ""
        raise ArchiveError(f"{path}: incomplete archive: missing {', '.join(missing)}{what}")
    altered = altered_files(crate, root)
    if altered:
        raise ArchiveError(
            f"{path}: altered archive: sha256 differs from the recorded one for "
            + ", ".join(altered)
        )
    issues = profile_issues(crate)
    if issues:
        raise ArchiveError(f"{path}: not a Workflow Run Crate: {'; '.join(issues)}")
    return Archive(crate, root, manifest)


def size_report(path: str | Path, archive: Archive) -> str:
    """One line: the crate's path, file count and size."""
    size = Path(path).stat().st_size
    n = len(archive.crate.data_entities)
    return f"{path}: {n} files, {size} bytes ({size / 2**20:.2f} MiB), read back with ro-crate-py"
