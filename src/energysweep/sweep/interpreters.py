"""Backend environments: which Python interpreter a backend's ranks run in, and whether it works.

Each engine may need its own environment: vLLM pins numpy < 2.4 and transformers < 5.20 while the
Slurm executor plugin needs numpy >= 2.4.5, so vLLM cannot live in Snakemake's venv. A measure
job therefore starts its ranks (torchrun, or the engine's entry point) with the interpreter of its
backend's environment, decided here and nowhere else:

- the backend registry's ``default_python`` (energysweep.job.backends, data) names each
  backend's default interpreter: ``None`` is the Python the measure job itself runs in
  (Snakemake's, or the rule's conda env); a relative path is relative to the workflow directory
  (``.venv-vllm/bin/python``, built by ``make vllm-env``);
- the config key ``environments.<backend>`` overrides it (a user's own vLLM install);
- under ``--software-deployment-method conda`` the rule's conda env (``envs/<backend>.yaml``) is
  the environment, so the measure job's own Python is used and nothing is checked here.

:func:`check` runs when the workflow loads, before any job is submitted: a missing interpreter or
one where the engine does not import is a :class:`ConfigError`-style problem naming the backend,
the key and the fix. It imports the engine in a subprocess of that interpreter (never in
Snakemake's process), bounded by a timeout and cached per workflow run and, for an environment
built from a lock, inside that environment (keyed by the lock's hash), so a clean run does not
import it again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from energysweep.job.backends import BACKENDS, SERVING
from energysweep.tables.io import write_json_atomic

# A serving job's client runs vLLM's load generator (vllm.benchmarks), whatever the server's
# engine: it runs in the vLLM environment; the server runs in its backend's.
LOAD_GENERATOR_BACKEND = "vllm"
LOAD_GENERATOR_MODULE = "vllm.benchmarks.serve"
PROBE_TIMEOUT_S = 300  # importing vLLM (torch, transformers, triton) takes 5-30 s on 2 busy cores
# Probe results that succeeded, per workflow run directory (see _cache_key).
CACHE_FILE = Path(".snakemake") / "energysweep" / "environments.json"
# ... and inside the environment itself where `make` built it from a lock (its
# energysweep-env.json names the lock's sha256): a clean run (`make clean`, a fresh checkout
# sharing the environment) does not import the engine again (see _env_cache).
ENV_RECORD = "energysweep-env.json"
ENV_CACHE = "energysweep-checks.json"
_memo: dict[str, dict] = {}


def interpreter(
    backend: str, environments: dict | None, workflow_dir: str | Path, use_conda: bool = False
) -> str | None:
    """Absolute path of the interpreter ``backend``'s ranks use; None: the measure job's own.

    Args:
        backend: a key of the backend registry (its ``default_python`` applies when
            ``environments`` does not set it).
        environments: the config section ``environments`` (may be None or miss the backend).
        workflow_dir: what a relative path is relative to (the Snakefile's directory).
        use_conda: the rule runs in its conda env, which is then the backend's environment.
    """
    if use_conda:
        return None
    configured = (environments or {}).get(backend)
    path = configured if configured is not None else BACKENDS[backend].default_python
    if path is None:
        return None
    p = Path(path).expanduser()
    # Not resolved: a venv's python is a symlink to the base interpreter, and only the path
    # inside the venv makes Python find the venv's site-packages.
    return str(p if p.is_absolute() else Path(workflow_dir).absolute() / p)


def job_interpreters(
    backend: str,
    scenario: str,
    environments: dict | None,
    workflow_dir: str | Path,
    use_conda: bool = False,
) -> tuple[str | None, str | None]:
    """(the job's process interpreter, a serving job's server interpreter; None: the measure
    job's own). A serving job's process is the load client, in the vLLM environment."""
    own = interpreter(backend, environments, workflow_dir, use_conda)
    if scenario != SERVING:
        return own, None
    client = interpreter(LOAD_GENERATOR_BACKEND, environments, workflow_dir, use_conda)
    return client, own or sys.executable


def _site_dirs(python: str) -> list[Path]:
    prefix = Path(python).parent.parent
    return sorted(prefix.glob("lib/python3*/site-packages")) + sorted(
        prefix.glob("lib64/python3*/site-packages")
    )


def _cache_key(python: str, module: str) -> str:
    """Changes whenever packages are installed or removed in that environment (the entries of
    its site-packages directories change), so a cached success is never stale."""
    stamps = [f"{d}:{d.stat().st_mtime_ns}" for d in _site_dirs(python)]
    return json.dumps([python, module, os.environ.get("PYTHONPATH", ""), stamps])


def _env_cache(python: str, module: str) -> tuple[Path, str] | None:
    """(the cache file inside ``python``'s environment, the key of ``module`` in it), or None
    where the environment was not built from a lock (no energysweep-env.json).

    The key is the lock's sha256 with the site-packages state and PYTHONPATH of
    :func:`_cache_key`: a rebuilt environment, or a package installed by hand, is probed again.
    """
    prefix = Path(python).parent.parent
    try:
        lock = json.loads((prefix / ENV_RECORD).read_text())["lock_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    stamps = [f"{d.name}:{d.stat().st_mtime_ns}" for d in _site_dirs(python)]
    key = json.dumps([module, lock, os.environ.get("PYTHONPATH", ""), stamps])
    return prefix / ENV_CACHE, key


def _remember(cache_file: Path, key: str, result: dict) -> None:
    try:
        cache = _read_cache(cache_file)
        cache[key] = result
        write_json_atomic(cache, cache_file)
    except OSError:  # a read-only directory only costs the next run a probe
        pass


def _read_cache(cache_file: Path) -> dict:
    try:
        return json.loads(cache_file.read_text())
    except (OSError, ValueError):
        return {}


def probe(
    python: str,
    module: str,
    timeout_s: float = PROBE_TIMEOUT_S,
    cache_file: Path | None = CACHE_FILE,
) -> dict:
    """Import ``module`` with ``python`` in a subprocess; ``{"ok", "version", "detail"}``.

    Successes are cached in memory, in ``cache_file`` (keyed by the interpreter, its
    site-packages state and PYTHONPATH) and inside the environment where it was built from a
    lock (:func:`_env_cache`); failures are always probed again.
    """
    key = _cache_key(python, module)
    if key in _memo:
        return _memo[key]
    kept = [(cache_file, key)] if cache_file is not None else []
    in_env = _env_cache(python, module)
    if in_env is not None:
        kept.append(in_env)
    for file, file_key in kept:
        hit = _read_cache(file).get(file_key)
        if hit:
            _memo[key] = hit
            return hit
    code = (
        f"import {module} as m, sys; "
        "print(getattr(m, '__version__', 'unknown')); print(sys.version.split()[0])"
    )
    try:
        proc = subprocess.run(
            [python, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    except subprocess.TimeoutExpired:
        return {
            "ok": False,
            "version": None,
            "detail": f"`import {module}` did not finish within {timeout_s:.0f} s",
        }
    except OSError as exc:
        return {"ok": False, "version": None, "detail": f"cannot run it: {exc}"}
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exit status {proc.returncode}"
        return {"ok": False, "version": None, "detail": f"`import {module}` failed: {last}"}
    out = proc.stdout.split()
    result = {
        "ok": True,
        "version": out[0] if out else "unknown",
        "python_version": out[1] if len(out) > 1 else None,
        "detail": "",
    }
    _memo[key] = result
    for file, file_key in kept:
        _remember(file, file_key, result)
    return result


def check(
    config: dict,
    workflow_dir: str | Path,
    use_conda: bool = False,
    dry_run: bool = False,
    cache_file: Path | None = CACHE_FILE,
) -> tuple[list[str], list[str]]:
    """Problems with the environments of ``config["backends"]``: (errors, warnings).

    A backend on the measure job's own Python must be importable here (``find_spec``, no import);
    one with its own interpreter must have it, and the engine must import there (subprocess).
    In a dry run nothing is executed: problems are warnings, and no engine is imported.

    Args:
        config: validated config (``backends``, optional ``environments``).
        workflow_dir: the Snakefile's directory (relative interpreter paths).
        use_conda: jobs run in their conda envs: nothing to check.
        dry_run: report problems as warnings and skip the import probes.
        cache_file: where successful probes are remembered (None: memory only).
    """
    import importlib.util

    errors: list[str] = []
    warnings: list[str] = []
    if use_conda:
        return errors, warnings
    envs = config["environments"]
    for b in config["backends"]:
        module, hint = BACKENDS[b].module, BACKENDS[b].install_hint
        python = interpreter(b, envs, workflow_dir)
        if python is None:
            if importlib.util.find_spec(module) is None:
                (warnings if dry_run else errors).append(
                    f"config key backends: backend {b!r} is not installed here (no module "
                    f"{module!r} in {sys.executable}); {hint}"
                )
            continue
        key = f"environments.{b}"
        where = "set" if envs.get(b) is not None else f"default {BACKENDS[b].default_python!r}"
        if not Path(python).is_file():
            (warnings if dry_run else errors).append(
                f"config key {key}: backend {b!r} runs its ranks with {python} ({where}), "
                f"which does not exist; {hint}"
            )
            continue
        if dry_run:
            continue
        result = probe(python, module, cache_file=cache_file)
        if not result["ok"]:
            errors.append(
                f"config key {key}: backend {b!r} runs its ranks with {python} ({where}), "
                f"but its environment is broken: {result['detail']}; {hint}"
            )
    serves = any(SERVING in BACKENDS[b].scenarios for b in config["backends"])
    # One problem per key: a vLLM environment already reported broken or missing is not
    # reported again for the load generator it also holds.
    key = f"config key environments.{LOAD_GENERATOR_BACKEND}:"
    reported = any(m.startswith(key) for m in errors + warnings)
    if SERVING in config["scenarios"] and serves and not reported:
        errors += _check_load_generator(envs, workflow_dir, dry_run, warnings, cache_file)
    return errors, warnings


def _check_load_generator(envs, workflow_dir, dry_run, warnings, cache_file) -> list[str]:
    """A serving sweep's client needs vLLM's load generator in the vLLM environment."""
    b = LOAD_GENERATOR_BACKEND
    python = interpreter(b, envs, workflow_dir) or sys.executable
    problem = None
    if not Path(python).is_file():
        problem = f"{python} does not exist"
    elif not dry_run:
        result = probe(python, LOAD_GENERATOR_MODULE, cache_file=cache_file)
        problem = None if result["ok"] else result["detail"]
    if problem is None:
        return []
    msg = (
        f"config key environments.{b}: scenario serving loads every server with vLLM's load "
        f"generator ({LOAD_GENERATOR_MODULE}) from the vLLM environment, but {problem}; "
        f"{BACKENDS[b].install_hint}"
    )
    if dry_run:
        warnings.append(msg)
        return []
    return [msg]
