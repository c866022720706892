"""One job, typed on both sides of the launch: :class:`JobSpec`, :class:`LaunchedJob`, JobDir.

:class:`JobSpec` is what determines a job's numbers: its :class:`JobKey` (model, backend,
scenario, tp, pp, dp, and the GPU setting axes power_limit_w and gpu_clock where the sweep has
them) and the config sections it carries (:mod:`energysweep.job.sections`). It
is built once from the validated config (:meth:`JobSpec.from_config`, rules/common.smk
``get_job_spec``), travels to the measure step as JSON, and is completed there by the launcher
(:meth:`JobSpec.launched`) with what only the run knows: the checkpoint directory, the output
paths, the limits, the job id, its config hash, the code version and the launch argv. The launcher
writes that :class:`LaunchedJob` to ``JobDir.spec_file``; every rank loads it back into the same
dataclasses (:meth:`LaunchedJob.load`, which refuses unknown or missing keys) and reads it by
attribute::

    job = LaunchedJob.load(path)
    job.measurement.sampler_hz      # config measurement.sampler_hz, default filled by the schema
    job.workload.repetitions
    job.outputs.power               # a path from JobDir, never spelled elsewhere
    job.placement.launch_mode       # computed once, on the job

:class:`JobDir` (:mod:`energysweep.job.files`) knows every file name of one job's directory
(``results/shards/<params>``).

Two hashes, one name each: ``config_hash`` is one job's: :func:`config_hash`
of its :class:`JobSpec` (the ``config_hash`` column of shards, job.json and the summary); rows of
jobs that ran the same settings share it. ``sweep_hash`` is the whole validated config's
(:func:`energysweep.sweep.config.sweep_hash`, stored in results/config.yaml). Neither covers a
location: the checkpoint directory the run resolved (``model_dir``) is not a setting, and every
path a setting names enters a hash as its last component only (:func:`portable_path`), so two
checkouts of the same sweep hash alike.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePath
from typing import Any

from energysweep.job.backends import BACKENDS, SERVING
from energysweep.job.files import JobDir as JobDir  # re-exported: a job's files
from energysweep.job.files import Outputs
from energysweep.job.gpu_request import SETTING_AXES, UNSET, GpuRequest
from energysweep.job.layout import ParallelLayout
from energysweep.job.placement import Placement
from energysweep.job.sections import (
    Engine,
    Gpu,
    Limits,
    Measurement,
    ModelEntry,
    Serving,
    Training,
    Workload,
    as_dict,
    load_section,
)


@dataclass(frozen=True)
class JobKey:
    """Which job of the grid this is: the key of its directory, its rows and its record.

    ``power_limit_w`` and ``gpu_clock`` are the GPU setting axes (config gpu.power_limit_w,
    gpu.clock) as text (:func:`energysweep.job.gpu_request.axis_text`: ``300``, ``medium``, or
    ``unset`` for a swept null). None where the sweep has no such axis: the key then has no path
    part for it, so a sweep without the axes keeps its paths; its rows still say ``unset``
    (:meth:`columns`).
    """

    model: str
    backend: str
    scenario: str
    tp: int
    pp: int
    dp: int
    power_limit_w: str | None = None
    gpu_clock: str | None = None

    @classmethod
    def from_strings(cls, values) -> JobKey:
        """From Snakemake wildcards or another mapping of strings (the degrees become ints); a
        setting axis the mapping lacks is not in the sweep (None)."""
        values = dict(values.items())
        fields: dict[str, Any] = {  # the degrees int, the names and axes str (or None)
            k: int(values[k]) if k in LAYOUT_KEYS else str(values[k])
            for k in JOB_KEYS if k not in SETTING_AXES
        }  # fmt: skip
        fields |= {k: None if values.get(k) is None else str(values[k]) for k in SETTING_AXES}
        return cls(**fields)

    @classmethod
    def from_path(cls, path: str | Path) -> JobKey:
        """The key of a job directory (its ``key~value`` parts: :meth:`params_path`)."""
        parts = dict(p.split("~", 1) for p in Path(path).parts if "~" in p)
        return cls.from_strings({k: v for k, v in parts.items() if k in JOB_KEYS})

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout(self.tp, self.pp, self.dp)

    def placement_on(self, gpus_per_node: int | None) -> Placement:
        """This job's backend running its layout on nodes of ``gpus_per_node`` GPUs.

        The one place a :class:`Placement` is made: a job reads :attr:`JobSpec.placement`.
        """
        return Placement(self.layout, self.backend, gpus_per_node, self.scenario)

    def wildcards(self) -> dict[str, str]:
        """The key as Snakemake wildcards (its output paths' ``model~m/.../dp~1``, then the
        setting axes the sweep has)."""
        return {k: str(v) for k, v in dataclasses.asdict(self).items() if v is not None}

    def columns(self) -> dict[str, str | int]:
        """The key as its rows' columns (every :data:`JOB_KEYS` column; an axis the sweep does
        not have is ``unset``: the GPU as the node has it)."""
        return {k: UNSET if v is None else v for k, v in dataclasses.asdict(self).items()}

    def gpu_request(self, power_limit_method: str | None) -> GpuRequest | None:
        """The key's GPU setting, typed (None: the job changes no GPU setting)."""
        return GpuRequest.of_key(self.power_limit_w, self.gpu_clock, power_limit_method)

    def params_path(self) -> str:
        """``model~m/backend~b/scenario~s/tp~1/pp~1/dp~1``: the job's directory under
        results/shards (Snakemake's Paramspace pattern of these wildcards)."""
        return "/".join(f"{k}~{v}" for k, v in self.wildcards().items())

    def label(self) -> str:
        """``model=m backend=b ... dp=1``, for messages."""
        return " ".join(f"{k}={v}" for k, v in self.wildcards().items())


