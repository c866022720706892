"""`make gpu-check` as a command: run against the emulated node (no GPU here), it prints the
measured figures beside the profile's and writes them; on the emulated node they come back as
the profile's own (a GPU node is what it is for: docs/emulated-node.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, test_env

pytestmark = [pytest.mark.integration]


@pytest.mark.timeout(300)
def test_gpu_check_prints_measured_figures_beside_the_profile(tmp_path):
    out = tmp_path / "gpu-check.json"
    argv = [sys.executable, "-m", "energysweep.validity.gpu_check", "--emulated", "--no-sweep",
            "--seconds", "3", "--workflow", str(ROOT), "--out", str(out)]  # fmt: skip
    proc = subprocess.run(argv, env=test_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "against profile h200-sxm" in proc.stdout  # the default emulated GPU
    for line in ("counter refresh period (s)", "energy read latency (s)", "idle power (W)",
                 "Zeus / NVML energy"):  # fmt: skip
        assert line in proc.stdout
    got = json.loads(out.read_text())
    assert 0.09 <= got["counter_period_s"] <= 0.12  # the profile's 100 ms, seen by polling
    # h200-sxm: 79 W without a context, read by a counter of gain 0.9967 (profiles.py)
    assert got["idle_w"] == pytest.approx(78.7, abs=1) and got["read_latency_s"] >= 0.002
    assert got["zeus_nvml_ratio"] == pytest.approx(1, abs=0.05)
