"""JobSpec (built once from config; its JSON form is the dict the ranks read), settings_hash, and
JobDir (every output path of a job)."""

from __future__ import annotations

import copy
import json

import pytest

from energysweep.job.layout import ParallelLayout
from energysweep.job.spec import (
    JobDir,
    JobSpec,
    launched,
    output_paths,
    restage,
    settings_hash,
)
from energysweep.sweep import config as es_config


def _config() -> dict:
    cfg = {
        "models": [{"name": "tiny", "path": "builtin:tiny"}],
        "backends": ["pytorch", "vllm"],
        "scenarios": ["inference", "training"],
    }
    es_config.validate_schema(cfg)
    cfg["workload"]["batch_sizes"] = [4, 1, 2]
    return cfg


def _legacy_spec(cfg, model, backend, scenario, tp, pp, dp) -> dict:
    """The dict rules/common.smk built before JobSpec (the oracle of the JSON form)."""
    return {
        "job": {"model": model, "backend": backend, "scenario": scenario,
                "tp": int(tp), "pp": int(pp), "dp": int(dp)},
        "dtype": cfg["dtype"], "seed": cfg["seed"], "workload": cfg["workload"],
        "measurement": cfg["measurement"],
        **({"training": cfg["training"]} if scenario == "training" else {}),
        "batch_sizes": sorted(cfg["workload"]["batch_sizes"]),
        "model_entry": {m["name"]: m for m in cfg["models"]}[model],
        "gpus_per_node": cfg["parallel"]["gpus_per_node"],
        **({"engine": cfg["engine"]} if backend in {"vllm", "tensorrt-llm"} else {}),
    }  # fmt: skip


@pytest.mark.parametrize("backend,scenario", [
    ("pytorch", "inference"), ("pytorch", "training"), ("vllm", "inference"),
    ("tensorrt-llm", "inference"),
])  # fmt: skip
def test_json_form_is_todays_dict_key_for_key_and_in_order(backend, scenario):
    cfg = _config()
    spec = JobSpec.from_config(cfg, "tiny", backend, scenario, "2", "1", "1")
    legacy = _legacy_spec(cfg, "tiny", backend, scenario, "2", "1", "1")
    assert spec.to_dict() == legacy
    assert list(spec.to_dict()) == list(legacy)
    assert json.dumps(spec.to_dict()) == json.dumps(legacy)
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert spec.layout == ParallelLayout(2, 1, 1)
    assert spec.placement.launch_mode == ("direct" if backend == "tensorrt-llm" else "torchrun")


def test_run_fields_come_last_and_unknown_keys_are_refused():
    cfg = _config()
    spec = JobSpec.from_config(cfg, "tiny", "pytorch", "inference", 1, 1, 1)
    outputs = JobDir("out").outputs(spec.batch_sizes, 2)
    ran = spec.with_run("/m", outputs).to_dict()
    assert list(ran)[-2:] == ["model_dir", "outputs"]
    assert ran["model_dir"] == "/m" and ran["outputs"] == outputs
    with pytest.raises(ValueError, match=r"unknown keys \['job_id'\]"):
        JobSpec.from_dict({**ran, "job_id": "x"})


def test_settings_hash_ignores_outputs_job_id_and_limits_not_settings():
    cfg = _config()
    spec = JobSpec.from_config(cfg, "tiny", "pytorch", "inference", 1, 1, 1).to_dict()
    h = settings_hash(spec)
    assert settings_hash({**spec, "outputs": {"x": "y"}, "job_id": "j", "limits": {"a": 1}}) == h
    changed = copy.deepcopy(spec)
    changed["workload"]["output_tokens"] += 1
    assert settings_hash(changed) != h
    out = launched(spec, {"job_timeout_s": 5}, "0.1+gabc")
    assert out["config_hash"] == h and out["code_version"] == "0.1+gabc"
    assert out["limits"] == {"job_timeout_s": 5} and len(out["job_id"]) == 32
    assert launched({**spec, "job_id": "mine"}, {}, "v")["job_id"] == "mine"
    # The job's hash is not the sweep's: the two are computed from different things.
    assert es_config.sweep_hash(cfg) != h


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
    out = d.outputs([1, 2], 2)
    assert output_paths(out) == [*d.shards([1, 2], [0, 1]), d.job_table, d.job_json,
                                 d.generations, d.power, d.requests]  # fmt: skip
    base = tmp_path / "job"
    staged = restage(JobDir(str(base)).outputs([1], 1), base / ".staging-x", base)
    assert staged["job_json"] == str(base / ".staging-x" / "job.json")
    assert staged["shards"]["1"] == [str(base / ".staging-x" / "bs~1" / "rep~0.parquet")]
