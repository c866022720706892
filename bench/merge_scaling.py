"""Aggregating N realistic shards (real schema) vs naive per-file `pandas.read_parquet` + concat.

The shards are written the way measure jobs write them (results/shards/<Paramspace path>/bs~B/
rep~R.parquet, one window each, one row per rank and GPU; the job table shards.parquet holding the
same rows in one file per job; each job's job.json), for 5 models x 2 backends x 25 layouts
(1 to 64 ranks) x 8 batch sizes x 5 repetitions = 10,000 shards of 250 jobs.

- naive: ``pd.concat([pd.read_parquet(p) for p in shards]).to_parquet(out)`` over the 10,000
  shards (the peer baseline: it writes the merged rows and computes no summary);
- ours:  ``energysweep.results.aggregate`` as the merge_shards rule calls it (over
  ``job_table_paths``: one file per job): the merged dataset, summary.csv and the environment
  table, each step timed. What the job tables cost the jobs (one more write of rows rank 0
  already holds) is timed while generating and printed;
- per-shard: the same ``aggregate`` over the 10,000 per-window shards (the merge before job
  tables), to show where the time went;
- floor: the fastest way found to get the shards into one Arrow table and nothing else
  (``pq.ParquetFile(p).read(use_threads=False)``, as ``shards.read_shard`` reads, on a thread
  pool; ``pq.read_table``, pyarrow.dataset or DuckDB over the file list are slower here),
  and the bare parse of every file's footer (``pq.read_metadata``), which every Parquet reader
  does first;

Each side runs in a fresh process (imports excluded from the time) that reports its own peak
RSS. The figure is naive / ours (how many times faster we are).

    python bench/merge_scaling.py                 # 10,000 shards (about 2.5 min on 2 cores,
                                                  # most of it the naive side)
    python bench/merge_scaling.py --shards 2000   # about 30 s
    python bench/merge_scaling.py --quick         # 120 shards: the test suite's run
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, machine

sys.path.insert(0, str(ROOT / "src"))

GOAL_SPEEDUP = 10.0
GOAL_S = 3.0
MODELS = [f"model{i}" for i in range(5)]
BACKENDS = ["pytorch", "vllm"]
LAYOUTS = [(t, p, d) for t in (1, 2, 4, 8) for p in (1, 2) for d in (1, 2, 4)] + [(16, 1, 1)]
BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128]
REPS = 5


def _template_row() -> dict:
    """A complete row of the current schema: the test helper's, every other column null."""
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    from energysweep.tables import shards

    from tests_rows import row

    base = row()
    return {name: base.get(name) for name in shards.SCHEMA.names}


