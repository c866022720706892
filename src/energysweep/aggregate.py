"""Shards -> merged rows -> one row per window -> one row per grid point.

Counting rule: a window's GPU energy is the sum over its *distinct* GPU UUIDs, so a GPU reported
by two ranks counts once, and every node's GPUs of a multi-node job are included. If any GPU
of the window has no measured energy the window's energy is null (never a partial sum). Host
(RAPL) energy is summed over distinct hosts, each read once by its local rank 0.

Derived, never stored in shards (rows keep gross energy):
- idle-adjusted energy = gross - sum of the window's GPUs' idle power x window duration
  (columns named ``*_idle_adjusted_*``);
- per repetition, prefill energy per iteration from the prefill window and decode energy per
  output token = (generate - prefill energy per iteration) / (output tokens - requests per
  iteration): the prefill pass generates each request's first token;
- training windows (phase ``train``): energy per training token = GPU energy / tokens trained on
  (``input_tokens``, all replicas), training tokens and samples per second, and the window's
  loss; output-token figures stay null for them (``output_token_status`` says why), as training
  figures do for inference points (``training_status``);
- per grid point, the median over ok repetitions and a bootstrap 95% CI of the median
  (:func:`bootstrap_ci`: numpy, fixed seed, 2000 resamples; null with ``ci_status`` when fewer
  than 2 repetitions are ok).

Every null in the summary is explained by a status column (:data:`NULL_STATUS`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from energysweep import validity
from energysweep.tables import io as tables_io
from energysweep.tables import shards

POINT_KEYS = ["model", "backend", "scenario", "tp", "pp", "dp", "batch_size"]
WINDOW_KEYS = ["job_id", *POINT_KEYS, "repetition", "phase"]
MEASURED = {"measured", "short-window"}
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CI_LEVEL = 0.95
# The point's figures come from these windows; prefill windows feed the prefill/decode split.
HEADLINE_PHASES = ("generate", "train")

# Summary column -> the status columns that explain a null in it (any non-ok value explains).
_ENERGY = ("gpu_energy_status", "status")
# Training generates no output tokens (output_token_status says so); inference trains on none
# (training_status says so).
_OUTPUT_TOKEN_COLUMNS = (
    "energy_per_output_token_j", "energy_per_output_token_j_ci_low",
    "energy_per_output_token_j_ci_high", "output_tokens_per_s", "output_tokens_per_s_ci_low",
    "output_tokens_per_s_ci_high", "output_tokens_per_window",
    "energy_per_output_token_idle_adjusted_j", "host_energy_per_output_token_j",
    "host_energy_per_output_token_idle_adjusted_j",
)
TRAINING_NULL_STATUS: dict[str, tuple[str, ...]] = {
    "energy_per_train_token_j": ("training_status", *_ENERGY),
    **{c: ("training_status", "ci_status", *_ENERGY) for c in (
        "energy_per_train_token_j_ci_low", "energy_per_train_token_j_ci_high",
    )},
    **{c: ("training_status", "status") for c in ("train_tokens_per_s", "samples_per_s", "loss")},
}
NULL_STATUS: dict[str, tuple[str, ...]] = {
    **{c: _ENERGY for c in (
        "energy_per_output_token_j", "energy_per_request_j", "energy_per_iteration_j",
        "mean_gpu_power_w",
    )},
    **{c: ("ci_status", *_ENERGY) for c in (
        "energy_per_output_token_j_ci_low", "energy_per_output_token_j_ci_high",
        "mean_gpu_power_w_ci_low", "mean_gpu_power_w_ci_high",
    )},
    **{c: ("ci_status", "status") for c in (
        "output_tokens_per_s_ci_low", "output_tokens_per_s_ci_high",
    )},
    **{c: ("status",) for c in (
        "output_tokens_per_s", "window_s", "iterations_per_window", "output_tokens_per_window",
        "cpu_time_s",
    )},
    **{c: ("idle_status", *_ENERGY) for c in (
        "idle_gpu_power_w", "energy_per_output_token_idle_adjusted_j",
        "gpu_energy_idle_adjusted_j",
    )},
    **{c: ("prefill_decode_status", *_ENERGY) for c in (
        "prefill_energy_per_request_j", "decode_energy_per_output_token_j",
        "prefill_energy_fraction",
    )},
    **{c: ("prefill_decode_status", "status") for c in (
        "prefill_s_per_iteration", "decode_output_tokens_per_s",
    )},
    **{c: ("host_energy_status", "status") for c in (
        "host_energy_per_output_token_j", "mean_host_power_w",
    )},
    **{c: ("idle_host_status", "host_energy_status", "status") for c in (
        "host_energy_per_output_token_idle_adjusted_j",
    )},
    "zeus_nvml_energy_ratio": ("zeus_status", *_ENERGY),
    **{c: ("flops_status", "status") for c in ("flops_estimate_per_s",)},
    **{c: ("flops_status", *_ENERGY) for c in ("flops_estimate_per_j",)},
}
for _c in _OUTPUT_TOKEN_COLUMNS:
    NULL_STATUS[_c] = ("output_token_status", *NULL_STATUS[_c])
NULL_STATUS.update(TRAINING_NULL_STATUS)
OK_STATUSES = {"ok", "measured", "counted", "config"}
TRAIN_PHASE = "train"
NOT_TRAINING = "not-applicable (inference: no optimizer steps)"
NO_OUTPUT_TOKENS = "not-applicable (training generates no output tokens)"
# Free-text columns: null means "nothing to report", not "not measured".
INFO_COLUMNS = {"error", "gpu_energy_detail", "host_energy_detail"}
# The validity verdict, re-check and stage columns (energysweep.validity) explain their nulls too.
NULL_STATUS.update(validity.NULL_STATUS)
INFO_COLUMNS |= validity.INFO_COLUMNS


# The shard columns windows() reads; aggregate() converts only these to pandas.
WINDOW_COLUMNS = [
    *WINDOW_KEYS, "status", "error", "window_start_ns", "window_end_ns", "iterations", "requests",
    "input_tokens", "output_tokens", "rank", "pid", "host", "device", "gpu_uuid",
    "gpu_energy_mj", "gpu_energy_status", "gpu_energy_method", "gpu_energy_detail",
    "energy_source", "gpu_energy_mj_zeus", "gpu_energy_zeus_status", "idle_gpu_power_w",
    "idle_gpu_power_status", "host_energy_mj", "host_dram_energy_mj", "host_energy_status",
    "host_energy_detail", "idle_host_power_w", "idle_host_power_status", "cpu_time_s",
    "model_parameters", "model_parameters_method", "flops_estimate", "loss", "config_hash",
    "code_version",
]

# The merged dataset is partitioned by these columns (hive style: model=m/backend=b/part-0.parquet).
PARTITION_KEYS = ["model", "backend"]


class MergeInputError(ValueError):
    """A job's files cannot be merged; the message names each file, its job, and the rerun."""


