"""What one job *is*, as pure data read by every later stage.

:mod:`.layout` (the parallel layout and the one "tp divides the heads, pp fits the layers" rule),
:mod:`.backends` (the backend registry: one record per engine), :mod:`.placement` (where a job's
processes run: launch mode, nodes, ranks per node, the scheduler request) and :mod:`.spec` (the
typed job spec the launcher writes and the ranks read, its settings hash, and :class:`JobDir`,
every path of a job). Nothing here imports a later stage.
"""
