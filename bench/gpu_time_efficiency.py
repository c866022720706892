"""Per job of the default grid: the fraction of its wall time spent inside measurement windows.

Runs the default sweep (config/config.yaml as shipped, local profile) in a copy of the workflow,
with a `benchmark:` directive added to the measure rule of the copy so Snakemake records each
job's wall time. For every job it reports the windows' total (job.json timing.window_s, written
by rank 0), the rank's own wall time (timing.rank0_wall_s, from its start to job.json) and the
job's wall time as Snakemake saw it (script wrapper, launcher, rank start-up and teardown
included), and the two fractions window_s / rank0_wall_s (job.json's timing.window_fraction) and
window_s / job wall.

    python bench/gpu_time_efficiency.py         # the default sweep: about 1-2 min on 2 cores
    python bench/gpu_time_efficiency.py --quick # one PyTorch job, one window: the test suite's run
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
from pathlib import Path

import yaml
from _common import (
    VENV_BIN,
    add_benchmark_directive,
    benchmark_path,
    check,
    machine,
    timed,
    workflow_copy,
)

QUICK = {  # one job, one window: the same path as the default sweep, in seconds
    "backends": ["pytorch"],
    "scenarios": ["inference"],
    "parallel": {"tp": [1], "pp": [1], "dp": [1]},
    "workload": {"batch_sizes": [1], "repetitions": 1, "iterations": 1},
    "measurement": {"min_window_s": 0, "idle_baseline_s": 0, "cooldown_s": 0},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one PyTorch job instead of the sweep")
    args = ap.parse_args()
    print(f"machine: {machine()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-efficiency-") as tmp:
        wf = workflow_copy(Path(tmp) / "wf")
        add_benchmark_directive(wf)
        argv = [str(VENV_BIN / "snakemake"), "--profile", "profiles/local"]
        if args.quick:
            (wf / "config" / "quick.yaml").write_text(yaml.safe_dump(QUICK))
            argv += ["--configfile", "config/quick.yaml"]
        run = check(timed(argv, wf, timeout_s=1800), "default sweep")
        for record in sorted((wf / "results" / "shards").rglob("job.json")):
            job_dir = record.parent.relative_to(wf).as_posix()
            timing = json.loads(record.read_text())["timing"]
            with open(wf / benchmark_path(job_dir)) as f:
                job_s = float(next(csv.DictReader(f, delimiter="\t"))["s"])
            rows.append((job_dir.split("shards/", 1)[1], timing, job_s))
    print(f"default sweep: {len(rows)} measure jobs, whole run {run.wall_s:.1f} s wall")
    for name, t, job_s in rows:
        load = t["model_load_s"]
        load = "per grid point" if load is None else f"{load:.2f} s"  # training: no job-level load
        print(
            f"{name}: windows {t['window_s']:.2f} s, rank 0 {t['rank0_wall_s']:.2f} s "
            f"(model load {load}), job {job_s:.2f} s -> "
            f"window_fraction {t['window_fraction']:.2f} of rank 0, "
            f"{t['window_s'] / job_s:.2f} of the job"
        )
    win = sum(t["window_s"] for _, t, _ in rows)
    rank = sum(t["rank0_wall_s"] for _, t, _ in rows)
    job = sum(s for _, _, s in rows)
    print(
        f"gpu_time_efficiency ({'quick' if args.quick else 'default'} grid, {len(rows)} jobs): "
        f"windows / job wall = "
        f"{win / job:.2f} (windows / rank-0 wall = {win / rank:.2f}); "
        f"per job " + ", ".join(f"{t['window_s'] / s:.2f}" for _, t, s in rows)
    )


if __name__ == "__main__":
    main()
