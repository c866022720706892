"""The emulated node as every process sees it: its GPUs' identities and sensor readings.

A :class:`Node` is one host's emulated GPUs under a job's state directory (``<dir>/<host>/``).
:class:`GpuView` turns a GPU's shared state (hw/emulated/state.py) into what NVML reports at a
wall time: the true energy E(t), the energy counter, the power reading, clocks, reasons and
limits, with the scripted faults applied (docs/emulated-node.md).
"""

from __future__ import annotations

import hashlib
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import energysweep.hw.emulated.physics as physics
from energysweep.hw.emulated.node_config import NodeSettings
from energysweep.hw.emulated.state import GpuState, gpu_file, pid_alive

# DGX H100 / A100 PCI bus numbers of GPUs 0-7 (the order NVML lists them in); more GPUs go on.
_BUS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def _bus(index: int) -> int:
    return _BUS[index] if index < len(_BUS) else 0xDB + 0x10 * (index - len(_BUS) + 1)


@dataclass(frozen=True)
class Identity:
    """What NVML says a GPU is: by node index (PCI bus order)."""

    index: int
    uuid: str
    bus: int
    serial: str

    @property
    def pci_bus_id(self) -> str:  # nvmlPciInfo_t.busId
        return f"00000000:{self.bus:02X}:00.0"

    @property
    def pci_bus_id_legacy(self) -> str:  # nvmlPciInfo_t.busIdLegacy
        return f"0000:{self.bus:02X}:00.0"


def identity(host: str, index: int) -> Identity:
    """The GPU at ``index`` of node ``host``: stable across jobs, distinct across nodes."""
    h = hashlib.sha256(f"energysweep-emulated:{host}:{index}".encode()).hexdigest()
    uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
    return Identity(index, uuid, _bus(index), str(int(h[32:44], 16) % 10**13).zfill(13))


def _interp(segs: list[dict], t: np.ndarray) -> np.ndarray:
    """E at ``t`` joined linearly between samples, searching the (at most two) time-ordered
    slices in place: no copy of the ring per reading."""
    if len(segs) == 2 and segs[1]["t_ns"][0] <= t.min():
        segs = segs[1:]  # the usual case: a recent instant, in the newer slice
    if len(segs) == 2:  # the join between the slices is one more sample interval
        join = {k: np.concatenate([segs[0][k][-1:], segs[1][k][:1]]) for k in segs[0]}
        segs = [segs[0], join, segs[1]]
    out = np.empty(t.shape, dtype=np.float64)
    for i, seg in enumerate(segs):
        ts, es = seg["t_ns"], seg["energy_mj"]
        lo = ts[0] if i == 0 else np.iinfo(np.int64).min
        mask = (t >= lo) & (t <= ts[-1]) if i < len(segs) - 1 else t >= lo
        if i > 0:
            mask &= t > segs[i - 1]["t_ns"][-1]
        if not mask.any():
            continue
        x = t[mask]
        k = np.clip(np.searchsorted(ts, x, side="right"), 1, max(len(ts) - 1, 1))
        if len(ts) == 1:
            out[mask] = es[0]
            continue
        t0, t1 = ts[k - 1], ts[k]
        frac = np.clip((x - t0) / np.maximum(t1 - t0, 1), 0.0, 1.0)
        out[mask] = es[k - 1] + frac * (es[k] - es[k - 1])
    return out


class Node:
    """One host's emulated GPUs, reading the shared state under ``state_dir``."""

    def __init__(
        self,
        settings: NodeSettings,
        state_dir: str | Path,
        host: str | None = None,
        clock=time.time_ns,
        capacity: int | None = None,
    ):
        self.settings = settings
        self.profile = settings.gpu_profile
        self.state_dir = Path(state_dir)
        self.host = host or socket.gethostname()
        self.clock = clock
        self.gpus = [identity(self.host, i) for i in range(settings.gpus)]
        self._views: dict[int, GpuView] = {}
        # Samples each GPU's ring keeps: HISTORY_S at the activity rate, with headroom.
        self.capacity = capacity or int(HISTORY_S * settings.activity_hz * 1.5) + 2048

    def view(self, index: int) -> GpuView:
        if index not in self._views:
            self._views[index] = GpuView(self, index)
        return self._views[index]

    def t_s(self, t_ns: int) -> float:
        """Seconds since the node's epoch (the time base of the faults)."""
        return (t_ns - self.settings.epoch_ns) / 1e9

    def close(self) -> None:
        for v in self._views.values():
            v.state.close()
        self._views = {}


