"""The stand-in engine's module (its record: :mod:`standin.registry`): its ranks run PyTorch's
backend, so a sweep of it is a sweep of PyTorch under another name."""

from __future__ import annotations


def load_backend(ctx, job):
    """The rank's backend: PyTorch's, as the stand-in has no engine of its own."""
    from energysweep.backends import pytorch

    return pytorch.load_backend(ctx, job)
