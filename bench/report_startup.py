"""The HTML report in the sweep's own Snakemake run vs in a second start-up (the old `make run`).

Two ways to redraw the figures and rebuild ``results/report.html`` on a finished sweep:
- two start-ups (before): ``snakemake`` (the run), then ``snakemake --report results/report.html``;
- one start-up (now, `make run`): ``snakemake --report results/report.html --report-after-run``.
Both force the ``figures`` and ``report_pages`` jobs, so they do the same work; the difference is
the second workflow parse and DAG build. Measured in ABAB... order (``--rounds`` each), in a
workflow copy with a one-job sweep; the figure is the mean CPU and wall seconds saved.

    python bench/report_startup.py              # ~2 min on 2 cores (one job, then 3 rounds)
    python bench/report_startup.py --rounds 5
    python bench/report_startup.py --quick      # one round, one window: the test suite's run
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import yaml
from _common import VENV_BIN, check, machine, timed, workflow_copy

SWEEP = {  # one small job: what is timed is the start-up, not the sweep
    "backends": ["pytorch"],
    "scenarios": ["inference"],
    "parallel": {"tp": [1], "pp": [1], "dp": [1], "max_gpus_per_job": 2},
    "workload": {"batch_sizes": [1, 4], "repetitions": 2, "iterations": 1},
}
FORCE = ["--forcerun", "figures", "report_pages"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one round of a one-window sweep")
    args = ap.parse_args()
    sweep = SWEEP
    if args.quick:
        args.rounds = 1
        sweep = {**SWEEP, "workload": {"batch_sizes": [1], "repetitions": 1, "iterations": 1}}
    snakemake = [
        str(VENV_BIN / "snakemake"),
        "--profile",
        "profiles/local",
        "--configfile",
        "config/bench.yaml",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        wf = workflow_copy(Path(tmp) / "wf")
        (wf / "config" / "bench.yaml").write_text(yaml.safe_dump(sweep))
        check(
            timed(
                [*snakemake, "--report", "results/report.html", "--report-after-run"],
                wf,
                timeout_s=1200,
            ),
            "the sweep",
        )
        two, one = [], []
        for _ in range(args.rounds):
            a = check(timed([*snakemake, *FORCE], wf), "run")
            b = check(timed([*snakemake, "--report", "results/report.html"], wf), "report")
            two.append((a.wall_s + b.wall_s, a.cpu_s + b.cpu_s))
            c = check(
                timed(
                    [*snakemake, *FORCE, "--report", "results/report.html", "--report-after-run"],
                    wf,
                ),
                "run + report",
            )
            one.append((c.wall_s, c.cpu_s))
    print(machine())
    for name, xs in (("two start-ups", two), ("one start-up ", one)):
        print(
            f"{name}: wall {statistics.mean(x[0] for x in xs):6.1f} s, "
            f"CPU {statistics.mean(x[1] for x in xs):6.1f} s  ({len(xs)} rounds)"
        )
    saved_wall = statistics.mean(x[0] for x in two) - statistics.mean(x[0] for x in one)
    saved_cpu = statistics.mean(x[1] for x in two) - statistics.mean(x[1] for x in one)
    print(f"one start-up saves {saved_wall:.1f} s wall, {saved_cpu:.1f} s CPU per make run")


if __name__ == "__main__":
    main()
