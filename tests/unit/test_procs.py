"""A job's processes are one unit: found by their mark, stopped together, never outliving it.

Real processes: a launcher that starts a child in a session of its own (as torchrun starts its
ranks) and a grandchild that ignores SIGTERM (as a wedged rank might).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from jobspec import job_spec, limits

from energysweep.job.spec import JobDir, LaunchedJob
from energysweep.launch import job as launch_job
from energysweep.launch import procs

# The launcher: starts a child in a new session that starts a grandchild ignoring SIGTERM, writes
# their pids to argv[1], then sleeps (or exits with argv[2] after a moment).
TREE = textwrap.dedent("""
    import json, os, signal, subprocess, sys, time
    out, exit_code = sys.argv[1], int(sys.argv[2])
    grandchild = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "print('ready', flush=True); time.sleep(600)")
    child = ("import subprocess, sys, time; "
             f"p = subprocess.Popen([sys.executable, '-c', {grandchild!r}], "
             "stdout=subprocess.PIPE, text=True); p.stdout.readline(); "
             "print(p.pid, flush=True); time.sleep(600)")
    c = subprocess.Popen([sys.executable, "-c", child], start_new_session=True,
                         stdout=subprocess.PIPE, text=True)
    gc = int(c.stdout.readline())
    with open(out + ".tmp", "w") as fh:
        json.dump({"launcher": os.getpid(), "child": c.pid, "grandchild": gc}, fh)
    os.replace(out + ".tmp", out)
    if exit_code >= 0:
        time.sleep(0.5)
        sys.exit(exit_code)
    time.sleep(600)
""")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_for(path: Path, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return json.loads(path.read_text())


@pytest.fixture
def tree_script(tmp_path):
    path = tmp_path / "tree.py"
    path.write_text(TREE)
    return path


@pytest.mark.timeout(120)
def test_stop_reaches_other_sessions_and_kills_after_grace(tmp_path, tree_script):
    mark = uuid.uuid4().hex
    pids_file = tmp_path / "pids.json"
    with open(tmp_path / "log", "w") as log:
        proc = procs.start(
            [sys.executable, str(tree_script), str(pids_file), "-1"], dict(os.environ), log, mark
        )
        pids = wait_for(pids_file)
        assert set(procs.marked(mark)) == set(pids.values())
        t0 = time.monotonic()
        killed = procs.stop(proc, mark, grace_s=1.0, log=log)
        elapsed = time.monotonic() - t0
    assert killed == [pids["grandchild"]]  # the only one that ignored SIGTERM
    assert not any(alive(p) for p in pids.values())
    assert procs.marked(mark) == []
    assert 1.0 <= elapsed < 15
    text = (tmp_path / "log").read_text()
    assert "SIGTERM, SIGKILL after 1 s" in text and "SIGKILL to" in text


@pytest.mark.timeout(120)
def test_stop_returns_only_when_a_killed_process_has_finished_exiting(tmp_path):
    """A process that is exiting has released its memory (its environment, mark included, can no
    longer be read) well before the kernel has finished with it: a rank holding 1 GiB is still
    running its exit for tens of milliseconds. stop() waits until it is a zombie or gone."""
    mark = uuid.uuid4().hex
    pids_file = tmp_path / "pids.json"
    rank = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "b = bytearray(1 << 30); print('ready', flush=True); time.sleep(600)"
    )
    launcher = textwrap.dedent(f"""
        import json, os, subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-c", {rank!r}], start_new_session=True,
                             stdout=subprocess.PIPE, text=True)
        p.stdout.readline()
        with open({str(pids_file)!r} + ".tmp", "w") as fh:
            json.dump({{"rank": p.pid}}, fh)
        os.replace({str(pids_file)!r} + ".tmp", {str(pids_file)!r})
        time.sleep(600)
    """)
    with open(tmp_path / "log", "w") as log:
        proc = procs.start([sys.executable, "-c", launcher], dict(os.environ), log, mark)
        rank_pid = wait_for(pids_file)["rank"]
        killed = procs.stop(proc, mark, grace_s=0.5, log=log)
        state = procs._state(rank_pid)
    assert killed == [rank_pid]
    assert state in (None, "Z", "X"), f"stop() returned while the rank was still exiting ({state})"


@pytest.mark.timeout(120)
def test_launched_command_dies_with_the_measure_step(tmp_path, tree_script):
    """SIGKILL of the process that started the job (no handler runs): the kernel stops it."""
    mark = uuid.uuid4().hex
    pids_file = tmp_path / "pids.json"
    starter = tmp_path / "starter.py"
    starter.write_text(
        textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(Path(procs.__file__).parents[2])!r})
        from energysweep.launch import procs
        procs.start([sys.executable, {str(tree_script)!r}, {str(pids_file)!r}, "-1"],
                    dict(os.environ), sys.stdout, {mark!r})
        time.sleep(600)
    """)
    )
    import subprocess

    starter_proc = subprocess.Popen([sys.executable, str(starter)])
    try:
        pids = wait_for(pids_file)
        os.kill(starter_proc.pid, signal.SIGKILL)
        starter_proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while alive(pids["launcher"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pids["launcher"]), "the launched command outlived its measure step"
    finally:
        starter_proc.kill()
        # What PDEATHSIG cannot reach (the launcher's own children) the measure step's sweep
        # does; here the test cleans up with the same function.
        procs.stop(None, mark, grace_s=0)
    assert procs.marked(mark) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("exit_code", "timeout_s", "match"),
    [
        (-1, 2.0, r"ran longer than limits\.job_timeout_s=2 s"),
        (3, 60.0, "exited 3"),
        (0, 60.0, None),
    ],
)
def test_run_job_leaves_no_process_and_publishes_only_success(
    tmp_path, tree_script, monkeypatch, exit_code, timeout_s, match
):
    """run_job on a stand-in command (any layout's argv is started the same way)."""
    pids_file = tmp_path / "pids.json"
    out = tmp_path / "job"

    def fake_argv(placement, spec_path, **kw):
        # The stand-in loads the launched job and writes its staged outputs, as rank 0 does,
        # then behaves as told.
        write = (
            "import pathlib; from energysweep.job.spec import LaunchedJob; "
            f"job = LaunchedJob.load({str(spec_path)!r}); "
            "[pathlib.Path(p).parent.mkdir(parents=True, exist_ok=True) "
            "or pathlib.Path(p).write_text('{}') for p in job.outputs.paths()]; "
        )
        return [
            sys.executable,
            "-c",
            write + f"import runpy, sys; sys.argv = ['tree', {str(pids_file)!r}, "
            f"'{exit_code}']; runpy.run_path({str(tree_script)!r}, run_name='__main__')",
        ]

    monkeypatch.setattr(launch_job, "build_argv", fake_argv)
    job_dir = JobDir(str(out))
    bounds = limits(job_timeout_s=timeout_s, kill_grace_s=0.5)
    log_path = tmp_path / "job.log"
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        if match is None:
            launch_job.run_job(job_spec(), job_dir, "/m", bounds, log, cpus=1)
        else:
            with pytest.raises(launch_job.JobFailed, match=match) as info:
                launch_job.run_job(job_spec(), job_dir, "/m", bounds, log, cpus=1)
            assert "nothing of it was published" in str(info.value)
    elapsed = time.monotonic() - t0
    pids = wait_for(pids_file, timeout=1)
    assert not any(alive(p) for p in pids.values()), "a process outlived its job"
    written = LaunchedJob.load(job_dir.spec_file)
    assert procs.marked(written.job_id) == []
    assert Path(job_dir.job_json).exists() == (match is None)
    assert not list(out.glob(".staging-*"))
    assert elapsed < timeout_s + 20
    assert written.limits == bounds


