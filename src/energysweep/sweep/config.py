"""Experiment config: schema validation with defaults, semantic checks, the sweep's hash.

Everything here runs when the workflow loads, before any job is submitted, so a bad value is
reported once, naming the key and the fix.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import sys
from pathlib import Path

import yaml

from energysweep.job.backends import BACKENDS
from energysweep.job.layout import ModelDims
from energysweep.job.sections import SCHEMA_PATH, Engine, Measurement, load_section
from energysweep.job.spec import portable_path
from energysweep.sweep import gpu_axes, measurement_config
from energysweep.sweep.grid import Grid, expand_grid

BUILTIN_TINY = "builtin:tiny"
# A checkpoint path may only hold these characters: it is passed on argv, never through a shell,
# but we still refuse anything a shell or a Slurm script could misread.
SAFE_PATH = re.compile(r"^[A-Za-z0-9._/+~-]+$")


class ConfigError(ValueError):
    """A config value that cannot be used; the message names the key and the fix."""


def _key(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


def _validator(schema: dict):
    import jsonschema

    base = jsonschema.Draft7Validator
    validate_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for prop, sub in properties.items():
                if "default" in sub:
                    instance.setdefault(prop, copy.deepcopy(sub["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(base, {"properties": set_defaults})(schema)


def _describe(schema: dict, path) -> str:
    node = schema
    for part in path:
        if isinstance(part, int):
            node = node.get("items", {})
        else:
            node = node.get("properties", {}).get(part, node.get("additionalProperties", {}))
        if not isinstance(node, dict):
            return ""
    return " ".join(str(node.get("description", "")).split())


def validate_schema(config: dict, schema_path: str | Path = SCHEMA_PATH) -> dict:
    """Validate ``config`` in place against the schema, filling defaults; raise ConfigError."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    # The schema lists the built-in backends; one registered from outside is as valid
    # (energysweep.job.backends.register_backend).
    schema["properties"]["backends"]["items"]["enum"] = list(BACKENDS)
    errors = sorted(_validator(schema).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for err in errors:
            key = _key(err.absolute_path)
            if err.validator == "additionalProperties":
                lines.append(f"config key {key}: {err.message} (remove or correct the key)")
                continue
            fix = _describe(schema, err.absolute_path)
            lines.append(f"config key {key}: {err.message}." + (f" Expected: {fix}" if fix else ""))
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines))
    return config


def model_dims(entry: dict, base_dir: Path) -> ModelDims | None:
    """Shape of a configured model, from its checkpoint's config.json, its spec, or `dims`."""
    if entry["path"] == BUILTIN_TINY:
        from energysweep.sweep.tinymodel import DEFAULT_SPEC

        return ModelDims.from_hf_config({**DEFAULT_SPEC, **entry.get("spec", {})})
    cfg_file = resolve_model_path(entry["path"], base_dir) / "config.json"
    if cfg_file.is_file():
        return ModelDims.from_hf_config(json.loads(cfg_file.read_text()))
    if "dims" in entry:
        # num_parameters (schema: for FLOP estimates) is read by the ranks, not by a layout.
        return ModelDims(**{k: v for k, v in entry["dims"].items() if k != "num_parameters"})
    return None


