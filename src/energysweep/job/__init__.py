"""What one job *is* (layout, backend record, placement, typed spec, files), as pure data read by
every later stage; it imports no other part of energysweep. Its modules: docs/architecture.md.
"""