def rerun_command(job_record: str | Path, snakemake_args: list[str] | None = None) -> str:
    """The command that reruns one job (and the merge after it).

    ``--forcerun`` of the job's job.json reruns the measure job that writes it, then everything
    downstream. ``snakemake_args`` are the options of the run that failed (``--profile``,
    ``--configfile``: energysweep.steplog.snakemake_options), default the local profile.
    """
    import shlex

    args = list(snakemake_args or ["--profile", "profiles/local"])
    return shlex.join(["snakemake", *args, "--forcerun", str(job_record)])


def _job_label(record: dict | None, job_record: Path) -> str:
    job = (record or {}).get("job") or {}
    keys = ("model", "backend", "scenario", "tp", "pp", "dp")
    label = " ".join(f"{k}={job[k]}" for k in keys if k in job)
    return f"{label} ({job_record})" if label else str(job_record)


def _problem(table: Path, job_record: Path, record: dict | None, what: str,
             snakemake_args: list[str] | None) -> str:
    """One line per bad file: the file and what is wrong, its job, the command to rerun it."""
    return (f"{table} {what}; job: {_job_label(record, job_record)}; "
            f"rerun it: {rerun_command(job_record, snakemake_args)}")


class MissingJobTable(MergeInputError, FileNotFoundError):
    """A job's table is missing next to its job.json."""


def job_table_paths(job_records: list[str | Path],
                    snakemake_args: list[str] | None = None) -> list[Path]:
    """Every job's table (``shards.JOB_TABLE``: all its shards' rows in one file), found next to
    its job.json.

    Reading one file per job instead of one per window is what keeps the merge of a large sweep
    fast (bench/merge_scaling.py). Raises MergeInputError (a FileNotFoundError too) naming every
    job whose table is missing and the command that reruns it (its job.json stands for all of the
    job's outputs in the merge rule, so Snakemake would not notice).
    """
    paths, problems = [], []
    for record in job_records:
        table = Path(record).parent / shards.JOB_TABLE
        if not table.is_file():
            problems.append(_problem(table, Path(record), None,
                                     f"is missing although {record} exists", snakemake_args))
        paths.append(table)
    if problems:
        raise MissingJobTable(_merge_failure(problems))
    return paths


def _merge_failure(problems: list[str]) -> str:
    shown = problems[:20]
    more = f"\n  ... and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
    return (
        f"merge refused: {len(problems)} job table(s) cannot be merged; nothing was written and "
        "the previous results are unchanged.\n  " + "\n  ".join(shown) + more
    )


def load_job_records(job_records: list[str | Path],
                     snakemake_args: list[str] | None = None) -> dict[Path, dict]:
    """job.json path -> its record; MergeInputError naming every unreadable one."""
    records, problems = {}, []
    for path in map(Path, job_records):
        try:
            records[path] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            problems.append(_problem(path, path, None, f"is unreadable ({exc})",
                                     snakemake_args))
    if problems:
        raise MergeInputError(_merge_failure(problems))
    return records


def _check_table(table: pa.Table, record: dict) -> list[str]:
    """What is wrong with a job's table given its job.json (empty: nothing)."""
    wrong = []
    versions = set(pc.unique(table.column("schema_version")).to_pylist())
    if versions != {shards.SCHEMA_VERSION} and table.num_rows:
        wrong.append(f"has schema version {sorted(versions)}, this energysweep merges version "
                     f"{shards.SCHEMA_VERSION}")
    expected_rows = record.get("job_table_rows")
    if expected_rows is None:
        wrong.append("has no row count in job.json (written by an older energysweep)")
    elif table.num_rows != expected_rows:
        wrong.append(f"has {table.num_rows} rows, job.json records {expected_rows}")
    hashes = set(pc.unique(table.column("config_hash")).to_pylist())
    if hashes - {record.get("config_hash")}:
        wrong.append(f"has config hash {sorted(hashes)}, not job.json's "
                     f"{record.get('config_hash')!r} (the file belongs to another run)")
    ids = set(pc.unique(table.column("job_id")).to_pylist())
    if ids - {record.get("job_id")}:
        wrong.append(f"has job id {sorted(ids)}, not job.json's {record.get('job_id')!r}")
    return wrong


# Shards per read task: each task concatenates its shards into one chunk, so the merged table
# is not 10^4 one-row chunks that every later step (the partitioned write, to_pandas) pays for.
MERGE_BATCH = 64


def _read_batch(paths: list[str | Path], expect: dict | None = None,
                snakemake_args: list[str] | None = None) -> tuple[pa.Table | None, list[str]]:
    """The batch's tables concatenated, and what is wrong with any of them (then no table)."""
    tables, problems = [], []
    for p in paths:
        job_record, record = (expect or {}).get(Path(p), (None, None))
        try:
            table = shards.read_shard(p)
        except (pa.ArrowException, OSError, shards.ShardError) as exc:
            if job_record is None:
                raise
            detail = " ".join(str(exc).split())  # one line per bad file
            what = f"is not a valid job table ({type(exc).__name__}: {detail})"
            if isinstance(exc, (pa.ArrowInvalid, OSError)):
                what = f"is not a readable Parquet file, truncated or corrupt ({detail})"
            problems.append(_problem(Path(p), job_record, record, what, snakemake_args))
            continue
        if record is not None:
            wrong = _check_table(table, record)
            if wrong:
                problems.append(_problem(Path(p), job_record, record, "; ".join(wrong),
                                         snakemake_args))
                continue
        tables.append(table)
    if problems:
        return None, problems
    return pa.concat_tables(tables).combine_chunks(), []


