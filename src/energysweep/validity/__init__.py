"""Can a figure be trusted? Checks that run before a sweep, inside a job, and on its results.
Its modules: docs/architecture.md.
"""
