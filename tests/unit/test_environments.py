"""Backend environments: one table decides each backend's interpreter; broken ones fail early."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from energysweep.job.layout import ParallelLayout
from energysweep.job.placement import Placement
from energysweep.launch import argv as launch_argv
from energysweep.sweep import config as es_config
from energysweep.sweep import interpreters

ROOT = Path(__file__).resolve().parents[2]


def cfg(backends, envs=None, scenarios=None):
    c = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    c["backends"] = backends
    if scenarios is not None:
        c["scenarios"] = scenarios
    if envs is not None:
        c["environments"] = envs
    return es_config.validate_schema(c)


@pytest.fixture(autouse=True)
def no_memo(monkeypatch):
    monkeypatch.setattr(interpreters, "_memo", {})


def fake_env(tmp_path: Path, name: str, module_source: str | None) -> str:
    """A directory that looks like a venv: bin/python (this interpreter, via a wrapper that puts
    the environment's site-packages first) and, if given, a module ``fakeengine`` there."""
    site = tmp_path / name / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    if module_source is not None:
        (site / "fakeengine.py").write_text(module_source)
    py = tmp_path / name / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    return str(py)


def test_the_table_decides_the_interpreter(tmp_path):
    # pytorch: the measure job's own Python; vllm: .venv-vllm beside the Snakefile.
    assert interpreters.interpreter("pytorch", {}, tmp_path) is None
    assert interpreters.interpreter("vllm", {}, tmp_path) == str(
        tmp_path / ".venv-vllm" / "bin" / "python"
    )
    assert interpreters.interpreter("vllm", {"vllm": "/opt/v/bin/python"}, tmp_path) == (
        "/opt/v/bin/python"
    )
    assert interpreters.interpreter("vllm", {"vllm": "envs/x/bin/python"}, tmp_path) == str(
        tmp_path / "envs/x/bin/python"
    )
    # Under conda the rule's env is the backend's environment.
    assert interpreters.interpreter("vllm", {"vllm": "/opt/v/bin/python"}, tmp_path, True) is None
    assert set(interpreters.BACKENDS) == {"pytorch", "vllm", "tensorrt-llm"}


def test_ranks_start_with_the_environments_interpreter():
    argv = launch_argv.build_argv(
        Placement(ParallelLayout(tp=2), "vllm", 8), "s.json", python="/e/bin/python"
    )
    assert argv[:3] == ["/e/bin/python", "-m", "torch.distributed.run"]
    argv = launch_argv.build_argv(
        Placement(ParallelLayout(), "vllm", 8), "s.json", python="/e/bin/python"
    )
    assert argv[:3] == ["/e/bin/python", "-m", "torch.distributed.run"]


def test_missing_environment_names_backend_key_and_fix(tmp_path):
    c = cfg(["pytorch", "vllm"])
    with pytest.raises(es_config.ConfigError) as err:
        es_config.check(c, workflow_dir=tmp_path)
    msg = str(err.value)
    assert "config key environments.vllm" in msg and "backend 'vllm'" in msg
    assert str(tmp_path / ".venv-vllm/bin/python") in msg and "does not exist" in msg
    assert "make vllm-env" in msg and "import vllm" in msg
    # A dry run only warns; conda provides the environment itself.
    es_config.check(c, workflow_dir=tmp_path, dry_run=True)
    es_config.check(c, workflow_dir=tmp_path, use_conda=True)


def test_broken_environment_reports_the_import_error(tmp_path, monkeypatch):
    py = fake_env(
        tmp_path, "broken", "raise ImportError('operator torchvision::nms does not exist')"
    )
    monkeypatch.setitem(
        interpreters.BACKENDS, "vllm", replace(interpreters.BACKENDS["vllm"], module="fakeengine")
    )
    errors, _ = interpreters.check(cfg(["vllm"], {"vllm": py}), tmp_path, cache_file=None)
    assert len(errors) == 1
    assert "environments.vllm" in errors[0] and "environment is broken" in errors[0]
    assert "torchvision::nms does not exist" in errors[0] and "make vllm-env" in errors[0]


def test_a_serving_sweep_needs_the_load_generator_in_the_vllm_environment(tmp_path, monkeypatch):
    py = fake_env(tmp_path, "engine-only", "__version__ = '0.32.0'")
    monkeypatch.setitem(
        interpreters.BACKENDS, "vllm", replace(interpreters.BACKENDS["vllm"], module="fakeengine")
    )
    c = cfg(["vllm"], {"vllm": py}, ["inference", "serving"])
    errors, _ = interpreters.check(c, tmp_path, cache_file=None)
    assert len(errors) == 1 and "vllm.benchmarks.serve" in errors[0], errors
    assert errors[0].startswith("config key environments.vllm:") and "make vllm-env" in errors[0]
    # Not a serving sweep: the engine alone is enough; a dry run only warns.
    assert interpreters.check(cfg(["vllm"], {"vllm": py}, ["inference"]), tmp_path, None) == (
        [],
        [],
    )
    errors, warnings = interpreters.check(c, tmp_path, dry_run=True, cache_file=None)
    assert errors == [] and warnings == []  # dry run: no probe, and the interpreter exists
    site = next(Path(py).parent.parent.glob("lib/python3*/site-packages"))
    (site / "vllm" / "benchmarks").mkdir(parents=True)
    for init in ("vllm/__init__.py", "vllm/benchmarks/__init__.py", "vllm/benchmarks/serve.py"):
        (site / init).write_text("")
    interpreters._memo.clear()
    assert interpreters.check(c, tmp_path, cache_file=None) == ([], [])


def test_probe_is_bounded_by_a_timeout(tmp_path):
    py = fake_env(tmp_path, "slow", "import time\ntime.sleep(30)")
    result = interpreters.probe(py, "fakeengine", timeout_s=1, cache_file=None)
    assert not result["ok"] and "did not finish within 1 s" in result["detail"]


def test_working_environment_passes_and_is_probed_once(tmp_path, monkeypatch):
    py = fake_env(tmp_path, "good", "__version__ = '0.32.0'")
    monkeypatch.setitem(
        interpreters.BACKENDS, "vllm", replace(interpreters.BACKENDS["vllm"], module="fakeengine")
    )
    cache = tmp_path / "cache.json"
    calls = []
    real_run = subprocess.run

    def counting_run(*args, **kw):
        calls.append(args[0])
        return real_run(*args, **kw)

    monkeypatch.setattr(interpreters.subprocess, "run", counting_run)
    # Not serving: the fake environment has no load generator (test_serving_load_generator_...).
    c = cfg(["pytorch", "vllm"], {"vllm": py}, ["inference"])
    assert interpreters.check(c, tmp_path, cache_file=cache) == ([], [])
    assert interpreters.check(c, tmp_path, cache_file=cache) == ([], [])
    assert len(calls) == 1  # the second check is a cache hit
    interpreters._memo.clear()
    assert interpreters.check(c, tmp_path, cache_file=cache) == ([], [])
    assert len(calls) == 1  # ... also from the file, in a new workflow process
    assert interpreters.probe(py, "fakeengine", cache_file=cache)["version"] == "0.32.0"
    # Installing or removing a package changes the site-packages directory: probed again.
    site = next(Path(py).parent.parent.glob("lib/python3*/site-packages"))
    (site / "other.py").write_text("")
    interpreters._memo.clear()
    assert interpreters.check(c, tmp_path, cache_file=cache) == ([], [])
    assert len(calls) == 2


def test_failures_are_not_cached(tmp_path, monkeypatch):
    py = fake_env(tmp_path, "env", None)
    monkeypatch.setitem(
        interpreters.BACKENDS, "vllm", replace(interpreters.BACKENDS["vllm"], module="fakeengine")
    )
    cache = tmp_path / "cache.json"
    c = cfg(["vllm"], {"vllm": py}, ["inference"])
    assert interpreters.check(c, tmp_path, cache_file=cache)[0]  # no module: broken
    site = next(Path(py).parent.parent.glob("lib/python3*/site-packages"))
    (site / "fakeengine.py").write_text("")  # fixed
    assert interpreters.check(c, tmp_path, cache_file=cache) == ([], [])


def test_interpreter_path_with_shell_characters_is_refused(tmp_path):
    c = cfg(["pytorch"], {"vllm": "/opt/x; rm -rf ~/bin/python"})
    with pytest.raises(es_config.ConfigError, match=r"environments\.vllm.*not allowed"):
        es_config.check(c, workflow_dir=tmp_path)


def test_a_check_is_kept_with_the_environment_and_its_lock(tmp_path, monkeypatch):
    """A clean run (no .snakemake cache) finds the check inside the environment while its lock
    is the one checked; a rebuilt environment (another lock hash) is probed again."""
    py = fake_env(tmp_path, "locked", "__version__ = '0.32.0'")
    record = Path(py).parent.parent / interpreters.ENV_RECORD
    record.write_text('{"lock": "envs/x.lock", "lock_sha256": "aaa"}')
    calls = []
    real_run = subprocess.run

    def counting_run(*args, **kw):
        calls.append(args[0])
        return real_run(*args, **kw)

    monkeypatch.setattr(interpreters.subprocess, "run", counting_run)
    assert interpreters.probe(py, "fakeengine", cache_file=tmp_path / "a.json")["ok"]
    assert (Path(py).parent.parent / interpreters.ENV_CACHE).is_file()
    interpreters._memo.clear()
    # A clean run: another (empty) workflow cache, the environment's own still there.
    assert interpreters.probe(py, "fakeengine", cache_file=tmp_path / "b.json")["ok"]
    assert len(calls) == 1
    record.write_text('{"lock": "envs/x.lock", "lock_sha256": "bbb"}')  # rebuilt from a new lock
    interpreters._memo.clear()
    assert interpreters.probe(py, "fakeengine", cache_file=tmp_path / "c.json")["ok"]
    assert len(calls) == 2
