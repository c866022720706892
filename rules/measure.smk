# One job per layout: the model is loaded once and swept over batch sizes and repetitions.
# Its GPU count comes from the layout (tp*pp*dp), so a scheduler allocates exactly that.


rule measure:
    input:
        unpack(get_model_input),
    output:
        # Paths from energysweep.job.spec.JobDir: one per batch size and repetition.
        shards=JOB_PATHS.shards(BATCH_SIZES, REPS),
        # The job's shards again, in one file: what merge_shards reads.
        job_table=JOB_PATHS.job_table,
        job=JOB_PATHS.job_json,
        generations=JOB_PATHS.generations,
        power=JOB_PATHS.power,
        requests=JOB_PATHS.requests,
    log:
        f"logs/measure/{PARAMS.wildcard_pattern}.log",
    wildcard_constraints:
        scenario="inference|training",
    conda:
        get_conda_env
    threads: get_threads
    resources:
        gpu=get_gpu,
        gres=get_gres,
        nodes=get_nodes,
        mpi=get_mpi,
        tasks=get_tasks,
        tasks_per_gpu=get_tasks_per_gpu,
        mem_mb=get_mem_mb,
        # The attempt, for the job's log (a retry overwrites it); no scheduler reads it.
        attempt=get_attempt,
        # gpu.clock as `--gpu-freq` and a slurm-prolog power limit as `--constraint`
        # (energysweep.sweep.gpu_axes); None adds no flag. Ignored off Slurm.
        slurm_extra=get_slurm_extra,
        constraint=get_constraint,
    params:
        spec=get_job_spec,
        model_dir=get_model_dir,
        # The backend's environment (energysweep.sweep.interpreters): the ranks' interpreter.
        python=get_python,
        # A serving job's server runs in its backend's environment ("" elsewhere).
        server_python=get_server_python,
    script:
        "../scripts/measure.py"


# A serving job (energysweep.scenarios.serving.scenario): the same step, one shard per batch cap and
# repetition (each holds every load level's window of that repetition). Started before the other
# ready jobs: it is a sweep's longest one-GPU job (a server start per batch cap, a load ramp per
# rate), so the shorter jobs fill the other GPUs (cores, on CPU) beside it instead of waiting
# after it (issue 30: make run spent 41 s with only the serving job running when it came last).
use rule measure as serve with:
    output:
        shards=JOB_PATHS.shards(SERVING_CAPS, REPS),
        job_table=JOB_PATHS.job_table,
        job=JOB_PATHS.job_json,
        generations=JOB_PATHS.generations,
        power=JOB_PATHS.power,
        requests=JOB_PATHS.requests,
    wildcard_constraints:
        scenario="serving",
    priority: 1
