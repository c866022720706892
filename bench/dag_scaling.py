"""`snakemake -n` on a generated N-layout grid vs a bare Snakefile with N trivial jobs (the floor).

Ours: the real workflow, a config of N/100 models declared by `dims:` (no checkpoint needed) x
tp {1,2,4,8} x pp {1,2,4,8,16} x dp {1,2,4,8,16}, so expand_grid yields exactly N measure jobs,
each with one shard per (batch size, repetition) plus job.json, generations.parquet and
power.parquet (the count is read from the workflow's own dry run).
Floor: one rule with N jobs and as many outputs per job (empty files), every output requested
by `rule all`: the least Snakemake does for that many jobs and files.

Both run `snakemake -n` (output to a file) side by side at each size; the figure is
ours / floor, in CPU seconds of the snakemake process (robust to other load on the machine) and
in wall seconds. Growth is the 10k / 1k time of each.

    python bench/dag_scaling.py                 # sizes 1000,3000,10000 (about 2-3 min on 2 cores)
    python bench/dag_scaling.py --sizes 1000    # one size
    python bench/dag_scaling.py --quick         # sizes 100,200: the test suite's run (seconds)
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

import yaml
from _common import ROOT, VENV_BIN, check, machine, timed, workflow_copy

GOAL = 1.3
TP, PP, DP = [1, 2, 4, 8], [1, 2, 4, 8, 16], [1, 2, 4, 8, 16]
LAYOUTS_PER_MODEL = len(TP) * len(PP) * len(DP)  # every one runnable with DIMS below
DIMS = {
    "num_attention_heads": 64,
    "num_key_value_heads": 16,
    "num_hidden_layers": 64,
    "intermediate_size": 8192,
    "hidden_size": 4096,
}

FLOOR = """# The floor: N trivial jobs, each with as many outputs as one measure job.
# Written the cheapest way Snakemake allows (plain lists, a `run:` block instead of a shell
# command to format), so it is a floor for the tool, not a straw man.
N = int(config["n"])
FILES = [f"out{{k}}.parquet" for k in range({outputs})]


rule all:
    input:
        [f"results/jobs/{{i:05d}}/{{f}}" for i in range(N) for f in FILES],


rule job:
    output:
        [f"results/jobs/{{{{i}}}}/{{f}}" for f in FILES],
    run:
        for path in output:
            open(path, "w").close()
