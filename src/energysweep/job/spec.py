"""One job's spec and its directory: what a job's ranks need, and where every output goes.

:class:`JobSpec` is built once from the config (rules/common.smk ``get_job_spec``), completed by
the measure step with the model directory and output paths (scripts/measure.py), and written by
the launcher as the ``.spec.json`` file the ranks read. Its JSON form (:meth:`JobSpec.to_dict`) is
the dict the ranks index (``spec["job"]["tp"]``, ``spec["outputs"]["job_json"]``, ...).

:class:`JobDir` knows every path of one job's directory (``results/shards/<params>``).

Two hashes, two names: :func:`energysweep.sweep.config.sweep_hash` is the whole config's (the
``config_hash`` of ``results/config.yaml``); :func:`settings_hash` is one job's settings, i.e.
its spec without outputs, job id and limits (the ``config_hash`` column of shards and job.json).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from dataclasses import dataclass
from pathlib import Path

from energysweep.job.backends import BACKENDS
from energysweep.job.gpu_request import GpuRequest
from energysweep.job.layout import ParallelLayout
from energysweep.job.placement import Placement

# Keys the launcher adds to a spec that do not determine the job's numbers (settings_hash).
NOT_SETTINGS = ("outputs", "job_id", "limits")


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """Everything a job's ranks need, as data (field order = the JSON key order).

    ``training`` is carried by training jobs only and ``engine`` by engine backends' jobs only,
    so those settings do not change the other jobs' :func:`settings_hash`; ``gpu`` (the job's
    power limit and clocks, :class:`energysweep.job.gpu_request.GpuRequest` as a dict) only by
    jobs that set one. ``model_dir`` and
    ``outputs`` are None until the measure step knows them (:meth:`with_run`).
    """

    job: dict
    dtype: str
    seed: int
    workload: dict
    measurement: dict
    training: dict | None = None
    batch_sizes: list[int]
    model_entry: dict
    gpus_per_node: int
    engine: dict | None = None
    gpu: dict | None = None
    model_dir: str | None = None
    outputs: dict | None = None

    @classmethod
    def from_config(
        cls,
        config: dict,
        model: str,
        backend: str,
        scenario: str,
        tp: int,
        pp: int,
        dp: int,
        gpu: dict | None = None,
    ) -> JobSpec:
        """The spec of one grid job of a validated (defaults-filled) config.

        Args:
            gpu: the job's setting, ``{"power_limit_w", "clock"}`` (energysweep.sweep.settings
                .request); None: the job changes no GPU setting.
        """
        entry = next(m for m in config["models"] if m["name"] == model)
        request = None
        if gpu is not None:
            request = GpuRequest(
                power_limit_w=gpu["power_limit_w"],
                clock=gpu["clock"],
                power_limit_method=config["gpu"]["power_limit_method"],
            ).to_dict()
        return cls(
            job={"model": model, "backend": backend, "scenario": scenario,
                 "tp": int(tp), "pp": int(pp), "dp": int(dp)},
            dtype=config["dtype"],
            seed=config["seed"],
            workload=config["workload"],
            measurement=config["measurement"],
            training=config["training"] if scenario == "training" else None,
            batch_sizes=sorted(config["workload"]["batch_sizes"]),
            model_entry=entry,
            gpus_per_node=config["parallel"]["gpus_per_node"],
            engine=config["engine"] if BACKENDS[backend].engine else None,
            gpu=request,
        )  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict) -> JobSpec:
        """Inverse of :meth:`to_dict`; a key that is not a field is an error."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"job spec has unknown keys {unknown}; known: {sorted(names)}")
        return cls(**data)

    def to_dict(self) -> dict:
        """The JSON form; a None optional field is left out (never written as null)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}  # fmt: skip

    def with_run(self, model_dir: str, outputs: dict) -> JobSpec:
        """This spec with the checkpoint directory and output paths the measure step knows."""
        return dataclasses.replace(self, model_dir=str(model_dir), outputs=outputs)

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout(self.job["tp"], self.job["pp"], self.job["dp"])

    @property
    def placement(self) -> Placement:
        return Placement(self.layout, self.job["backend"], self.gpus_per_node)


def settings_hash(spec: dict) -> str:
    """Stable short hash of one job's settings: its spec less :data:`NOT_SETTINGS`.

    It covers what determines the job's numbers (not where its outputs go), so rows of jobs that
    ran the same settings share it. Stored as the ``config_hash`` of shards and job.json.
    """
    settings = {k: v for k, v in spec.items() if k not in NOT_SETTINGS}
    blob = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def launched(spec: dict, limits: dict, code_version: str) -> dict:
    """The spec as the ranks read it: plus job id, settings hash, code version and limits.

    Limits are passed to the ranks but are no setting: a limit changes no measurement.
    """
    return {
        **spec,
        "job_id": spec.get("job_id") or uuid.uuid4().hex,
        "config_hash": settings_hash(spec),
        "code_version": code_version,
        "limits": limits,
    }


def _file(name: str, doc: str) -> property:
    """A JobDir property: the path of ``name`` in the job's directory."""
    return property(lambda self: f"{self.root}/{name}", doc=doc)


@dataclass(frozen=True)
class JobDir:
    """Every path of one job: ``root`` is ``results/shards/<params>`` (may hold wildcards)."""

    root: str

    def shard(self, bs, rep) -> str:
        return f"{self.root}/bs~{bs}/rep~{rep}.parquet"

    def shards(self, batch_sizes, reps) -> list[str]:
        """Every per-window shard, batch size outer, repetition inner (Snakemake's expand)."""
        return [self.shard(bs, rep) for bs in batch_sizes for rep in reps]

    job_table = _file("shards.parquet", "The job's shards in one file: what the merge reads.")
    job_json = _file("job.json", "The job record; published last, it marks a complete job.")
    generations = _file("generations.parquet", "The generated token ids (for accuracy checks).")
    power = _file("power.parquet", "The power samples of the job's GPUs.")
    requests = _file("requests.parquet", "The engine backends' per-request timings.")
    spec_file = _file(".spec.json", "The spec the ranks read (written by the launcher).")

    def outputs(self, batch_sizes, reps: int) -> dict:
        """``spec["outputs"]``: shard paths per batch size, then the job's other files."""
        return {
            "shards": {str(bs): [self.shard(bs, r) for r in range(reps)] for bs in batch_sizes},
            "job_table": self.job_table,
            "job_json": self.job_json,
            "generations": self.generations,
            "power": self.power,
            "requests": self.requests,
        }


def output_paths(outputs) -> list[str]:
    """Every path of an ``outputs`` structure (nested dicts and lists), in order."""
    if isinstance(outputs, dict):
        return [p for v in outputs.values() for p in output_paths(v)]
    if isinstance(outputs, (list, tuple)):
        return [p for v in outputs for p in output_paths(v)]
    return [outputs]


def restage(outputs, staging: Path, base: Path):
    """The same structure with every path moved under ``staging`` (relative to ``base``)."""
    if isinstance(outputs, dict):
        return {k: restage(v, staging, base) for k, v in outputs.items()}
    if isinstance(outputs, (list, tuple)):
        return [restage(v, staging, base) for v in outputs]
    return str(staging / Path(outputs).resolve().relative_to(base))
