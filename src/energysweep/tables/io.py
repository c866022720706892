"""Atomic writes for every table: a temp file beside the target, then a rename.

A killed writer leaves at most a ``.tmp-*`` file, which no reader globs or counts; a failed
write (a full disk, say) raises an error naming the file it was for.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def write_atomic(table: pa.Table, path: str | Path) -> None:
    """Write ``table`` to ``path`` via a temp file in the same directory and a rename.

    A killed writer leaves at most a ``.tmp-*`` file, which no reader globs or counts.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are for everyone to read
    try:
        try:
            pq.write_table(table, tmp)
        except OSError as exc:
            raise write_error(exc, path) from exc
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_error(exc: OSError, path: str | Path) -> OSError:
    """``exc`` (a failed write: a full disk, say) saying which file; pyarrow's errors do not."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return OSError(exc.errno, f"cannot write {path}: {reason}")


def write_text_atomic(text: str, path: str | Path) -> None:
    """Write ``text`` to ``path`` via a temp file beside it and a rename (as write_atomic)."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    try:
        try:
            tmp.write_text(text)
        except OSError as exc:
            raise write_error(exc, path) from exc
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
