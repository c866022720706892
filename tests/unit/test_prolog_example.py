"""The admin Prolog/Epilog example (docs/examples) does what docs/gpu-settings.md says: sets the
limit a job's powercap_<W>w feature asks for on the job's GPUs only, and the Epilog puts each
GPU's previous limit back. nvidia-smi is a stand-in keeping each GPU's limit in a file."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


@pytest.fixture
def node(tmp_path):
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    for i, watts in enumerate((700, 650, 700, 700)):
        (gpus / str(i)).write_text(f"{watts}.00\n")
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    # `-i N --query-gpu=power.limit ...` prints the limit; `-i N -pl W` sets it.
    smi.write_text(
        "#!/bin/sh\n"
        f'g="{gpus}/$2"\n'
        '[ "$3" = "-pl" ] && { echo "$4.00" > "$g"; exit 0; }\n'
        'cat "$g"\n'
    )
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    return gpus, smi.parent


def _run(script: str, node, tmp_path, **env):
    gpus, bin_dir = node
    full = {
        "SLURM_POWERCAP_STATE": str(tmp_path / "state"),
        "SLURM_JOB_ID": "77",
        "NVIDIA_SMI": str(bin_dir / "nvidia-smi"),
        **env,
    }
    return subprocess.run(
        ["bash", str(EXAMPLES / script)],
        env={**os.environ, **full},
        capture_output=True,
        text=True,
        timeout=30,
    )


def _limits(gpus: Path) -> list[str]:
    return [(gpus / str(i)).read_text().strip() for i in range(4)]


def test_prolog_sets_the_asked_limit_on_the_jobs_gpus_and_epilog_restores(node, tmp_path):
    gpus, _ = node
    env = {"SLURM_JOB_CONSTRAINTS": "hopper&powercap_300w", "SLURM_JOB_GPUS": "1,2"}
    assert _run("slurm-prolog-powercap.sh", node, tmp_path, **env).returncode == 0
    assert _limits(gpus) == ["700.00", "300.00", "300.00", "700.00"]
    # A second Prolog run (Slurm may run it per step) must not record the capped values.
    assert _run("slurm-prolog-powercap.sh", node, tmp_path, **env).returncode == 0
    assert _run("slurm-epilog-powercap.sh", node, tmp_path).returncode == 0
    assert _limits(gpus) == ["700.00", "650.00", "700.00", "700.00"]  # each GPU's own previous
    assert not (tmp_path / "state" / "77").exists()


def test_prolog_without_a_powercap_feature_touches_nothing(node, tmp_path):
    gpus, _ = node
    env = {"SLURM_JOB_CONSTRAINTS": "hopper", "SLURM_JOB_GPUS": "0"}
    assert _run("slurm-prolog-powercap.sh", node, tmp_path, **env).returncode == 0
    assert _run("slurm-epilog-powercap.sh", node, tmp_path).returncode == 0
    assert _limits(gpus) == ["700.00", "650.00", "700.00", "700.00"]
