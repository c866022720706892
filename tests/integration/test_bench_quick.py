"""Every bench/ script runs as shipped: its quick mode (tiny sizes, the same code path as the
headline run) completes and prints its figure on the last line. Nothing here is timed: a bench
that rots (a config it no longer matches, a renamed module) fails here instead of in a paper run.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT, test_env

pytestmark = [pytest.mark.integration]

# script -> what its last line starts with (the figure it exists to print)
BENCHES = {
    "dag_scaling.py": "dag_scaling n=",
    "launch_overhead.py": "launch_overhead: ",
    "gpu_time_efficiency.py": "gpu_time_efficiency (",
    "merge_scaling.py": "merge_scaling ",
    "report_startup.py": "one start-up saves ",
    "sampler_overhead.py": "sampler thread CPU: ",
    "validity_scaling.py": "check: window timeline/counter ratio",
    "energy_accuracy.py": "energy_accuracy: ours worst |error| ",
    "validity_calibration.py": "false-invalid rate of healthy windows at the defaults: ",
    "serving_overhead.py": "serving time outside windows / inside: ",
    "job_overhead.py": "job_overhead: sweep wall / windows = ",
}


def test_every_bench_is_listed():
    shipped = {p.name for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_")}
    assert shipped == set(BENCHES)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("script", sorted(BENCHES))
def test_bench_quick_mode_runs(script):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick"],
        cwd=ROOT,
        env=test_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(BENCHES[script]), out[-2000:]
