# Grid construction and input functions. The grid logic itself lives in energysweep.sweep.grid
# (config, grid) and energysweep.job (placement, spec); this file only turns it into Snakemake
# patterns.
import os
import sys
from pathlib import Path

import pandas as pd
from snakemake.utils import Paramspace

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from energysweep.sweep import config as es_config
from energysweep.sweep import interpreters
from energysweep.sweep import gpu_axes
from energysweep.util.version import code_version
from energysweep.job.backends import BACKENDS
from energysweep.job.spec import JobDir, JobKey, JobSpec
from energysweep.archive.crate import crate_name, config_emulated
from energysweep.launch import gpu_claims
from energysweep.util import sigterm, slurm_status

# Snakemake's SIGTERM handler can deadlock on its scheduler's lock (energysweep.util.sigterm):
# a lock-free one in this process, the head Snakemake's as every Slurm job's.
from snakemake.scheduling.job_scheduler import JobScheduler

sigterm.patch(JobScheduler)

# ENERGYSWEEP_SLURM_STATUS_MAX_S caps the Slurm plugin's wait between two checks of its jobs
# (energysweep.util.slurm_status; the test cluster answers at once, tests/conftest.py sets it).
_status_max_s = slurm_status.max_interval(os.environ)
if _status_max_s is not None:
    from snakemake_executor_plugin_slurm import Executor as SlurmExecutor

    slurm_status.cap(SlurmExecutor, _status_max_s)

# Our own schema validation (defaults filled) names the key and the fix for every bad value,
# before any job exists.
es_config.validate_schema(
    config, Path(workflow.basedir) / "config" / "config.schema.yaml"
)
USE_CONDA = "conda" in str(workflow.deployment_settings.deployment_method).lower()
# Every backend's environment is checked here, before any job: its interpreter exists and the
# engine imports there (energysweep.sweep.interpreters).
es_config.check(
    config,
    base_dir=Path.cwd(),
    use_conda=USE_CONDA,
    # A dry run or a lint executes nothing: an engine missing here is a warning, not an error.
    # (Snakemake exposes no lint setting to the workflow; its own command line says it.)
    dry_run=bool(getattr(workflow.output_settings, "dryrun", False))
    or "--lint" in sys.argv,
    workflow_dir=workflow.basedir,
)

GRID = es_config.build_grid(config, Path.cwd())
# A local run starts no more GPU work at once than this node has GPUs (each job also claims its
# own: energysweep.launch.gpu_claims); `--resources gpu=N` overrides it. A cluster run submits
# with --jobs (Snakemake's `nodes`, by which its own scheduler tells cluster submission apart):
# Slurm allocates. (`workflow.local_exec` cannot tell them apart here: Snakemake sets the
# executor after reading the Snakefile, so it is True while it is read, and a Slurm sweep was
# held to the GPU count of the machine it was submitted from: on the emulated node, its 4 GPUs
# across the cluster, 2-GPU jobs submitted two at a time.)
if (
    workflow.global_resources["_nodes"].value is None
    and "gpu" not in workflow.global_resources
    and not os.environ.get("SLURM_JOB_ID")
):
    NODE_GPUS = gpu_claims.node_gpu_count(config["measurement"])
    if NODE_GPUS:
        workflow.register_resource("gpu", NODE_GPUS)
# A layout asking one node for more CPUs/memory than it has would wait for ever: refuse it now.
es_config.check_node_fit(config, GRID)
# The whole config's hash (results/config.yaml `sweep_hash`); each job's own is its
# `config_hash` (energysweep.job.spec.config_hash).
SWEEP_HASH = es_config.sweep_hash(config)
CODE_VERSION = code_version(workflow.basedir)
MODELS = {m["name"]: m for m in config["models"]}
BATCH_SIZES = sorted(config["workload"]["batch_sizes"])
# A serving job's batch axis is the engine's batch cap (config serving.batch_caps).
SERVING_CAPS = sorted(config["serving"]["batch_caps"] or BATCH_SIZES)
REPS = list(range(config["workload"]["repetitions"]))

# The job-key columns of this sweep's paths: JOB_KEYS, the GPU setting axes (gpu.power_limit_w,
# gpu.clock) only where the config sweeps them (energysweep.sweep.gpu_axes.path_keys).
PATH_KEYS = gpu_axes.path_keys(config)
JOBS = pd.DataFrame([j.wildcards() for j in GRID.jobs], columns=PATH_KEYS)
PARAMS = Paramspace(JOBS)
JOB_DIR = f"results/shards/{PARAMS.wildcard_pattern}"
# Every output path of one job (energysweep.job.spec.JobDir), as wildcard patterns.
JOB_PATHS = JobDir(JOB_DIR)


