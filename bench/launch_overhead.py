"""Per-job overhead: one measure job (1 and 2 ranks, tiny model) minus its windows vs bare torchrun.

Ours: the real workflow runs one measure job per layout (`snakemake --cores 2 --forcerun measure
<job.json>`), with a `benchmark:` directive added to the measure rule of the bench's copy so
Snakemake itself records the job's wall time (its script wrapper, energysweep.launch, torchrun, the
ranks' imports, dist init, model load, shard and job.json writes, teardown). The measurement
protocol is set to its minimum (no warm-up, idle baseline, cooldown or prefill pass; one batch
size, one repetition, min_window_s 0), so what is left besides the window is overhead. Its
window time comes from job.json (timing.window_s) and is subtracted.

Floor (the goal's): `python -m torch.distributed.run --standalone --nproc-per-node N noop.py`
with the same ranks (N=1 too, although our 1-rank jobs skip torchrun).
Work floor (context): what any job must do on top, started the way our job is (plain python for
1 rank, torchrun for 2): import torch, start gloo, import transformers and load the tiny model
and tokenizer. Overhead over it is what the pipeline itself adds.

    python bench/launch_overhead.py             # about 2.5 min on 2 cores (--repeats 2: 4.5)
    python bench/launch_overhead.py --quick     # the 1-rank job only, its first (cold) run: the
                                                # test suite's run
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
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

GOAL_S = 1.5
MINIMAL_RANK = """import os, sys
import torch
import torch.distributed as dist
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    dist.init_process_group("gloo")
from transformers import AutoModelForCausalLM, AutoTokenizer
AutoTokenizer.from_pretrained(sys.argv[1])
AutoModelForCausalLM.from_pretrained(sys.argv[1])
if dist.is_initialized():
    dist.barrier()
    dist.destroy_process_group()
"""
LAYOUT_DP = [1, 2]  # 1 rank and 2 ranks (data parallel; the tiny model has 4 heads, 4 layers)
CONFIG = {
    "models": [{"name": "tiny-llama", "path": "builtin:tiny"}],
    "backends": ["pytorch"],
    "parallel": {"tp": [1], "pp": [1], "dp": LAYOUT_DP, "max_gpus_per_job": 2},
    "workload": {"batch_sizes": [1], "repetitions": 1, "iterations": 1, "warmup_iterations": 0},
    "measurement": {
        "min_window_s": 0,
        "idle_baseline_s": 0,
        "cooldown_s": 0,
        "prefill_pass": False,
    },
}


def job_dir(dp: int) -> str:
    return f"results/shards/model~tiny-llama/backend~pytorch/scenario~inference/tp~1/pp~1/dp~{dp}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1, help="runs per side and layout (min kept)")
    ap.add_argument(
        "--quick", action="store_true", help="the 1-rank layout only, measured on its first run"
    )
    args = ap.parse_args()
    layouts = LAYOUT_DP[:1] if args.quick else LAYOUT_DP
    config = {**CONFIG, "parallel": {**CONFIG["parallel"], "dp": layouts}}
    snakemake = [
        str(VENV_BIN / "snakemake"),
        "--profile",
        "profiles/local",
        "--cores",
        "2",
        "--configfile=config/bench.yaml",
    ]
    print(f"machine: {machine()}")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
        tmp = Path(tmp)
        wf = workflow_copy(tmp / "wf")
        add_benchmark_directive(wf)
        (wf / "config" / "bench.yaml").write_text(yaml.safe_dump(config))
        noop = tmp / "noop.py"
        noop.write_text("")
        minimal = tmp / "minimal_rank.py"
        minimal.write_text(MINIMAL_RANK)
        model_dir = str(wf / "resources" / "models" / "tiny-llama")
        # Untimed: build the tiny model, and run each job once so every cache is warm.
        targets = [f"{job_dir(dp)}/job.json" for dp in layouts]
        check(timed([*snakemake, *targets], wf), "first run")
        for dp in layouts:
            ranks = dp
            ours, floor, work = [], [], []
            for _ in range(args.repeats):
                target = f"{job_dir(dp)}/job.json"
                if not args.quick:  # quick: the first run's (cold) job is the one measured
                    check(timed([*snakemake, "--forcerun", "measure", target], wf), f"dp={dp}")
                with open(wf / benchmark_path(job_dir(dp))) as f:
                    job_s = float(next(csv.DictReader(f, delimiter="\t"))["s"])
                timing = json.loads((wf / target).read_text())["timing"]
                ours.append((job_s - timing["window_s"], job_s, timing))
                torchrun = [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc-per-node",
                    str(ranks),
                ]
                floor.append(check(timed([*torchrun, str(noop)], tmp), "torchrun noop").wall_s)
                # The work floor starts the way our job does: no torchrun for one rank.
                start = torchrun if ranks > 1 else [sys.executable]
                t = timed([*start, str(minimal), model_dir], tmp)
                work.append(check(t, "minimal rank").wall_s)
            over, job_s, timing = min(ours, key=lambda r: r[0])
            results.append((ranks, over, job_s, timing, min(floor), min(work)))
    for ranks, over, job_s, timing, floor_s, work_s in results:
        print(
            f"{ranks} rank(s): job {job_s:.2f} s (rank 0 {timing['rank0_wall_s']:.2f} s, model "
            f"load {timing['model_load_s']:.2f} s, windows {timing['window_s']:.2f} s) -> "
            f"overhead {over:.2f} s; torchrun no-op {floor_s:.2f} s ({over - floor_s:+.2f} s); "
            f"work floor (imports + gloo + model load) {work_s:.2f} s ({over - work_s:+.2f} s)"
        )
    worst = max(over - floor_s for _, over, _, _, floor_s, _ in results)
    print(
        "launch_overhead: "
        + ", ".join(
            f"{r}-rank job overhead {o:.2f} s vs torchrun no-op {f:.2f} s ({o - f:+.2f} s; "
            f"{o - w:+.2f} s over the work floor)"
            for r, o, _, _, f, w in results
        )
        + f"; goal <= +{GOAL_S} s per job over torchrun no-op: "
        f"{'met' if worst <= GOAL_S else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
