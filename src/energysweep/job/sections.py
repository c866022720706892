"""The config sections, as frozen dataclasses: one class per schema section (those a job
carries, and ``gpu`` and ``facility``, which the grid and the aggregate read).

Each class's fields are exactly the properties of its section in ``config/config.schema.yaml``
(tests/unit/test_jobspec.py holds them equal), and none has a default: every value comes from the
validated config, whose defaults the schema fills (``energysweep.sweep.config.validate_schema``).
A default is written once, in the schema.

:func:`load_section` builds a section from its dict (the config's, or the JSON the ranks read)
and refuses unknown or missing keys, so a spec that is not what the validated config makes fails
loudly instead of falling back to a value nobody chose.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
# The one place a config default is written.
SCHEMA_PATH = Path(__file__).resolve().parents[3] / "config" / "config.schema.yaml"


class JobSpecError(ValueError):
    """A job spec (or one of its sections) that is not what the validated config makes."""


def load_section(cls: type[T], data, where: str) -> T:
    """``cls(**data)``; a key that is not a field, or a field without a key, is an error. A
    field typed as a section dataclass (``Measurement.emulated``) is loaded the same way.

    Args:
        where: the section's name in the error (``measurement``, ``.spec.json: limits``).

    Raises:
        JobSpecError: naming the unknown and the missing keys.
    """
    if not isinstance(data, dict):
        raise JobSpecError(f"{where}: expected an object, got {type(data).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    missing = [n for n in names if n not in data]
    if unknown or missing:
        raise JobSpecError(
            f"{where}: unknown keys {unknown}, missing keys {missing}; a job is built from the "
            "validated config (energysweep.job.spec.JobSpec.from_config), which has every key"
        )
    hints = typing.get_type_hints(cls)
    return cls(**{k: _load_nested(hints[k], v, f"{where}.{k}") for k, v in data.items()})


def _load_nested(hint, value, where: str):
    """``value`` as a field of type ``hint``: a section dataclass from its dict, else as is (a
    section already loaded, another field's value)."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type) and isinstance(value, dict):
        return load_section(hint, value, where)
    return value


def schema_defaults(section: str) -> dict:
    """The schema's default of every key of config section ``section``, read from the schema.

    For a command that runs without a config (``python -m energysweep.validity.preflight``);
    a job's values come from its validated config instead.
    """
    import yaml

    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    return {k: p["default"] for k, p in schema["properties"][section]["properties"].items()}


def as_dict(section) -> dict:
    """A section as its JSON object (the inverse of :func:`load_section`)."""
    return dataclasses.asdict(section)


@dataclass(frozen=True, kw_only=True)
class Workload:
    """Config section ``workload``: what every grid point runs (``job.workload.repetitions``)."""

    prompts: str
    batch_sizes: list[int]
    max_input_tokens: int
    output_tokens: int
    warmup_iterations: int
    iterations: int
    repetitions: int


@dataclass(frozen=True, kw_only=True)
class Emulated:
    """Config section ``measurement.emulated``: the emulated GPU node of ``measurement.device``
    ``emulated`` (docs/emulated-node.md). A None behaviour setting takes the profile's value;
    ``faults`` and ``refusals`` are the schema-validated entries, which
    ``energysweep.hw.emulated.node_config.resolve`` turns into its typed ``Fault`` and refusals."""

    profile: str
    node_gpus: int
    counter_period_s: float | None
    counter_jitter_s: float | None
    power_avg_window_s: float | None
    power_sample_coverage: float | None
    read_latency_s: float | None
    counter_gain: float | None
    counter_offset_w: float | None
    counter_noise_mj: float | None
    counter_delay_s: float | None
    average_gain: float | None
    instant_gain: float | None
    activity_hz: float
    allow_privileged: bool
    device_cgroups: bool
    seed: int
    faults: list[dict]
    refusals: list[dict]


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """Config section ``measurement``: how energy is read and windows are formed
    (``job.measurement.sampler_hz``, ``job.measurement.min_window_s``)."""

    energy_source: str
    host_energy_source: str
    device: str
    emulated: Emulated
    min_window_s: float
    idle_baseline_s: float
    cooldown_s: float
    sampler_hz: float
    prefill_pass: bool
    warmup_max_s: float | None
    require_energy: str


@dataclass(frozen=True, kw_only=True)
class Training:
    """Config section ``training``: what a training job runs at each batch size."""

    steps: int
    warmup_steps: int
    seq_len: int
    data: str
    optimizer: str
    lr: float
    microbatches: int


@dataclass(frozen=True, kw_only=True)
class Engine:
    """Config section ``engine``: options of the vLLM and TensorRT-LLM engines."""

    gpu_memory_utilization: float
    enforce_eager: bool
    cpu_kvcache_gib: float
    max_model_len: int | None

    @property
    def cpu_kvcache_bytes(self) -> int:
        """``cpu_kvcache_gib`` in bytes: vLLM's ``kv_cache_memory_bytes`` on CPU ranks."""
        return int(round(float(self.cpu_kvcache_gib) * 2**30))


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Config section ``limits``: how long a failing job may take to fail. No setting: a limit
    changes no measurement, so it is not part of a job's config hash."""

    job_timeout_s: float
    collective_timeout_s: float
    kill_grace_s: float
    server_start_timeout_s: float
    request_timeout_s: float
    client_stall_timeout_s: float


@dataclass(frozen=True, kw_only=True)
class Gpu:
    """Config section ``gpu``: the GPU setting axes and how they are applied, as the grid reads
    it (energysweep.sweep.gpu_axes). A job carries its own point only: the axis values in its
    key and ``power_limit_method`` on the job (``job.gpu``)."""

    power_limit_w: list[float | None]
    clock: list[str | int | None]
    power_limit_method: str
    prolog_constraint: str

    @classmethod
    def from_config(cls, config: dict) -> Gpu:
        """The validated config's ``gpu`` section (every key present: defaults filled)."""
        return load_section(cls, config["gpu"], "gpu")


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """One estimate of config section ``facility`` (``facility.pue``,
    ``facility.carbon_intensity_g_per_kwh``): a value with its band and provenance, or all None
    (not estimated)."""

    value: float | None
    low: float | None
    high: float | None
    source: str | None
    year: int | None


@dataclass(frozen=True, kw_only=True)
class Facility:
    """Config section ``facility``: the estimates beyond what is measured (the energy boundary
    ladder's facility and CO2e rungs, energysweep.aggregate.ladder). No job carries it: it
    changes no measurement."""

    pue: Estimate
    carbon_intensity_g_per_kwh: Estimate

    @classmethod
    def from_config(cls, section: dict) -> Facility:
        """The validated config's ``facility`` section (every key present: defaults filled)."""
        estimates = {k: load_section(Estimate, v, f"facility.{k}") for k, v in section.items()}
        return load_section(cls, estimates, "facility")

    def estimates(self) -> dict[str, Estimate]:
        """Config key name -> its estimate."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True, kw_only=True)
class ModelEntry:
    """One entry of config ``models``; ``spec`` and ``dims`` are None where the entry has none."""

    name: str
    path: str
    spec: dict | None
    dims: dict | None

    @classmethod
    def from_config(cls, entry: dict) -> ModelEntry:
        """The entry as the validated config has it (``spec`` and ``dims`` are optional)."""
        return load_section(cls, {"spec": None, "dims": None, **entry}, f"models[{entry['name']}]")


@dataclass(frozen=True, kw_only=True)
class Slo:
    """Config ``serving.slo``: the latency objectives of goodput (None: not checked)."""

    ttft_ms: float | None
    tpot_ms: float | None


@dataclass(frozen=True, kw_only=True)
class Serving:
    """Config section ``serving``: what a serving job runs (``job.serving.request_rates``).

    ``parallel`` chooses which serving jobs exist, not what one measures: it is carried (a
    section is its schema's properties) but left out of the config hash (job.spec.config_hash).
    """

    batch_caps: list[int] | None
    request_rates: list[float] | None
    burstiness: float | None
    concurrency: list[int] | None
    ramp_requests: int | None
    slo: Slo
    metrics_hz: float
    parallel: dict | None

    @classmethod
    def load(cls, data, where: str) -> Serving:
        """The section from its dict (config or JSON), ``slo`` typed too."""
        if isinstance(data, dict) and isinstance(data.get("slo"), dict):
            data = {**data, "slo": load_section(Slo, data["slo"], f"{where}.slo")}
        return load_section(cls, data, where)


# Config section name -> its dataclass (what the schema test walks).
SECTIONS: dict[str, type] = {
    "workload": Workload,
    "measurement": Measurement,
    "training": Training,
    "engine": Engine,
    "limits": Limits,
    "serving": Serving,
    "gpu": Gpu,
    "facility": Facility,
}
