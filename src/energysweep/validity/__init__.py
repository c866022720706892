"""Can a figure be trusted? Checks that run before a sweep, inside a job, and on its results.

Before: :mod:`.preflight` (can this node measure energy?) and :mod:`.require` (fail closed when
``measurement.require_energy`` cannot be met). After aggregation: :mod:`.verdict` (``valid`` and
``invalid_reasons`` per point), :mod:`.recheck` with :mod:`.timeline` (every window re-checked
against the power timeline) and :mod:`.stages` (energy per stage of a job).
"""
