"""The measured phases of a window: the one place their names are spelled.

``Phase`` is a ``str`` enum, so ``Phase.GENERATE == "generate"`` and the value is what the
shards' ``phase`` column stores.
"""

from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    GENERATE = "generate"  # prefill + decode of a batch of prompts (inference)
    PREFILL = "prefill"  # one forward pass over the prompts (inference, measurement.prefill_pass)
    TRAIN = "train"  # optimizer steps (training)
    SERVE = "serve"  # a server's steady state under one load level (serving)

    def __str__(self) -> str:
        return self.value


# The phases a point's headline figures (summary, validity, stages) are computed from.
HEADLINE_PHASES = (Phase.GENERATE.value, Phase.TRAIN.value, Phase.SERVE.value)


class JobPhase(str, Enum):
    """Where a job's rank-0 wall time goes (job.json ``timing.phases_s``, the summary's
    ``job_<phase>_s`` columns, the report's job-time figure): every second of the rank's life,
    from its process's creation to its job.json, is in exactly one of them.
    """

    START = "start"  # interpreter start, imports, process group, world audit, fail-closed check
    LOAD = "load"  # model, engine, tokenizer, data (training: also each point's model copy)
    SERVER_START = "server_start"  # serving: a batch cap's server, spawn to healthy
    WARMUP = "warmup"  # unmeasured warm-up iterations / steps / requests of each point
    IDLE_BASELINE = "idle_baseline"  # the idle power measurement before the first window
    COOLDOWN = "cooldown"  # idle before each window (measurement.cooldown_s)
    EDGES = "edges"  # window edges: device sync, barriers, counter-refresh alignment, reads
    WINDOW = "window"  # inside measured windows (start edge to end edge)
    RAMP = "ramp"  # serving: requests sent before the steady-state window opens
    DRAIN = "drain"  # serving: requests finishing after it closes, the server settling
    WRITE = "write"  # combining the ranks' rows of a window and writing its shard
    TEARDOWN = "teardown"  # after the last window: power tail, gathers, tables, stops, job.json
    OTHER = "other"  # everything else (per-point checks, snapshots, batch encoding)

    def __str__(self) -> str:
        return self.value


# Report order (the stacked bar's order): set-up, measurement, the rest.
JOB_PHASES = tuple(JobPhase)