# Seconds of samples each GPU's shared state keeps (older energy is read from fault anchors).
HISTORY_S = 600.0


class GpuView:
    """NVML's view of one emulated GPU at any wall time (numpy-vectorised where it matters)."""

    def __init__(self, node: Node, index: int):
        self.node = node
        self.index = index
        self.ident = node.gpus[index]
        self.prof = node.profile
        s = node.settings
        self.state = GpuState(gpu_file(node.state_dir, node.host, index), node.capacity)
        self.key = physics.tick_key(s.seed, self.ident.uuid)
        self.period_ns = int(round(s.counter_period_s * 1e9))
        self.jitter_ns = int(round(s.counter_jitter_s * 1e9))
        # "mJ since the driver loaded": a large, GPU-specific starting value.
        self.base_mj = 10**10 + self.key % 10**10

    # ---------------------------------------------------------------------------- truth
    def owner_alive(self) -> bool:
        return pid_alive(self.state.get("owner_pid"))

    def energy_mj(self, t_ns, alive: bool | None = None, mark: bool = False) -> np.ndarray:
        """True energy (mJ since the epoch; negative before it) at wall times ``t_ns``: the
        owner's samples joined linearly (exact: power is constant between samples), idle power
        outside them. After the newest sample the GPU holds that sample's power while its owner
        lives; a sensor read (``mark``) past it appends a sample there holding that power, under
        the state's lock, and the owner's next sample starts from it (hw/emulated/owner.py):
        what a reader saw of a refresh is the truth, however late the owner's thread runs."""
        t = np.asarray(t_ns, dtype=np.int64)
        live = self.owner_alive() if alive is None else alive
        if mark and live and t.size:
            self._hold_through(int(t.max()))
        idle = self.prof.idle_w
        epoch = self.node.settings.epoch_ns
        segs = self.state.segments()
        if not segs:
            return (t - epoch) * idle / 1e6  # idle before and after the epoch
        out = _interp(segs, t)
        t_first, e_first = segs[0]["t_ns"][0], segs[0]["energy_mj"][0]
        t_last, e_last = segs[-1]["t_ns"][-1], segs[-1]["energy_mj"][-1]
        before = t < t_first
        out = np.where(before, e_first - (t_first - t) * idle / 1e6, out)
        after = t > t_last
        held = float(segs[-1]["power_w"][-1]) if live else idle
        out = np.where(after, e_last + (t - t_last) * held / 1e6, out)
        return out

    def _hold_through(self, t_ns: int) -> None:
        """A sample at ``t_ns`` holding the newest sample's power, if the samples end before."""
        last = self.state.last()
        if last is None or last["t_ns"] >= t_ns:
            return
        with self.state.lock():
            last = self.state.last()
            if last is None or last["t_ns"] >= t_ns:
                return
            e = last["energy_mj"] + (t_ns - last["t_ns"]) * last["power_w"] / 1e6
            self.state.append(t_ns, e, last["power_w"], last["clock_mhz"], int(last["reasons"]))

    # ---------------------------------------------------------------------------- sensors
    def tick(self, t_ns):
        s = self.node.settings
        return physics.last_tick(t_ns, s.epoch_ns, self.period_ns, self.jitter_ns, self.key)

    def sensor_mj(self, k, tk) -> np.ndarray:
        """The counter's reading of refresh ``k`` (at ``tk``), less its base: the sensor's gain
        on the energy ``delay`` before the refresh, its offset, its noise (profiles.py)."""
        s = self.node.settings
        delay_ns = int(round(s.counter_delay_s * 1e9))
        tk = np.asarray(tk, dtype=np.int64)
        return (
            s.counter_gain * self.energy_mj(tk - delay_ns, mark=True)
            + s.counter_offset_w * (tk - s.epoch_ns) / 1e6
            + physics.noise_mj(k, self.key, s.counter_noise_mj)
        )

    def _counter_energy(self, t_ns: int) -> float:
        """Counter value at ``t_ns`` before stuck episodes: the sensor's reading of the latest
        refresh (visible from its instant on, as a driver publishes it, whatever the owner's
        sampling thread is doing), from the latest counter reset on."""
        k, tk = self.tick(t_ns)
        value = float(self.sensor_mj(k, tk)) + self.base_mj
        s = self.node.settings
        latest = None
        for slot, f in enumerate(s.faults):
            if f.kind != "counter_reset" or not f.applies(self.node.host, self.index):
                continue
            start = f.last_start(self.node.t_s(t_ns))
            if start is not None and (latest is None or start[1] > latest[2]):
                latest = (slot, start[0], start[1])
        if latest is not None:
            slot, occ, start_s = latest
            value = value - self.base_mj - self.anchor_energy(slot, occ, start_s)
        return value

    def anchor_energy(self, slot: int, occurrence: int, start_s: float) -> float:
        """The sensor's reading of the refresh before a fault episode's start (recorded by the
        owner, else read)."""
        key, value = self.state.anchor(slot)
        if key == occurrence + 1:
            return value
        start_ns = self.node.settings.epoch_ns + int(round(start_s * 1e9))
        return float(self.sensor_mj(*self.tick(start_ns)))

    def counter_mj(self, t_ns: int) -> int:
        """``nvmlDeviceGetTotalEnergyConsumption`` at ``t_ns``: a stuck counter stays at its
        value from the episode's start, and the energy of the episode is lost for good (it
        resumes from where it stopped, as in Zeus #181: 187 J counted of 327 J drawn)."""
        epoch, lost, at = self.node.settings.epoch_ns, 0.0, t_ns
        for f in self.node.settings.faults_of("stuck_counter", self.node.host, self.index):
            for start, end in f.episodes_until(self.node.t_s(t_ns)):
                a = epoch + int(round(start * 1e9))
                if end is None or self.node.t_s(t_ns) < end:
                    at = min(at, a)  # inside the episode: frozen at its start
                else:
                    b = epoch + int(round(end * 1e9))
                    lost += self._counter_energy(b) - self._counter_energy(a)
        return int(self._counter_energy(at) - lost)

    def power_w(self, t_ns: int, window_s: float | None = None) -> float:
        """The power reading at ``t_ns``: nvmlDeviceGetPowerUsage by default (the node's
        averaging window and gain); with ``window_s`` the instant field (its gain)."""
        s = self.node.settings
        k, _ = self.tick(t_ns)
        window = s.power_avg_window_s if window_s is None else window_s
        gain = s.average_gain if window_s is None else s.instant_gain
        return gain * float(
            physics.power_reading_w(
                lambda t: self.energy_mj(t, mark=True),
                k,
                s.epoch_ns,
                self.period_ns,
                self.jitter_ns,
                self.key,
                int(round(window * 1e9)),
                s.power_sample_coverage,
            )
        )

    def in_episode(self, kind: str, t_ns: int):
        for f in self.node.settings.faults_of(kind, self.node.host, self.index):
            if f.episode(self.node.t_s(t_ns)) is not None:
                return f
        return None

    def clocks(self, t_ns: int) -> tuple[int, int]:
        """(SM clock MHz, clock event reasons) now: the owner's latest sample, idle otherwise."""
        last = self.state.last() if self.owner_alive() else None
        if last is None:
            clock, reasons = self.prof.idle_sm_mhz, physics.GPU_IDLE
        else:
            clock, reasons = int(last["clock_mhz"]), int(last["reasons"])
        if self.in_episode("throttle", t_ns) is not None:
            reasons |= physics.HW_SLOWDOWN
        return clock, reasons

    def last_power_w(self) -> float:
        last = self.state.last() if self.owner_alive() else None
        return self.prof.idle_w if last is None else float(last["power_w"])

    # ---------------------------------------------------------------------------- settings
    def power_limit_mw(self) -> int:
        return self.state.get("power_limit_mw") or int(self.prof.default_limit_w * 1000)

    def cap_mhz(self) -> int:
        return physics.cap_clock_mhz(
            self.prof, self.state.get("locked_max_mhz"), self.state.get("app_sm_mhz")
        )
