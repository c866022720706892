"""A job -> its processes: argv and environment, start, the job's processes as one unit, publish.

Everything is an argv list: no config value ever passes through a shell. Its modules:
docs/architecture.md.
"""