# The job-key columns, in order: of the grid tables, the shards (tables.shards.POINT_KEYS) and
# every output path. Written here only.
JOB_KEYS = tuple(f.name for f in dataclasses.fields(JobKey))
LAYOUT_KEYS = ("tp", "pp", "dp")


def portable_path(path: str) -> str:
    """A path as it enters a hash: its last component (``builtin`` values have none).

    A hash that should match across checkouts and machines must not hold where a file lies.
    """
    return PurePath(path).name if "/" in path else path


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """What determines one job's numbers; field order is the JSON key order.

    ``training`` is None except on training jobs, ``serving`` None except on serving jobs,
    ``engine`` None except on engine backends' jobs, and ``power_limit_method`` (config
    gpu.power_limit_method) None except on jobs that set a power limit, so those settings do not
    change the other jobs' :func:`config_hash`. A serving job's batch sizes are its batch caps.
    The job's GPU setting itself is in its key (:attr:`gpu`).
    """

    key: JobKey
    dtype: str
    seed: int
    gpus_per_node: int
    model_entry: ModelEntry
    workload: Workload
    measurement: Measurement
    training: Training | None
    engine: Engine | None
    serving: Serving | None
    power_limit_method: str | None

    @classmethod
    def from_config(cls, config: dict, key: JobKey) -> JobSpec:
        """The spec of grid job ``key`` of a validated (defaults-filled) config."""
        entry = next(m for m in config["models"] if m["name"] == key.model)
        training = key.scenario == "training"
        sets_power = key.power_limit_w not in (None, UNSET)
        return cls(
            key=key,
            dtype=config["dtype"],
            seed=config["seed"],
            gpus_per_node=config["parallel"]["gpus_per_node"],
            model_entry=ModelEntry.from_config(entry),
            workload=load_section(Workload, config["workload"], "workload"),
            measurement=load_section(Measurement, config["measurement"], "measurement"),
            training=load_section(Training, config["training"], "training") if training else None,
            engine=(
                load_section(Engine, config["engine"], "engine")
                if BACKENDS[key.backend].engine
                else None
            ),
            serving=(
                Serving.load(config["serving"], "serving") if key.scenario == SERVING else None
            ),
            power_limit_method=Gpu.from_config(config).power_limit_method if sets_power else None,
        )

    @cached_property
    def placement(self) -> Placement:
        """Where the job's processes go (launch mode, nodes, ranks per node): made once, here."""
        return self.key.placement_on(self.gpus_per_node)

    @property
    def layout(self) -> ParallelLayout:
        return self.key.layout

    @property
    def gpu(self) -> GpuRequest | None:
        """The job's GPU power limit and clock, typed (None: it changes no GPU setting)."""
        return self.key.gpu_request(self.power_limit_method)

    @property
    def batch_sizes(self) -> list[int]:
        """The swept batch sizes, ascending (the order the job runs them): a serving job's batch
        caps (config serving.batch_caps; null there means workload.batch_sizes)."""
        if self.serving is not None and self.serving.batch_caps is not None:
            return sorted(self.serving.batch_caps)
        return sorted(self.workload.batch_sizes)

    def to_json(self) -> dict:
        """The JSON object of every field (sections as objects, an absent section as null)."""
        return {
            f.name: _to_json(getattr(self, f.name)) for f in dataclasses.fields(self)
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict, where: str = "job spec"):
        """Inverse of :meth:`to_json`; refuses unknown or missing keys at every level."""
        if not isinstance(data, dict):
            raise TypeError(f"{where}: expected an object, got {type(data).__name__}")
        typed = {k: _SECTION_LOADERS[k](v, f"{where}: {k}") if k in _SECTION_LOADERS else v
                 for k, v in data.items()}  # fmt: skip
        return load_section(cls, typed, where)

    def launched(
        self,
        *,
        model_dir: str,
        outputs: Outputs,
        limits: Limits,
        code_version: str,
        launch_argv: list[str],
        job_id: str | None = None,
        server_python: str | None = None,
    ) -> LaunchedJob:
        """This spec as the ranks read it: plus what only the run knows (a new job id if None;
        ``server_python``: a serving job's server interpreter, None on other jobs)."""
        settings = {f.name: getattr(self, f.name) for f in dataclasses.fields(JobSpec)}
        return LaunchedJob(
            **settings,
            model_dir=str(model_dir),
            outputs=outputs,
            limits=limits,
            job_id=job_id or uuid.uuid4().hex,
            config_hash=config_hash(self),
            code_version=code_version,
            launch_argv=list(launch_argv),
            server_python=server_python,
        )