wildcard_constraints:
    model=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    backend="|".join(BACKENDS),
    scenario=r"inference|training|serving",
    tp=r"\d+",
    pp=r"\d+",
    dp=r"\d+",
    power_limit_w=gpu_axes.WILDCARD_CONSTRAINTS["power_limit_w"],
    gpu_clock=gpu_axes.WILDCARD_CONSTRAINTS["gpu_clock"],


def world_size(wildcards):
    return int(wildcards.tp) * int(wildcards.pp) * int(wildcards.dp)


_JOB_SPECS = {}


def get_job(wildcards):
    """The typed job of these wildcards (energysweep.job.spec.JobSpec), built once per job."""
    key = JobKey.from_strings({k: getattr(wildcards, k) for k in PATH_KEYS})
    if key not in _JOB_SPECS:
        _JOB_SPECS[key] = JobSpec.from_config(config, key)
    return _JOB_SPECS[key]


def get_placement(wildcards):
    """The job's placement on nodes (computed once, on the typed job: JobSpec.placement)."""
    return get_job(wildcards).placement


def get_node_request(wildcards):
    """What each node of this job is asked for (energysweep.job.placement.Placement)."""
    return get_placement(wildcards).node_request


def get_threads(wildcards):
    """CPUs per Slurm task (--cpus-per-task): one per rank on a node, over the node's tasks.

    Per node, not per job: a 2-node job of 8 ranks asks each node for 4 CPUs, not 8.
    """
    return get_node_request(wildcards).cpus_per_task


def get_nodes(wildcards):
    """Nodes a layout spans: one GPU per rank, parallel.gpus_per_node per node."""
    return get_placement(wildcards).nodes


def multi_node(wildcards):
    return get_nodes(wildcards) > 1


def get_gpu(wildcards):
    """Single node: the job's GPUs (sbatch --gpus=N). Multi-node jobs use gres instead."""
    return None if multi_node(wildcards) else world_size(wildcards)


def get_gres(wildcards):
    """Multi-node: GPUs per node (sbatch --gres=gpu:G)."""
    if not multi_node(wildcards):
        return None
    return f"gpu:{world_size(wildcards) // get_nodes(wildcards)}"


def get_mpi(wildcards):
    """Multi-node jobs are not wrapped in `srun -n1`: energysweep.launch.argv starts one torchrun per node."""
    return "srun" if multi_node(wildcards) else None


def get_tasks(wildcards):
    """Multi-node jobs: one task per node (one torchrun each), or tp*pp MPI ranks under the mpi
    launch mode (TensorRT-LLM). Never set on single-node GPU jobs, where the plugin would turn
    it into --ntasks-per-gpu (plugin issue #459)."""
    return get_placement(wildcards).slurm_tasks


def get_tasks_per_gpu(wildcards):
    """0 stops the plugin from deriving --ntasks-per-gpu from `tasks` on multi-node jobs."""
    return 0 if multi_node(wildcards) else None


def get_model_input(wildcards):
    """The built tiny model is a rule output; a user checkpoint is read in place (params)."""
    if MODELS[wildcards.model]["path"] == es_config.BUILTIN_TINY:
        return {"model": f"resources/models/{wildcards.model}"}
    return {}


def get_conda_env(wildcards):
    """The measure job's environment under --software-deployment-method conda: one per backend."""
    return str(Path(workflow.basedir) / BACKENDS[wildcards.backend].conda_env)


def get_python(wildcards):
    """Interpreter of the job's ranks, or of a serving job's load client (energysweep.sweep.
    interpreters decides); "" = the job's own."""
    python, _ = interpreters.job_interpreters(
        wildcards.backend,
        wildcards.scenario,
        config["environments"],
        workflow.basedir,
        USE_CONDA,
    )
    return python or ""


def get_server_python(wildcards):
    """Interpreter of a serving job's server (its backend's environment); "" elsewhere."""
    _, python = interpreters.job_interpreters(
        wildcards.backend,
        wildcards.scenario,
        config["environments"],
        workflow.basedir,
        USE_CONDA,
    )
    return python or ""


def get_tiny_spec(wildcards):
    return MODELS[wildcards.model].get("spec", {})


def get_model_dir(wildcards, input):
    if "model" in input.keys():
        return str(Path(input.model).resolve())
    return str(
        es_config.resolve_model_path(MODELS[wildcards.model]["path"], Path.cwd())
    )