def merge(paths: list[str | Path], records: dict[Path, dict] | None = None,
          snakemake_args: list[str] | None = None) -> pa.Table:
    """Read every shard once, check its schema, and concatenate (one chunk per batch of shards).

    With ``records`` (job.json path -> record, :func:`load_job_records`), each path must be the
    job table next to one of them and is verified against it: readable Parquet, the shard
    schema and its version, the row count job.json records, the job's config hash and job id.
    Every bad table is reported at once (:class:`MergeInputError`), each with its job and the
    command that reruns it.

    Reads run on a few threads: pyarrow decodes without the GIL, and per-file open and decode
    (not bytes) is the cost of many small shards (bench/merge_scaling.py).
    """
    if not paths:
        return shards.SCHEMA.empty_table()
    expect = None
    if records is not None:
        expect = {Path(j).parent / shards.JOB_TABLE: (Path(j), r) for j, r in records.items()}
    batches = [paths[i : i + MERGE_BATCH] for i in range(0, len(paths), MERGE_BATCH)]
    workers = min(8, 2 * (os.cpu_count() or 1), len(batches))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda b: _read_batch(b, expect, snakemake_args), batches))
    problems = [p for _, batch_problems in results for p in batch_problems]
    if problems:
        raise MergeInputError(_merge_failure(problems))
    return pa.concat_tables([t for t, _ in results])


def _write_dataset_tmp(table: pa.Table, out: Path) -> Path:
    """``table`` as a hive-partitioned dataset in a new temp directory beside ``out``."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; results are for everyone to read
    try:
        if table.num_rows:
            # One chunk per shard made the partitioned write 25x slower (per-batch work).
            ds.write_dataset(
                table.combine_chunks(), tmp, format="parquet", partitioning=PARTITION_KEYS,
                partitioning_flavor="hive", basename_template="part-{i}.parquet",
                existing_data_behavior="overwrite_or_ignore", preserve_order=True,
            )
        else:  # no partitions to write: one empty file keeps the schema readable
            pq.write_table(table, tmp / "part-0.parquet")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def _swap_in(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` (file or directory) to ``out``, replacing what was there."""
    if tmp.is_dir():
        old = out.with_name(f".old-{out.name}-{uuid.uuid4().hex}") if out.exists() else None
        if old:
            os.replace(out, old)
        os.replace(tmp, out)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


def write_dataset(table: pa.Table, out_dir: str | Path) -> None:
    """Write ``table`` as a hive-partitioned Parquet dataset at ``out_dir``, atomically.

    It is written to a temp directory beside ``out_dir`` and renamed into place, so a reader sees
    the old dataset or the new one, never a half-written one.
    """
    out = Path(out_dir)
    _swap_in(_write_dataset_tmp(table, out), out)


class _Groups:
    """Rows of a frame, in a given order, grouped by a group id: vectorized per-group reductions.

    ``rows`` are positions in the frame (a subset, in the order a per-group loop would see them);
    they are stably ordered by group, so each group's rows stay in that order. Every method takes
    a frame-aligned array and returns one value per group (``n`` groups, empty ones included).
    """

    def __init__(self, gid: np.ndarray, n: int, rows: np.ndarray | None = None):
        rows = np.arange(len(gid)) if rows is None else np.asarray(rows, dtype=np.int64)
        self.rows = rows[np.argsort(gid[rows], kind="stable")]
        self.g = gid[self.rows]
        self.n = n
        self.count = np.bincount(self.g, minlength=n)
        self.start = np.concatenate([[0], np.cumsum(self.count)[:-1]]).astype(np.int64)

    def _take(self, values) -> np.ndarray:
        return np.asarray(values)[self.rows]

    def all(self, mask) -> np.ndarray:
        """Whether ``mask`` holds on every row of the group (True for an empty group)."""
        return np.bincount(self.g, weights=~self._take(mask), minlength=self.n) == 0

    def any(self, mask) -> np.ndarray:
        return np.bincount(self.g, weights=self._take(mask), minlength=self.n) > 0

    def sum(self, values) -> np.ndarray:
        """Sums with NaN as 0, rounded exactly as ``Series.sum`` rounds (numpy pairwise sums)."""
        v = np.nan_to_num(self._take(values).astype(float), nan=0.0)
        # Up to 7 values numpy adds in order, as bincount does; from 8 on it sums pairwise.
        out = np.bincount(self.g, weights=v, minlength=self.n)
        for g in np.flatnonzero(self.count >= 8):
            out[g] = np.add.reduce(v[self.start[g] : self.start[g] + self.count[g]])
        return out

    def sum_all_or_nan(self, values) -> np.ndarray:
        """Per group the sum, or NaN if a value is missing or there is none (never partial)."""
        v = self._take(values).astype(float)
        bad = np.bincount(self.g, weights=np.isnan(v), minlength=self.n) > 0
        return np.where(bad | (self.count == 0), np.nan, self.sum(values))

    def sum_min_count_1(self, values) -> np.ndarray:
        """``Series.sum(min_count=1)``: the sum of the values present, NaN if none is."""
        v = self._take(values).astype(float)
        present = np.bincount(self.g, weights=~np.isnan(v), minlength=self.n)
        return np.where(present > 0, self.sum(values), np.nan)

    def first(self, values) -> np.ndarray:
        """The group's first value (None for an empty group)."""
        out = np.full(self.n, None, dtype=object)
        has = self.count > 0
        out[has] = self._take(values)[self.start[has]]
        return out

    def _distinct(self, values) -> tuple[np.ndarray, np.ndarray]:
        """Distinct non-null (group, value) pairs, sorted by group then value: (groups, values)."""
        codes, uniques = pd.factorize(pd.Series(values), sort=True)  # codes follow value order
        codes = codes[self.rows]
        present = codes >= 0
        m = max(len(uniques), 1)
        pairs = np.unique(self.g[present].astype(np.int64) * m + codes[present])
        return pairs // m, np.asarray(uniques, dtype=object)[pairs % m]

    def nunique(self, values) -> np.ndarray:
        """Distinct non-null values per group."""
        return np.bincount(self._distinct(values)[0], minlength=self.n)

    def joined(self, values, sep: str) -> np.ndarray:
        """``sep.join(sorted(set(non-null values)))`` per group ("" for none)."""
        g, v = self._distinct(values)
        out = np.full(self.n, "", dtype=object)
        counts = np.bincount(g, minlength=self.n)
        starts = np.cumsum(counts) - counts
        single = counts == 1  # most groups: their one value, no join
        out[single] = v[starts[single]]
        for k in np.flatnonzero(counts > 1):
            out[k] = sep.join(v[starts[k] : starts[k] + counts[k]])
        return out

    def status_of(self, values, mask_measured, mask_ok) -> np.ndarray:
        """One status for each group's set of statuses.

        "measured" if all are measured (``mask_measured``), else "short-window" if all are
        accepted (``mask_ok``: measured or short-window), else the one value if there is one,
        else "partial".
        """
        nuniq = self.nunique(values)
        return np.where(
            self.all(mask_measured), "measured",
            np.where(self.all(mask_ok), "short-window",
                     np.where(nuniq == 1, self.first(values), "partial")),
        ).astype(object)


