"""Helpers for tests of the emulated GPU node: a virtual clock and a node built on it."""

from __future__ import annotations

import numpy as np
import pynvml as real

from energysweep.hw import emulated
from energysweep.hw.emulated import node_config
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
    """``measurement.emulated`` with the schema's defaults and ``overrides``, on the h100-sxm
    profile unless they name one: its sensors are the truth and its reads take a fixed time, so
    a test of the window arithmetic sees that alone (the h200-sxm sensor has its own tests)."""
    return {**node_config.section_defaults(), "profile": "h100-sxm", **overrides}


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


class VirtualJob:
    """One emulated node on a virtual clock: sleeping advances the owners and samples power."""

    def __init__(self, tmp_path, gpus: int, faults: list[dict]):
        self.node, self.nvml, self.clock = make_node(tmp_path, faults=faults)
        self.clock.sleep = self.sleep
        self.nvml.emulated_driver.sleep = self.sleep
        self.busy = False
        self.level: float | None = None  # a load other than busy / idle, while set
        self.owner = emulated.Owner(
            self.node, list(range(gpus)), emulated.FunctionActivity(lambda t: self.load())
        )
        self.samples: list[dict] = []
        self.next_sample = EPOCH_NS
        self.uuids = [g.uuid for g in self.node.gpus[:gpus]]

    def load(self) -> float:
        if self.level is not None:
            return self.level
        return 0.8 if self.busy else 0.0

    def sleep(self, seconds: float) -> None:
        """Advance the clock: the owner's 4 ms samples in bulk, the 10 Hz timeline when due."""
        target = self.clock.t + int(round(seconds * 1e9))
        while self.clock.t < target:
            stop = min(target, self.next_sample)
            times = np.arange(self.clock.t + 4_000_000, stop, 4_000_000, dtype=np.int64)
            times = np.append(times, stop) if not len(times) or times[-1] != stop else times
            self.owner.advance(times, np.full(len(times), self.load()))
            self.clock.t = stop
            if stop >= self.next_sample:
                self.next_sample += 100_000_000
                self._sample()

    def _sample(self) -> None:
        try:
            self.nvml.nvmlInit()
        except real.NVMLError:
            return  # NVML fails on this node: no timeline
        for uuid in self.uuids:
            r = {"job_id": "j1", "gpu_uuid": uuid, "time_ns": self.clock.t}
            try:
                h = self.nvml.nvmlDeviceGetHandleByUUID(uuid)
                r["power_mw"] = self.nvml.nvmlDeviceGetPowerUsage(h)
                r["energy_counter_mj"] = self.nvml.nvmlDeviceGetTotalEnergyConsumption(h)
                r["clock_event_reasons"] = self.nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
            except real.NVMLError:
                continue
            self.samples.append(r)
        self.nvml.nvmlShutdown()
