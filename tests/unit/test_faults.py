"""The test-only fault hook: parsing of ENERGYSWEEP_TEST_FAULT and where it fires."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from energysweep.util import faults
from energysweep.util.faults import ENV_VAR, Fault, FaultSpecError, inject, parse


@pytest.mark.parametrize("text", [None, "", "  "])
def test_off_when_unset_or_empty(text):
    assert parse(text) is None
    inject(0, 4, "inference", environ={} if text is None else {ENV_VAR: text})


def test_parses_the_contract_example():
    assert parse('{"rank": 1, "batch_size": 4, "action": "raise"}') == Fault("raise", 1, 4)
    assert parse('{"action": "hang", "scenario": "training"}') == Fault(
        "hang", None, None, "training"
    )


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{rank: 1}", "not JSON"),
        ("[1]", "JSON object"),
        ('{"rank": 1}', "'action' must be one of"),
        ('{"action": "explode"}', "'action' must be one of"),
        ('{"action": "raise", "rank": "1"}', "'rank' must be an integer"),
        ('{"action": "raise", "batch_size": true}', "'batch_size' must be an integer"),
        ('{"action": "raise", "scenario": "batch"}', "'scenario' must be one of"),
        ('{"action": "raise", "rnak": 1}', "unknown keys"),
    ],
)
def test_bad_values_name_the_variable_and_key(text, match):
    with pytest.raises(FaultSpecError, match=match) as info:
        parse(text)
    assert ENV_VAR in str(info.value)


def test_fires_only_on_its_rank_batch_size_and_scenario():
    env = {ENV_VAR: '{"rank": 1, "batch_size": 4, "action": "raise", "scenario": "inference"}'}
    inject(0, 4, "inference", environ=env)
    inject(1, 8, "inference", environ=env)
    inject(1, 4, "training", environ=env)
    with pytest.raises(RuntimeError, match="injected fault .raise. on rank 1 at batch size 4"):
        inject(1, 4, "inference", environ=env)


def test_without_rank_it_fires_on_every_rank():
    env = {ENV_VAR: '{"action": "raise"}'}
    for rank in (0, 1, 7):
        with pytest.raises(RuntimeError, match="injected fault"):
            inject(rank, 2, "training", environ=env)


@pytest.mark.parametrize(("action", "rc"), [("kill", -signal.SIGKILL), ("hang", None)])
def test_kill_and_hang_really_happen(action, rc):
    code = (
        "from energysweep.util import faults; faults.inject(0, 1, 'inference'); print('survived')"
    )
    env = {
        **os.environ,
        ENV_VAR: f'{{"action": "{action}"}}',
        "PYTHONPATH": str(Path(faults.__file__).resolve().parents[2]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=3 if action == "hang" else 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=30)
        assert rc is None, "the kill action should have ended the process"
        assert "survived" not in out
        return
    assert proc.returncode == rc
    assert "survived" not in out
    assert f"injected fault ({action}) on rank 0" in err


def test_step_faults_fire_only_in_their_step_never_in_a_point():
    env = {ENV_VAR: '{"action": "raise", "step": "merge_shards"}'}
    assert parse(env[ENV_VAR]) == Fault("raise", step=("merge_shards",))
    assert parse('{"action": "raise", "step": ["a", "b"]}').step == ("a", "b")
    faults.inject_step("measure", environ=env)
    inject(0, 1, "inference", environ=env)
    with pytest.raises(RuntimeError, match="injected fault .raise. in step merge_shards"):
        faults.inject_step("merge_shards", environ=env)
    with pytest.raises(FaultSpecError, match="'step'"):
        parse('{"action": "kill", "step": "measure"}')


def test_a_fault_can_name_the_layout_of_its_job():
    fault = faults.parse('{"action": "hang", "scenario": "serving", "layout": [1, 2, 1]}')
    assert fault.applies(0, 4, "serving", (1, 2, 1))
    assert not fault.applies(0, 4, "serving", (2, 1, 1))
    assert not fault.applies(0, 4, "inference", (1, 2, 1))
    with pytest.raises(faults.FaultSpecError, match="layout"):
        faults.parse('{"action": "hang", "layout": [1, 2]}')
