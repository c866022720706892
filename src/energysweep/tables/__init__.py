"""Every table energysweep writes, its schema defined once (one module per table), and the atomic
writers they all use. Its modules: docs/architecture.md.
"""
