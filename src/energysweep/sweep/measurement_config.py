"""The ``measurement`` section's checks when the workflow loads: contradictions the schema
cannot see.

``measurement.require_energy`` against the sources it needs (the rank-time half, reading each
source once before the model loads, is energysweep.validity.require), and the emulated node's
section (``measurement.emulated``: a fault on a GPU the node lacks, a jitter that would reorder
refreshes; energysweep.hw.emulated.node_config).
"""

from __future__ import annotations

from energysweep.job.sections import Measurement, as_dict


def check_config(measurement: Measurement) -> list[str]:
    """Contradictions in the ``measurement`` section (config load time): problem texts.

    Includes what the schema cannot check in ``measurement.emulated`` (a fault on a GPU the
    emulated node lacks, a jitter that would reorder refreshes): energysweep.hw.emulated.
    """
    from energysweep.hw.emulated.node_config import problems

    return problems(as_dict(measurement.emulated)) + _source_contradictions(measurement)


def _source_contradictions(measurement: Measurement) -> list[str]:
    if measurement.require_energy == "gpu" and measurement.energy_source == "none":
        return [
            "config key measurement.require_energy is gpu but measurement.energy_source is "
            "none: set energy_source to auto or nvml, or require_energy to auto or none"
        ]
    if measurement.require_energy == "host" and measurement.host_energy_source == "none":
        return [
            "config key measurement.require_energy is host but "
            "measurement.host_energy_source is none: set it to auto or rapl"
        ]
    return []
