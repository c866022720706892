# One job per layout: the model is loaded once and swept over batch sizes and repetitions.
# Its GPU count comes from the layout (tp*pp*dp), so a scheduler allocates exactly that.


rule measure:
    input:
        unpack(get_model_input),
    output:
        shards=expand(
            f"{JOB_DIR}/bs~{{bs}}/rep~{{rep}}.parquet",
            bs=BATCH_SIZES,
            rep=REPS,
            allow_missing=True,
        ),
        # The job's shards again, in one file: what merge_shards reads.
        job_table=f"{JOB_DIR}/shards.parquet",
        job=f"{JOB_DIR}/job.json",
        generations=f"{JOB_DIR}/generations.parquet",
        power=f"{JOB_DIR}/power.parquet",
        requests=f"{JOB_DIR}/requests.parquet",
    log:
        f"logs/measure/{PARAMS.wildcard_pattern}.log",
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
    params:
        spec=get_job_spec,
        model_dir=get_model_dir,
        # The backend's environment (energysweep.environments): the ranks' interpreter.
        python=get_python,
    script:
        "../scripts/measure.py"
