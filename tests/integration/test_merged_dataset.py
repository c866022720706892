"""The merged dataset (results/energy.parquet/) is hive-partitioned Parquet that pandas, pyarrow
and DuckDB each read as the same table; aggregation reads every job's table (its shards in one file)
exactly once and no per-window shard."""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow.dataset as ds
import pytest

from energysweep import aggregate as agg
from energysweep import results
from energysweep.job.spec import JobDir
from energysweep.tables import io as tables_io
from energysweep.tables import shards

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from tests_rows import row  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SHARD_NAMES = [f"bs~{bs}/rep~{rep}.parquet" for bs in (1, 4) for rep in range(2)]
JOBS = [("tiny-a", "pytorch", 1), ("tiny-a", "pytorch", 2), ("tiny-b", "vllm", 1)]


def make_sweep(root: Path) -> list[Path]:
    """Shards, job table and job.json of three jobs (two models, two backends, dp 1 and 2),
    laid out as measure jobs write them."""
    records = []
    for j, (model, backend, dp) in enumerate(JOBS):
        job_dir = (
            root
            / "results"
            / "shards"
            / f"model~{model}"
            / f"backend~{backend}"
            / "scenario~inference"
            / "tp~1"
            / "pp~1"
            / f"dp~{dp}"
        )
        tables = []
        for name in SHARD_NAMES:
            bs = int(name.split("/")[0].split("~")[1])
            rep = int(name.split("/")[1].split("~")[1].split(".")[0])
            rows = [
                row(
                    job_id=f"j{j}",
                    model=model,
                    backend=backend,
                    dp=dp,
                    world_size=dp,
                    batch_size=bs,
                    global_batch_size=bs * dp,
                    repetition=rep,
                    rank=r,
                    pid=r + 1,
                    dp_rank=r,
                    gpu_uuid=f"GPU-{j}-{r}",
                    gpu_energy_mj=1000.0 * (r + 1),
                )
                for r in range(dp)
            ]
            tables.append(shards.to_table(rows))
            tables_io.write_atomic(tables[-1], job_dir / name)
        job_table = shards.concat(tables)
        tables_io.write_atomic(job_table, JobDir(str(job_dir)).job_table)
        # What the merge checks a job table against (aggregate.merge with job records).
        record = {
            "job_id": f"j{j}",
            "config_hash": "h",
            "job_table_rows": job_table.num_rows,
            "job": {
                "model": model,
                "backend": backend,
                "scenario": "inference",
                "tp": 1,
                "pp": 1,
                "dp": dp,
            },
        }
        (job_dir / "job.json").write_text(json.dumps(record))
        records.append(job_dir / "job.json")
    return records


@pytest.fixture
def merged(tmp_path, monkeypatch):
    records = make_sweep(tmp_path)
    reads = collections.Counter()
    real_read = shards.read_shard

    def counting_read(path):
        reads[str(path)] += 1
        return real_read(path)

    monkeypatch.setattr(shards, "read_shard", counting_read)
    paths = agg.job_table_paths(records)
    out = tmp_path / "results" / "energy.parquet"
    results.aggregate(paths, out, tmp_path / "results" / "summary.csv")
    return out, paths, reads


def _canonical(df: pd.DataFrame) -> pd.DataFrame:
    """Same rows, same column order, plain Python values (readers differ in dtypes and nulls)."""
    df = df[sorted(df.columns)].sort_values(["job_id", "batch_size", "repetition", "rank"])
    df = df.reset_index(drop=True).astype(object)
    return df.where(df.notna(), None)


def test_every_job_table_read_exactly_once_and_no_shard(merged):
    _, paths, reads = merged
    assert len(paths) == len(JOBS)
    assert sorted(reads) == sorted(str(p) for p in paths)
    assert set(reads.values()) == {1}


def test_hive_partitioned_layout(merged):
    out, _, _ = merged
    assert out.is_dir()
    parts = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.parquet"))
    assert parts == [
        "model=tiny-a/backend=pytorch/part-0.parquet",
        "model=tiny-b/backend=vllm/part-0.parquet",
    ]
    assert not [p for p in out.parent.iterdir() if p.name.startswith((".tmp-", ".old-"))]


def test_pandas_pyarrow_duckdb_read_the_same_table(merged):
    out, paths, _ = merged
    expected = agg.merge(paths).to_pandas()
    by_pandas = pd.read_parquet(out)
    by_pyarrow = ds.dataset(out, format="parquet", partitioning="hive").to_table().to_pandas()
    assert len(by_pandas) == len(expected) == 16  # 4 windows x (1 + 2 + 1) ranks
    assert set(by_pandas.columns) == set(shards.SCHEMA.names)
    pd.testing.assert_frame_equal(_canonical(by_pandas), _canonical(expected))
    pd.testing.assert_frame_equal(_canonical(by_pyarrow), _canonical(expected))
    by_duckdb = duckdb.sql(
        f"SELECT * FROM read_parquet('{out}/**/*.parquet', hive_partitioning = true)"
    ).df()
    pd.testing.assert_frame_equal(_canonical(by_duckdb), _canonical(expected))
    # A filter on a partition column reads only that partition's files.
    n = duckdb.sql(
        f"SELECT count(*) FROM read_parquet('{out}/**/*.parquet', hive_partitioning = true) "
        "WHERE backend = 'vllm'"
    ).fetchall()[0][0]
    assert n == (expected["backend"] == "vllm").sum()


def test_rewrite_replaces_the_dataset_whole(merged, tmp_path):
    out, paths, _ = merged
    agg.write_dataset(agg.merge(paths[:1]), out)  # the first job only
    assert len(pd.read_parquet(out)) == 4
    assert sorted(p.parent.name for p in out.rglob("*.parquet")) == ["backend=pytorch"]
    assert not [p for p in out.parent.iterdir() if p.name.startswith((".tmp-", ".old-"))]


def test_missing_job_table_names_its_job(tmp_path):
    records = make_sweep(tmp_path)
    (Path(JobDir.of(records[1]).job_table)).unlink()
    with pytest.raises(FileNotFoundError, match=r"dp~2/shards\.parquet is missing.*--forcerun"):
        agg.job_table_paths(records)