def test_limits_do_not_change_the_config_hash(tmp_path, monkeypatch):
    def fake_argv(placement, spec_path, **kw):
        return [sys.executable, "-c", "raise SystemExit(1)"]

    monkeypatch.setattr(launch_job, "build_argv", fake_argv)
    job_dir = JobDir(str(tmp_path))
    hashes = []
    for bounds in (limits(job_timeout_s=5), limits(job_timeout_s=9, kill_grace_s=1)):
        with open(tmp_path / "log", "w") as log, pytest.raises(launch_job.JobFailed):
            launch_job.run_job(job_spec(), job_dir, "/m", bounds, log, 1)
        written = LaunchedJob.load(job_dir.spec_file)
        assert written.limits == bounds
        hashes.append(written.config_hash)
    assert hashes[0] == hashes[1]


# ------------------------------------------------ how a rank ends (energysweep.run.entry)
@pytest.mark.parametrize(
    "outcome, code, traceback_printed",
    [(lambda: 0, 0, False), (lambda: 3, 3, False), (lambda: 1 / 0, 1, True)],
    ids=["success", "exit-code", "raises"],
)
def test_a_rank_exits_at_once_with_its_result_and_its_output_flushed(
    monkeypatch, capsys, outcome, code, traceback_printed
):
    """Success or failure, the rank ends with os._exit (no interpreter teardown: 0.8-1.9 s per
    job, issue 30), after the logging handlers and both streams are flushed."""
    from energysweep import run

    exits, flushed = [], []
    monkeypatch.setattr(run.procs, "die_with_parent", lambda: None)
    monkeypatch.setattr(run, "main", lambda argv=None: (print("rank output"), outcome())[1])
    monkeypatch.setattr(run.logging, "shutdown", lambda: flushed.append("logging"))

    def _exit(status):
        exits.append(status)
        raise SystemExit(status)  # os._exit never returns

    monkeypatch.setattr(run.os, "_exit", _exit)
    with pytest.raises(SystemExit):
        run.entry([])
    out, err = capsys.readouterr()
    assert exits == [code] and flushed == ["logging"] and "rank output" in out
    assert ("ZeroDivisionError" in err) is traceback_printed
