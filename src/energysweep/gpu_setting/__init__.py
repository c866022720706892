"""A job's GPU setting (power limit, clocks): set on the node, recorded for the ranks, read back
around every window, put back. Imported by the launcher and the ranks, importing only ``hw``,
``job`` and ``tables``. Its modules: docs/architecture.md.
"""
