"""The hardware layer: the only code that talks to NVML (:mod:`.nvml`) and RAPL (:mod:`.rapl`).

Everything above it (energy sources, the power sampler, the environment snapshot, preflight)
asks these modules; tests fake the hardware at exactly this boundary (tests/fake_pynvml.py
replaces ``pynvml`` inside :mod:`energysweep.hw.nvml`; a fake powercap tree stands in for RAPL).
"""
