"""The energy shard table: its one Parquet schema, the keys of a point and a window, the
writer and the validating reader.

A shard holds one measured window (or one failed grid point) of one job: one row per
(rank, GPU) that took part. Nothing in a shard is 0 where nothing was measured: such values are
null and the matching ``*_status`` column says why.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from energysweep.job.spec import JOB_KEYS
from energysweep.tables.io import write_atomic

# v2: phase prefill, energy_source, min_window_s, Zeus cross-check, idle baseline, host (RAPL)
# energy, model_parameters, flops_estimate and loss (training) columns.
# v3: launcher_processes and gpu_workers (what the process audit expects per launch mode).
# v5: gpu_processes_status and gpu_processes_foreign (who else computed on the GPU at the
# window's edges: the gpu_shared check), idle_settle_s, gpu_edge_read_max_ms.
# v4: scenario serving: the point key `load`, and the serving columns (load, rates, errors,
# goodput, ramp/drain, queue, latency percentiles) with serving_status; the GPU setting behind
# every row (gpu.power_limit_w, gpu.clock: asked, read back, status), node energy (Slurm's
# accounting), Slurm step, account and node name.
# v6: server_requests_completed (the server's own count of a serving window's requests).
SCHEMA_VERSION = 6

# The shard schema, one column a line: name, pyarrow type, "null" if the column may be null (else
# "-"), meaning. An indented line continues the meaning above; "#" lines are headings. The README's
# schema table is generated from it (markdown_table).
_COLUMNS_TABLE = """
# The job: one model load, one layout, one code version.
schema_version          int16   -    version of this schema
job_id                  string  -    unique id of the job run (one model load, one layout)
config_hash             string  -    sha256 prefix of the settings that determine this job (its
                                     JobSpec, no paths: job.spec.config_hash; not the sweep_hash)
