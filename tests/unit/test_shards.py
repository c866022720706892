import os
import signal
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from energysweep.tables import shards

from tests_rows import row


def test_roundtrip(tmp_path):
    path = tmp_path / "a" / "s.parquet"
    shards.write_shard([row(), row(rank=1, pid=2)], path)
    table = shards.read_shard(path)
    assert table.num_rows == 2
    assert table.schema.equals(shards.SCHEMA)
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]


def test_non_nullable_and_unknown_columns(tmp_path):
    with pytest.raises(shards.ShardError, match="rank may not be null"):
        shards.to_table([row(rank=None)])
    with pytest.raises(shards.ShardError, match="not in the schema"):
        shards.to_table([{**row(), "surprise": 1}])
    r = row()
    del r["gpu_energy_status"]
    with pytest.raises(shards.ShardError, match="lack columns"):
        shards.to_table([r])


def test_other_schema_rejected(tmp_path):
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), tmp_path / "bad.parquet")
    with pytest.raises(shards.ShardError, match="schema differs"):
        shards.read_shard(tmp_path / "bad.parquet")


def test_killed_writer_leaves_no_shard(tmp_path):
    """SIGKILL while writing: the final name never appears, only a .tmp- file may."""
    target = tmp_path / "s.parquet"
    code = textwrap.dedent(
        f"""
        import os, signal
        import pyarrow.parquet as pq
        from energysweep.tables import shards
        real = pq.write_table
        def write_then_die(table, where, **kw):
            real(table, where, **kw)
            os.kill(os.getpid(), signal.SIGKILL)
        pq.write_table = write_then_die
        from tests_rows import row
        shards.write_shard([row()], {str(target)!r})
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-s.parquet")]


def test_schema_doc_table_is_generated_from_columns():
    """docs/schema.md holds shards.markdown_table() verbatim, at the current version."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "schema.md").read_text()
    assert f"# The shard schema (v{shards.SCHEMA_VERSION})" in doc
    assert shards.markdown_table() in doc