def generate(root: Path, n_shards: int) -> tuple[list[Path], list[Path], float]:
    """Write ``n_shards`` shards, their jobs' tables and job.json under ``root``. Returns the
    shards, the job.json files, and the seconds spent writing the job tables."""
    import pyarrow.parquet as pq

    from energysweep.job.spec import JobDir
    from energysweep.tables import io as tables_io
    from energysweep.tables import shards

    template = _template_row()
    shard_paths, job_paths = [], []
    job_table_s = 0.0
    windows_per_job = len(BATCH_SIZES) * REPS
    jobs = [(m, b, lay) for m in MODELS for b in BACKENDS for lay in LAYOUTS]
    for j, (model, backend, (tp, pp, dp)) in enumerate(jobs):
        if len(shard_paths) >= n_shards:
            break
        world = tp * pp * dp
        job_dir = (
            root / f"results/shards/model~{model}/backend~{backend}/scenario~inference/"
            f"tp~{tp}/pp~{pp}/dp~{dp}"
        )
        rows = []
        names = []
        for bs in BATCH_SIZES:
            for rep in range(REPS):
                start = (
                    1_700_000_000_000_000_000 + (j * windows_per_job + len(names)) * 3_000_000_000
                )
                names.append((bs, rep))
                for rank in range(world):
                    rows.append(
                        {
                            **template,
                            "job_id": f"job{j:05d}",
                            "model": model,
                            "backend": backend,
                            "tp": tp,
                            "pp": pp,
                            "dp": dp,
                            "world_size": world,
                            "batch_size": bs,
                            "global_batch_size": bs * dp,
                            "repetition": rep,
                            "window_start_ns": start,
                            "window_end_ns": start + 2_000_000_000,
                            "requests": bs * dp * 2,
                            "output_tokens": bs * dp * 2 * 16,
                            "rank": rank,
                            "local_rank": rank % 8,
                            "pid": 1000 + rank,
                            "host": f"node{rank // 8}",
                            "device": f"cuda:{rank % 8}",
                            "dp_rank": rank // (tp * pp),
                            "pp_rank": (rank // tp) % pp,
                            "tp_rank": rank % tp,
                            "is_writer": rank % (tp * pp) == 0,
                            "gpu_uuid": f"GPU-{j:05d}-{rank:03d}",
                            "gpu_index": rank % 8,
                            "gpu_energy_mj": 100_000.0 + rank + bs,
                        }
                    )
        table = shards.to_table(rows)
        kept = min(len(names), n_shards - len(shard_paths))  # the windows kept below
        job_dir.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        tables_io.write_atomic(table.slice(0, kept * world), JobDir(str(job_dir)).job_table)
        job_table_s += time.perf_counter() - t
        for i, (bs, rep) in enumerate(names):
            if len(shard_paths) >= n_shards:
                break
            path = job_dir / f"bs~{bs}" / f"rep~{rep}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table.slice(i * world, world), path)
            shard_paths.append(path)
        job_dir.mkdir(parents=True, exist_ok=True)
        record = {
            "job_id": f"job{j:05d}",
            "config_hash": "h",
            "code_version": "bench",
            "job_table_rows": kept * world,  # what the merge checks the job table against
            "environment": {
                "hosts": [{"host": "node0", "cpu_model": "x"}],
                "gpus": [{"host": "node0", "uuid": f"GPU-{j:05d}-000"}],
            },
        }
        (job_dir / "job.json").write_text(json.dumps(record))
        job_paths.append(job_dir / "job.json")
    return shard_paths, job_paths, job_table_s


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _floor(paths: list[str], steps: dict[str, float]) -> int:
    """The fastest read found, and the footers alone; timed into ``steps``; returns rows."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import pyarrow.parquet as pq

    workers = min(8, 2 * (os.cpu_count() or 1))

    def read_batch(batch):
        return pa.concat_tables(
            [pq.ParquetFile(p).read(use_threads=False) for p in batch]
        ).combine_chunks()

    batches = [paths[i : i + 64] for i in range(0, len(paths), 64)]
    t = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        table = pa.concat_tables(list(pool.map(read_batch, batches)))
    steps["read"] = time.perf_counter() - t
    t = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(pq.read_metadata, paths):  # parsed and dropped: no RSS of 10^4 footers
            pass
    steps["footers only"] = time.perf_counter() - t
    return table.num_rows


def child(side: str, listing: Path, out: Path) -> None:
    """Run one side in this (fresh) process and print its timings as JSON."""
    import inspect

    import pandas as pd

    from energysweep import aggregate as agg
    from energysweep import results
    from energysweep.aggregate import publish

    spec = json.loads(listing.read_text())
    paths, jobs = spec["shards"], spec["jobs"]
    steps: dict[str, float] = {}
    rows = None
    cpu = time.process_time()
    start = time.perf_counter()
    if side == "naive":
        merged = pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True)
        steps["read+concat"] = time.perf_counter() - start
        merged.to_parquet(out / "naive.parquet")
        rows = len(merged)
    elif side == "floor":
        rows = _floor(paths, steps)
    else:
        # Time the steps of aggregate() separately by wrapping the functions it calls.
        def timed(name, fn):
            def wrapper(*a, **k):
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    steps[name] = steps.get(name, 0.0) + time.perf_counter() - t

            return wrapper

        for name in (
            "merge",
            "write_dataset",
            "_write_dataset_tmp",
            "windows",
            "summarize",
            "environment_table",
        ):
            for module in (results, publish):  # where aggregate() looks them up
                if hasattr(module, name):
                    setattr(module, name, timed(name, getattr(module, name)))
        kwargs = {}
        params = inspect.signature(results.aggregate).parameters
        if "jobs" in params:
            kwargs = {"jobs": jobs, "environment_out": out / "environment.parquet"}
        if side == "ours":  # as scripts/aggregate.py does: the job tables next to job.json
            paths = agg.job_table_paths(jobs)
        results.aggregate(paths, out / "energy.parquet", out / "summary.csv", **kwargs)
        total = time.perf_counter() - start
        steps["other"] = total - sum(steps.values())  # to_pandas, the CSV
    total = time.perf_counter() - start
    print(
        json.dumps(
            {
                "side": side,
                "total_s": total,
                "cpu_s": time.process_time() - cpu,
                "steps": steps,
                "peak_rss_mb": _peak_rss_mb(),
                "rows": rows,
                "files": len(paths),
            }
        )
    )


def run_side(side: str, listing: Path, out: Path) -> dict:
    import subprocess

    from _common import env

    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, __file__, "--child", side, "--listing", str(listing), "--out", str(out)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode:
        sys.exit(f"{side} failed:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=10_000)
    ap.add_argument("--quick", action="store_true", help="120 shards: the test suite's run")
    ap.add_argument("--child", choices=["ours", "naive", "floor", "per-shard"])
    ap.add_argument("--listing", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.listing, args.out)
        return
    if args.quick:
        args.shards = 120
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="bench-merge-") as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        paths, jobs, job_table_s = generate(tmp / "wf", args.shards)
        print(
            f"generated {len(paths)} shards of {len(jobs)} jobs in {time.perf_counter() - t:.1f} s;"
            f" writing the job tables took {job_table_s:.2f} s "
            f"({job_table_s / len(jobs) * 1e3:.1f} ms per job, paid inside the measure jobs)"
        )
        listing = tmp / "listing.json"
        listing.write_text(
            json.dumps(
                {
                    "shards": [str(p) for p in paths],
                    "jobs": [str(p) for p in jobs],
                }
            )
        )
        # Naive first: all read files the generator just wrote, so the page cache is warm alike.
        results = [
            run_side(side, listing, tmp / f"out-{side}")
            for side in ("naive", "ours", "per-shard", "floor")
        ]
        ours_summary = (tmp / "out-ours" / "summary.csv").read_text()
        same = ours_summary == (tmp / "out-per-shard" / "summary.csv").read_text()
    naive, ours, per_shard, floor = results
    for r in results:
        steps = ", ".join(f"{k} {v:.2f} s" for k, v in r["steps"].items())
        print(
            f"{r['side']:7s} {r['total_s']:7.2f} s (CPU {r['cpu_s']:6.2f} s) {r['files']:6d} files"
            f"  peak RSS {r['peak_rss_mb']:5.0f} MB  ({steps})"
        )
    print(f"summary.csv from the job tables identical to the one from the shards: {same}")
    if not same:
        sys.exit("the job tables and the shards disagree")
    speedup = naive["total_s"] / ours["total_s"]
    met = speedup >= GOAL_SPEEDUP and ours["total_s"] <= GOAL_S
    floor_s = floor["steps"]["read"]
    print(
        f"merge_scaling {len(paths)} shards: naive/ours = {speedup:.1f}x faster, ours "
        f"{ours['total_s']:.2f} s vs naive {naive['total_s']:.1f} s; read floor {floor_s:.2f} s "
        f"(footers alone {floor['steps']['footers only']:.2f} s) reading the shards, "
        f"{per_shard['total_s']:.2f} s aggregating them; "
        f"peak RSS ours {ours['peak_rss_mb']:.0f} MB naive {naive['peak_rss_mb']:.0f} MB; "
        f"goal >= {GOAL_SPEEDUP:.0f}x and <= {GOAL_S:.0f} s: {'met' if met else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