def get_job_spec(wildcards):
    """Everything that determines a job's numbers, as data (JSON, never through a shell).

    Snakemake params get the typed job's JSON form (get_job), which scripts/measure.py loads
    back into a JobSpec.
    """
    return get_job(wildcards).to_json()


def get_slurm_extra(wildcards):
    """`--gpu-freq=<gpu.clock>` on the job's sbatch: Slurm sets the clocks (and resets them)."""
    return gpu_axes.slurm_extra(get_job(wildcards).key)


def get_constraint(wildcards):
    """The node feature asking the site's prolog for the power limit (gpu.power_limit_method
    slurm-prolog), else None (no --constraint)."""
    return gpu_axes.constraint(get_job(wildcards).key, config)


def get_all_job_records():
    return expand(
        JobDir("results/shards/{params}").job_json, params=PARAMS.instance_patterns
    )


STAGE_TABLE = "results/stages.csv"
# The report's first screen (rules/report.smk, included by report/workflow.rst).
HEADLINE = "results/report/headline.html"


def report_figure(name, category, question):
    """A figure output marked for the report: caption report/<name>.rst, listed by question."""
    return report(
        f"results/plots/{name}.png",
        caption=f"../report/{name}.rst",
        category=category,
        labels={"figure": question},
    )


def get_figure_inputs(wildcards):
    """The tables the figures read; the per-stage table only where a rule produces it (it
    arrives with the validity work; without it the stage figure is a note)."""
    inputs = {
        "summary": "results/summary.csv",
        "energy": "results/energy.parquet",
        "jobs": get_all_job_records(),
    }
    if any(str(f) == STAGE_TABLE for r in workflow.rules for f in r.output):
        inputs["stages"] = STAGE_TABLE
    return inputs


def get_final_outputs():
    return [
        "results/config.yaml",
        "results/grid/jobs.tsv",
        "results/grid/skipped.tsv",
        "results/energy.parquet",
        "results/summary.csv",
        # Every figure and report page (rules/report.smk; called after it is included).
        *rules.figures.output,
        *rules.report_pages.output,
        HEADLINE,
        *rules.exports.output,
    ]


def get_archive_name():
    """The crate's name: the sweep's hash, and EMULATED for a sweep on the emulated GPU node."""
    return crate_name(SWEEP_HASH, config_emulated(config))


def get_archive_path():
    return f"results/archive/{get_archive_name()}.crate.zip"


def get_preflight_slots():
    """Node slots preflight checks: as many as the largest layout of the sweep spans."""
    return list(range(max([get_nodes(j) for j in JOBS.itertuples()], default=1)))


def get_preflight_gpus(wildcards):
    """GPUs of one preflight job: as many as one node of the sweep's largest layout uses."""
    return min(
        config["parallel"]["gpus_per_node"],
        max([world_size(j) for j in JOBS.itertuples()], default=1),
    )


def get_mem_mb(wildcards, attempt):
    """Host memory per node (sbatch --mem); a retry after an OOM kill asks for more, at most
    parallel.mem_mb_per_node (more could never be granted: the job would wait for ever).
    """
    mem = get_node_request(wildcards).mem_mb_per_node * attempt
    cap = config["parallel"]["mem_mb_per_node"]
    return min(mem, cap) if cap else mem


def get_attempt(wildcards, attempt):
    """Which attempt of the job this is (1, then 2 on a retry): the measure step logs it.
    Snakemake gives the attempt to resource functions only, not to a script's object."""
    return attempt


# Snakemake reads an input/params/resources function's signature (inspect.signature) each time it
# calls it: ~37 times per measure job, 7-9 % of `snakemake -n` at 3,000 jobs
# (bench/dag_scaling.py, bench/README.md). Its own hook stores the parameters once per function.
# Functions missing from this list still work, only without the saving.
from snakemake.common import overwrite_function_params
import inspect

for _func in (
    world_size,
    get_job,
    get_placement,
    get_node_request,
    get_threads,
    get_nodes,
    get_gpu,
    get_gres,
    get_mpi,
    get_tasks,
    get_tasks_per_gpu,
    get_model_input,
    get_conda_env,
    get_python,
    get_server_python,
    get_tiny_spec,
    get_model_dir,
    get_job_spec,
    get_mem_mb,
    get_attempt,
    get_slurm_extra,
    get_constraint,
):
    overwrite_function_params(_func, inspect.signature(_func).parameters)
