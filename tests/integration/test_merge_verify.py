"""The merge verifies every job table against its job.json and refuses bad ones, all at once.

Each kind of bad table (truncated, corrupt, wrong schema, wrong schema version, wrong row count,
another run's config hash) fails the merge with a message naming the file, the job and the
command that reruns it; no output is written and earlier outputs stay as they were. The real
Snakemake path (update() outputs, the printed rerun command actually working) is in
test_failures.py.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from test_merged_dataset import make_sweep

from energysweep import aggregate as agg
from energysweep import results
from energysweep.job.spec import JobDir
from energysweep.tables import shards

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _rewrite(path, table):
    pq.write_table(table, path)


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def corrupt(path):
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = b"\xff" * 64  # the footer stays valid: the pages do not
    data[4:68] = b"\x00" * 64
    path.write_bytes(bytes(data))


def wrong_schema(path):
    table = pq.read_table(path)
    _rewrite(path, table.drop_columns(["gpu_energy_mj"]))


def wrong_version(path):
    table = pq.read_table(path)
    i = table.schema.get_field_index("schema_version")
    col = pa.array([shards.SCHEMA_VERSION - 1] * table.num_rows, pa.int16())
    _rewrite(path, table.set_column(i, table.schema.field(i), col))


def wrong_hash(path):
    table = pq.read_table(path)
    i = table.schema.get_field_index("config_hash")
    col = pa.array(["another-run"] * table.num_rows, pa.string())
    _rewrite(path, table.set_column(i, table.schema.field(i), col))


def missing_rows(path):
    table = pq.read_table(path)
    _rewrite(path, table.filter(pc.equal(table.column("repetition"), 0)))


CASES = {
    "truncated": (truncate, "is not a readable Parquet file"),
    "corrupt": (corrupt, r"is not a readable Parquet file, truncated or corrupt \(\S"),
    "wrong-schema": (wrong_schema, r"schema differs .*missing columns \['gpu_energy_mj'\]"),
    "wrong-version": (wrong_version, rf"has schema version \[{shards.SCHEMA_VERSION - 1}\]"),
    "wrong-config-hash": (wrong_hash, r"has config hash \['another-run'\], not job.json's 'h'"),
    "missing-rows": (missing_rows, r"has \d+ rows, job\.json records \d+"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_job_table_refused_naming_file_job_and_rerun(tmp_path, case):
    damage, what = CASES[case]
    records = make_sweep(tmp_path)
    out = tmp_path / "results"
    energy, summary, env = out / "energy.parquet", out / "summary.csv", out / "environment.parquet"
    # A complete earlier merge: what a refused merge must leave as it was.
    results.aggregate(agg.job_table_paths(records), energy, summary)
    before = {p: p.read_bytes() for p in [summary, *energy.rglob("*.parquet")]}
    bad = Path(JobDir.of(records[1]).job_table)
    damage(bad)
    args = ["--profile", "profiles/local", "--configfile=config/x.yaml"]
    with pytest.raises(agg.MergeInputError) as info:
        results.aggregate(
            agg.job_table_paths(records, args),
            energy,
            summary,
            jobs=records,
            environment_out=env,
            snakemake_args=args,
        )
    msg = str(info.value)
    assert f"{bad} " in msg and re.search(what, msg), msg
    assert len(msg.splitlines()) == 2  # the verdict, then one line per bad table
    label = "model=tiny-a backend=pytorch scenario=inference tp=1 pp=1 dp=2"
    assert f"job: {label} ({records[1]})" in msg
    assert "rerun it: " + shlex.join(["snakemake", *args, "--forcerun", str(records[1])]) in msg
    assert msg.count("rerun it:") == 1  # only the bad job
    assert {p: p.read_bytes() for p in [summary, *energy.rglob("*.parquet")]} == before
    assert not env.exists()
    assert not [p for p in out.iterdir() if p.name.startswith((".tmp-", ".old-"))]


def test_every_bad_table_reported_at_once_and_good_merge_passes(tmp_path):
    records = make_sweep(tmp_path)
    out = tmp_path / "results"
    results.aggregate(
        agg.job_table_paths(records),
        out / "e",
        out / "s.csv",
        jobs=records,
        environment_out=out / "env.parquet",
    )
    assert (out / "s.csv").is_file() and (out / "env.parquet").is_file()
    truncate(Path(JobDir.of(records[0]).job_table))
    wrong_hash(Path(JobDir.of(records[2]).job_table))
    with pytest.raises(agg.MergeInputError, match="2 job table") as info:
        results.aggregate(
            agg.job_table_paths(records),
            out / "e",
            out / "s.csv",
            jobs=records,
            environment_out=out / "env.parquet",
        )
    assert str(records[0].parent) in str(info.value) and str(records[2].parent) in str(info.value)


def test_unreadable_job_json_and_missing_table(tmp_path):
    records = make_sweep(tmp_path)
    records[0].write_text("{not json")
    with pytest.raises(agg.MergeInputError, match=r"job\.json is unreadable"):
        agg.load_job_records(records)
    (Path(JobDir.of(records[2]).job_table)).unlink()
    with pytest.raises(FileNotFoundError, match=r"shards\.parquet is missing.*--forcerun"):
        agg.job_table_paths(records)
    assert json.loads(records[1].read_text())["job_table_rows"] > 0
