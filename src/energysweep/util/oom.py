"""Out-of-memory detection: the one test every backend and scenario uses."""

from __future__ import annotations


def is_oom(exc: BaseException) -> bool:
    """CUDA out-of-memory, as torch raises it or as an engine reports it in its message."""
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except ImportError:  # pragma: no cover - torch is present wherever an engine is
        pass
    return "out of memory" in str(exc).lower()