code_version            string  -    energysweep version + git commit (+dirty)
model                   string  -    model name from the config
backend                 string  -    pytorch | vllm | tensorrt-llm
scenario                string  -    inference | training | serving
tp                      int16   -    tensor-parallel degree
pp                      int16   -    pipeline-parallel degree
dp                      int16   -    data-parallel degree
world_size              int16   -    GPUs of the layout: tp*pp*dp
launch_mode             string  -    torchrun (one process per GPU) | direct (one process per DP
                                     replica; the engine spawns its GPU workers) | mpi (one replica
                                     over several nodes, srun starts tp*pp MPI ranks) | server (one
                                     client; the engine's server spawns its GPU workers)
launcher_processes      int16   -    processes our code ran in, as the process audit checked them
                                     (tp*pp*dp for torchrun, dp for direct, 1 for mpi and server)
gpu_workers             int16   -    processes computing on a GPU: tp*pp*dp in every mode
# The GPU setting the job asked for (grid axes gpu.power_limit_w, gpu.clock; part of the point).
power_limit_w           string  -    the point's gpu.power_limit_w in W as text (300, 312.5), or
                                     unset (left as the node has it); a job-key column
gpu_clock               string  -    the point's gpu.clock (Slurm --gpu-freq vocabulary), or unset;
                                     a job-key column
# The window: one (batch size, repetition, phase) of the job, and what ran in it.
batch_size              int32   -    per-replica batch size (serving: the engine's batch cap,
                                     max_num_seqs)
global_batch_size       int32   -    batch_size * dp
load                    string  -    the point's load: batch (fixed batches: inference, training) |
                                     rate=R[,burstiness=B] | concurrency=C (serving)
repetition              int16   -    repetition index of this window
phase                   string  -    what the window ran: generate (output_tokens new tokens) |
                                     prefill (1 new token) | train (optimizer steps) | serve (a
                                     server's steady state under load)
status                  string  -    ok | oom | error
error                   string  null error message when status != ok
window_start_ns         int64   null window start, ns since epoch (after sync + barrier)
window_end_ns           int64   null window end, ns since epoch (after sync + barrier)
iterations              int32   null measured iterations in the window (>= workload.iterations,
                                     window >= min_window_s)
min_window_s            float64 -    measurement.min_window_s the window was run with
requests                int64   null prompts completed in the window, all replicas (serving:
                                     requests that ended inside it)
input_tokens            int64   null prompt tokens (excluding padding) in the window, all replicas
                                     (serving: of requests whose first token came inside it)
output_tokens           int64   null generated tokens in the window, all replicas (serving: tokens
                                     that arrived inside it)
# The rank that wrote this row and where it ran.
rank                    int32   -    global rank that produced this row
local_rank              int32   -    rank within its node
pid                     int64   -    process id of that rank
host                    string  -    hostname of that rank
device                  string  -    torch device the rank computed on (cpu, cuda:0)
dp_rank                 int16   -    replica index of that rank
pp_rank                 int16   -    pipeline stage of that rank
tp_rank                 int16   -    tensor-parallel index of that rank
is_writer               bool_   -    whether that rank writes its replica's outputs
# The GPU this row measured, and its energy over the window.
gpu_uuid                string  null GPU measured (UUID); null when no GPU energy was available
gpu_index               int32   null NVML index of that GPU
gpu_pci_bus_id          string  null PCI bus id of that GPU
gpu_name                string  null product name of that GPU
gpu_energy_mj           float64 null GPU energy over the window in mJ; null if not measured
gpu_energy_status       string  -    measured | short-window | unavailable
gpu_energy_method       string  -    how gpu_energy_mj was obtained; prefixed emulated: on the
                                     emulated GPU node (measurement.device emulated)
gpu_energy_detail       string  null why energy is unavailable or flagged
gpu_edge_read_max_ms    float64 null slowest energy-counter read (between its bracketing timestamps,
                                     with any late wake-up of the poll before it) that fixed a
                                     counter refresh at this window's edges, in ms; or, if
                                     longer, how far the start value extrapolated past a
                                     refresh it missed (in serving also the end value, back
                                     past a refresh it skipped), or how much later than the window's
                                     the rank took its edges (late out of a barrier);
                                     above validity.counter_period_s / 4 the verdict says
                                     edge_read_slow; null where no counter read at aligned edges
energy_source           string  -    GPU energy source used: nvml | zeus | cross-check | none (auto
                                     resolved); prefixed emulated: on the emulated GPU node
gpu_energy_mj_zeus      float64 null cross-check: Zeus's energy for the same GPU and window in mJ
gpu_energy_zeus_status  string  -    not-requested (source is not cross-check) | measured |
                                     short-window | unavailable
# This GPU's power limit and clocks: asked, read back right outside the window's edges.
gpu_power_limit_target_w float64 null power limit this GPU was asked for in W; null when unset
gpu_sm_clock_target_mhz int32   null applications SM clock gpu.clock resolves to on this GPU (as
                                     Slurm resolves it); null when unset
gpu_mem_clock_target_mhz int32  null applications memory clock gpu.clock resolves to
gpu_power_limit_w       float64 null enforced power limit read back before the window's start, W
gpu_power_limit_end_w   float64 null enforced power limit read back after the window's end, W
gpu_default_power_limit_w float64 null this GPU's default power limit, W
gpu_app_sm_clock_mhz    int32   null applications SM clock read back before the window's start
gpu_app_mem_clock_mhz   int32   null applications memory clock read back before the window's start
gpu_default_sm_clock_mhz int32  null this GPU's default applications SM clock
gpu_sm_clock_mhz        int32   null SM clock the GPU ran at, read right after the window's end
gpu_mem_clock_mhz       int32   null memory clock read right after the window's end
gpu_power_limit_status  string  -    unset | applied (read back as asked) | refused (the setter
                                     failed) | not-applied (read back otherwise) | unverified (no
                                     GPU or NVML to read it from)
gpu_clock_status        string  -    the same for gpu.clock
gpu_setting_detail      string  null how a setting was refused or read back otherwise
# The idle baseline measured before any window (the *_idle_adjusted_* figures subtract it).
idle_window_s           float64 null length of the job's idle-baseline window in s (before any
                                     window); null if none
idle_gpu_power_w        float64 null this GPU's idle power in W (idle baseline)
idle_gpu_power_status   string  -    measured | short-window | skipped (idle_baseline_s 0) |
                                     unavailable
idle_settle_s           float64 null s waited after the warm-up for this GPU's power to settle
                                     before the idle baseline (bounded); null if not waited for
# Other processes on this GPU (nvmlDeviceGetComputeRunningProcesses at both window edges).
gpu_processes_status    string  -    ok (only the job's processes) | shared (another process
                                     computed on the GPU: the verdict's gpu_shared) | unverifiable
                                     (...) | unavailable (...) | not-applicable (...)
gpu_processes_foreign   string  null the other processes and the edge(s) they were seen at ("pid
                                     4242 at start+end"); null when none
# The host (RAPL) and this process's CPU time.
host_energy_mj          float64 null RAPL CPU package energy of this host over the window in mJ
                                     (local rank 0 rows only)
host_dram_energy_mj     float64 null RAPL DRAM energy of this host in mJ
host_energy_status      string  -    measured | not-read (another rank of this host reads it) |
                                     unavailable
host_energy_detail      string  null zones read, or why host energy is unavailable
idle_host_power_w       float64 null this host's idle package power in W (RAPL)
idle_host_power_status  string  -    measured | not-read | skipped | unavailable
cpu_time_s              float64 null user+system CPU seconds of this rank's process in the window
# The node (Slurm's energy accounting: the boundary ladder's node rung).
node_energy_mj          float64 null node energy over the window, all the job step's nodes (Slurm
                                     ConsumedEnergy via sstat; global rank 0's rows) in mJ
node_energy_status      string  -    measured | short-window | not-read (rank 0 reads it) |
                                     unavailable
node_energy_method      string  -    slurm-sstat-consumed-energy | none
node_energy_detail      string  null Slurm's energy plugin and step, or why node energy is
                                     unavailable
# The model and the work it did.
model_parameters        int64   null parameters of one model replica (all its ranks)
model_parameters_method string  -    counted (checkpoint config built on the meta device) | config
                                     (models[].dims) | unavailable
flops_estimate          float64 null ESTIMATE window FLOPs, all GPUs: 2 * model_parameters *
                                     (input_tokens + output_tokens) for inference, 6 *
                                     model_parameters * input_tokens for training
loss                    float64 null training: mean global-batch loss over the window's steps; null
                                     for inference
# Serving: one load run's window (scenario serving; null elsewhere, serving_status says why).
load_mode               string  -    batch | rate (open loop) | concurrency (closed loop)
offered_load            float64 null rate: requests/s offered; concurrency: requests kept in flight
burstiness              float64 null rate: gamma shape of the inter-arrival times (1 = Poisson)
requests_sent           int64   null requests sent in the load run (ramp, window and drain)
request_errors          int64   null requests of the load run that failed (any phase)
requests_cancelled      int64   null requests still queued when the drain's running ones ended,
                                     cancelled (they never ran inside the window; no error)
requests_dropped        int64   null rate: arrivals not sent, the client already having 64 per
                                     engine slot (and >= 1024) in flight; offered, not taken on
arrival_rate_rps        float64 null requests sent inside the window / its length
achieved_rate_rps       float64 null requests completed inside the window / its length
achieved_concurrency    float64 null mean requests running in the engine over the window (its
                                     /metrics, sampled at serving.metrics_hz)
load_sustained          float64 null share of the offered load the server took on: rate: 1 - queue
                                     growth over the window / requests sent in it (queue: requests
                                     in flight beyond cap x dp); concurrency: 1 - mean requests
                                     waiting in its queue (/metrics) / requests kept in flight
slo_met_requests        int64   null requests completed in the window within serving.slo
ramp_s                  float64 null first request sent -> window start (outside the window)
drain_s                 float64 null window end -> last request finished (outside the window)
queue_waiting_mean      float64 null mean requests waiting in the server's queue over the window
queue_waiting_max       float64 null most requests waiting in the server's queue in the window
queue_time_mean_s       float64 null mean server-side queue time of the requests the engine
                                     scheduled in the window (its /metrics histogram)
server_requests_completed int64 null requests the server itself completed inside the window (its
                                     /metrics counter, e.g. vllm:request_success_total, read at
                                     both edges): a cross-check of `requests`
ttft_p50_s              float64 null median time to first token of the window's completed requests
ttft_p99_s              float64 null 99th percentile time to first token
tpot_p50_s              float64 null median time per output token after the first
tpot_p99_s              float64 null 99th percentile time per output token
itl_p50_s               float64 null median inter-token latency (every gap of those requests)
itl_p99_s               float64 null 99th percentile inter-token latency
e2e_p50_s               float64 null median end-to-end request latency
e2e_p99_s               float64 null 99th percentile end-to-end request latency
serving_status          string  -    ok | not-applicable (...) | what is unavailable, "; "-joined:
                                     queue-unavailable (...), queue-time-unavailable (...),
                                     server-count-unavailable (...)
# The scheduler.
slurm_job_id            string  null SLURM_JOB_ID, null outside Slurm
slurm_step_id           string  null SLURM_STEP_ID (the step the ranks ran in)
slurm_partition         string  null SLURM_JOB_PARTITION
slurm_account           string  null SLURM_JOB_ACCOUNT
slurm_node              string  null SLURMD_NODENAME: Slurm's name of this rank's node
slurm_nodelist          string  null SLURM_JOB_NODELIST
# Per node: on a 2-node job every host sees e.g. "0,1". The job's GPU count is the layout's
# tp*pp*dp (and sacct's gres/gpu), never these lists concatenated across hosts.
allocated_gpus          string  null GPUs the scheduler gave this rank's node (CUDA_VISIBLE_DEVICES;
                                     per node, not per job)
"""


def _parse_columns(text: str) -> list[tuple[str, pa.DataType, bool, str]]:
    """:data:`_COLUMNS_TABLE` as (name, type, nullable, description) tuples, in order."""
    columns: list[tuple[str, pa.DataType, bool, str]] = []
    for line in text.strip("\n").splitlines():
        if line.startswith("#"):
            continue
        if line.startswith(" "):  # the meaning above, continued
            name, arrow_type, null_ok, meaning = columns[-1]
            columns[-1] = (name, arrow_type, null_ok, f"{meaning} {line.strip()}")
            continue
        name, kind, nullable, meaning = line.split(maxsplit=3)
        columns.append((name, getattr(pa, kind)(), nullable == "null", meaning))
    return columns


COLUMNS = _parse_columns(_COLUMNS_TABLE)

# A measure job's directory (energysweep.job.spec.JobDir) holds one shard per (batch size,
# repetition) and the same rows again in one file, the job table (what aggregation reads).

# A grid point, and one measured window of it (a job runs each point's repetitions and phases).
POINT_KEYS = [*JOB_KEYS, "batch_size", "load"]
# The load of every point that is not a serving load level: fixed batches.
BATCH_LOAD = "batch"
# The serving group's nullable columns (null outside a serving window).
SERVING_NULLABLE = [
    "offered_load", "burstiness", "requests_sent", "request_errors", "requests_cancelled",
    "requests_dropped", "arrival_rate_rps",
    "achieved_rate_rps", "achieved_concurrency", "load_sustained", "slo_met_requests", "ramp_s",
    "drain_s",
    "queue_waiting_mean", "queue_waiting_max", "queue_time_mean_s", "server_requests_completed",
    "ttft_p50_s", "ttft_p99_s",
    "tpot_p50_s", "tpot_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p50_s", "e2e_p99_s",
]  # fmt: skip
WINDOW_KEYS = ["job_id", *POINT_KEYS, "repetition", "phase"]

SCHEMA = pa.schema([pa.field(n, t, nullable=null) for n, t, null, _ in COLUMNS])


class ShardError(ValueError):
    """A file that is not a valid shard."""


def to_table(rows: list[dict]) -> pa.Table:
    """Rows (dicts with every column) to a table of the shard schema; checks nullability."""
    missing = [n for n in SCHEMA.names if rows and n not in rows[0]]
    if missing:
        raise ShardError(f"rows lack columns {missing}")
    extra = set().union(*(r.keys() for r in rows)) - set(SCHEMA.names) if rows else set()
    if extra:
        raise ShardError(f"rows have columns not in the schema: {sorted(extra)}")
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    for field in SCHEMA:
        if not field.nullable and table.column(field.name).null_count:
            raise ShardError(f"column {field.name} may not be null")
    return table


def concat(tables: list[pa.Table]) -> pa.Table:
    """Shards (tables of this schema) as one table with one chunk; empty list: empty table."""
    if not tables:
        return SCHEMA.empty_table()
    return pa.concat_tables(tables).combine_chunks()


def write_shard(rows: list[dict], path: str | Path) -> None:
    write_atomic(to_table(rows), path)


def read_shard(path: str | Path) -> pa.Table:
    """Read one shard (or job table) and check it has exactly the shard schema."""
    # ParquetFile.read, not pq.read_table: no dataset discovery per file (2x faster on the many
    # small files of a sweep, bench/merge_scaling.py).
    table = pq.ParquetFile(path).read(use_threads=False)
    if not table.schema.equals(SCHEMA, check_metadata=False):
        raise ShardError(
            f"{path}: schema differs from energysweep.tables.shards.SCHEMA "
            f"v{SCHEMA_VERSION} ({schema_difference(table.schema)})"
        )
    return table


def schema_difference(schema: pa.Schema) -> str:
    """How ``schema`` differs from :data:`SCHEMA`: missing, extra and retyped columns."""
    ours = {f.name: f for f in SCHEMA}
    theirs = {f.name: f for f in schema}
    parts = []
    if missing := [n for n in ours if n not in theirs]:
        parts.append(f"missing columns {missing}")
    if extra := [n for n in theirs if n not in ours]:
        parts.append(f"extra columns {extra}")
    changed = [
        f"{n}: {theirs[n].type} (nullable={theirs[n].nullable}), expected "
        f"{ours[n].type} (nullable={ours[n].nullable})"
        for n in ours
        if n in theirs and not theirs[n].equals(ours[n])
    ]
    if changed:
        parts.append("changed " + "; ".join(changed))
    if not parts and schema.names != SCHEMA.names:
        parts.append("columns in another order")
    return ", ".join(parts) or "field metadata differs"


def markdown_table() -> str:
    """The schema as a Markdown table (for the README)."""
    lines = ["| column | type | nullable | meaning |", "|---|---|---|---|"]
    lines += [f"| `{n}` | {t} | {'yes' if null else 'no'} | {d} |" for n, t, null, d in COLUMNS]
    return "\n".join(lines)
