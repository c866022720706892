"""A new engine is two files: a registry record and a module (tests/standin). Registered through
energysweep.job.backends.register_backend only, it gets its server command, /metrics series and
unsupported layouts from its record, and a sweep of it dry-runs through Snakemake."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from test_examples_dryrun import measure_jobs, snakemake

from energysweep.job.backends import BACKENDS
from energysweep.job.layout import ParallelLayout
from energysweep.job.sections import Engine
from energysweep.launch.server import ServerOptions, server_argv, server_env
from energysweep.scenarios.serving.probes import metrics_names
from energysweep.sweep.grid import engine_unsupported

from conftest import workflow_copy

pytestmark = [pytest.mark.integration]

TESTS = Path(__file__).resolve().parents[1]
ENGINE = Engine(
    enforce_eager=True, cpu_kvcache_gib=1, gpu_memory_utilization=0.5, max_model_len=None
)


@pytest.fixture
def standin():
    """The stand-in registered in this process, taken out again after the test."""
    sys.path.insert(0, str(TESTS))
    import standin.registry

    BACKENDS.setdefault("standin", standin.registry.STANDIN)
    yield BACKENDS["standin"]
    BACKENDS.pop("standin", None)
    sys.path.remove(str(TESTS))


def test_launch_scenarios_and_sweep_read_the_standin_from_its_record(standin):
    o = ServerOptions("standin", "/env/bin/python", "/m", ParallelLayout(1, 1, 2), 4, 64,
                      "float32", 0, ENGINE)  # fmt: skip
    assert server_argv(o, 31000, "es-x") == [
        "/env/bin/python", "-m", "standin.engine", "--model", "/m", "--name", "es-x",
        "--port", "31000", "--tp", "1", "--dp", "2", "--batch", "4", "--eager",
    ]  # fmt: skip
    env = server_env(o, {"STANDIN_OFFLINE": "1", "X": "2"}, None)
    assert env == {"X": "2", "STANDIN_KV_GIB": "1"}
    assert metrics_names("standin") == {"running": "standin_running", "waiting": "standin_waiting"}
    assert engine_unsupported("standin", ParallelLayout(2, 1, 1), ENGINE, True, "serving") == [
        "standin cannot split a layer on CPUs (tp=2); set parallel.tp: [1]"
    ]
    assert engine_unsupported("standin", ParallelLayout(2, 1, 1), ENGINE, False) == []


def test_a_sweep_of_the_standin_dry_runs(tmp_path):
    wf = workflow_copy(tmp_path)
    # The registration runs before the workflow reads its config: a Snakefile that registers
    # the stand-in's record, then includes the workflow's own (same directory, same basedir).
    (wf / "Snakefile.standin").write_text(
        "import sys\n"
        f"sys.path[:0] = [{str(wf / 'src')!r}, {str(TESTS)!r}]\n"
        "import standin.registry  # registers the stand-in engine\n\n\n"
        'include: "Snakefile"\n'
    )
    cfg = {
        "backends": ["pytorch", "standin"],
        "scenarios": ["inference", "serving"],
        "parallel": {"tp": [1, 2], "pp": [1], "dp": [1]},
        "serving": {"parallel": {"tp": [1, 2], "pp": [1], "dp": [1]}},
    }
    (wf / "config" / "standin.yaml").write_text(yaml.safe_dump(cfg))
    # Target `all` named: the wrapper's default target is not the included workflow's.
    rc, out = snakemake(
        wf, "all", "-n", "-s", "Snakefile.standin", "--profile", "profiles/local",
        "--configfile", "config/standin.yaml",
    )  # fmt: skip
    assert rc == 0, out[-4000:]
    # A serving job is rule serve's, an inference job rule measure's: both blocks parse alike.
    ran = {
        (j["wildcards"]["backend"], j["wildcards"]["scenario"], j["wildcards"]["tp"])
        for j in measure_jobs(out.replace("rule serve:", "rule measure:"))
    }
    # Its record: both scenarios; tp=2 on CPUs unsupported (pytorch's tp=2 still runs).
    assert {("standin", "inference", "1"), ("standin", "serving", "1")} <= ran
    assert ("pytorch", "inference", "2") in ran
    assert not {b for b, _, tp in ran if b == "standin" and tp == "2"}
