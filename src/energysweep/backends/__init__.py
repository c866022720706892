"""Inference backends: one module per engine, imported lazily (vLLM/TRT-LLM need CUDA).

Which module implements which backend is data (energysweep.job.backends); each defines
``load_backend(ctx, job)`` returning an :class:`energysweep.backends.base.Backend` for the rank
(``ctx``, :class:`energysweep.dist.RankContext`) of the launched job (``job``,
:class:`energysweep.job.spec.LaunchedJob`, typed: engines read ``job.engine``, ``job.workload``).
"""

from __future__ import annotations

import importlib

from energysweep.job.backends import backend


def load_backend(job, ctx):
    """Import the job's backend module only now and build it for this rank."""
    module = importlib.import_module(backend(job.key.backend).module_path)
    return module.load_backend(ctx, job)
