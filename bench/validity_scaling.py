"""Cost of the merge step's trust hook (re-check, stages, verdict) against the merge itself.

Builds J jobs of 8 batch sizes x 5 repetitions x 2 phases, each window one row per GPU (G GPUs
per job, PP stages of G/PP GPUs), with a 10 Hz power timeline per GPU spanning every window, in
memory (no files: it times the computation, not the reads), then times in one process:

- summarize: ``aggregate.summarize(aggregate.windows(rows))`` (what the merge computes anyway);
- recheck:   ``recheck.recheck`` (timeline integral per GPU and window, idle rows);
- stages:    ``stages.stage_table``;
- annotate:  ``validity.annotate`` (verdict, stage and parity columns).

The figure is (recheck + stages + annotate) / summarize: how much the trust hook adds.

    python bench/validity_scaling.py               # 100 jobs x 4 GPUs = 32,000 GPU-windows
    python bench/validity_scaling.py --jobs 20     # smaller
    python bench/validity_scaling.py --quick       # 2 jobs: the test suite's run
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "unit"))

from energysweep import aggregate  # noqa: E402
from energysweep.job.sections import schema_defaults  # noqa: E402
from energysweep.tables import shards  # noqa: E402
from energysweep.validity import recheck, stages  # noqa: E402
from energysweep.validity import verdict as validity  # noqa: E402

# The verdict's thresholds of a sweep that sets none: the schema's defaults.
THRESHOLDS = validity.Thresholds.from_config(schema_defaults("validity"))

from tests_rows import row  # noqa: E402


def build(jobs: int, gpus: int, pp: int):
    rows, power, idle = [], [], []
    window_ns = 5 * 10**9
    for j in range(jobs):
        job = f"job{j}"
        t = 10**18 + j * 10**12
        idle.append({"job_id": job, "idle_start_ns": t, "idle_end_ns": t + window_ns})
        t0 = t
        t += window_ns + 10**9
        for bs in (1, 2, 4, 8, 16, 32, 64, 128):
            for rep in range(5):
                for phase in ("prefill", "generate"):
                    for g in range(gpus):
                        rows.append(
                            row(
                                job_id=job,
                                tp=gpus // pp,
                                pp=pp,
                                world_size=gpus,
                                batch_size=bs,
                                global_batch_size=bs,
                                repetition=rep,
                                phase=phase,
                                rank=g,
                                pid=g,
                                pp_rank=g // (gpus // pp),
                                gpu_uuid=f"GPU-{j}-{g}",
                                window_start_ns=t,
                                window_end_ns=t + window_ns,
                                iterations=32,
                                requests=32 * bs,
                                gpu_energy_mj=1.5e6,
                                idle_gpu_power_w=60.0,
                                idle_gpu_power_status="measured",
                            )
                        )
                    t += window_ns + 10**9
        times = np.arange(t0 - 10**9, t + 10**9, 10**8)
        for g in range(gpus):
            power.append(
                pd.DataFrame(
                    {
                        "job_id": job,
                        "gpu_uuid": f"GPU-{j}-{g}",
                        "time_ns": times,
                        "power_mw": 300_000,
                        "energy_counter_mj": (times - times[0]) // 10**6 * 300,
                        "clock_event_reasons": 4,
                    }
                )
            )
    return (
        shards.to_table(rows).to_pandas(),
        pd.concat(power, ignore_index=True),
        pd.DataFrame(idle),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="2 jobs: the test suite's run")
    args = parser.parse_args()
    if args.quick:
        args.jobs = 2
    rows, power, idle = build(args.jobs, args.gpus, args.pp)
    n_gpu_windows = len(rows)
    t = {}
    t0 = time.process_time()
    summary = aggregate.summarize(aggregate.windows(rows))
    t["summarize"] = time.process_time() - t0
    t0 = time.process_time()
    table = recheck.recheck(rows, power, idle, 0.0)
    t["recheck"] = time.process_time() - t0
    t0 = time.process_time()
    stages.stage_table(rows)
    t["stages"] = time.process_time() - t0
    t0 = time.process_time()
    out = validity.annotate(summary, rows, table, THRESHOLDS)
    t["annotate"] = time.process_time() - t0
    hook = t["recheck"] + t["stages"] + t["annotate"]
    print(
        f"{args.jobs} jobs, {n_gpu_windows} GPU-windows, {len(power)} power samples, "
        f"{len(out)} points"
    )
    for k, v in t.items():
        print(f"  {k:<10} {v:7.2f} s")
    print(
        f"trust hook / summarize = {hook / t['summarize']:.2f}x "
        f"({hook / n_gpu_windows * 1e6:.0f} us per GPU-window)"
    )
    ratio = table.loc[table["scope"] == "window", "timeline_counter_ratio"]
    print(f"check: window timeline/counter ratio median {ratio.median():.3f} (expect 1.000)")


if __name__ == "__main__":
    main()
