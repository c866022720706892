"""The code version a result was made with: ``<package version>+g<commit>[.dirty]``.

Recorded in every shard row, job.json and results/config.yaml (the workflow computes it once
when it loads, rules/common.smk; the launcher for each job, energysweep.launch.job).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from energysweep import __version__


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10, check=True
    ).stdout.strip()


def code_version(repo: str | Path | None = None) -> str:
    """``<package version>+g<commit>[.dirty]``; ``+unknown`` outside a git checkout."""
    repo = Path(repo or Path(__file__).resolve().parents[3])
    try:
        commit = _git(repo, "rev-parse", "--short=12", "HEAD")
        dirty = _git(repo, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return f"{__version__}+unknown"
    return f"{__version__}+g{commit}" + (".dirty" if dirty else "")


def git_commit(code_version_str: str | None) -> str | None:
    """The commit in a :func:`code_version` string (``0.1.0+gabc123.dirty`` -> ``abc123``)."""
    match = re.search(r"\+g([0-9a-f]+)", code_version_str or "")
    return match.group(1) if match else None
