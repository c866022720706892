"""Logging of one Snakemake script step: everything, the traceback included, goes to its rule log.

Every ``scripts/*.py`` step runs its body inside :func:`step_log`::

    with step_log(snakemake.log[0], "merge_shards"):
        ...

Python-level and file-descriptor-level stdout/stderr (what child processes and native libraries
print) go to the log for the whole step. If the body raises, the full traceback is written to the
log *before* it is closed (a plain ``with open(log)`` closes the file first, and the traceback is
lost), one line naming the step, the error and the log goes to the console (the step's original
stderr, which Snakemake shows), and the step exits 1.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

from energysweep.util import faults

EXIT_FAILED = 1
# The running step's console (its original stderr), for what must be seen on the terminal.
_console = None


def to_console(text: str) -> None:
    """Print ``text`` on the running step's console (the terminal), besides the rule log."""
    if _console is not None:
        with contextlib.suppress(Exception):
            print(text, file=_console, flush=True)


def console_line(step: str, exc: BaseException, log_path: str | Path) -> str:
    """The one console line of a failed step: what failed, why (first line), where the log is."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    # The second line too: a merge's first bad file, say, is worth seeing without the log.
    first = " | ".join(lines[:2])
    if len(first) > 600:
        first = first[:600] + "..."
    why = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return f"energysweep step {step} failed: {why} (full traceback in {log_path})"


@contextlib.contextmanager
def step_log(log_path: str | Path, step: str) -> Iterator:
    """Send the step's output to ``log_path``; on an exception log its traceback and exit 1.

    Args:
        log_path: the rule's log file (``snakemake.log[0]``); created or truncated.
        step: the step's name for the console line (the rule name).

    Yields:
        The open log file (line-buffered), for child processes' stdout/stderr.

    Raises:
        SystemExit: exit status 1 after any exception in the body (0 for ``sys.exit(0)``).
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    # The console: a duplicate of fd 2 taken before fd 2 is pointed at the log.
    global _console
    console = _console = os.fdopen(os.dup(2), "w", buffering=1)
    saved_fds = (os.dup(1), os.dup(2))
    saved = (sys.stdout, sys.stderr)
    with open(log_path, "w", buffering=1) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
        try:
            faults.inject_step(step)  # test-only; off unless ENERGYSWEEP_TEST_FAULT names a step
            yield log
        except SystemExit as exc:
            if exc.code in (0, None):
                raise
            print(f"step {step} exited with {exc.code!r}", file=log)
            _report(log, console, step, exc, log_path)
            raise SystemExit(EXIT_FAILED) from None
        except BaseException as exc:  # KeyboardInterrupt too: every way out is logged
            traceback.print_exc(file=log)
            _report(log, console, step, exc, log_path)
            raise SystemExit(EXIT_FAILED) from None
        finally:
            log.flush()
            sys.stdout, sys.stderr = saved
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            _console = None
            console.close()


def _report(log, console, step: str, exc: BaseException, log_path: Path) -> None:
    line = console_line(step, exc, log_path)
    print(line, file=log, flush=True)
    with contextlib.suppress(Exception):
        print(line, file=console, flush=True)


# Options of the running Snakemake that a rerun command must repeat (a value each, or several).
_RERUN_OPTIONS = ("--profile", "--configfile", "--configfiles", "--directory", "-d")


def snakemake_options(pid: int | None = None) -> list[str] | None:
    """``--profile``/``--configfile``/``--directory`` of the Snakemake that runs this step.

    Found on the command line of the nearest ``snakemake`` ancestor process (Linux /proc), so
    that the rerun command a failed step prints works as typed. None when there is none.
    """
    pid = os.getppid() if pid is None else pid
    for _ in range(16):  # the step runs a few levels below Snakemake (shell, python)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            argv = cmdline.split("\0")[:-1]
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        if any(Path(a).name == "snakemake" for a in argv[:2]) or argv[1:3] == ["-m", "snakemake"]:
            return _pick_options(argv)
        pid = int(stat.rpartition(")")[2].split()[1])
        if pid <= 1:
            return None
    return None


def _pick_options(argv: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in _RERUN_OPTIONS:
            if eq:
                out.append(arg)
            else:
                out.append(arg)
                i += 1
                multi = name in ("--configfile", "--configfiles")
                while i < len(argv) and not argv[i].startswith("-"):
                    out.append(argv[i])
                    i += 1
                    if not multi:
                        break
                continue
        i += 1
    return out
