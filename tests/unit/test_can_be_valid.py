"""Defaults that can be valid (issue 27.5): the schema's workload and measurement defaults meet
the schema's own validity thresholds, and a config that cannot give a valid point is refused
before any job, naming the keys and the fix."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from energysweep.sweep import can_be_valid
from energysweep.sweep import config as es_config

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = yaml.safe_load((ROOT / "config" / "config.schema.yaml").read_text())


def default(section: str, key: str):
    return SCHEMA["properties"][section]["properties"][key]["default"]


def minimal(**sections) -> dict:
    """The smallest config: one model, everything else the schema's defaults."""
    cfg = {"models": [{"name": "tiny", "path": "builtin:tiny"}], **sections}
    es_config.validate_schema(cfg)
    return cfg


def test_schema_defaults_meet_the_schema_thresholds():
    """Derived from the schema itself: changing a default or a threshold breaks it."""
    reps = default("workload", "repetitions")
    window = default("measurement", "min_window_s")
    assert reps >= default("validity", "min_ok_repetitions")
    assert reps * window >= default("validity", "min_steady_state_s")
    assert window >= default("validity", "min_counter_periods") * default(
        "validity", "counter_period_s"
    )
    assert default("workload", "iterations") >= default("validity", "min_iterations")
    assert default("training", "steps") >= default("validity", "min_iterations")
    assert default("measurement", "energy_source") != "none"
    assert default("measurement", "sampler_hz") > 0
    # ... and the check agrees, for every scenario with fixed batches.
    cfg = minimal(scenarios=["inference", "training"])
    assert can_be_valid.problems(cfg) == []


def test_the_h200_run3_settings_are_named_with_their_fix():
    """3 x 5 s windows cannot reach 20 s of steady state (seen on the H200, every training
    point steady_state_short); 2 iterations fewer than 32."""
    cfg = minimal(
        scenarios=["inference", "training"],
        workload={"repetitions": 3, "iterations": 2},
        measurement={"device": "cuda"},
    )
    found = can_be_valid.problems(cfg)
    text = "\n".join(found)
    steady = SCHEMA["properties"]["validity"]["properties"]["min_steady_state_s"]["default"]
    assert "workload.repetitions 3 x measurement.min_window_s 5 s = 15 s" in text
    assert f"validity.min_steady_state_s {steady:g} s" in text
    assert f"workload.repetitions >= {math.ceil(steady / 5)}" in text
    assert f"measurement.min_window_s >= {steady / 3:.3g}" in text
    assert "workload.iterations 2 < validity.min_iterations 32" in text
    assert "training.steps" not in text  # its default is enough
    assert len(found) == 2


@pytest.mark.parametrize(
    "sections, keys",
    [
        ({"workload": {"repetitions": 2}}, ["workload.repetitions", "min_ok_repetitions"]),
        ({"measurement": {"min_window_s": 2}}, ["measurement.min_window_s", "min_counter_periods"]),
        ({"measurement": {"energy_source": "none"}}, ["measurement.energy_source"]),
        ({"measurement": {"sampler_hz": 0}}, ["measurement.sampler_hz", "require_timeline"]),
        ({"scenarios": ["training"], "training": {"steps": 4}}, ["training.steps"]),
    ],
)
def test_each_certain_failure_is_named(sections, keys):
    found = "\n".join(can_be_valid.problems(minimal(**sections)))
    for key in keys:
        assert key in found


def test_a_gpu_sweep_that_cannot_be_valid_is_refused_before_any_job(capsys):
    cfg = minimal(workload={"repetitions": 3}, measurement={"device": "cuda"})
    with pytest.raises(es_config.ConfigError) as err:
        es_config.check(cfg, workflow_dir=ROOT)
    msg = str(err.value)
    assert "can give no valid point" in msg and "validity.exploratory" in msg
    assert "workload.repetitions 3 x measurement.min_window_s 5 s" in msg


def test_exploratory_or_cpu_sweeps_are_warned_about(capsys):
    cfg = minimal(
        workload={"repetitions": 3},
        measurement={"device": "cuda"},
        validity={"exploratory": True},
    )
    es_config.check(cfg, workflow_dir=ROOT)
    assert "warning: these settings can give no valid point" in capsys.readouterr().err
    cpu = minimal(workload={"repetitions": 3}, measurement={"device": "cpu"})
    es_config.check(cpu, workflow_dir=ROOT)
    assert "workload.repetitions 3" in capsys.readouterr().err


def test_the_schema_defaults_pass_the_check_silently(capsys):
    es_config.check(minimal(measurement={"device": "cuda"}), workflow_dir=ROOT)
    assert "valid point" not in capsys.readouterr().err
