"""util.steplog: a failing step's traceback reaches its log; one line reaches the console."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def run_step(tmp_path: Path, body: str, env_extra: dict | None = None):
    log = tmp_path / "logs" / "step.log"
    script = tmp_path / "step.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, subprocess, sys
        from energysweep.util.steplog import step_log
        with step_log({str(log)!r}, "my_rule"):
            print("to stdout")
            print("to stderr", file=sys.stderr)
            subprocess.run([sys.executable, "-c", "import os; os.write(2, b'child fd2\\\\n')"])
        """)
        + textwrap.dedent(body)
    )
    env = {k: v for k, v in os.environ.items() if k != "ENERGYSWEEP_TEST_FAULT"}
    env.update({"PYTHONPATH": str(SRC), **(env_extra or {})})
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    return proc, log


def test_success_logs_everything_and_prints_nothing(tmp_path):
    proc, log = run_step(tmp_path, "")
    assert proc.returncode == 0, proc.stderr
    text = log.read_text()
    assert "to stdout" in text and "to stderr" in text and "child fd2" in text
    assert proc.stdout == "" and proc.stderr == ""


def test_exception_traceback_in_log_one_line_on_console(tmp_path):
    proc, log = run_step(
        tmp_path,
        """
        def deep():
            raise ValueError("bad shard\\nsecond line")
        with step_log(sys.argv[0] + ".log2", "merge_shards"):
            print("before the error")
            deep()
        """,
    )
    assert proc.returncode == 1
    text = Path(str(tmp_path / "step.py") + ".log2").read_text()
    assert "before the error" in text
    assert "Traceback (most recent call last)" in text and "in deep" in text
    assert "ValueError: bad shard" in text and "second line" in text
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("energysweep step merge_shards failed: ValueError: bad shard")
    assert lines[0].endswith(".log2)")


@pytest.mark.parametrize(
    ("body", "rc", "expect"),
    [
        ("with step_log(sys.argv[0] + '.log2', 's'):\n    sys.exit(3)\n", 1, "exited with 3"),
        ("with step_log(sys.argv[0] + '.log2', 's'):\n    sys.exit(0)\n", 0, ""),
        (
            "with step_log(sys.argv[0] + '.log2', 's'):\n    raise KeyboardInterrupt\n",
            1,
            "KeyboardInterrupt",
        ),
    ],
)
def test_exits(tmp_path, body, rc, expect):
    proc, _ = run_step(tmp_path, body)
    assert proc.returncode == rc
    assert expect in Path(str(tmp_path / "step.py") + ".log2").read_text()


def test_step_fault_hook(tmp_path):
    proc, log = run_step(
        tmp_path, "", {"ENERGYSWEEP_TEST_FAULT": '{"action": "raise", "step": "my_rule"}'}
    )
    assert proc.returncode == 1
    assert "RuntimeError: injected fault (raise) in step my_rule" in log.read_text()
    assert "energysweep step my_rule failed" in proc.stderr


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["/v/bin/snakemake", "--profile", "profiles/slurm", "--configfile=c.yaml", "-n"],
            ["--profile", "profiles/slurm", "--configfile=c.yaml"],
        ),
        (
            [
                "python",
                "-m",
                "snakemake",
                "--configfile",
                "a.yaml",
                "b.yaml",
                "--cores",
                "4",
                "all",
            ],
            ["--configfile", "a.yaml", "b.yaml"],
        ),
        (
            ["snakemake", "--profile=profiles/local", "-d", "wf", "--forcerun", "x"],
            ["--profile=profiles/local", "-d", "wf"],
        ),
    ],
)
def test_rerun_options_taken_from_the_snakemake_command_line(argv, expected):
    from energysweep.util.steplog import _pick_options

    assert _pick_options(argv) == expected


def test_snakemake_options_none_without_a_snakemake_ancestor():
    from energysweep.util.steplog import snakemake_options

    assert snakemake_options() is None  # pytest's ancestors are not Snakemake
