# Two commands: `make run` (set up, run the default sweep locally, build the report) and
# `make test` (set up, run the test suite). Both start from a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SNAKEMAKE := $(BIN)/snakemake

.PHONY: run test venv lint dryrun report clean bench slurm-up slurm-down chromium

venv: $(STAMP)

# torch is installed first and pinned: a requirement that admits a newer torch pulls a
# multi-GB CUDA build on CPU-only machines.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

# One Snakemake start-up: the sweep, then the HTML report from the same DAG (--report-after-run).
run: $(STAMP)
	$(SNAKEMAKE) --profile profiles/local --report results/report.html --report-after-run
	@echo "report: $(CURDIR)/results/report.html  (summary: results/summary.csv)"

# The report test opens results/report.html in Debian's headless chromium.
test: $(STAMP) chromium
	$(BIN)/python -m pytest -q

chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq chromium; }

lint: $(STAMP)
	$(SNAKEMAKE) --lint
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/snakefmt --check Snakefile rules

dryrun: $(STAMP)
	$(SNAKEMAKE) -n --profile profiles/local

slurm-up:
	bash cluster/slurm-local.sh up

slurm-down:
	bash cluster/slurm-local.sh down

clean:
	rm -rf results logs .snakemake
