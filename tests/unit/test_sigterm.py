"""Snakemake's SIGTERM handler, deadlocked and not (energysweep.util.sigterm).

The handler runs in the main thread, on top of whatever that thread was doing. Here the lock
is taken by the thread that then calls the handler, which is what the signal does to it.
"""

from __future__ import annotations

import subprocess
import sys
import threading

from snakemake.scheduling.job_scheduler import JobScheduler

from energysweep.util import sigterm

from conftest import test_env, workflow_copy


def _scheduler(cls: type):
    """A scheduler with just what the handler touches (no workflow behind it)."""
    s = cls.__new__(cls)
    s._lock = threading.Lock()
    s._open_jobs = threading.Semaphore(0)  # as JobScheduler.__init__ makes them
    s._user_kill = None
    return s


def test_snakemakes_own_handler_hangs_while_its_thread_holds_the_lock():
    """Why the workaround exists (the pinned Snakemake, envs/venv.lock): if this fails, the
    installed Snakemake no longer deadlocks, and rules/common.smk's patch can go."""
    s = _scheduler(JobScheduler)

    def signalled_while_holding():
        with s._lock:
            JobScheduler.exit_gracefully(s)

    t = threading.Thread(target=signalled_while_holding, daemon=True)  # left blocked: a daemon
    t.start()
    t.join(2)
    assert t.is_alive()


def test_the_patched_handler_returns_and_wakes_the_scheduler():
    class Scheduler(JobScheduler):  # the real class's handler, patched on a subclass only
        pass

    assert sigterm.patch(Scheduler) is True
    s = _scheduler(Scheduler)
    done = threading.Event()

    def signalled_while_holding():
        with s._lock, s._open_jobs._cond:  # the scheduler's lock and the semaphore's own
            s.exit_gracefully()
        done.set()

    threading.Thread(target=signalled_while_holding, daemon=True).start()
    assert done.wait(10), "the patched handler blocked"
    assert s._user_kill == "graceful"
    assert s._open_jobs.acquire(timeout=10)  # the schedule loop is woken
    assert JobScheduler.exit_gracefully is not sigterm.exit_gracefully  # only the subclass


def test_a_handler_that_takes_no_lock_is_left_alone():
    class Fixed:
        def exit_gracefully(self, *args):
            self._user_kill = "graceful"

    original = Fixed.exit_gracefully
    assert sigterm.patch(Fixed) is False and Fixed.exit_gracefully is original
    assert sigterm.patch(object) is False


_DRY_RUN = """
import sys
from snakemake.cli import main
sys.argv = ["snakemake", "-n", "--profile", "profiles/local", "--quiet"]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
from snakemake.scheduling.job_scheduler import JobScheduler
from energysweep.util import sigterm
print("patched", JobScheduler.exit_gracefully is sigterm.exit_gracefully)
"""


def test_the_workflow_patches_the_scheduler_it_runs(tmp_path):
    """rules/common.smk patches the class before Snakemake builds its scheduler (a dry run, in
    the process that parsed the workflow, as the head Snakemake and every Slurm job's do)."""
    wf = workflow_copy(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", _DRY_RUN],
        cwd=wf,
        env={**test_env(), "PYTHONPATH": str(wf / "src")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "patched True", proc.stdout[-2000:]
