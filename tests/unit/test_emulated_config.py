"""A misconfigured ``measurement.emulated`` section is rejected when the workflow loads (before any
job), naming the key; a good one resolves to the node every process reads back."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from energysweep.hw.emulated import node_config
from energysweep.sweep import config as es_config

ROOT = Path(__file__).resolve().parents[2]


def load(emulated: dict) -> None:
    """The workflow's load-time steps (schema, then the semantic checks) on a config."""
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["backends"] = ["pytorch"]
    cfg["measurement"] = {**cfg["measurement"], "device": "emulated", "emulated": emulated}
    es_config.validate_schema(cfg)
    es_config.check(cfg, workflow_dir=ROOT)


@pytest.mark.parametrize(
    ("emulated", "names"),
    [
        ({"profile": "b200"}, "measurement.emulated.profile"),
        ({"counter_period_s": -0.1}, "measurement.emulated.counter_period_s"),
        ({"counter_period_s": 0}, "measurement.emulated.counter_period_s"),
        ({"faults": [{"kind": "stuck_counter", "gpu": 8}]}, "measurement.emulated.faults[0].gpu"),
        (
            {"node_gpus": 2, "faults": [{"kind": "throttle", "gpu": 2}]},
            "faults[0].gpu: GPU 2 does not",
        ),
        ({"faults": [{"kind": "melt"}]}, "measurement.emulated.faults[0].kind"),
        ({"counter_jitter_s": 0.05}, "measurement.emulated.counter_jitter_s"),
        ({"refusals": [{"call": "nvmlDeviceGetName"}]}, "measurement.emulated.refusals[0].call"),
        ({"activity_hz": 50}, "measurement.emulated.activity_hz"),
    ],
)
def test_bad_emulated_section_is_refused_naming_the_key(emulated, names):
    with pytest.raises(es_config.ConfigError, match=names.replace("[", r"\[").replace("]", r"\]")):
        load(emulated)


def test_a_good_section_resolves_with_the_profiles_values_for_nulls():
    load({"profile": "a100-sxm", "faults": [{"kind": "missing_gpu", "gpu": 3}]})
    node = node_config.resolve({**node_config.section_defaults(), "profile": "a100-sxm"}, 7)
    assert (node.counter_period_s, node.power_avg_window_s) == (0.1, 0.1)  # a100: GA100
    assert node.epoch_ns == 7 and node.faults == ()
    assert node_config.NodeSettings.from_json(node.to_json()) == node
