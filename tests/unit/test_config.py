import copy
from pathlib import Path

import pytest
import yaml

from energysweep.sweep import config as es_config

ROOT = Path(__file__).resolve().parents[2]


def default():
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def test_default_config_valid_and_defaults_filled():
    cfg = default()
    es_config.validate_schema(cfg)
    # The default sweep compares PyTorch and vLLM; vLLM's environment is .venv-vllm here
    # (`make test` builds it), checked by importing vllm there.
    assert cfg["backends"] == ["pytorch", "vllm"]
    es_config.check(cfg, workflow_dir=ROOT)
    assert cfg["workload"]["batch_sizes"] == [1, 4, 8]
    assert cfg["measurement"]["energy_source"] == "auto"
    grid = es_config.build_grid(cfg)
    assert {j.layout.dp for j in grid.jobs} == {1, 2}


def test_every_schema_key_is_described():
    schema = yaml.safe_load((ROOT / "config" / "config.schema.yaml").read_text())

    def walk(node, path):
        for key, sub in node.get("properties", {}).items():
            assert sub.get("description"), f"{path}.{key} has no description"
            walk(sub, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], path + "[]")

    walk(schema, "config")


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda c: c["workload"].update(batch_sizes=[-1]), "workload.batch_sizes[0]"),
        (lambda c: c.update(backends=["tensorflow"]), "backends[0]"),
        (lambda c: c["parallel"].update(tp=[0]), "parallel.tp[0]"),
        (lambda c: c["models"][0].update(name="a b"), "models[0].name"),
        (lambda c: c.update(bogus=1), "<top level>"),
        (lambda c: c["workload"].update(repetitions="2"), "workload.repetitions"),
    ],
)
def test_malformed_values_name_the_key(mutate, key):
    cfg = copy.deepcopy(default())
    mutate(cfg)
    with pytest.raises(es_config.ConfigError) as err:
        es_config.validate_schema(cfg)
    assert f"config key {key}" in str(err.value)


def test_shell_metacharacters_in_model_path_rejected():
    cfg = default()
    cfg["models"] = [{"name": "evil", "path": "/models/x; rm -rf ~"}]
    es_config.validate_schema(cfg)
    with pytest.raises(es_config.ConfigError, match=r"models\[0\]\.path.*not allowed"):
        es_config.check(cfg)


def test_missing_checkpoint_names_fix(tmp_path):
    cfg = default()
    cfg["models"] = [{"name": "m", "path": str(tmp_path / "nope")}]
    es_config.validate_schema(cfg)
    with pytest.raises(es_config.ConfigError, match=r"declare\s+models\[0\]\.dims"):
        es_config.check(cfg)


def test_uninstalled_backend_gives_install_hint():
    cfg = default()
    cfg["backends"] = ["pytorch", "tensorrt-llm"]
    es_config.validate_schema(cfg)
    with pytest.raises(es_config.ConfigError, match="envs/tensorrt-llm.yaml"):
        es_config.check(cfg)
    es_config.check(cfg, use_conda=True)  # the conda env will provide it


def test_duplicate_model_names():
    cfg = default()
    cfg["models"] = cfg["models"] * 2
    es_config.validate_schema(cfg)
    with pytest.raises(es_config.ConfigError, match="used twice"):
        es_config.check(cfg)


def test_hash_is_stable_and_sensitive():
    a, b = default(), default()
    es_config.validate_schema(a)
    es_config.validate_schema(b)
    assert es_config.sweep_hash(a) == es_config.sweep_hash(b)
    b["seed"] = 1
    assert es_config.sweep_hash(a) != es_config.sweep_hash(b)
