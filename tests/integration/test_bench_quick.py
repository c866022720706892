"""Every bench/ script runs as shipped: its quick mode (tiny sizes, the same code path as the
headline run) completes and prints its figure on the last line. Nothing here is timed: a bench
that rots (a config it no longer matches, a renamed module) fails here instead of in a paper run.
One exception: bench/serving_overhead.py's quick sweep is planned by Snakemake here (its config
checked, its serving job in the DAG), and its report runs on the Slurm serving sweep of
tests/integration/test_slurm_serving.py (``--results``): a vLLM server sweep of its own cost a
minute of `make test` (issue 28).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, test_env

pytestmark = [pytest.mark.integration]

# script -> what its last line starts with (the figure it exists to print)
BENCHES = {
    "dag_scaling.py": "dag_scaling n=",
    "launch_overhead.py": "launch_overhead: ",
    "merge_scaling.py": "merge_scaling ",
    "report_startup.py": "one start-up saves ",
    "sampler_overhead.py": "sampler thread CPU: ",
    "validity_scaling.py": "check: window timeline/counter ratio",
    "energy_accuracy.py": "energy_accuracy: ours worst |error| ",  # asserted: see the end
    "validity_calibration.py": "false-invalid rate of healthy windows at the defaults: ",
    # Planned, not run: its report runs on the Slurm serving sweep (test_slurm_serving.py).
    "serving_overhead.py": "serving_overhead dry run: 1 serving job(s) planned",
    "fit_h200_profile.py": "fit_h200_profile: refresh ",
    "job_overhead.py": "job_overhead: sweep wall / windows = ",
}
# Arguments of the tests' run: --quick, or what replaces it.
ARGS = {"serving_overhead.py": ["--quick", "--dry-run"]}


def test_every_bench_is_listed():
    shipped = {p.name for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_")}
    assert shipped == set(BENCHES)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("script", sorted(set(BENCHES) - {"energy_accuracy.py"}))
def test_bench_quick_mode_runs(script):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *ARGS.get(script, ["--quick"])],
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


# bench/energy_accuracy.py --quick's headline (virtual time, seeded loads and read latencies: the
# same figures every run): per method and window length (s), (median, worst) |error| in % of the
# true energy on the default emulated node (h200-sxm). Recorded at the commit that wrote them;
# a change of any method's figure beyond the tolerance is a regression (or a deliberate change:
# then rerun the bench and record the new figures with the reason in the commit).
EXPECTED = {
    "1 Hz power poller": {
        "0.5": (13.8348, 32.3001),
        "5": (1.4752, 10.8148),
    },
    "Zeus ZeusMonitor": {
        "0.5": (2.3339, 7.6578),
        "5": (0.6727, 1.9378),
    },
    "counter, unaligned": {
        "0.5": (1.4637, 6.4932),
        "5": (0.5595, 1.2422),
    },
    "ours: counter, tick-aligned": {
        "0.5": (1.3712, 10.1947),
        "5": (0.3564, 0.9332),
    },
    "ours: timeline 10 Hz": {
        "0.5": (11.6082, 30.7664),
        "5": (1.143, 2.3498),
    },
}
# |got - expected| <= max(REL_TOL x expected, ABS_TOL_PCT): the figures are deterministic, the
# tolerance only absorbs floating-point order across numpy builds.
REL_TOL = 0.05
ABS_TOL_PCT = 0.02


@pytest.mark.timeout(420)
def test_energy_accuracy_headline_holds(tmp_path):
    """Every method's median and worst error at each quick window length, as recorded."""
    out = tmp_path / "accuracy.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "energy_accuracy.py"), "--quick", "--json", str(out)],
        cwd=ROOT,
        env=test_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert proc.stdout.strip().splitlines()[-1].startswith(BENCHES["energy_accuracy.py"])
    head = json.loads(out.read_text())["headline"]
    moved = []
    for method, by_length in EXPECTED.items():
        for length, (median, worst) in by_length.items():
            got = head[method][length]
            for name, want in (("median", median), ("worst", worst)):
                if abs(got[name] - want) > max(REL_TOL * want, ABS_TOL_PCT):
                    moved.append(f"{method} {length} s {name}: {got[name]} (recorded {want})")
    assert not moved, "\n".join(moved)
