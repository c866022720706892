"""generations.parquet: the token ids rank 0's first repetition generated, per batch size.

One row per prompt of the first ``workload.iterations`` iterations of repetition 0 of each batch
size (every DP replica's writer contributes its prompts), sorted by batch size, iteration and
prompt index; accuracy checks compare them across layouts and backends.
"""

from __future__ import annotations

import pyarrow as pa

from energysweep.tables.io import write_atomic

SCHEMA = pa.schema(
    [
        ("batch_size", pa.int32()),
        ("dp_rank", pa.int16()),
        ("iteration", pa.int32()),
        ("prompt_index", pa.int32()),
        ("token_ids", pa.list_(pa.int32())),
    ]
)


def write_generations(generations: list[list[dict]], path: str) -> None:
    """Write every rank's generation rows (a list per rank) as one sorted table, atomically."""
    gens = sorted(
        (g for rank_gens in generations for g in rank_gens),
        key=lambda g: (g["batch_size"], g["iteration"], g["prompt_index"]),
    )
    table = pa.Table.from_pylist(gens, schema=SCHEMA)
    write_atomic(table, path)
