"""The environments' locks (envs/*.lock, envs/locks.py) and the Makefile's environment stamps.

- every lock still admits what its inputs ask for, and the check fails when an input changes;
- the environments `make` built hold exactly the locked versions (the vLLM one too);
- a stamp depends on the content of what the environment installs from, not on file times, and a
  `.venv` that links to another checkout's environment is never installed into.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, vllm_python

sys.path.insert(0, str(ROOT / "envs"))
import locks  # noqa: E402

VENV = Path(sys.prefix)


def copy_inputs(dst: Path) -> Path:
    shutil.copytree(ROOT / "envs", dst / "envs", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "Makefile"):
        shutil.copy2(ROOT / name, dst / name)
    return dst


@pytest.mark.timeout(60)
def test_locks_match_their_inputs():
    for lock in locks.LOCKS.values():
        assert locks.mismatches(lock) == [], lock.name


@pytest.mark.timeout(60)
def test_check_fails_when_an_input_changes(tmp_path):
    root = copy_inputs(tmp_path)
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"pandas>=2.2"', '"pandas>=9"'))
    ranks = root / "envs" / "vllm-ranks.txt"
    ranks.write_text(ranks.read_text().replace("\npsutil\n", "\nrequests-toolbelt\n"))
    problems = locks.mismatches(locks.LOCKS["venv"], root)
    assert problems == [
        "envs/venv.lock: 'pandas>=9' (pyproject.toml) does not admit the locked "
        f"pandas=={locks.pins((root / 'envs/venv.lock').read_text())['pandas']}"
    ]
    cpu = locks.mismatches(locks.LOCKS["vllm-cpu"], root)
    assert any("'requests-toolbelt' (envs/vllm-cpu.in) is not in the lock" in p for p in cpu)
    assert any("psutil is locked as a requirement of envs/vllm-cpu.in" in p for p in cpu)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "envs/locks.py"), "check", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "run `make lock`" in proc.stderr


@pytest.mark.timeout(120)
def test_environments_hold_exactly_their_locks():
    assert locks.differences(locks.LOCKS["venv"], sys.executable) == []
    assert locks.differences(locks.LOCKS["vllm-cpu"], vllm_python()) == []
    # The engine's broken companions are left out of the lock, so never installed.
    installed = locks.installed(vllm_python())
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(installed)
    assert locks.pins((ROOT / "envs/vllm-cpu.lock").read_text())["torch"] == "2.13.0+cpu"


@pytest.mark.timeout(120)
def test_environment_records_its_lock_hash():
    for env, lock in (
        (VENV, "envs/venv.lock"),
        (Path(vllm_python()).parents[1], "envs/vllm-cpu.lock"),
    ):
        record = json.loads((env / "energysweep-env.json").read_text())
        assert record == {"lock": lock, "lock_sha256": locks.sha256(ROOT / lock)}


def make(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(root), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.timeout(300)
def test_stamps_follow_content_not_file_times_and_a_linked_venv_is_never_installed_into(tmp_path):
    root = copy_inputs(tmp_path)
    (root / ".venv").symlink_to(VENV, target_is_directory=True)
    before = sorted(p.name for p in VENV.iterdir())
    # Same content, new file times (a fresh clone, a checkout, a touch): nothing to do.
    for name in ("pyproject.toml", "envs/venv.lock"):
        os.utime(root / name)
    dry = make(root, "-n", "venv")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.strip() == "make: Nothing to be done for 'venv'.", dry.stdout
    # Other content: the stamp is another one; the linked environment is refused, not touched.
    lock = root / "envs" / "venv.lock"
    lock.write_text(lock.read_text() + "\n")
    proc = make(root, "venv")
    assert proc.returncode != 0
    assert ".venv is a link to" in proc.stderr and "not installing into it" in proc.stderr
    assert "pip install" not in proc.stdout
    assert sorted(p.name for p in VENV.iterdir()) == before


def test_snapshot_and_environment_rows_carry_the_lock(tmp_path):
    from energysweep.measure import provenance
    from energysweep.tables.environment import environment_rows

    lock = {"lock": "envs/venv.lock", "lock_sha256": locks.sha256(ROOT / "envs/venv.lock")}
    assert provenance.env_lock() == lock  # this process runs in .venv
    assert provenance.snapshot()["env_lock"] == lock
    assert provenance.env_lock(tmp_path) is None  # not built from a lock: null, never a guess
    hosts = [{"host": "h", "env_lock": lock}, {"host": "g", "env_lock": None}]
    rows = environment_rows(
        {"job_id": "j", "environment": {"hosts": hosts, "gpus": [{"host": "h"}, {"host": "g"}]}}
    )
    assert [(r["env_lock"], r["env_lock_sha256"]) for r in rows] == [
        ("envs/venv.lock", lock["lock_sha256"]),
        (None, None),
    ]
