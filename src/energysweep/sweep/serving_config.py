"""Checks of config section ``serving`` the schema cannot express (run when the workflow loads)."""

from __future__ import annotations

from energysweep.job.backends import SERVING


def check_serving(config: dict) -> list[str]:
    """Problems with ``serving``: one load axis, exactly (each problem names its keys)."""
    sv = config["serving"]
    rates, concurrency = sv["request_rates"], sv["concurrency"]
    problems = []
    if rates is not None and concurrency is not None:
        problems.append(
            "config keys serving.request_rates and serving.concurrency are both set: a serving "
            "sweep has one load axis, open loop (request rates) or closed loop (requests in "
            "flight); keep one of them and sweep the other in a second config (a --configfile "
            "is merged into config/config.yaml: set the other key to null there)"
        )
    elif rates is None and concurrency is None and SERVING in config["scenarios"]:
        problems.append(
            "config key serving: scenario serving needs a load axis; set serving.request_rates "
            "(requests/s, e.g. [1, 4, 16]) or serving.concurrency (requests in flight, e.g. "
            "[1, 4, 16])"
        )
    if sv["burstiness"] is not None and rates is None:
        problems.append(
            "config key serving.burstiness: shapes the arrivals of serving.request_rates only; "
            "remove it, or sweep request rates instead of serving.concurrency"
        )
    return problems
