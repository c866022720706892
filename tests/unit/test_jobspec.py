"""The typed job: JobSpec (built once from the validated config), LaunchedJob (what the ranks load
back into the same dataclasses), config_hash (one job's, location-free) and JobDir (every path of
a job)."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

import pytest
from jobspec import job_spec, launched_job, limits, validated_config

from energysweep.job.gpu_request import GpuRequest
from energysweep.job.layout import ParallelLayout
from energysweep.job.sections import Emulated, JobSpecError, Workload
from energysweep.job.spec import (
    JOB_KEYS,
    JobDir,
    JobKey,
    JobSpec,
    LaunchedJob,
    config_hash,
    portable_path,
)
from energysweep.sweep import config as es_config


def _config() -> dict:
    cfg = validated_config(backends=["pytorch", "vllm"], scenarios=["inference", "training"])
    cfg["workload"]["batch_sizes"] = [4, 1, 2]
    return cfg


@pytest.mark.parametrize("backend,scenario", [
    ("pytorch", "inference"), ("pytorch", "training"), ("vllm", "inference"),
    ("tensorrt-llm", "inference"),
])  # fmt: skip
def test_from_config_carries_the_validated_sections_and_round_trips(backend, scenario):
    cfg = _config()
    spec = JobSpec.from_config(cfg, JobKey("tiny", backend, scenario, 2, 1, 1))
    assert spec.workload == Workload(**cfg["workload"])
    assert spec.measurement.sampler_hz == cfg["measurement"]["sampler_hz"] == 10  # the schema's
    # A section inside a section is typed too: measurement.emulated, with the schema's defaults.
    assert spec.measurement.emulated == Emulated(**cfg["measurement"]["emulated"])
    emulated = spec.measurement.emulated
    assert emulated.profile == "h200-sxm" and emulated.faults == []
    assert (spec.training is not None) == (scenario == "training")
    assert (spec.engine is not None) == (backend in ("vllm", "tensorrt-llm"))
    assert spec.batch_sizes == [1, 2, 4]
    assert JobSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert spec.layout == ParallelLayout(2, 1, 1)
    assert spec.placement.launch_mode == ("direct" if backend == "tensorrt-llm" else "torchrun")
    assert spec.placement is spec.placement  # computed once, on the job


def test_launched_job_round_trips_through_its_file(tmp_path):
    job = launched_job(tmp_path / "out", model_dir="/m", batch_sizes=(1, 2), reps=2)
    path = tmp_path / "spec.json"
    path.write_text(job.dumps())
    loaded = LaunchedJob.load(path)
    assert loaded == job
    assert loaded.outputs.shard(2, 1) == JobDir(str(tmp_path / "out")).shard(2, 1)
    assert loaded.outputs.power == JobDir(str(tmp_path / "out")).power
    assert loaded.limits == limits()
    assert loaded.config_hash == config_hash(job)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda d: d.update(job_id_typo="x"), r"unknown keys \['job_id_typo'\]"),
        (lambda d: d.pop("limits"), r"missing keys \['limits'\]"),
        (
            lambda d: d["measurement"].pop("sampler_hz"),
            r"measurement: .*missing keys \['sampler_hz'\]",
        ),
        (lambda d: d["workload"].update(reps=1), r"workload: unknown keys \['reps'\]"),
        (lambda d: d["outputs"].pop("power"), r"outputs: .*missing keys \['power'\]"),
    ],
)
def test_a_launched_job_with_unknown_or_missing_keys_is_refused(tmp_path, edit, message):
    data = launched_job(tmp_path).to_json()
    edit(data)
    (tmp_path / "spec.json").write_text(json.dumps(data))
    with pytest.raises(JobSpecError, match=message):
        LaunchedJob.load(tmp_path / "spec.json")


def test_a_job_spec_refuses_the_launched_fields():
    data = launched_job("out").to_json()
    with pytest.raises(JobSpecError, match=r"unknown keys \['code_version', 'config_hash'"):
        JobSpec.from_json(data)


def test_config_hash_covers_settings_not_the_run_and_no_location():
    spec = job_spec()
    h = config_hash(spec)
    a = spec.launched(model_dir="/a/ckpt", outputs=JobDir("x").outputs([1], 1, emulated=False),
                      limits=limits(), code_version="1", launch_argv=["a"],
                      job_id="j1")  # fmt: skip
    b = spec.launched(model_dir="/b/ckpt", outputs=JobDir("y").outputs([1], 1, emulated=False),
                      limits=limits(job_timeout_s=5), code_version="2", launch_argv=["b"],
                      job_id="j2")  # fmt: skip
    assert a.config_hash == b.config_hash == h  # model_dir, outputs, limits, ids: no settings
    assert config_hash(dataclasses.replace(spec, seed=1)) != h
    # The same checkpoint and prompts in another checkout hash alike: a path enters as its name.
    here = job_spec(workload={"prompts": "/home/a/sweep/prompts.jsonl"})
    there = job_spec(workload={"prompts": "/scratch/b/sweep/prompts.jsonl"})
    assert config_hash(here) == config_hash(there)
    assert config_hash(here) != config_hash(job_spec(workload={"prompts": "/a/other.jsonl"}))
    assert portable_path("/data/ckpt/llama-8b") == "llama-8b" == portable_path("llama-8b")
    assert portable_path("builtin:tiny") == "builtin:tiny"


def test_sweep_hash_is_location_free_and_not_a_jobs_hash():
    cfg = _config()
    moved = copy.deepcopy(cfg)
    cfg["models"][0]["path"] = "/home/a/ckpt/llama"
    moved["models"][0]["path"] = "/scratch/b/ckpt/llama"
    cfg["environments"]["vllm"] = "/home/a/sweep/.venv-vllm/bin/python"
    moved["environments"]["vllm"] = "/scratch/b/sweep/.venv-vllm/bin/python"
    assert es_config.sweep_hash(cfg) == es_config.sweep_hash(moved)
    assert cfg["models"][0]["path"] == "/home/a/ckpt/llama"  # the config itself is untouched
    moved["workload"]["output_tokens"] += 1
    assert es_config.sweep_hash(cfg) != es_config.sweep_hash(moved)
    spec = JobSpec.from_config(cfg, JobKey("tiny", "pytorch", "inference", 1, 1, 1))
    assert es_config.sweep_hash(cfg) != config_hash(spec)


def test_job_key_is_the_grid_and_path_vocabulary():
    key = JobKey.from_strings({"model": "m", "backend": "vllm", "scenario": "inference",
                               "tp": "2", "pp": "1", "dp": "1"})  # fmt: skip
    assert JOB_KEYS == ("model", "backend", "scenario", "tp", "pp", "dp", "power_limit_w",
                        "gpu_clock")  # fmt: skip
    assert key == JobKey("m", "vllm", "inference", 2, 1, 1)
    assert key.params_path() == "model~m/backend~vllm/scenario~inference/tp~2/pp~1/dp~1"
    assert key.placement_on(1).nodes == 2
    # A sweep without the GPU setting axes has no path part for them; its rows say unset.
    assert key.columns()["power_limit_w"] == key.columns()["gpu_clock"] == "unset"
    assert key.gpu_request("nvml") is None
    # A swept axis is a path part after the layout, and the job's typed request.
    swept = JobKey.from_strings({**key.wildcards(), "power_limit_w": "300", "gpu_clock": "unset"})
    assert swept.params_path().endswith("/dp~1/power_limit_w~300/gpu_clock~unset")
    assert JobKey.from_path(f"results/shards/{swept.params_path()}") == swept
    assert swept.gpu_request("nvml") == GpuRequest(
        power_limit_w=300.0, clock=None, power_limit_method="nvml"
    )


def test_job_dir_knows_every_path_of_a_job(tmp_path):
    d = JobDir("results/shards/model~m/tp~1")
    assert d.shards([1, 2], [0, 1]) == [
        "results/shards/model~m/tp~1/bs~1/rep~0.parquet",
        "results/shards/model~m/tp~1/bs~1/rep~1.parquet",
        "results/shards/model~m/tp~1/bs~2/rep~0.parquet",
        "results/shards/model~m/tp~1/bs~2/rep~1.parquet",
    ]
    assert (d.job_table, d.job_json, d.spec_file) == (
        "results/shards/model~m/tp~1/shards.parquet",
        "results/shards/model~m/tp~1/job.json",
        "results/shards/model~m/tp~1/.spec.json",
    )
    assert JobDir.of(d.job_json) == d
    out = d.outputs([1, 2], 2, emulated=False)
    assert out.paths() == [*d.shards([1, 2], [0, 1]), d.job_table, d.job_json,
                           d.generations, d.power, d.requests]  # fmt: skip
    # measurement.device emulated: the node's state directory is published with the job, last.
    assert d.outputs([1], 1, emulated=True).paths()[-1] == "results/shards/model~m/tp~1/emulated"
    base = tmp_path / "job"
    staged = JobDir(str(base)).outputs([1], 1, emulated=True).restaged(base / ".staging-x", base)
    assert staged.job_json == str(base / ".staging-x" / "job.json")
    assert staged.shard(1, 0) == str(base / ".staging-x" / "bs~1" / "rep~0.parquet")
    assert staged.emulated == str(base / ".staging-x" / "emulated")
    assert JobDir(str(base)).outputs([1], 1, emulated=False).restaged(base, base).emulated is None
    found = JobDir(str(tmp_path / "found"))
    (tmp_path / "found").mkdir()
    for name in ("power", "job_json"):
        Path(getattr(found, name)).touch()
        assert JobDir.find(tmp_path, name) == [Path(getattr(found, name))]


# The rank side: everything a launched job's processes run. They read the typed job by attribute.
SRC = Path(__file__).resolve().parents[2] / "src" / "energysweep"
RANK_SIDE = [
    SRC / "run.py",
    SRC / "dist.py",
    SRC / "tables" / "job_record.py",
    *sorted((SRC / "measure").glob("*.py")),
    *sorted((SRC / "scenarios").glob("*.py")),
    *sorted((SRC / "backends").glob("*.py")),
    *sorted((SRC / "energy").glob("*.py")),
    *sorted((SRC / "torchpp").glob("*.py")),
]
# A job read as a dict, the context's untyped extras, the spec handed around inside one.
UNTYPED = re.compile(r"\bspec\[|\bspec\.get\(|\bcfg\[|\.extra\b|\bspec_of\b")


def untyped_reads(text: str) -> list[str]:
    return [
        f"line {n}: {line.strip()}"
        for n, line in enumerate(text.splitlines(), 1)
        if UNTYPED.search(line)
    ]


def test_the_untyped_read_finder_finds_each_kind():
    text = 'a = spec["job"]\nb = spec.get("x")\nc = cfg["lr"]\nd = ctx.extra\nspec_of(ctx)\nok\n'
    assert [f.split(":")[0] for f in untyped_reads(text)] == [f"line {n}" for n in range(1, 6)]


@pytest.mark.parametrize("path", RANK_SIDE, ids=lambda p: str(p.relative_to(SRC)))
def test_the_rank_side_reads_the_job_by_attribute(path):
    assert untyped_reads(path.read_text()) == [], (
        f"{path.relative_to(SRC)} reads the job untyped; use the LaunchedJob's attributes "
        "(job.measurement.sampler_hz, job.outputs.power, ...)"
    )
