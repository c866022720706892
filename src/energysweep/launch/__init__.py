"""A job -> its processes: argv and environment (:mod:`.argv`), running and publishing one job
(:mod:`.job`), the job's processes as one unit (:mod:`.procs`), ports (:mod:`.ports`), the Slurm
allocation (:mod:`.slurm`) and the per-replica step of ``direct`` jobs (:mod:`.replica`).

Everything is an argv list: no config value ever passes through a shell.
"""
