"""Finding a multi-node job's nodes from its job id (energysweep.launch.slurm); the real test is the
2-node cluster (tests/integration/test_slurm_multinode.py)."""

from __future__ import annotations

import subprocess

import pytest

from energysweep.launch.slurm import SlurmNodesError, job_nodes, parse_show_job

SHOW_JOB = """JobId=42 JobName=rule_measure
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   NodeList=esnode[1-2]
   BatchHost=esnode1
   ReqNodeList=(null) ExcNodeList=(null)
   NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
"""


class FakeSlurm:
    """Answers squeue/scontrol like Slurm 22.05; records every command it was asked."""

    def __init__(self, squeue=("esnode[1-2]\n", 0), show_job=(SHOW_JOB, 0)):
        self.answers = {"squeue": squeue, "show job": show_job}
        self.calls: list[list[str]] = []

    def __call__(self, argv):
        self.calls.append(argv)
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            hosts = {"esnode[1-2]": "esnode1\nesnode2\n", "dgx-[07,09]": "dgx-07\ndgx-09\n"}
            return subprocess.CompletedProcess(argv, 0, hosts.get(argv[3], ""), "")
        key = "squeue" if argv[0] == "squeue" else "show job"
        out, rc = self.answers[key]
        return subprocess.CompletedProcess(
            argv, rc, out if rc == 0 else "", "" if rc == 0 else f"{argv[0]}: error: boom"
        )


def test_nodelist_variable_is_used_when_present():
    fake = FakeSlurm()
    assert job_nodes({"SLURM_JOB_NODELIST": "dgx-[07,09]"}, run=fake) == ["dgx-07", "dgx-09"]
    assert [c[0] for c in fake.calls] == ["scontrol"]


def test_stripped_environment_asks_squeue_by_job_id():
    fake = FakeSlurm()
    assert job_nodes({"SLURM_JOB_ID": "42"}, run=fake) == ["esnode1", "esnode2"]
    assert fake.calls[0] == ["squeue", "-h", "-j", "42", "-o", "%N"]


def test_falls_back_to_scontrol_show_job():
    fake = FakeSlurm(squeue=("", 1))
    assert job_nodes({"SLURM_JOB_ID": "42"}, run=fake) == ["esnode1", "esnode2"]
    assert ["scontrol", "show", "job", "42"] in fake.calls


def test_show_job_parsing_ignores_requested_and_excluded_lists():
    assert parse_show_job(SHOW_JOB) == "esnode[1-2]"
    assert parse_show_job("JobId=1\n   NodeList=(null)\n   ReqNodeList=dgx1\n") is None
    assert parse_show_job("JobId=1 ReqNodeList=dgx1 ExcNodeList=dgx2") is None


def test_error_names_everything_it_looked_at():
    fake = FakeSlurm(squeue=("", 1), show_job=("JobId=42\n   NodeList=(null)\n", 0))
    with pytest.raises(SlurmNodesError) as err:
        job_nodes({"SLURM_JOB_ID": "42"}, run=fake)
    msg = str(err.value)
    assert "Slurm job 42" in msg
    assert "SLURM_JOB_NODELIST is not set" in msg
    assert "squeue -h -j 42 -o %N` exited 1" in msg
    assert "scontrol show job 42` printed no node list" in msg


def test_outside_slurm_says_so():
    with pytest.raises(SlurmNodesError, match="SLURM_JOB_ID is not set"):
        job_nodes({}, run=FakeSlurm())


def test_missing_commands_are_reported_not_raised_raw():
    def no_slurm(argv):
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    with pytest.raises(SlurmNodesError, match="squeue -h -j 7 -o %N` failed: FileNotFoundError"):
        job_nodes({"SLURM_JOB_ID": "7"}, run=no_slurm)
