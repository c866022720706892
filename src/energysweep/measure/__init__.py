"""Measurement on one rank: the window rule, the job monitor and the rows of the shard schema.

:mod:`.window` holds the window rule (sync + barrier edges, min elapsed over ranks) and the merge of
the ranks' rows of one window; :mod:`.monitor` the job-level measurement (energy sources, power
timeline, idle baseline, environment snapshots); :mod:`.rows` how readings become rows.
"""