@dataclass(frozen=True, kw_only=True)
class LaunchedJob(JobSpec):
    """A :class:`JobSpec` completed by the measure step and the launcher: what every rank reads.

    Written by the launcher (energysweep.launch.job.run_job) to ``JobDir.spec_file``, loaded by
    each rank with :meth:`load`. ``outputs`` are the staging paths the ranks write to (the
    launcher publishes them under their final names); ``limits`` are passed to the ranks but are
    no setting (not in :attr:`config_hash`), nor is ``server_python`` (a serving job's server
    interpreter: the backend's environment; None on other jobs).
    """

    model_dir: str
    outputs: Outputs
    limits: Limits
    job_id: str
    config_hash: str
    code_version: str
    launch_argv: list[str]
    server_python: str | None

    @classmethod
    def load(cls, path: str | Path) -> LaunchedJob:
        """The launched job in ``path`` (JSON); an unknown or missing key is an error."""
        return cls.from_json(json.loads(Path(path).read_text()), str(path))

    def dumps(self) -> str:
        """The JSON text :meth:`load` reads."""
        return json.dumps(self.to_json(), indent=2)


def config_hash(spec: JobSpec) -> str:
    """Stable short hash of one job's settings: its :class:`JobSpec` fields, location-free.

    It covers what determines the job's numbers and nothing a run adds (outputs, job id, limits,
    the resolved checkpoint directory); a path enters as :func:`portable_path`. Stored as the
    ``config_hash`` column of shards, job.json and the summary.
    """
    settings = {f.name: _to_json(getattr(spec, f.name)) for f in dataclasses.fields(JobSpec)}
    settings["model_entry"]["path"] = portable_path(spec.model_entry.path)
    settings["workload"]["prompts"] = portable_path(spec.workload.prompts)
    if spec.serving is not None:  # which serving jobs exist, not what one measures
        del settings["serving"]["parallel"]
    blob = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _to_json(value):
    return as_dict(value) if dataclasses.is_dataclass(value) else value


def _optional(cls):
    return lambda v, where: None if v is None else load_section(cls, v, where)


_SECTION_LOADERS = {
    "key": lambda v, where: load_section(JobKey, v, where),
    "model_entry": lambda v, where: load_section(ModelEntry, v, where),
    "workload": lambda v, where: load_section(Workload, v, where),
    "measurement": lambda v, where: load_section(Measurement, v, where),
    "training": _optional(Training),
    "engine": _optional(Engine),
    "serving": lambda v, where: None if v is None else Serving.load(v, where),
    "limits": lambda v, where: load_section(Limits, v, where),
    "outputs": lambda v, where: load_section(Outputs, v, where),
}
