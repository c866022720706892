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
