"""Publishing the merge's outputs all or nothing: staged beside each output, then renamed.

The merged dataset is a hive-partitioned Parquet directory (:data:`PARTITION_KEYS`); the other
outputs are single files. Each is written to a temp name beside its output, and only when all
are written are they renamed into place, so a failed merge leaves the previous outputs as they
were and no partial file under an output's name.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from energysweep.tables import io as tables_io

# The merged dataset is partitioned by these columns (hive style: model=m/backend=b/part-0.parquet).
PARTITION_KEYS = ["model", "backend"]


def _write_dataset_tmp(table: pa.Table, out: Path) -> Path:
    """``table`` as a hive-partitioned dataset in a new temp directory beside ``out``."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    tmp = tables_io.temp_beside(out, directory=True)
    try:
        if table.num_rows:
            # One chunk per shard made the partitioned write 25x slower (per-batch work).
            ds.write_dataset(
                table.combine_chunks(),
                tmp,
                format="parquet",
                partitioning=PARTITION_KEYS,
                partitioning_flavor="hive",
                basename_template="part-{i}.parquet",
                existing_data_behavior="overwrite_or_ignore",
                preserve_order=True,
            )
        else:  # no partitions to write: one empty file keeps the schema readable
            pq.write_table(table, tmp / "part-0.parquet")
    except BaseException:
        tables_io.remove(tmp)
        raise
    return tmp


def write_dataset(table: pa.Table, out_dir: str | Path) -> None:
    """Write ``table`` as a hive-partitioned Parquet dataset at ``out_dir``, atomically.

    It is written to a temp directory beside ``out_dir`` and renamed into place, so a reader sees
    the old dataset or the new one, never a half-written one.
    """
    out = Path(out_dir)
    tables_io.replace(_write_dataset_tmp(table, out), out)


def publish(
    table: pa.Table, energy_out: str | Path, files: list[tuple[Path, Callable[[str], object]]]
) -> None:
    """Write ``table`` as the dataset ``energy_out`` and each (output, writer) of ``files``, all
    or nothing.

    Each writer writes its output to the temp path it is given (beside the output); only when
    every one is written are they renamed into place, in order. On any failure every temp file
    is removed and the outputs are as they were; an OSError (a full disk, say) names the output
    being written (pyarrow's errors do not).
    """
    energy_out = Path(energy_out)
    staged: list[tuple[Path, Path]] = []
    writing = energy_out
    try:
        staged.append((_write_dataset_tmp(table, energy_out), energy_out))
        for out, write in files:
            writing = out
            tmp = tables_io.temp_beside(out)
            staged.append((tmp, out))
            write(str(tmp))
        for tmp, out in staged:
            tables_io.replace(tmp, out)
        staged = []
    except OSError as exc:  # a full disk, say: name the output (pyarrow's errors do not)
        raise tables_io.write_error(exc, writing) from exc
    finally:
        for tmp, _ in staged:
            tables_io.remove(tmp)
