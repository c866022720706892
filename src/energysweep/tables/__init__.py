"""Every table energysweep writes: one module per table, its schema defined once and documented
from that definition, plus the atomic writers they all use.

- :mod:`energysweep.tables.io`: atomic Parquet and text writes (temp file beside the target,
  then a rename) and the error naming the file a failed write was for.
- :mod:`energysweep.tables.shards`: the energy shard schema (``bs~B/rep~R.parquet`` and the
  job table ``shards.parquet``), the keys of a grid point and of a window, the validating reader.
- :mod:`energysweep.tables.power`: the power timeline ``power.parquet`` (energy/sampler.py).
- :mod:`energysweep.tables.requests`: per-request engine timings ``requests.parquet``
  (backends/request_log.py).
- :mod:`energysweep.tables.generations` and :mod:`energysweep.tables.job_record`:
  ``generations.parquet`` and ``job.json`` (written by the per-rank entry point).

The merged dataset, summary, validation and stage tables are derived from these by
:mod:`energysweep.aggregate`.
"""
