"""Every Snakemake step logs its own failure: nothing that can fail runs before ``step_log``.

An error before ``with step_log(...)`` (an import of the package, say) never reaches the rule's
log: Snakemake then reports "Logfile ... not found". Two checks: the scripts' top level holds
nothing but the path set-up and the import of ``step_log`` itself; and each script, run against
a copy of the package whose every other module fails to import, exits 1 with the traceback in
its rule log.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
# What a step's own logging needs: it must import, or no error can be logged at all.
LOGGING_MODULES = {
    "__init__.py",
    "util/__init__.py",
    "util/steplog.py",
    "util/faults.py",
    "util/jsonobj.py",
}


def _allowed_before_log(node: ast.stmt) -> bool:
    """Docstring, stdlib imports, ``sys.path.insert``, the step_log import, ``sm = snakemake``."""
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return True  # the docstring
    if isinstance(node, ast.Import):
        return all(a.name in {"sys", "os", "json", "csv"} for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.module in {"pathlib", "energysweep.util.steplog"}
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        return ast.unparse(node.value.func) == "sys.path.insert"
    if isinstance(node, ast.Assign):
        return isinstance(node.value, (ast.Name, ast.List, ast.Constant))
    return False


def _is_step_log(node: ast.stmt) -> bool:
    return isinstance(node, ast.With) and any(
        isinstance(i.context_expr, ast.Call) and ast.unparse(i.context_expr.func) == "step_log"
        for i in node.items
    )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_nothing_that_can_fail_runs_before_step_log(script):
    body = ast.parse(script.read_text()).body
    first_log = next(i for i, node in enumerate(body) if _is_step_log(node))
    early = [ast.unparse(n) for n in body[:first_log] if not _allowed_before_log(n)]
    assert not early, f"{script.name} runs before step_log (its errors would miss the log): {early}"


def _broken_package(tmp_path: Path) -> Path:
    """A copy of src/ where every module but the step's own logging raises ImportError."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__"))
    pkg = src / "energysweep"
    for module in pkg.rglob("*.py"):
        if str(module.relative_to(pkg)) not in LOGGING_MODULES:
            module.write_text(f"raise ImportError('broken on purpose: {module.name}')\n")
    return tmp_path / "scripts"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_failing_import_reaches_the_rule_log(script, tmp_path):
    scriptdir = _broken_package(tmp_path)
    log = tmp_path / "logs" / f"{script.stem}.log"
    # A stand-in for Snakemake's ``snakemake`` object: only what the scripts read first.
    runner = textwrap.dedent(f"""
        import runpy, types
        sm = types.SimpleNamespace(
            scriptdir={str(scriptdir)!r}, log=[{str(log)!r}], rule={script.stem!r},
            input=types.SimpleNamespace(), output=types.SimpleNamespace(),
            params=types.SimpleNamespace(), threads=1, config={{}},
        )
        runpy.run_path({str(script)!r}, init_globals={{"snakemake": sm}}, run_name="__main__")
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ENERGYSWEEP_TEST_FAULT")}
    proc = subprocess.run(
        [sys.executable, "-c", runner], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert log.is_file(), f"{script.name}: no rule log; stderr: {proc.stderr[-2000:]}"
    text = log.read_text()
    assert "Traceback (most recent call last)" in text, text
    if "from energysweep." in script.read_text().replace("energysweep.util.steplog", ""):
        assert "ImportError: broken on purpose" in text, text
    assert f"energysweep step {script.stem} failed" in proc.stderr
