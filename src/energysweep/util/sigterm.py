"""A workaround for Snakemake's SIGTERM handler, which can hang its process forever.

Snakemake's ``JobScheduler.exit_gracefully`` (9.27.1) is its SIGTERM handler, and it takes the
scheduler's lock, a ``threading.Lock`` (not reentrant). Python runs a signal handler in the main
thread, between two bytecodes of whatever that thread is doing. A SIGTERM that arrives while the
main thread holds the lock blocks the handler on a lock its own thread holds, so the process
hangs. The main thread holds the lock while it finishes or fails a job (``_finish_jobs``,
``_error_jobs``: postprocessing and file I/O).

Seen in CI on 2026-11-30: a Slurm job's Snakemake was stopped at its time limit. py-spy showed
``exit_gracefully`` blocked under ``_error_jobs`` -> ``Job.postprocess``. Its parent shell had
died of the same SIGTERM, so ``proctrack/linuxproc`` lost the orphan, and Slurm's SIGKILL never
reached it. It was left running after the test cluster had gone.

:func:`patch` replaces the handler with :func:`exit_gracefully`, which takes no lock. It sets
the same flag, which is one attribute store. It wakes the scheduler from a thread of its own,
because the semaphore's ``release`` takes the semaphore's own lock, which the main thread may
hold too. The workflow applies it (rules/common.smk); nothing here imports Snakemake.
"""

from __future__ import annotations

import inspect
import threading


def exit_gracefully(self, *args) -> None:
    """Snakemake's SIGTERM handler without its lock: stop after the running jobs."""
    self._user_kill = "graceful"
    threading.Thread(target=self._open_jobs.release, name="sigterm-wake", daemon=True).start()


def patch(scheduler_cls: type) -> bool:
    """Install :func:`exit_gracefully` on Snakemake's ``JobScheduler`` class if its own handler
    takes the scheduler's lock. Returns True if it did, False if that handler does not."""
    try:
        source = inspect.getsource(scheduler_cls.exit_gracefully)  # type: ignore[attr-defined]
    except (AttributeError, OSError, TypeError):
        return False
    if "self._lock" not in source:
        return False
    scheduler_cls.exit_gracefully = exit_gracefully  # type: ignore[attr-defined]
    return True