def resolve_model_path(path: str, base_dir: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (base_dir / p)


def check(
    config: dict,
    base_dir: str | Path = ".",
    use_conda: bool = False,
    dry_run: bool = False,
    workflow_dir: str | Path | None = None,
) -> None:
    """Semantic checks the schema cannot express. Raises ConfigError naming key and fix.

    Every backend's environment must work (energysweep.sweep.interpreters.check): its interpreter
    exists and the engine imports there, unless its jobs run in their own conda environment
    (``use_conda``); in a dry run (nothing is executed) a problem is only a warning, so a
    cluster sweep can be dry-run on a machine without the engine. ``workflow_dir`` (default
    ``base_dir``) is what relative ``environments`` paths are relative to.
    """
    base_dir = Path(base_dir)
    problems = []
    # measurement.require_energy against the sources it needs; the emulated node's section.
    problems += measurement_config.check_config(
        load_section(Measurement, config["measurement"], "measurement")
    )
    # gpu.clock in Slurm's vocabulary; facility estimates with source, year and band.
    problems += gpu_axes.check(config)
    names = [m["name"] for m in config["models"]]
    for name in {n for n in names if names.count(n) > 1}:
        problems.append(
            f"config key models: name {name!r} is used twice; model names must be unique"
        )
    for i, m in enumerate(config["models"]):
        key = f"models[{i}]"
        if m["path"] == BUILTIN_TINY:
            continue
        if "spec" in m:
            problems.append(f"config key {key}.spec: only allowed with path: {BUILTIN_TINY}")
        if not SAFE_PATH.match(m["path"]) or m["path"].startswith("-"):
            problems.append(
                f"config key {key}.path: {m['path']!r} has characters that are not allowed; use "
                "letters, digits and . _ - / + ~ only (rename or symlink the checkpoint directory)"
            )
            continue
        resolved = resolve_model_path(m["path"], base_dir)
        if not (resolved / "config.json").is_file() and "dims" not in m:
            problems.append(
                f"config key {key}.path: no checkpoint (config.json) at {resolved}; give the "
                f"directory of a Hugging Face checkpoint, use {BUILTIN_TINY}, or declare "
                f"{key}.dims to validate a sweep for a model stored elsewhere"
            )
    wl = config["workload"]
    if wl["prompts"] != "builtin":
        p = resolve_model_path(wl["prompts"], base_dir)
        if not SAFE_PATH.match(wl["prompts"]):
            problems.append(
                "config key workload.prompts: path has characters that are not allowed; use "
                "letters, digits and . _ - / + ~ only"
            )
        elif not p.is_file():
            problems.append(
                f"config key workload.prompts: {p} is not a file; use `builtin` or a JSONL file"
            )
    for b, path in config["environments"].items():
        if path is not None and (not SAFE_PATH.match(path) or path.startswith("-")):
            problems.append(
                f"config key environments.{b}: {path!r} has characters that are not allowed; "
                "use letters, digits and . _ - / + ~ only"
            )
    from energysweep.sweep import interpreters
    from energysweep.sweep.serving_config import check_serving

    problems += check_serving(config)

    errors, warnings = interpreters.check(
        config, workflow_dir if workflow_dir is not None else base_dir, use_conda, dry_run
    )
    problems += errors
    for msg in warnings:
        print(f"warning (dry run): {msg}", file=sys.stderr)
    problems += _can_be_valid(config)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def _can_be_valid(config: dict) -> list[str]:
    """Settings that can give no valid point (energysweep.sweep.can_be_valid): refused on a GPU
    sweep unless validity.exploratory, a warning otherwise."""
    from energysweep.sweep import can_be_valid

    found = can_be_valid.problems(config)
    if not found:
        return []
    refused = can_be_valid.refuse(config, not runs_on_cpu(config["measurement"]["device"]))
    if refused:
        return [can_be_valid.message(found, True)]
    print(can_be_valid.message(found, False), file=sys.stderr)
    return []


def runs_on_cpu(device: str) -> bool:
    """Whether ranks compute on CPUs: ``measurement.device`` cpu or emulated (CPU ranks that
    own emulated GPUs), or auto where this host has no NVIDIA GPU device node (no torch import:
    this runs when the workflow loads)."""
    if device in ("cpu", "emulated"):
        return True
    if device == "cuda":
        return False
    return not _nvidia_devices()


def build_grid(config: dict, base_dir: str | Path = ".") -> Grid:
    """The grid of jobs (and skipped points) a validated config describes."""
    base_dir = Path(base_dir)
    par = config["parallel"]
    device = config["measurement"]["device"]
    grid = expand_grid(
        {m["name"]: model_dims(m, base_dir) for m in config["models"]},
        config["backends"],
        config["scenarios"],
        par["tp"],
        par["pp"],
        par["dp"],
        par["max_gpus_per_job"],
        par["gpus_per_node"],
        engine=load_section(Engine, config["engine"], "engine"),
        on_cpu=runs_on_cpu(device),
        serving_parallel=config["serving"]["parallel"],
    )
    # The GPU setting axes (gpu.power_limit_w, gpu.clock): one job per setting.
    return gpu_axes.expand(grid, config, gpu_axes.no_gpu_reason(device))


def _nvidia_devices() -> bool:
    """Whether this host has NVIDIA GPU device nodes (no torch import at workflow load)."""
    import glob

    return bool(glob.glob("/dev/nvidia[0-9]*"))


def check_node_fit(config: dict, grid: Grid) -> None:
    """Refuse a grid whose jobs ask one node for more CPUs or memory than a node has.

    Such a job would stay PENDING for ever (Slurm: ``Reason=PartitionConfig``) and Snakemake would
    wait without end, so it is an error before anything is submitted, naming every such layout
    and the limit. Limits are ``parallel.cpus_per_node`` and ``parallel.mem_mb_per_node``; unset
    (null) means not checked.
    """
    par = config["parallel"]
    cpus, mem = par["cpus_per_node"], par["mem_mb_per_node"]
    problems = []
    for job in grid.jobs:
        req = job.placement_on(par["gpus_per_node"]).node_request
        where = (
            f"layout {job.layout} ({job.backend}, {job.scenario}) puts {req.ranks_per_node} "
            f"ranks on each of its {req.nodes} node(s) (parallel.gpus_per_node="
            f"{par['gpus_per_node']})"
        )
        if cpus is not None and req.cpus_per_node > cpus:
            problems.append(
                f"config key parallel.cpus_per_node: {where} and asks each for "
                f"{req.cpus_per_node} CPUs (one per rank), but a node has {cpus}; lower "
                "parallel.gpus_per_node to spread the ranks over more nodes, or drop the layout"
            )
        if mem is not None and req.mem_mb_per_node > mem:
            problems.append(
                f"config key parallel.mem_mb_per_node: {where} and asks each for "
                f"{req.mem_mb_per_node} MB, but a node has {mem} MB; lower "
                "parallel.gpus_per_node, or drop the layout"
            )
    if problems:
        raise ConfigError("invalid config (no job was submitted):\n  " + "\n  ".join(problems))


def sweep_hash(config: dict) -> str:
    """Stable short hash of the whole (validated, defaults-filled) config: the sweep's identity.

    Stored as ``sweep_hash`` in results/config.yaml. Not to be confused with one job's
    ``config_hash`` (:func:`energysweep.job.spec.config_hash`: the ``config_hash`` column of
    shards, job.json and the summary). Location-free, so two checkouts of the same sweep hash
    alike: every path (``models[].path``, ``workload.prompts``, ``environments.*``) enters as
    its last component (:func:`energysweep.job.spec.portable_path`).
    """
    portable = copy.deepcopy(config)
    for entry in portable["models"]:
        entry["path"] = portable_path(entry["path"])
    portable["workload"]["prompts"] = portable_path(portable["workload"]["prompts"])
    portable["environments"] = {
        b: None if p is None else portable_path(p) for b, p in portable["environments"].items()
    }
    blob = json.dumps(portable, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load(path: str | Path, use_conda: bool = False) -> dict:
    """Load, validate and check a config file (the same steps the Snakefile takes)."""
    path = Path(path)
    config = yaml.safe_load(path.read_text()) or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: the config must be a mapping of keys to values")
    validate_schema(config)
    check(config, Path.cwd(), use_conda=use_conda)
    return config