def _col(frame: pd.DataFrame, name: str) -> np.ndarray:
    """A column as a numpy array: floats with NaN for nulls, other types as objects."""
    s = frame[name]
    if pd.api.types.is_numeric_dtype(s.dtype) and not pd.api.types.is_bool_dtype(s.dtype):
        return s.to_numpy(dtype=float, na_value=np.nan)
    return s.to_numpy(dtype=object)


def _is(frame: pd.DataFrame, name: str, values) -> np.ndarray:
    return frame[name].isin(list(values)).to_numpy()


def _null_if_empty(strings: np.ndarray) -> list:
    return [s or None for s in strings]


def _host_columns(energy: pd.DataFrame, gid: np.ndarray, n: int, ok: np.ndarray) -> dict:
    """Host energy per window: each distinct host once, from the rank that read it.

    Per (window, host) the first row whose ``host_energy_status`` is not "not-read", else the
    host's first row; hosts in sorted order, as a per-window ``groupby("host")`` sees them.
    """
    host = energy["host"]
    keep = host.notna().to_numpy()
    order = pd.DataFrame({
        "g": gid, "host": host, "not_read": _is(energy, "host_energy_status", ["not-read"]),
        "pos": np.arange(len(energy)),
    })[keep].sort_values(["g", "host", "not_read", "pos"], kind="stable")
    per_host = order.drop_duplicates(["g", "host"])["pos"].to_numpy()
    h = _Groups(gid, n, per_host)
    measured = ok & h.all(_is(energy, "host_energy_status", ["measured"]))
    idle_ok = measured & h.all(_is(energy, "idle_host_power_status", ["measured"]))
    host_measured = _is(energy, "host_energy_status", ["measured"])
    idle_measured = _is(energy, "idle_host_power_status", ["measured"])
    return {
        "host_energy_j": np.where(measured, h.sum_all_or_nan(_col(energy, "host_energy_mj")) / 1e3,
                                  np.nan),
        "host_dram_energy_j": np.where(
            measured, h.sum_all_or_nan(_col(energy, "host_dram_energy_mj")) / 1e3, np.nan
        ),
        "host_energy_status": np.where(
            measured, "measured",
            h.status_of(energy["host_energy_status"], host_measured, host_measured),
        ).tolist(),
        "host_energy_detail": _null_if_empty(h.joined(energy["host_energy_detail"], "; ")),
        "idle_host_power_w": np.where(
            idle_ok, h.sum_all_or_nan(_col(energy, "idle_host_power_w")), np.nan
        ),
        "idle_host_status": np.where(
            idle_ok, "measured",
            h.status_of(energy["idle_host_power_status"], idle_measured, idle_measured),
        ).tolist(),
    }


