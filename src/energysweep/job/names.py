"""The names a job gives what it creates on a node outside its processes.

Derived from the job id alone, so every rank, the measure step and a later job's clean-up
(:mod:`energysweep.launch.cleanup`) agree on them without talking to each other.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

PREFIX = "energysweep-"
# Characters of the job id in a name: unique enough for the jobs of one node, short enough that
# a socket path in the job's temp dir fits AF_UNIX's 107 bytes.
ID_CHARS = 16


def segment_prefix(job_id: str) -> str:
    """The prefix of every engine shared-memory segment of a job: ``energysweep-<id[:16]>``."""
    return f"{PREFIX}{job_id[:ID_CHARS]}"


def tmpdir(job_id: str, base: str | Path | None = None) -> Path:
    """The job's own temp dir (its processes' ``TMPDIR``), in ``base`` or the temp dir."""
    return Path(base or tempfile.gettempdir()) / f"{PREFIX}job-{job_id[:ID_CHARS]}"


def job_of(name: str) -> str | None:
    """The job-id part of a name given by :func:`segment_prefix` or :func:`tmpdir`; else None."""
    m = re.match(rf"{PREFIX}(?:job-)?([0-9a-f]{{{ID_CHARS}}})", name)
    return m.group(1) if m else None
