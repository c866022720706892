"""Config -> a validated grid of jobs. Runs when the workflow loads (no torch is imported).

:mod:`.config` validates the config against the schema (errors name the key and the fix),
:mod:`.grid` expands it into jobs and skipped points with reasons, :mod:`.interpreters` decides
and checks the Python each backend's ranks run in, :mod:`.tinymodel` builds the demo checkpoint.
"""