def windows(energy: pd.DataFrame) -> pd.DataFrame:
    """One row per measured window, with derived per-token and per-second figures.

    Vectorized: a few whole-frame passes, not a Python function per window (which cost 20-30 ms
    per window: bench/merge_scaling.py). Each value is what a per-window loop over the window's
    rows gives (tests/unit/test_aggregate_reference.py compares the two).
    """
    if energy.empty:
        return pd.DataFrame(columns=[*WINDOW_KEYS, "status"])
    gid = energy.groupby(WINDOW_KEYS, sort=True, dropna=False).ngroup().to_numpy()
    n = int(gid.max()) + 1
    _, first_pos = np.unique(gid, return_index=True)  # each window's first row
    first = energy.iloc[first_pos].reset_index(drop=True)
    ok = (first["status"] == "ok").to_numpy()
    rows = _Groups(gid, n)

    # GPUs: each distinct UUID of the window once (its first row).
    uuid = energy["gpu_uuid"]
    dup = pd.DataFrame({"g": gid, "u": uuid}).duplicated().to_numpy()
    gpus = _Groups(gid, n, np.flatnonzero(uuid.notna().to_numpy() & ~dup))
    n_gpus = gpus.count
    has_gpus = n_gpus > 0
    estatus_measured = rows.all(_is(energy, "gpu_energy_status", MEASURED))
    gpu_mj = _col(energy, "gpu_energy_mj")
    gpu_complete = gpus.all(~np.isnan(gpu_mj))
    energy_ok = ok & has_gpus & estatus_measured & gpu_complete
    short = rows.any(_is(energy, "gpu_energy_status", ["short-window"]))
    unavailable = rows.all(_is(energy, "gpu_energy_status", ["unavailable"]))
    estatus = np.where(
        energy_ok, np.where(short, "short-window", "measured"),
        np.where(unavailable, "unavailable", "partial"),
    )

    zeus_st = energy["gpu_energy_zeus_status"]
    zeus_measured = _is(energy, "gpu_energy_zeus_status", ["measured"])
    zeus_ok = _is(energy, "gpu_energy_zeus_status", MEASURED)
    zeus_j = np.where(
        ok & has_gpus & gpus.all(zeus_ok),
        gpus.sum_all_or_nan(_col(energy, "gpu_energy_mj_zeus")) / 1e3, np.nan,
    )
    zeus_status = np.where(
        has_gpus, gpus.status_of(zeus_st, zeus_measured, zeus_ok), "not-requested"
    )

    # Idle statuses come from the window's GPUs, or from all its rows when it has none.
    idle_st = energy["idle_gpu_power_status"]
    idle_measured = _is(energy, "idle_gpu_power_status", ["measured"])
    idle_in = _is(energy, "idle_gpu_power_status", MEASURED)
    idle_w = np.where(
        has_gpus & gpus.all(idle_in), gpus.sum_all_or_nan(_col(energy, "idle_gpu_power_w")),
        np.nan,
    )
    idle_status = np.where(
        has_gpus, gpus.status_of(idle_st, idle_measured, idle_in),
        rows.status_of(idle_st, idle_measured, idle_in),
    )

    hosts_pids = pd.DataFrame({"g": gid, "host": energy["host"], "pid": energy["pid"]})
    processes = _Groups(gid, n, np.flatnonzero(~hosts_pids.duplicated().to_numpy()))

    dur = (first["window_end_ns"] - first["window_start_ns"]) / 1e9
    out = first[WINDOW_KEYS].copy()
    columns = {
        "status": first["status"],
        "error": first["error"],
        "duration_s": dur.where(ok, np.nan),
        "iterations": first["iterations"],
        "requests": first["requests"],
        "input_tokens": first["input_tokens"],
        "output_tokens": first["output_tokens"].where(ok, np.nan),
        "n_ranks": rows.nunique(energy["rank"]),
        "n_processes": processes.count,
        "n_gpus": n_gpus,
        "n_hosts": rows.nunique(energy["host"]),
        "energy_source": rows.joined(energy["energy_source"], ",").tolist(),
        "gpu_energy_j": np.where(energy_ok, gpus.sum(gpu_mj) / 1e3, np.nan),
        "gpu_energy_status": estatus.tolist(),
        "gpu_energy_method": rows.joined(energy["gpu_energy_method"], ",").tolist(),
        "gpu_energy_detail": _null_if_empty(rows.joined(energy["gpu_energy_detail"], "; ")),
        "gpu_energy_zeus_j": zeus_j,
        "zeus_status": zeus_status.tolist(),
        "idle_gpu_power_w": idle_w,
        "idle_status": idle_status.tolist(),
        **_host_columns(energy, gid, n, ok),
        "cpu_time_s": processes.sum_min_count_1(_col(energy, "cpu_time_s")),
        "model_parameters": first["model_parameters"],
        "flops_estimate": first["flops_estimate"],
        "loss": first["loss"].where(ok, np.nan),
        "flops_status": first["model_parameters_method"],
        "config_hash": first["config_hash"],
        "code_version": first["code_version"],
        "device": rows.joined(energy["device"], ",").tolist(),
    }
    w = pd.concat([out, pd.DataFrame(columns, index=out.index)], axis=1)
    w["energy_per_output_token_j"] = w["gpu_energy_j"] / w["output_tokens"]
    w["energy_per_request_j"] = w["gpu_energy_j"] / w["requests"]
    w["energy_per_iteration_j"] = w["gpu_energy_j"] / w["iterations"]
    w["output_tokens_per_s"] = w["output_tokens"] / w["duration_s"]
    w["mean_gpu_power_w"] = w["gpu_energy_j"] / w["duration_s"]
    w["gpu_energy_idle_adjusted_j"] = w["gpu_energy_j"] - w["idle_gpu_power_w"] * w["duration_s"]
    w["energy_per_output_token_idle_adjusted_j"] = (
        w["gpu_energy_idle_adjusted_j"] / w["output_tokens"]
    )
    w["host_energy_per_output_token_j"] = w["host_energy_j"] / w["output_tokens"]
    w["mean_host_power_w"] = w["host_energy_j"] / w["duration_s"]
    w["host_energy_idle_adjusted_j"] = (
        w["host_energy_j"] - w["idle_host_power_w"] * w["duration_s"]
    )
    w["zeus_nvml_energy_ratio"] = w["gpu_energy_zeus_j"] / w["gpu_energy_j"]
    w["flops_estimate_per_s"] = w["flops_estimate"] / w["duration_s"]
    w["flops_estimate_per_j"] = w["flops_estimate"] / w["gpu_energy_j"]
    # Training windows: input_tokens = tokens trained on and requests = sequences (all replicas).
    train = w["phase"] == TRAIN_PHASE
    w["energy_per_train_token_j"] = (w["gpu_energy_j"] / w["input_tokens"]).where(train)
    w["train_tokens_per_s"] = (w["input_tokens"] / w["duration_s"]).where(train)
    w["samples_per_s"] = (w["requests"] / w["duration_s"]).where(train)
    return w