"""


def grid_config(n_jobs: int, base: dict) -> dict:
    if n_jobs % LAYOUTS_PER_MODEL:
        raise SystemExit(f"sizes must be multiples of {LAYOUTS_PER_MODEL}")
    models = [
        {"name": f"m{i:04d}", "path": f"checkpoints/m{i:04d}", "dims": DIMS}
        for i in range(n_jobs // LAYOUTS_PER_MODEL)
    ]
    return {
        **base,
        "models": models,
        # One backend and one scenario: N measure jobs = N layouts, whatever backends the
        # shipped config sweeps (with vLLM beside PyTorch it would be more than N).
        "backends": ["pytorch"],
        "scenarios": ["inference"],
        "parallel": {"tp": TP, "pp": PP, "dp": DP, "max_gpus_per_job": 4096, "gpus_per_node": 8},
    }


def job_count(output: str, rule: str) -> int:
    m = re.search(rf"^{rule}\s+(\d+)\s*$", output, re.M)
    return int(m.group(1)) if m else -1


def measure_outputs(dry_run_output: str) -> int:
    """Outputs of one measure job, read from the dry run's listing of the first one."""
    m = re.search(r"^rule measure:\n\s+output: (.*)$", dry_run_output, re.M)
    if not m:
        raise SystemExit("no measure job in the dry run")
    return len(m.group(1).split(", "))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,3000,10000")
    ap.add_argument("--quick", action="store_true", help="sizes 100,200 (a check that it runs)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per side and size, in ABBA order; the least CPU time is kept",
    )
    ap.add_argument(
        "--workflow",
        type=Path,
        default=ROOT,
        help="workflow to measure (default: this checkout), e.g. an older revision's tree",
    )
    args = ap.parse_args()
    sizes = [int(s) for s in ("100,200" if args.quick else args.sizes).split(",")]
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    snakemake = str(VENV_BIN / "snakemake")
    dry = [snakemake, "-n", "--cores", "1"]
    print(f"machine: {machine()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-dag-") as tmp:
        tmp = Path(tmp)
        wf = workflow_copy(tmp / "wf", args.workflow)
        floor = tmp / "floor"
        floor.mkdir()
        for n in [LAYOUTS_PER_MODEL, *sizes]:
            (wf / "config" / f"bench{n}.yaml").write_text(yaml.safe_dump(grid_config(n, base)))
            (floor / f"n{n}.yaml").write_text(yaml.safe_dump({"n": n}))
        # Untimed warm-up at 100 jobs (bytecode, caches, .snakemake/), which also tells how
        # many files one measure job outputs, so the floor's jobs get as many.
        first = check(
            timed(
                [*dry, f"--configfile=config/bench{LAYOUTS_PER_MODEL}.yaml"],
                wf,
                out_file=tmp / "ours.txt",
            ),
            "warm-up",
        )
        per_job = measure_outputs(first.output)
        (floor / "Snakefile").write_text(FLOOR.format(outputs=per_job))
        check(
            timed(
                [*dry, f"--configfile=n{LAYOUTS_PER_MODEL}.yaml"], floor, out_file=tmp / "floor.txt"
            ),
            "floor warm-up",
        )
        print(f"outputs per measure job: {per_job}")
        for n in sizes:
            sides = {
                "ours": (wf, f"--configfile=config/bench{n}.yaml"),
                "floor": (floor, f"--configfile=n{n}.yaml"),
            }
            runs: dict[str, list] = {"ours": [], "floor": []}
            for r in range(args.repeats):
                # ABBA: alternate which side goes first, so drifting load hits both alike.
                order = ["ours", "floor"] if r % 2 == 0 else ["floor", "ours"]
                for side in order:
                    cwd, cfg = sides[side]
                    t = timed([*dry, cfg], cwd, out_file=tmp / f"{side}.txt")
                    runs[side].append(check(t, f"{side} n={n}"))
            o = min(runs["ours"], key=lambda t: t.cpu_s)
            f = min(runs["floor"], key=lambda t: t.cpu_s)
            got = (job_count(o.output, "measure"), job_count(f.output, "job"))
            if got != (n, n):
                raise SystemExit(f"expected {n} jobs on each side, got measure/job = {got}")
            rows.append((n, o, f))
            print(
                f"n={n:6d}  ours {o.cpu_s:6.1f} cpu-s {o.wall_s:6.1f} wall-s   "
                f"floor {f.cpu_s:6.1f} cpu-s {f.wall_s:6.1f} wall-s   "
                f"ratio cpu {o.cpu_s / f.cpu_s:.2f} wall {o.wall_s / f.wall_s:.2f}",
                flush=True,
            )
    n0, o0, f0 = rows[0]
    n1, o1, f1 = rows[-1]
    growth = ""
    if n1 > n0:
        g_o, g_f = o1.cpu_s / o0.cpu_s, f1.cpu_s / f0.cpu_s
        verdict = "no worse than the floor" if g_o <= g_f * 1.05 else "WORSE than the floor"
        growth = f" growth {n0}->{n1}: ours x{g_o:.2f}, floor x{g_f:.2f} (cpu), {verdict};"
    ratio = o1.cpu_s / f1.cpu_s
    print(
        f"dag_scaling n={n1}: ratio ours/floor = {ratio:.2f} cpu ({o1.wall_s / f1.wall_s:.2f} "
        f"wall);{growth} goal <= {GOAL}: {'met' if ratio <= GOAL else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
