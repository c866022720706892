"""A ceiling on how long Snakemake's Slurm plugin waits between two checks of its jobs.

The plugin (snakemake-executor-plugin-slurm 2.8) starts at
``slurm-init-seconds-before-status-checks`` and then waits 10 s longer after each check that
finds no job finished, up to 180 s. It goes back to the start after a check that finds one. That
spares a large cluster's controller. But a job's end is seen up to one interval late, and its
dependants wait that long (a 70 s job, checked at 2, 14, 36, 68 and 110 s, is seen 40 s after its
end). No setting of the plugin changes the 10 s step or the 180 s ceiling.

Where the controller answers at once (the test cluster of cluster/slurm-local.sh), set
``ENERGYSWEEP_SLURM_STATUS_MAX_S`` to a number of seconds: the workflow (rules/common.smk) then
caps the plugin's interval at that. Each check is one ``sacct`` query. Unset, the plugin's own
intervals hold. Nothing here imports Snakemake or the plugin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

ENV = "ENERGYSWEEP_SLURM_STATUS_MAX_S"
ATTRIBUTE = "next_seconds_between_status_checks"


def max_interval(env: Mapping[str, str]) -> float | None:
    """The cap in seconds from ``env``, or None when it is unset or empty. Raises ValueError,
    naming the variable and the fix, for anything but a positive number."""
    text = env.get(ENV, "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(
            f"{ENV}={text!r} is not a positive number of seconds: set it to e.g. 5, or unset it "
            "to keep the Slurm plugin's own status-check intervals"
        )
    return seconds


def cap(executor_cls: type, max_s: float) -> None:
    """Cap every interval ``executor_cls`` (the Slurm plugin's ``Executor``) sets for its next
    status check at ``max_s``. The interval is a property with a setter on Snakemake's
    ``RemoteExecutor``; the plugin sets it after each check. Raises TypeError if that is no
    longer so (a newer plugin or interface), rather than changing nothing silently."""
    prop = getattr(executor_cls, ATTRIBUTE, None)
    if not isinstance(prop, property) or prop.fget is None or prop.fset is None:
        raise TypeError(f"{executor_cls.__qualname__}.{ATTRIBUTE} is not a settable property")
    setter = prop.fset

    def capped(self, value):
        setter(self, value if value is None else min(value, max_s))

    setattr(executor_cls, ATTRIBUTE, property(prop.fget, capped, prop.fdel, prop.__doc__))
