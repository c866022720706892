"""Measurement on one rank: the window rule, the job monitor and the rows of the shard schema.
Its modules: docs/architecture.md.
"""
