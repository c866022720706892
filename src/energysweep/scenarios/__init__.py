"""What a job measures at each grid point: one :class:`.base.Scenario` loop, two scenarios.

:mod:`.inference` (generate and prefill windows through a backend) and :mod:`.training` (optimizer
steps through :mod:`.trainers`) differ only in what a point prepares and what one repetition
measures; the point loop (repetitions, fault hook, failure agreement, OOM) is the base's.
:mod:`.serving` runs each point as load levels against the job's server.
"""
