"""Where a job's processes go: one backend running one layout on nodes of a given size.

:class:`Placement` is the one place that decides the launch mode (energysweep.job.backends
``LAUNCH_MODES``), how many nodes a job spans, ranks and Slurm tasks per node, the per-node
resource request, which processes a job consists of, and each process's coordinates. The grid,
the rules, the launcher and the ranks' audit all read it instead of recomputing these facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from energysweep.job.backends import BACKENDS, SERVING
from energysweep.job.layout import ParallelLayout, RankCoords

# Host RAM one rank needs beyond its GPU (tokenizer, loader, buffers): sbatch --mem per node is
# this times the ranks on the node.
MEM_MB_PER_RANK = 2000
# A serving job's client and the server's front end (API server, engine core) need host RAM
# beyond the workers': a vLLM CPU server's front end took ~1.5 GB, the client ~0.5 GB.
SERVING_EXTRA_MEM_MB = 2000


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


@dataclass(frozen=True)
class Placement:
    """``backend`` running ``layout`` on nodes of ``gpus_per_node`` GPUs (None: one node), for
    ``scenario`` (a serving job runs in launch mode ``server``).

    Each rank owns one GPU, so a layout spans ``ceil(world_size / gpus_per_node)`` nodes.
    """

    layout: ParallelLayout
    backend: str
    gpus_per_node: int | None = None
    scenario: str = "inference"

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; known: {sorted(BACKENDS)}")

    @cached_property
    def nodes(self) -> int:
        """Nodes the job spans."""
        if self.gpus_per_node is None:
            return 1
        return self.layout.nodes(self.gpus_per_node)

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    @cached_property
    def launch_mode(self) -> str:
        """The launch mode (a LAUNCH_MODES key): the backend's single- or multi-node one."""
        if self.scenario == SERVING:
            return "server"
        caps = BACKENDS[self.backend]
        return caps.launch_multi_node if self.multi_node else caps.launch

    @property
    def ranks_per_node(self) -> int:
        """GPU workers (ranks) on each node, the job's ranks spread evenly."""
        return -(-self.layout.world_size // self.nodes)

    @property
    def node_request(self) -> NodeRequest:
        """Per-node resources (one CPU, one GPU, ``MEM_MB_PER_RANK`` per rank on the node)."""
        per_node = self.ranks_per_node
        tasks = per_node if (self.launch_mode == "mpi" and self.multi_node) else 1
        mem = MEM_MB_PER_RANK * per_node
        if self.launch_mode == "server":
            mem += SERVING_EXTRA_MEM_MB
        return NodeRequest(self.nodes, per_node, tasks, per_node, per_node, mem)

    @property
    def slurm_tasks(self) -> int | None:
        """Slurm tasks of a multi-node job: one per node (one torchrun each), or tp*pp MPI ranks
        under the mpi launch mode; None on a single node (one task, the plugin's default)."""
        if not self.multi_node:
            return None
        if self.launch_mode == "mpi":
            return self.layout.ranks_per_replica
        return self.nodes

    @property
    def processes(self) -> tuple[int, int]:
        """``(launchers, gpu_workers)`` the job must consist of.

        Launchers are the processes energysweep.run runs in (what the process audit counts); GPU
        workers are the processes computing on a GPU (one per GPU in every mode). A vLLM TP=4 job
        (torchrun + external_launcher) has 4 launchers that are its 4 GPU workers; a TensorRT-LLM
        TP=4 job (direct) has 1 launcher and 4 GPU workers spawned by the engine.
        """
        if self.launch_mode == "torchrun":
            return self.layout.world_size, self.layout.world_size
        if self.launch_mode == "server":
            return 1, self.layout.world_size
        return self.layout.dp, self.layout.world_size

    def coords(self, rank: int) -> RankCoords:
        """Coordinates of launcher process ``rank``.

        Under torchrun a process is one rank of the layout; under direct and mpi it is a whole
        DP replica (it holds tp_rank 0 of stage 0, and writes for its replica).
        """
        layout, mode = self.layout, self.launch_mode
        if mode == "torchrun":
            return layout.coords(rank)
        if mode == "server":
            if rank != 0:
                raise ValueError(f"a serving job has one client process (rank 0), not {rank}")
            return RankCoords(0, 0, 0, 0, True)
        if not 0 <= rank < layout.dp:
            raise ValueError(
                f"launcher {rank} outside the {layout.dp} replicas of {layout} ({mode})"
            )
        return RankCoords(rank, rank, 0, 0, True)

    def unsupported(self) -> list[str]:
        """Why the backend cannot start this layout on nodes of this size (empty list: it can)."""
        layout, mode, nodes = self.layout, self.launch_mode, self.nodes
        if mode == "server" and nodes > 1:
            return [
                f"multi-node serving is not supported: {layout} needs {nodes} nodes of "
                f"{self.gpus_per_node} GPUs, and one {self.backend} server across nodes needs "
                + BACKENDS[self.backend].multi_node_serving
            ]
        if mode == "torchrun":
            if layout.world_size % nodes:
                return [f"{layout.world_size} ranks do not fill {nodes} nodes evenly"]
            return []
        if mode == "mpi":
            reasons = []
            if layout.dp > 1:
                reasons.append(
                    f"{self.backend} runs a multi-node job as one replica (mpi launch); "
                    f"dp={layout.dp} needs tp*pp*dp={layout.world_size} <= "
                    f"gpus_per_node={self.gpus_per_node}"
                )
            if layout.ranks_per_replica % nodes:
                reasons.append(
                    f"{layout.ranks_per_replica} MPI ranks do not fill {nodes} nodes evenly"
                )
            return reasons
        return []
