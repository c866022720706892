"""Inference backends: one module per engine, imported lazily (vLLM/TRT-LLM need CUDA).

Which module implements which backend is data (energysweep.job.backends); each defines
``load_backend(ctx)`` returning an :class:`energysweep.backends.base.Backend`.
"""

from __future__ import annotations

import importlib

from energysweep.job.backends import backend


def load_backend(name: str, ctx):
    """Import the backend module only now and build it for this rank (see run.RankContext)."""
    module = importlib.import_module(f"energysweep.backends.{backend(name).impl}")
    return module.load_backend(ctx)
