"""Inference backends: one module per engine, imported lazily (vLLM/TRT-LLM need CUDA)."""

from __future__ import annotations

import importlib

# backend name -> module under energysweep.backends that defines `load_backend(ctx)`.
_MODULES = {"pytorch": "pytorch", "vllm": "vllm_backend", "tensorrt-llm": "trtllm_backend"}


def load_backend(name: str, ctx):
    """Import the backend module only now and build it for this rank (see run.RankContext)."""
    if name not in _MODULES:
        raise ValueError(f"unknown backend {name!r}; known: {sorted(_MODULES)}")
    module = importlib.import_module(f"energysweep.backends.{_MODULES[name]}")
    return module.load_backend(ctx)