def bootstrap_ci(
    values, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
    level: float = CI_LEVEL,
) -> tuple[float, float]:
    """Percentile bootstrap CI of the median of ``values`` (NaNs dropped); NaNs if < 2 values."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if len(x) < 2:
        return np.nan, np.nan
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(x, size=(resamples, len(x)), replace=True), axis=1)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(medians, [tail, 100 - tail])
    return float(lo), float(hi)


def prefill_decode(win: pd.DataFrame) -> pd.DataFrame:
    """Per (job, point, repetition): the prefill/decode split from a generate and a prefill window.

    Returns one row per generate window with the split's columns and ``prefill_decode_status``.
    """
    keys = ["job_id", *POINT_KEYS, "repetition"]
    gen = win[win["phase"] == "generate"].set_index(keys)
    pre = win[win["phase"] == "prefill"].set_index(keys)
    out = pd.DataFrame(index=gen.index)
    pre = pre.reindex(gen.index)
    g_iter = gen["gpu_energy_j"] / gen["iterations"]
    p_iter = pre["gpu_energy_j"] / pre["iterations"]
    req_iter = gen["requests"] / gen["iterations"]
    decode_tokens_iter = gen["output_tokens"] / gen["iterations"] - req_iter
    g_time = gen["duration_s"] / gen["iterations"]
    p_time = pre["duration_s"] / pre["iterations"]
    out["prefill_energy_per_request_j"] = p_iter / req_iter
    decode_tokens = decode_tokens_iter.where(decode_tokens_iter > 0)
    out["decode_energy_per_output_token_j"] = (g_iter - p_iter) / decode_tokens
    out["prefill_energy_fraction"] = p_iter / g_iter
    out["prefill_s_per_iteration"] = p_time
    out["decode_output_tokens_per_s"] = decode_tokens / (g_time - p_time).where(g_time > p_time)
    status = pd.Series("ok", index=gen.index, dtype=object)
    no_energy = ~gen["gpu_energy_status"].isin(MEASURED) | ~pre["gpu_energy_status"].isin(MEASURED)
    status[no_energy] = "energy-unavailable"
    status[(g_iter - p_iter) < 0] = "decode-negative (prefill per iteration >= generate)"
    status[g_time <= p_time] = "decode-time-not-positive"
    status[~(decode_tokens_iter > 0)] = "no-decode-tokens (output_tokens is 1)"
    status[pre["status"].ne("ok")] = "no-prefill-window"
    status[gen["status"].ne("ok")] = "point-failed"
    out["prefill_decode_status"] = status
    return out.reset_index()


def _bootstrap_ci_groups(
    g: np.ndarray, values: np.ndarray, n: int, resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED, level: float = CI_LEVEL,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`bootstrap_ci` of each of ``n`` groups' values at once, with the same numbers.

    ``g`` (group ids) and ``values`` are aligned; each group's values are taken in their order.
    ``bootstrap_ci`` draws its resample indices from a fresh generator with a fixed seed, so they
    depend only on the number of values L and every group with L values shares them: ``drawn``
    counts how often each position is drawn in each resample. A resample's median is then an
    order statistic of the group's sorted values, found by counting the draws at or below each
    sorted value, and the percentiles come from one call along the resample axis.
    """
    lo, hi = np.full(n, np.nan), np.full(n, np.nan)
    keep = np.flatnonzero(~np.isnan(values))
    keep = keep[np.argsort(g[keep], kind="stable")]
    g, values = g[keep], values[keep]
    count = np.bincount(g, minlength=n)
    start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    tail = (1 - level) / 2 * 100
    for length in np.unique(count[count >= 2]):
        groups = np.flatnonzero(count == length)
        draws = np.random.default_rng(seed).choice(length, size=(resamples, length), replace=True)
        # drawn[j, r]: how often resample r draws position j.
        flat = (draws + length * np.arange(resamples)[:, None]).ravel()
        drawn = np.bincount(flat, minlength=resamples * length).reshape(resamples, length).T
        drawn = drawn.astype(np.int16 if length < 2**15 else np.int64)
        middle = [length // 2] if length % 2 else [length // 2 - 1, length // 2]
        per_chunk = max(1, 4_000_000 // resamples)  # bounds the (groups, resamples) arrays
        for chunk in np.array_split(groups, -(-len(groups) // per_chunk)):
            x = values[start[chunk, None] + np.arange(length)]
            order = np.argsort(x, axis=1, kind="stable")
            ordered = np.take_along_axis(x, order, axis=1)
            # below: draws of each resample among the group's j+1 smallest values; the k-th
            # smallest value drawn (0-based) is the sorted value at the count of j with below <= k.
            below = np.zeros((len(chunk), resamples), dtype=drawn.dtype)
            at = [np.zeros((len(chunk), resamples), dtype=drawn.dtype) for _ in middle]
            for j in range(length):
                below += drawn[order[:, j]]
                for pos, k in zip(at, middle, strict=True):
                    pos += below <= k
            picked = [np.take_along_axis(ordered, pos.astype(np.intp), axis=1) for pos in at]
            # np.median averages the two middle values, (a + b) / 2, of an even-sized sample.
            medians = picked[0] if length % 2 else (picked[0] + picked[1]) / 2
            lo[chunk], hi[chunk] = np.percentile(medians, [tail, 100 - tail], axis=1)
    return lo, hi


def _medians(frame: pd.DataFrame, gid: np.ndarray, n: int, columns: list[str]) -> pd.DataFrame:
    """Per group the median of each column (NaNs skipped; NaN when none is present)."""
    return frame[columns].astype(float).groupby(gid).median().reindex(range(n))


def summarize(win: pd.DataFrame) -> pd.DataFrame:
    """One row per grid point: medians and bootstrap CIs over repetitions; statuses say why.

    Vectorized over points (whole-frame passes); tests/unit/test_aggregate_reference.py checks
    it against the per-point loop it replaced.
    """
    split = prefill_decode(win) if len(win) else pd.DataFrame()
    head = win[win["phase"].isin(HEADLINE_PHASES)]
    if head.empty:
        return pd.DataFrame()
    ngroup = head.groupby(POINT_KEYS, sort=True).ngroup()
    head = head[ngroup.notna().to_numpy()].reset_index(drop=True)  # a null key has no point
    gid = ngroup.dropna().to_numpy(dtype=np.int64)
    n = int(gid.max()) + 1
    _, first_pos = np.unique(gid, return_index=True)
    first = head.iloc[first_pos].reset_index(drop=True)
    is_ok = (head["status"] == "ok").to_numpy()
    rows = _Groups(gid, n)
    good = _Groups(gid, n, np.flatnonzero(is_ok))
    ok = head[is_ok]
    ok_gid = gid[is_ok]
    n_rows, n_ok = rows.count, good.count
    training = (first["scenario"] == "training").to_numpy()

    med = _medians(
        ok.assign(
            host_energy_per_output_token_idle_adjusted_j=(
                ok["host_energy_idle_adjusted_j"] / ok["output_tokens"]
            )
        ),
        ok_gid, n,
        [
            "energy_per_output_token_j", "energy_per_request_j", "energy_per_iteration_j",
            "output_tokens_per_s", "mean_gpu_power_w", "energy_per_train_token_j",
            "train_tokens_per_s", "samples_per_s", "loss", "idle_gpu_power_w",
            "gpu_energy_idle_adjusted_j", "energy_per_output_token_idle_adjusted_j",
            "host_energy_per_output_token_j", "mean_host_power_w",
            "host_energy_per_output_token_idle_adjusted_j", "zeus_nvml_energy_ratio",
            "flops_estimate_per_s", "flops_estimate_per_j", "duration_s", "iterations",
            "output_tokens", "cpu_time_s",
        ],
    )

    def joined_ok(column: str, default: str) -> list:
        """The ok repetitions' distinct values, or ``default`` where there are none."""
        j = good.joined(head[column], ",")
        return np.where(j != "", j, default).tolist()

    def join_text(frame_rows: _Groups, column: str) -> list:
        v = _col(head, column)
        texts = np.array([isinstance(x, str) and x != "" for x in v])
        sub = _Groups(gid, n, frame_rows.rows[texts[frame_rows.rows]])
        return _null_if_empty(sub.joined(v, "; "))

    status_set = rows.joined(head["status"], ",")
    columns: dict = {
        **{k: first[k] for k in POINT_KEYS},
        "status": np.where(
            n_ok == n_rows, "ok", np.where(n_ok > 0, "partial", status_set)
        ).tolist(),
        "error": join_text(rows, "error"),
        "repetitions": n_rows,
        "repetitions_ok": n_ok,
        "energy_source": rows.joined(head["energy_source"], ",").tolist(),
        **{c: med[c].to_numpy() for c in (
            "energy_per_output_token_j", "energy_per_request_j", "energy_per_iteration_j",
            "output_tokens_per_s", "mean_gpu_power_w",
        )},
        "output_token_status": np.where(training, NO_OUTPUT_TOKENS, "ok").tolist(),
        "training_status": np.where(training, "ok", NOT_TRAINING).tolist(),
        **{c: med[c].to_numpy() for c in (
            "energy_per_train_token_j", "train_tokens_per_s", "samples_per_s", "loss",
        )},
    }
    for metric in ("energy_per_output_token_j", "output_tokens_per_s", "mean_gpu_power_w",
                   "energy_per_train_token_j"):
        lo, hi = _bootstrap_ci_groups(ok_gid, _col(ok, metric), n)
        columns[f"{metric}_ci_low"], columns[f"{metric}_ci_high"] = lo, hi
    columns["ci_status"] = [
        "ok" if k >= 2 else f"too-few-repetitions ({k} ok; a CI needs 2 or more)" for k in n_ok
    ]
    columns.update(
        {
            "gpu_energy_status": joined_ok("gpu_energy_status", "unavailable"),
            "gpu_energy_detail": join_text(good, "gpu_energy_detail"),
            "idle_gpu_power_w": med["idle_gpu_power_w"].to_numpy(),
            "gpu_energy_idle_adjusted_j": med["gpu_energy_idle_adjusted_j"].to_numpy(),
            "energy_per_output_token_idle_adjusted_j": med[
                "energy_per_output_token_idle_adjusted_j"
            ].to_numpy(),
            "idle_status": joined_ok("idle_status", "unavailable"),
        }
    )
    columns.update(_prefill_decode_columns(split, ok, ok_gid, n, n_ok, training))
    columns.update(
        {
            "host_energy_per_output_token_j": med["host_energy_per_output_token_j"].to_numpy(),
            "mean_host_power_w": med["mean_host_power_w"].to_numpy(),
            "host_energy_per_output_token_idle_adjusted_j": med[
                "host_energy_per_output_token_idle_adjusted_j"
            ].to_numpy(),
            "host_energy_status": joined_ok("host_energy_status", "unavailable"),
            "host_energy_detail": join_text(good, "host_energy_detail"),
            "idle_host_status": joined_ok("idle_host_status", "unavailable"),
            "zeus_nvml_energy_ratio": med["zeus_nvml_energy_ratio"].to_numpy(),
            "zeus_status": joined_ok("zeus_status", "not-requested"),
            "flops_estimate_per_s": med["flops_estimate_per_s"].to_numpy(),
            "flops_estimate_per_j": med["flops_estimate_per_j"].to_numpy(),
            "flops_status": rows.joined(head["flops_status"], ",").tolist(),
            "window_s": med["duration_s"].to_numpy(),
            "iterations_per_window": med["iterations"].to_numpy(),
            "output_tokens_per_window": med["output_tokens"].to_numpy(),
            **{
                c: head[c].groupby(gid).max().to_numpy().astype(np.int64)
                for c in ("n_processes", "n_gpus", "n_hosts")
            },
            "cpu_time_s": med["cpu_time_s"].to_numpy(),
            "device": rows.joined(head["device"], ",").tolist(),
            "config_hash": rows.joined(head["config_hash"], ",").tolist(),
            "code_version": rows.joined(head["code_version"], ",").tolist(),
        }
    )
    summary = pd.DataFrame(columns)
    for k in POINT_KEYS:  # as a frame built from rows of Python values has them
        if pd.api.types.is_integer_dtype(summary[k].dtype):
            summary[k] = summary[k].astype(np.int64)
    return summary


def _prefill_decode_columns(
    split: pd.DataFrame, ok: pd.DataFrame, ok_gid: np.ndarray, n: int, n_ok: np.ndarray,
    training: np.ndarray,
) -> dict:
    """Per point the prefill/decode split over its ok repetitions (see :func:`prefill_decode`)."""
    keys = ["job_id", *POINT_KEYS, "repetition"]
    cols = ["prefill_energy_per_request_j", "decode_energy_per_output_token_j",
            "prefill_energy_fraction", "prefill_s_per_iteration", "decode_output_tokens_per_s"]
    if len(split):
        rows = split.merge(ok[keys].assign(_point=ok_gid), on=keys, how="inner")
    else:
        rows = pd.DataFrame({"_point": np.array([], dtype=np.int64)})
    g = rows["_point"].to_numpy(dtype=np.int64)
    has = np.bincount(g, minlength=n) > 0
    out: dict = {}
    if len(rows):
        good = (rows["prefill_decode_status"] == "ok").to_numpy()
        timed = rows["prefill_s_per_iteration"].notna().to_numpy()
        for c in cols[:3]:
            out[c] = _medians(rows[good], g[good], n, [c])[c].to_numpy()
        for c in cols[3:]:
            out[c] = _medians(rows[timed], g[timed], n, [c])[c].to_numpy()
        status = _Groups(g, n).joined(rows["prefill_decode_status"].to_numpy(dtype=object), ",")
    else:
        out = {c: np.full(n, np.nan) for c in cols}
        status = np.full(n, "", dtype=object)
    out["prefill_decode_status"] = np.where(
        has, status,
        np.where(training, "not-applicable (training)",
                 np.where(n_ok > 0, "no-prefill-window (measurement.prefill_pass: false)",
                          "point-failed")),
    ).tolist()
    return out


def unexplained_nulls(summary: pd.DataFrame) -> list[str]:
    """``column[row]`` for every null in ``summary`` that no status column explains."""
    bad = []
    for col in summary.columns:
        nulls = summary[col].isna()
        if col in INFO_COLUMNS:
            continue
        if not nulls.any():
            continue
        explainers = NULL_STATUS.get(col)
        if explainers is None:
            bad += [f"{col}[{i}] (no status column)" for i in summary.index[nulls]]
            continue
        for i in summary.index[nulls]:
            if all(str(summary.at[i, s]) in OK_STATUSES for s in explainers if s in summary):
                bad.append(f"{col}[{i}]")
    return bad


def environment_table(job_json_paths: list[str | Path],
                      records: dict[Path, dict] | None = None) -> pd.DataFrame:
    """Every job's environment (job.json) as one row per (job, GPU); join on ``job_id``."""
    from energysweep.envinfo import environment_rows

    rows = []
    for p in job_json_paths:
        record = records[Path(p)] if records is not None else json.loads(Path(p).read_text())
        rows += environment_rows(record)
    return pd.DataFrame(rows)


def aggregate(
    paths: list[str | Path], energy_out: str | Path, summary_out: str | Path,
    jobs: list[str | Path] | None = None, environment_out: str | Path | None = None,
    snakemake_args: list[str] | None = None,
    validation_out: str | Path | None = None, stages_out: str | Path | None = None,
    validity_config: dict | None = None,
) -> None:
    """Merge shards or job tables (``paths``; same schema) into ``energy_out`` (a hive-partitioned
    Parquet dataset, see
    :func:`write_dataset`) and write the per-point ``summary_out`` (CSV).

    With ``jobs`` (job.json paths), every job table is verified against its job.json first
    (:func:`merge`); with ``environment_out`` too, also write the environment table. With
    ``validation_out``/``stages_out``, also re-check every window against the jobs' power
    timelines, write the validation table and the per-stage table, and add the validity verdict
    to the summary (energysweep.validity; thresholds ``validity_config``).

    All or nothing: everything is read, checked and computed before the first write; each
    output is written to a temp name beside it, and only when all are written are they renamed
    into place. A failed merge (a bad job table, a full disk) leaves the previous outputs as
    they were and no partial file under an output's name.

    Raises:
        MergeInputError: a job table or job.json is missing, unreadable, or disagrees with its
            job.json; the message names each, its job, and the command that reruns it.
    """
    import pyarrow.parquet as pq

    records = load_job_records(jobs, snakemake_args) if jobs is not None else None
    table = merge(paths, records, snakemake_args)
    summary = summarize(windows(table.select(WINDOW_COLUMNS).to_pandas()))
    validation = stages = None
    if validation_out is not None or stages_out is not None:
        summary, validation, stages = validity.evaluate(
            summary, table.select(validity.ROW_COLUMNS).to_pandas(), jobs or [], validity_config,
        )
    # (output path, writer of a temp file beside it), in publishing order.
    files: list[tuple[Path, object]] = [
        (Path(summary_out), lambda tmp: summary.to_csv(tmp, index=False)),
    ]
    if jobs is not None and environment_out is not None:
        env = pa.Table.from_pandas(environment_table(jobs, records), preserve_index=False)
        files.append((Path(environment_out), lambda tmp: pq.write_table(env, tmp)))
    if validation_out is not None:
        files.append((Path(validation_out), lambda tmp: pq.write_table(
            pa.Table.from_pandas(validation, preserve_index=False), tmp)))
    if stages_out is not None:
        files.append((Path(stages_out), lambda tmp: stages.to_csv(tmp, index=False)))
    energy_out = Path(energy_out)
    staged: list[tuple[Path, Path]] = []
    writing = energy_out
    try:
        staged.append((_write_dataset_tmp(table, energy_out), energy_out))
        umask = os.umask(0)
        os.umask(umask)
        for out, write in files:
            writing = out
            out.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".tmp-{out.name}-", dir=out.parent)
            os.close(fd)
            staged.append((Path(tmp), out))
            write(tmp)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are for everyone
        for tmp_path, out in staged:
            _swap_in(tmp_path, out)
        staged = []
    except OSError as exc:  # a full disk, say: name the output (pyarrow's errors do not)
        raise tables_io.write_error(exc, writing) from exc
    finally:
        for tmp_path, _ in staged:
            if tmp_path.is_dir():
                shutil.rmtree(tmp_path, ignore_errors=True)
            else:
                tmp_path.unlink(missing_ok=True)
