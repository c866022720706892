"""The interface every inference backend implements (one subclass per engine).

The rank's scenario calls these methods; the optional hooks have defaults here instead of being
probed with ``hasattr``, so a backend states what it does by overriding them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from energysweep.util.oom import is_oom


class Backend(ABC):
    """One rank's (or one replica's) engine: load in ``__init__``, then encode and generate.

    Attributes:
        name: the backend's registry name.
        writes_requests: ``close()`` writes requests.parquet (the run writes an empty one else).
        fatal_point_errors: a failed point leaves the engine unusable, so it fails the job.
        startup: a record of the engine's start-up timings for job.json, or None.
    """

    name: str = ""
    writes_requests: bool = False
    startup: dict | None = None

    @property
    def fatal_point_errors(self) -> bool:
        return False

    @abstractmethod
    def encode(self, prompts: list[str]):
        """Tokenise a batch of prompts into what :meth:`generate` takes."""

    @staticmethod
    @abstractmethod
    def input_tokens(batch) -> int:
        """Prompt tokens in an encoded batch."""

    @abstractmethod
    def generate(self, batch, max_new_tokens: int) -> list[list[int]] | None:
        """Generate ``max_new_tokens`` per prompt; the new token ids on the writer, else None."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until the device finished the work submitted so far (a window edge)."""

    @abstractmethod
    def close(self) -> None:
        """Release the engine (and write what it logged)."""

    is_oom = staticmethod(is_oom)

    def gpu_uuids(self) -> list[str] | None:
        """UUIDs of the GPUs this process measures; None: the run looks them up by device."""
        return None

    def wrap_energy_source(self, source):
        """The energy source this backend's readings go through (default: ``source`` itself)."""
        return source


class NotLoaded(Backend):
    """The backend of a job whose every point is known to fail before its model loads (its GPU
    setting was refused: energysweep.run): nothing is loaded, and nothing may be generated."""

    def __init__(self, why: str):
        self.why = why

    def encode(self, prompts: list[str]):
        raise RuntimeError(f"the model was not loaded: {self.why}")

    @staticmethod
    def input_tokens(batch) -> int:
        raise RuntimeError("the model was not loaded")

    def generate(self, batch, max_new_tokens: int) -> list[list[int]] | None:
        raise RuntimeError(f"the model was not loaded: {self.why}")

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        pass
