"""Atomic writes, the one way energysweep writes a file or directory: a temp beside the target,
then a rename.

A reader sees the old file or the new one, never half of one: a killed writer leaves at most a
hidden ``.tmp-*`` file (or directory), which no reader globs or counts, and a failed write (a full
disk, say) raises an error naming the file it was for. :func:`atomic_path` is the primitive;
:func:`write_atomic` (a Parquet table), :func:`write_text_atomic` and :func:`write_json_atomic`
are the common cases; :func:`temp_beside` and :func:`replace` let a caller stage several outputs
and rename them all at the end (energysweep.aggregate.publish).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def temp_beside(path: str | Path, directory: bool = False) -> Path:
    """A new hidden temp file (or directory) in ``path``'s directory, readable like any output.

    Beside the target, so the final rename stays on one filesystem (atomic).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".tmp-{path.name}-"
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=path.parent))
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; results are for everyone
        return tmp
    fd, name = tempfile.mkstemp(prefix=prefix, dir=path.parent)
    os.close(fd)
    os.chmod(name, 0o666 & ~_umask())  # mkstemp makes 0600; results are for everyone to read
    return Path(name)


def replace(tmp: str | Path, path: str | Path) -> None:
    """Rename ``tmp`` to ``path``; a directory already at ``path`` is moved aside, then removed."""
    tmp, path = Path(tmp), Path(path)
    if tmp.is_dir() and path.exists():
        # rename() cannot replace a non-empty directory: move the old one aside first.
        old = path.with_name(f".old-{path.name}-{uuid.uuid4().hex}")
        os.replace(path, old)
        try:
            os.replace(tmp, path)
        except BaseException:
            os.replace(old, path)
            raise
        shutil.rmtree(old, ignore_errors=True)
        return
    os.replace(tmp, path)


def remove(tmp: str | Path) -> None:
    """Remove a temp file or directory of :func:`temp_beside` (a failed write's leftovers)."""
    tmp = Path(tmp)
    if tmp.is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)


def write_error(exc: OSError, path: str | Path) -> OSError:
    """``exc`` (a failed write: a full disk, say) saying which file; pyarrow's errors do not."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return OSError(exc.errno, f"cannot write {path}: {reason}")


@contextlib.contextmanager
def atomic_path(path: str | Path, directory: bool = False) -> Iterator[Path]:
    """Yield a temp path beside ``path``; once the block ends without error, it becomes ``path``.

    On an error the temp is removed and ``path`` is as it was; an OSError names ``path``.
    """
    tmp = temp_beside(path, directory)
    try:
        try:
            yield tmp
        except OSError as exc:
            raise write_error(exc, path) from exc
        replace(tmp, path)
    except BaseException:
        remove(tmp)
        raise


def write_atomic(table, path: str | Path) -> None:
    """Write a pyarrow ``table`` as Parquet to ``path``, atomically."""
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def write_text_atomic(text: str, path: str | Path) -> None:
    """Write ``text`` to ``path``, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(obj, path: str | Path) -> None:
    """Write ``obj`` as indented JSON to ``path``, atomically (non-JSON values as ``str``)."""
    write_text_atomic(json.dumps(obj, indent=2, default=str), path)
