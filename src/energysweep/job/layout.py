"""The parallel layout: the one place that knows what a layout is.

``tp * pp * dp == world size``, which layouts a model can run (tp dividing the heads, pp at most
the layers), how a global rank maps to (dp, pp, tp) coordinates, and which rank writes. The sweep
(energysweep.sweep.grid), the placement of a job on nodes (energysweep.job.placement), the
launcher, the ranks and the tests all use :class:`ParallelLayout`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelDims:
    """The model shape facts a layout must respect."""

    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    intermediate_size: int
    hidden_size: int

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

    def __str__(self) -> str:
        return f"tp{self.tp}-pp{self.pp}-dp{self.dp}"


def split_contiguous(n: int, parts: int, index: int) -> range:
    """Items of a contiguous split of ``n`` into ``parts`` (earlier parts get one extra).

    Matches accelerate's ``split_between_processes(apply_padding=False)``: 33 on 4 -> 9, 8, 8, 8.
    """
    floor, rem = divmod(n, parts)
    start = index * floor + min(index, rem)
    return range(start, start + floor + (1 if index < rem else 0))
