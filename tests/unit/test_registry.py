"""The backend registry is the one list of backends: the schema, envs/ and modules agree with it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from energysweep.backends import base
from energysweep.job.backends import (
    BACKENDS,
    LAUNCH_MODES,
    SERVING,
    BackendInfo,
    Unsupported,
    backend,
    check_backend,
    register_backend,
)

ROOT = Path(__file__).resolve().parents[2]


def test_schema_backend_enum_equals_the_registry():
    schema = yaml.safe_load((ROOT / "config" / "config.schema.yaml").read_text())
    enum = schema["properties"]["backends"]["items"]["enum"]
    assert enum == list(BACKENDS)


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_has_its_module_env_file_and_modes(name):
    info = BACKENDS[name]
    assert info.name == name
    assert importlib.util.find_spec(f"energysweep.backends.{info.impl}") is not None
    assert (ROOT / info.conda_env).is_file()
    assert {info.launch, info.launch_multi_node} <= set(LAUNCH_MODES)
    assert info.dims <= {"tp", "pp", "dp"} and info.scenarios <= {
        "inference",
        "training",
        "serving",
    }


def test_unknown_backend_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown backend 'jax'; known: \['pytorch', "):
        backend("jax")


def test_backend_hooks_have_defaults_instead_of_hasattr_probes():
    class Minimal(base.Backend):
        def encode(self, prompts):
            return prompts

        @staticmethod
        def input_tokens(batch):
            return len(batch)

        def generate(self, batch, max_new_tokens):
            return None

        def synchronize(self):
            pass

        def close(self):
            pass

    b = Minimal()
    source = object()
    assert b.gpu_uuids() is None and b.wrap_energy_source(source) is source
    assert b.is_oom(RuntimeError("CUDA out of memory")) and not b.is_oom(RuntimeError("x"))
    assert (b.writes_requests, b.fatal_point_errors, b.startup) == (False, False, None)
    with pytest.raises(TypeError, match="abstract"):
        type("Half", (base.Backend,), {"encode": lambda self, p: p})()


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_record_names_only_known_placeholders_conditions_and_features(name):
    check_backend(BACKENDS[name])
    info = BACKENDS[name]
    assert bool(info.server_argv) == (SERVING in info.scenarios)


def test_a_record_with_an_unknown_placeholder_or_feature_is_refused():
    bad = BackendInfo(
        name="bad", impl="x.y", module="x", install_hint="-",
        server_argv=("{python}", "{gpus}"),
        unsupported=(Unsupported(frozenset({"pp>2"}), "no"),),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"'bad': unknown server_argv placeholders \['gpus'\].*"
                       r"unknown unsupported features \['pp>2'\]"):  # fmt: skip
        register_backend(bad)
    assert "bad" not in BACKENDS
    with pytest.raises(ValueError, match="'vllm' is already registered"):
        register_backend(BackendInfo(name="vllm", impl="x.y", module="x", install_hint="-"))


def test_a_dotted_impl_is_its_own_module_path():
    assert BACKENDS["vllm"].module_path == "energysweep.backends.vllm_backend"
    assert BackendInfo(name="s", impl="pkg.engine", module="m", install_hint="").module_path == (
        "pkg.engine"
    )
