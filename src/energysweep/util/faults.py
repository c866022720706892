"""Test-only fault injection: make one rank fail at one grid point, on purpose.

Off unless the environment variable ``ENERGYSWEEP_TEST_FAULT`` holds a JSON object, e.g.::

    ENERGYSWEEP_TEST_FAULT='{"rank": 1, "batch_size": 4, "action": "raise"}'

Keys:
    action: ``raise`` (RuntimeError("injected fault ...") inside the point), ``kill`` (the rank
        SIGKILLs itself) or ``hang`` (the rank sleeps forever inside the point).
    rank: global rank that fails; absent: every rank (a failure all ranks see, like an OOM).
    batch_size: the grid point (batch size) at which it fails; absent: every batch size.
    scenario: ``inference``, ``training`` or ``serving``; absent: all.
    layout: ``[tp, pp, dp]`` of the job that fails; absent: every job (one sweep can then give
        each layout its own fault).
    step: instead of a rank's point, fail the Snakemake script step of this rule name (or of
        any rule in a list of names: ``measure``, ``merge_shards``, ...) when it starts
        (:func:`energysweep.util.steplog.step_log`); only ``raise`` applies there.

The variable passes to every rank by inheritance (Snakemake -> measure step -> torchrun/srun ->
ranks). The measurers call :func:`inject` once per rank and batch size, before the point's first
window, so tests can exercise the failure paths of real jobs (tests/integration/test_failures.py).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

from energysweep.util.jsonobj import parse_object

ENV_VAR = "ENERGYSWEEP_TEST_FAULT"
ACTIONS = ("raise", "kill", "hang")
SCENARIOS = ("inference", "training", "serving")


class FaultSpecError(ValueError):
    """``ENERGYSWEEP_TEST_FAULT`` is set but does not describe a fault."""


@dataclass(frozen=True)
class Fault:
    """One injected fault (see the module docstring for the keys)."""

    action: str
    rank: int | None = None
    batch_size: int | None = None
    scenario: str | None = None
    step: tuple[str, ...] | None = None
    layout: tuple[int, int, int] | None = None

    def applies(
        self, rank: int, batch_size: int, scenario: str, layout: tuple | None = None
    ) -> bool:
        """Whether this fault fires on ``rank`` at ``batch_size`` in ``scenario`` (of a job of
        ``layout``, (tp, pp, dp))."""
        return (
            self.step is None
            and (self.layout is None or layout is None or tuple(layout) == self.layout)
            and (self.rank is None or self.rank == rank)
            and (self.batch_size is None or self.batch_size == batch_size)
            and (self.scenario is None or self.scenario == scenario)
        )


def _int_or_none(obj: dict, key: str, text: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise FaultSpecError(f"{ENV_VAR}: {key!r} must be an integer, got {value!r} in {text!r}")
    return value


def parse(text: str | None) -> Fault | None:
    """The fault described by ``text`` (the variable's value); None when unset or empty.

    Raises:
        FaultSpecError: not a JSON object, unknown key, unknown action or scenario, bad types.
    """
    if text is None or not text.strip():
        return None
    obj = parse_object(text, ENV_VAR, FaultSpecError, "is not JSON", "must be a JSON object")
    unknown = sorted(set(obj) - {"action", "rank", "batch_size", "scenario", "step", "layout"})
    if unknown:
        raise FaultSpecError(f"{ENV_VAR}: unknown keys {unknown} in {text!r}")
    action = obj.get("action")
    if action not in ACTIONS:
        raise FaultSpecError(f"{ENV_VAR}: 'action' must be one of {ACTIONS}, got {action!r}")
    scenario = obj.get("scenario")
    if scenario is not None and scenario not in SCENARIOS:
        raise FaultSpecError(f"{ENV_VAR}: 'scenario' must be one of {SCENARIOS}, got {scenario!r}")
    step = obj.get("step")
    if isinstance(step, str):
        step = [step]
    if step is not None:
        if action != "raise" or not all(isinstance(s, str) for s in step) or not step:
            raise FaultSpecError(
                f"{ENV_VAR}: 'step' must be a rule name or a list of them, with action 'raise': "
                f"{text!r}"
            )
        step = tuple(step)
    layout = obj.get("layout")
    if layout is not None and (
        not isinstance(layout, list) or len(layout) != 3 or not all(type(x) is int for x in layout)
    ):
        raise FaultSpecError(f"{ENV_VAR}: 'layout' must be [tp, pp, dp] integers: {text!r}")
    return Fault(
        action,
        _int_or_none(obj, "rank", text),
        _int_or_none(obj, "batch_size", text),
        scenario,
        step,
        tuple(layout) if layout is not None else None,
    )


def from_env(environ=None) -> Fault | None:
    """The fault in ``ENERGYSWEEP_TEST_FAULT`` of ``environ`` (default: os.environ)."""
    return parse((os.environ if environ is None else environ).get(ENV_VAR))


def inject(
    rank: int, batch_size: int, scenario: str, environ=None, layout: tuple | None = None
) -> None:
    """Fail here if the configured fault applies to this rank, batch size and scenario.

    Called inside a measurer's point, before its first window. Does nothing when the variable
    is unset (the normal case).
    """
    fault = from_env(environ)
    if fault is None or not fault.applies(rank, batch_size, scenario, layout):
        return
    what = f"injected fault ({fault.action}) on rank {rank} at batch size {batch_size} ({scenario})"
    # The wall-clock time lets a test bound how long the job took to fail after the fault.
    print(f"{ENV_VAR}: {what} at unix time {time.time():.3f}", file=sys.stderr, flush=True)
    if fault.action == "raise":
        raise RuntimeError(what)
    if fault.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # hang: only an outside timeout or signal ends this rank
        time.sleep(3600)


def inject_step(step: str, environ=None) -> None:
    """Raise here if the configured fault names this Snakemake script step (rule name)."""
    fault = from_env(environ)
    if fault is not None and fault.step is not None and step in fault.step:
        raise RuntimeError(f"injected fault (raise) in step {step}")
