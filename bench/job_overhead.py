"""Where the default sweep's time goes: each job's phases, the sweep's wall against its windows.

Runs the default sweep (config/config.yaml as shipped, local profile, the report built in the
same run, as `make run` does) in a temporary copy of the workflow, and prints per job its rank-0
wall time split into phases (job.json ``timing.phases_s``), its window seconds and window
fraction, and Snakemake's wall time for the job (launcher and script included). The figure is
the sweep's wall / its windows' seconds (windows of every job, summed).

After the sweeps (the machine idle again) it times each backend's import floor: a fresh
interpreter of the ranks' environment importing what a rank of that backend needs before it can
compute (torch and transformers' Llama for PyTorch, ``vllm.LLM`` for vLLM), three times. No job
can spend less than that outside its windows, so windows / (windows + floor) bounds its window
fraction; the table prints the bound beside the fraction reached.

With ``--baseline REF`` the same sweep also runs from the code at git ref REF (exported with
`git archive`), in the same invocation, before this checkout's: both arms side by side, so their
ratios are taken under the same machine load. A ref whose job.json has no phases shows only
what it recorded.

    python bench/job_overhead.py                        # this checkout (about 4-8 min on 2 cores)
    python bench/job_overhead.py --baseline main        # main, then this checkout
    python bench/job_overhead.py --quick                # one PyTorch job; baseline HEAD (the tests)
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml
from _common import (
    ROOT,
    VENV_BIN,
    add_benchmark_directive,
    benchmark_path,
    check,
    env,
    machine,
    timed,
    workflow_copy,
)

QUICK = {  # one job, two short windows: the same path as the default sweep
    "backends": ["pytorch"],
    "scenarios": ["inference"],
    "parallel": {"tp": [1], "pp": [1], "dp": [1]},
    "workload": {"batch_sizes": [1], "repetitions": 1, "iterations": 1},
    "measurement": {"min_window_s": 0.2, "idle_baseline_s": 0.2, "cooldown_s": 0.1},
}
SHORT = {  # column titles of the phase table (energysweep.tables.phases.JobPhase values)
    "start": "start",
    "load": "load",
    "server_start": "server",
    "warmup": "warm",
    "idle_baseline": "idle",
    "cooldown": "cool",
    "edges": "edges",
    "window": "window",
    "ramp": "ramp",
    "drain": "drain",
    "write": "write",
    "teardown": "tear",
    "other": "other",
}


# What a rank of each backend imports before it can compute (backends/pytorch.py, torchpp; vLLM
# imports torch and transformers itself), run in a fresh interpreter of the ranks' environment.
FLOOR_IMPORTS = {
    "pytorch": (
        VENV_BIN / "python",
        "import torch, torch.distributed; from transformers import AutoTokenizer, LlamaForCausalLM",
    ),
    "vllm": (ROOT / ".venv-vllm" / "bin" / "python", "from vllm import LLM"),
}


# Printed by the floor's interpreter once its imports are done: its age, by the function that
# starts a rank's phase clock (interpreter start and imports, not its exit; ``env()`` puts the
# package on its path).
AGE = "from energysweep.measure.phase_clock import process_age_s; print(process_age_s())"


def import_floor(backends: set[str], repeats: int) -> dict[str, float]:
    """Per backend of ``backends``: the median seconds a fresh interpreter of its ranks'
    environment takes from its creation to the end of what its ranks import
    (:data:`FLOOR_IMPORTS`); a backend whose environment is missing is left out."""
    floor = {}
    for name, (python, code) in FLOOR_IMPORTS.items():
        if name not in backends or not python.exists():
            continue
        runs = []
        for _ in range(repeats):
            out = subprocess.run(
                [str(python), "-c", f"{code}\n{AGE}"],
                cwd=ROOT,
                env=env(),
                capture_output=True,
                text=True,
                timeout=300,
            )
            if out.returncode != 0:
                raise SystemExit(f"{name} import floor failed:\n{out.stderr[-2000:]}")
            runs.append(float(out.stdout.split()[-1]))
        floor[name] = sorted(runs)[len(runs) // 2]
    return floor


def floor_table(arm: dict, floor: dict[str, float]) -> None:
    """Per job of ``arm``: its windows, the import floor of its backend, the fraction bound
    windows / (windows + floor), and the fraction it reached (serving jobs: the client's
    floor is not the server's, so they are left out)."""
    print("\nimport floor (s): " + ", ".join(f"{b} {s:.2f}" for b, s in floor.items()))
    print(f"{'job':<34}{'windows':>8}{'floor':>7}{'bound':>7}{'frac':>6}")
    for label, t in arm["jobs"].items():
        backend, scenario = label.split()[:2]
        if backend not in floor or scenario == "serving":
            continue
        w = t["window_s"]
        bound = w / (w + floor[backend])
        print(
            f"{label:<34}{w:>8.1f}{floor[backend]:>7.2f}{bound:>7.2f}{t['window_fraction']:>6.2f}"
        )


def export(ref: str, dst: Path) -> Path:
    """The workflow at git ref ``ref`` (committed files only), unpacked into ``dst``."""
    dst.mkdir(parents=True)
    out = subprocess.run(
        ["git", "archive", "--format=tar", ref], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        tar.extractall(dst, filter="data")
    return dst


def run_arm(name: str, root: Path, tmp: Path, quick: bool, folder: str) -> dict:
    """One sweep from the workflow at ``root`` in ``tmp/folder``: its wall time and every job's
    record. (A plain folder name: a path with spaces breaks compilers that tools start.)"""
    wf = workflow_copy(tmp / folder, root=root)
    add_benchmark_directive(wf)
    argv = [str(VENV_BIN / "snakemake"), "--profile", "profiles/local"]
    argv += ["--report", "results/report.html", "--report-after-run"]
    if quick:
        (wf / "config" / "quick.yaml").write_text(yaml.safe_dump(QUICK))
        argv += ["--configfile", "config/quick.yaml"]
    # The arm's own package (scripts and ranks), never the checkout's.
    extra = {"SLURM_CONF": "/dev/null", "PYTHONPATH": str(wf / "src")}
    run = check(timed(argv, wf, timeout_s=3600, extra_env=extra), f"{name} sweep")
    jobs = {}
    for record in sorted((wf / "results" / "shards").rglob("job.json")):
        job_dir = record.parent.relative_to(wf).as_posix()
        rec = json.loads(record.read_text())
        with open(wf / benchmark_path(job_dir)) as f:
            job_s = float(next(csv.DictReader(f, delimiter="\t"))["s"])
        k = rec["job"]
        label = f"{k['backend']} {k['scenario']} tp{k['tp']} pp{k['pp']} dp{k['dp']}"
        jobs[label] = {**rec["timing"], "job_s": job_s}
    windows = sum(t["window_s"] for t in jobs.values())
    print(f"{name}: {len(jobs)} jobs, sweep {run.wall_s:.1f} s wall ({run.cpu_s:.0f} s CPU)")
    return {"name": name, "wall_s": run.wall_s, "windows_s": windows, "jobs": jobs}


def phase_table(arm: dict) -> None:
    """Per job: seconds per phase, their sum against the rank-0 wall, the window fraction."""
    jobs = {k: t for k, t in arm["jobs"].items() if t.get("phases_s")}
    if not jobs:
        print(f"\n{arm['name']}: no job recorded its phases (job.json timing.phases_s)")
        return
    phases = list(next(iter(jobs.values()))["phases_s"])
    print(f"\n{arm['name']}: rank-0 seconds per phase")
    head = f"{'job':<34}" + "".join(f"{SHORT.get(p, p):>7}" for p in phases)
    print(head + f"{'sum':>7}{'rank0':>7}{'frac':>6}")
    for label, t in jobs.items():
        cells = "".join(f"{t['phases_s'][p]:>7.1f}" for p in phases)
        total = sum(t["phases_s"].values())
        print(
            f"{label:<34}{cells}{total:>7.1f}{t['rank0_wall_s']:>7.1f}{t['window_fraction']:>6.2f}"
        )
    sums = {p: sum(t["phases_s"][p] for t in jobs.values()) for p in phases}
    print(f"{'all jobs':<34}" + "".join(f"{sums[p]:>7.1f}" for p in phases))


def side_by_side(arms: list[dict]) -> None:
    """Per job of each arm: rank-0 wall, Snakemake's job wall, windows, window fraction."""
    labels = sorted({k for a in arms for k in a["jobs"]})
    print("\nper job: rank-0 wall s / Snakemake job wall s / windows s / window fraction")
    print(f"{'job':<34}" + "".join(f"{a['name']:>30}" for a in arms))
    for label in labels:
        cells = []
        for a in arms:
            t = a["jobs"].get(label)
            cells.append(
                f"{t['rank0_wall_s']:>7.1f} {t['job_s']:>7.1f} {t['window_s']:>6.1f} "
                f"{t['window_fraction']:>6.2f}"
                if t
                else f"{'-':>30}"
            )
        print(f"{label:<34}" + "".join(f"{c:>30}" for c in cells))
    for a in arms:
        print(
            f"{a['name']}: sweep {a['wall_s']:.1f} s wall / {a['windows_s']:.1f} s of windows = "
            f"{a['wall_s'] / a['windows_s']:.2f}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one PyTorch job (baseline: HEAD)")
    ap.add_argument("--baseline", help="git ref to run first, side by side (default: none)")
    ap.add_argument("--keep", type=Path, help="keep the arms' workflow copies in this folder")
    args = ap.parse_args()
    baseline = args.baseline or ("HEAD" if args.quick else None)
    print(f"machine: {machine()}")
    arms = []
    with tempfile.TemporaryDirectory(prefix="bench-job-overhead-") as tmp:
        tmp = args.keep or Path(tmp)
        if baseline:
            src = export(baseline, tmp / "baseline-src")
            arms.append(run_arm(f"before ({baseline})", src, tmp, args.quick, "before"))
        arms.append(run_arm("after (this checkout)", ROOT, tmp, args.quick, "after"))
    # The quick mode (the tests) times its one backend once: the same code path.
    floor = import_floor(
        {label.split()[0] for label in arms[-1]["jobs"]}, repeats=1 if args.quick else 3
    )
    for arm in arms:
        phase_table(arm)
    side_by_side(arms)
    floor_table(arms[-1], floor)
    print(
        "job_overhead: sweep wall / windows = "
        + ", ".join(f"{a['wall_s'] / a['windows_s']:.2f} {a['name']}" for a in arms)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
