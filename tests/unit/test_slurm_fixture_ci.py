"""A Slurm cluster that cannot start skips on a developer's machine and fails in CI."""

from __future__ import annotations

import subprocess

import pytest

import slurm_fixtures


def _refuse_check(monkeypatch):
    def fake_run(subcommand, timeout_s, *args):
        return subprocess.CompletedProcess(["check"], 1, "needs root", "")

    monkeypatch.setattr(slurm_fixtures, "run_script", fake_run)


def test_cannot_start_fails_in_ci(monkeypatch):
    _refuse_check(monkeypatch)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(BaseException) as outcome:  # a skip must not pass for a failure here
        slurm_fixtures.ClusterSwitch().ensure(1)
    assert outcome.type is pytest.fail.Exception, outcome.type
    assert "needs root" in str(outcome.value) and "CI=true" in str(outcome.value)


def test_cannot_start_skips_elsewhere(monkeypatch):
    _refuse_check(monkeypatch)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(BaseException) as outcome:
        slurm_fixtures.ClusterSwitch().ensure(1)
    assert outcome.type is pytest.skip.Exception, outcome.type
    assert "needs root" in str(outcome.value)
