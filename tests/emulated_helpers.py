"""Helpers for tests of the emulated GPU node: a virtual clock and a node built on it."""

from __future__ import annotations

import pynvml as real

from energysweep.hw import emulated
from energysweep.hw.emulated import settings as es_settings
from energysweep.hw.emulated.node import Node

EPOCH_NS = 1_700_000_000 * 10**9


class VirtualClock:
    """Wall time in ns that moves only when told (``sleep`` advances it)."""

    def __init__(self, t_ns: int = EPOCH_NS):
        self.t = t_ns

    def __call__(self) -> int:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += int(round(seconds * 1e9))

    def at(self, seconds_after_epoch: float) -> int:
        return EPOCH_NS + int(round(seconds_after_epoch * 1e9))


def section(**overrides) -> dict:
    """``measurement.emulated`` with the schema's defaults and ``overrides``."""
    return {**es_settings.section_defaults(), **overrides}


def make_node(tmp_path, host="esnode1", clock=None, **overrides):
    """(node, module, clock): an emulated node under ``tmp_path`` on a virtual clock."""
    clock = clock or VirtualClock()
    resolved = emulated.prepare(tmp_path, section(**overrides), EPOCH_NS)
    node = Node(resolved, tmp_path, host=host, clock=clock)
    module = emulated.make_module(real, lambda: node, sleep=clock.sleep, environ={})
    return node, module, clock


def steady(level: float):
    return emulated.FunctionActivity(lambda t: level)


def run_owner(owner, clock, seconds: float, hz: float = 250.0) -> None:
    """Step ``owner`` at ``hz`` for ``seconds`` of virtual time."""
    steps = int(round(seconds * hz))
    for _ in range(steps):
        clock.sleep(1.0 / hz)
        owner.step(clock())
