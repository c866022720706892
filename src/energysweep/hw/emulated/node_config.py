"""The emulated node's settings: config section ``measurement.emulated`` resolved and checked.

The schema (config/config.schema.yaml) holds every key's type, description and default; a
``null`` behaviour setting means "the profile's value" (hw/emulated/profiles.py). This module
checks what the schema cannot (a fault on a GPU that does not exist, a jitter that would reorder
refreshes) and resolves the section into :class:`NodeSettings`, the one object every emulated
process reads back from the job's ``settings.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from energysweep.hw.emulated.profiles import PROFILES, Profile, profile

SETTINGS_FILE = "settings.json"
# The config schema, where every key's default is written (the repository's config/).
SCHEMA_PATH = Path(__file__).resolve().parents[4] / "config" / "config.schema.yaml"
KEY = "measurement.emulated"

# Scripted faults (docs/emulated-node.md, "Faults"): kind -> what it does.
FAULT_KINDS = {
    "stuck_counter": "the energy counter stops moving for the episode (Zeus #181)",
    "counter_reset": "the energy counter restarts from 0 at the episode's start (driver reload)",
    "nvml_error": "every call on the GPU raises the NVML error `error` during the episode",
    "missing_gpu": "the GPU is absent from NVML (count, by index, by UUID) for the whole run",
    "throttle": "HW_SLOWDOWN: the clock is halved during the episode (power follows)",
    "init_error": "nvmlInit raises the NVML error `error` (a node whose NVML fails)",
}
# The privileged setters a node may refuse (``refusals``) and that need ``allow_privileged``.
SETTERS = (
    "nvmlDeviceSetPowerManagementLimit",
    "nvmlDeviceSetGpuLockedClocks",
    "nvmlDeviceResetGpuLockedClocks",
    "nvmlDeviceSetApplicationsClocks",
    "nvmlDeviceResetApplicationsClocks",
)
# Behaviour settings that fall back to the profile's value when null.
PROFILE_KEYS = (
    "counter_period_s",
    "counter_jitter_s",
    "power_avg_window_s",
    "power_sample_coverage",
    "read_latency_s",
    "counter_gain",
    "counter_offset_w",
    "counter_noise_mj",
    "counter_delay_s",
    "average_gain",
    "instant_gain",
)


@dataclass(frozen=True, kw_only=True)
class Fault:
    """One scripted fault; times are seconds after the node's epoch (the job's launch).

    Fields (defaults in the schema, ``measurement.emulated.faults``): ``gpu`` a node index or
    None for every GPU, ``host`` a node name or None for every node, ``duration_s`` None until
    the end, ``repeat_s`` None for once, ``error`` the NVML_ERROR_<error> of nvml_error and
    init_error.
    """

    kind: str
    gpu: int | None
    host: str | None
    start_s: float
    duration_s: float | None
    repeat_s: float | None
    error: str

    def applies(self, host: str, gpu: int | None) -> bool:
        return (self.host is None or self.host == host) and (
            self.gpu is None or gpu is None or self.gpu == gpu
        )

    def episode(self, t_s: float) -> tuple[int, float] | None:
        """(occurrence, its start in s after the epoch) of the episode active at ``t_s``."""
        e = t_s - self.start_s
        if e < 0:
            return None
        k = int(e // self.repeat_s) if self.repeat_s else 0
        within = e - k * (self.repeat_s or 0.0)
        if self.duration_s is not None and within >= self.duration_s:
            return None
        return k, self.start_s + k * (self.repeat_s or 0.0)

    def episodes_until(self, t_s: float) -> list[tuple[float, float | None]]:
        """(start, end or None) of every episode that started at or before ``t_s``."""
        last = self.last_start(t_s)
        if last is None:
            return []
        starts = [self.start_s + k * (self.repeat_s or 0.0) for k in range(last[0] + 1)]
        return [(a, None if self.duration_s is None else a + self.duration_s) for a in starts]

    def last_start(self, t_s: float) -> tuple[int, float] | None:
        """(occurrence, start) of the latest episode that started at or before ``t_s``."""
        e = t_s - self.start_s
        if e < 0:
            return None
        k = int(e // self.repeat_s) if self.repeat_s else 0
        return k, self.start_s + k * (self.repeat_s or 0.0)


@dataclass(frozen=True)
class NodeSettings:
    """An emulated node, resolved: its profile's figures with the config's overrides."""

    profile: str
    gpus: int
    counter_period_s: float
    counter_jitter_s: float
    power_avg_window_s: float
    power_sample_coverage: float
    read_latency_s: float
    activity_hz: float
    allow_privileged: bool
    device_cgroups: bool
    seed: int
    epoch_ns: int
    faults: tuple[Fault, ...] = ()
    refusals: tuple[tuple[str, str, int | None], ...] = ()  # (call, error, gpu or None)
    # The sensors against the truth (profiles.py; 1/0 = a sensor that is the truth).
    counter_gain: float = 1.0
    counter_offset_w: float = 0.0
    counter_noise_mj: float = 0.0
    counter_delay_s: float = 0.0
    average_gain: float = 1.0
    instant_gain: float = 1.0
    # Energy read latency (quantile, s) pairs: the profile's unless read_latency_s is set.
    energy_read_latency_q: tuple[tuple[float, float], ...] = ()

    @property
    def gpu_profile(self) -> Profile:
        return profile(self.profile)

    def faults_of(self, kind: str, host: str, gpu: int | None) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind and f.applies(host, gpu)]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> NodeSettings:
        data = json.loads(text)
        data["faults"] = tuple(Fault(**f) for f in data["faults"])
        data["refusals"] = tuple(tuple(r) for r in data["refusals"])
        data["energy_read_latency_q"] = tuple(
            tuple(q) for q in data.get("energy_read_latency_q", ())
        )
        return cls(**data)


def problems(section: dict) -> list[str]:
    """What is wrong with a schema-valid ``measurement.emulated`` section (texts naming the key)."""
    out = []
    prof = section.get("profile")
    if prof not in PROFILES:
        return [
            f"config key {KEY}.profile: {prof!r} is not a known profile; use one of "
            f"{sorted(PROFILES)}"
        ]
    resolved: dict[str, Any] = {  # numbers: the schema's (set) or the profile's
        k: section.get(k) if section.get(k) is not None else getattr(PROFILES[prof], k)
        for k in PROFILE_KEYS
    }
    for k in ("counter_period_s", "power_avg_window_s"):
        if not resolved[k] > 0:
            out.append(f"config key {KEY}.{k}: {resolved[k]} must be > 0 (seconds)")
    if out:
        return out
    if not 0 <= resolved["counter_jitter_s"] < resolved["counter_period_s"] / 2:
        out.append(
            f"config key {KEY}.counter_jitter_s: {resolved['counter_jitter_s']} must be "
            f">= 0 and below half the counter period ({resolved['counter_period_s']} s), "
            "or refreshes would change order"
        )
    if not 0 < resolved["power_sample_coverage"] <= 1:
        out.append(f"config key {KEY}.power_sample_coverage: must be in (0, 1]")
    if not 0 <= resolved["counter_delay_s"] < resolved["counter_period_s"]:
        out.append(
            f"config key {KEY}.counter_delay_s: {resolved['counter_delay_s']} must be >= 0 and "
            f"below the counter period ({resolved['counter_period_s']} s)"
        )
    gpus = section["node_gpus"]
    for i, f in enumerate(section["faults"]):
        where = f"config key {KEY}.faults[{i}]"
        if f.get("kind") not in FAULT_KINDS:
            out.append(f"{where}.kind: {f.get('kind')!r}; use one of {sorted(FAULT_KINDS)}")
        if f.get("gpu") is not None and not 0 <= f["gpu"] < gpus:
            out.append(
                f"{where}.gpu: GPU {f['gpu']} does not exist on an emulated node of "
                f"{gpus} GPUs ({KEY}.node_gpus); use 0..{gpus - 1} or null for every GPU"
            )
        if f.get("kind") == "missing_gpu" and f.get("gpu") is None:
            out.append(f"{where}.gpu: a missing_gpu fault names the GPU (0..{gpus - 1})")
        if (
            f.get("repeat_s") is not None
            and f.get("duration_s") is not None
            and f["duration_s"] > f["repeat_s"]
        ):
            out.append(f"{where}.duration_s: longer than repeat_s: episodes would overlap")
    for i, r in enumerate(section["refusals"]):
        if r.get("call") not in SETTERS:
            out.append(
                f"config key {KEY}.refusals[{i}].call: {r.get('call')!r} is not a setter "
                f"the node can refuse; use one of {list(SETTERS)}"
            )
        if r.get("gpu") is not None and not 0 <= r["gpu"] < gpus:
            out.append(
                f"config key {KEY}.refusals[{i}].gpu: GPU {r['gpu']} does not exist "
                f"on an emulated node of {gpus} GPUs"
            )
    return out


def resolve(section: dict, epoch_ns: int) -> NodeSettings:
    """The settings of a checked section (:func:`problems` empty) for a node started at
    ``epoch_ns`` (wall clock); raises ValueError with the problems otherwise."""
    bad = problems(section)
    if bad:
        raise ValueError("; ".join(bad))
    prof = PROFILES[section["profile"]]
    values = {
        k: float(section[k]) if section.get(k) is not None else getattr(prof, k)
        for k in PROFILE_KEYS
    }
    faults = tuple(Fault(**{**item_defaults("faults"), **f}) for f in section["faults"])
    refusals = tuple(
        (r["call"], r["error"], r["gpu"])
        for r in ({**item_defaults("refusals"), **r} for r in section["refusals"])
    )
    activity_hz = float(section["activity_hz"])
    if not math.isfinite(activity_hz) or activity_hz < 200:
        raise ValueError(f"config key {KEY}.activity_hz: {activity_hz} < 200")
    return NodeSettings(
        profile=prof.key,
        gpus=int(section["node_gpus"]),
        activity_hz=activity_hz,
        allow_privileged=bool(section["allow_privileged"]),
        device_cgroups=bool(section["device_cgroups"]),
        seed=int(section["seed"]),
        epoch_ns=int(epoch_ns),
        faults=faults,
        refusals=refusals,
        energy_read_latency_q=(
            prof.energy_read_latency_q if section.get("read_latency_s") is None else ()
        ),
        **values,
    )


def _schema_section() -> dict:
    """The schema of ``measurement.emulated`` (config/config.schema.yaml)."""
    import yaml

    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    return schema["properties"]["measurement"]["properties"]["emulated"]


def section_defaults() -> dict:
    """The section as the schema fills it when the config leaves it out (for code that builds
    a node without a config: the benchmark, tests)."""
    props = _schema_section()["properties"]
    return {k: v["default"] for k, v in props.items()}


def item_defaults(key: str) -> dict:
    """Schema defaults of one ``faults`` or ``refusals`` entry."""
    props = _schema_section()["properties"][key]["items"]["properties"]
    return {k: v["default"] for k, v in props.items() if "default" in v}


def write(settings: NodeSettings, directory: str | Path) -> Path:
    """``settings.json`` in the node's state directory (made if missing)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / SETTINGS_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(settings.to_json())
    tmp.replace(path)
    return path


def read(directory: str | Path) -> NodeSettings:
    return NodeSettings.from_json((Path(directory) / SETTINGS_FILE).read_text())
