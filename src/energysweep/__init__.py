"""energysweep: energy and speed of LLM inference and training across backends and layouts."""

__version__ = "0.1.0"
