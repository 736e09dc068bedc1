# topokeeper: `make demo` runs the whole system locally, `make test` runs every suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Debian packages the tests and the demo need: debootstrap builds the real-Slurm chroots, systemd checks the
# agent's units (systemd-analyze verify).
SYSTEM_PACKAGES := debootstrap systemd
# ssh-keygen for `topokeeper login rotate-host-keys`; ssh for the login-endpoint tests (sshd runs in a chroot).
SYSTEM_PACKAGES += openssh-client
# chromium renders the simulation report's Mermaid diagrams in tests/e2e.
SYSTEM_PACKAGES += chromium

export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDK_DISABLE_CLI_TELEMETRY := true
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install install-pcluster install-system system-packages lint typecheck test unit slurm reliability bench clean synth demo

install: $(VENV)/.installed node_modules/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $@

# ParallelCluster's own config schema for the docs' cluster-config snippets, in a venv of its own (its CDK v1
# and jsii pins cannot share the stack's); only what loading the schema needs, pinned.
PCLUSTER_VENV := .venv-pcluster
$(PCLUSTER_VENV)/.installed: tests/parallelcluster/schema-requirements.txt
	$(PYTHON) -m venv $(PCLUSTER_VENV)
	$(PCLUSTER_VENV)/bin/pip install -q --no-deps -r $<
	touch $@

install-pcluster: $(PCLUSTER_VENV)/.installed

# The CDK CLI (npx cdk ...) and Mermaid for the simulation report, pinned in package.json; reinstalled only
# when the pins or the lock change.
node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

# The CloudFormation template and assets in cdk.out/, through the pinned CLI and cdk.json (whose example values
# only synthesize when asked: a deploy of them is refused).
synth: install
	npx cdk synth --quiet -c topokeeper:examples=true
	$(BIN)/topokeeper cost --template cdk.out/Topokeeper.template.json

# The package manager's output goes to this log, not into the tests' or the demo's story.
SYSTEM_LOG := out/install-system.log
# What the demo needs of them: debootstrap for its real slurmctld (the browser and the rest are the tests').
DEMO_PACKAGES := debootstrap

install-system:
	@$(MAKE) --no-print-directory system-packages PACKAGES="$(SYSTEM_PACKAGES)" WHY="the tests need them"

system-packages:
	@missing=""; for package in $(PACKAGES); do \
	  dpkg -s $$package >/dev/null 2>&1 || missing="$$missing $$package"; done; \
	if [ -n "$$missing" ]; then \
	  mkdir -p $$(dirname $(SYSTEM_LOG)); \
	  echo "installing Debian packages:$$missing ($(WHY); apt-get's output: $(SYSTEM_LOG))"; \
	  sudo_cmd=""; [ "$$(id -u)" = 0 ] || sudo_cmd=sudo; \
	  { $$sudo_cmd apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo_cmd apt-get install -y -qq \
	    --no-upgrade $$missing; } >>$(SYSTEM_LOG) 2>&1 || { echo "apt-get failed: see $(SYSTEM_LOG)"; exit 1; }; \
	fi

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PYTHONPATH=. $(BIN)/lint-imports --no-cache

typecheck: install
	$(BIN)/mypy

test: install install-pcluster install-system lint typecheck
	$(BIN)/pytest

# The fast tier, in process: the applier, agent and head-node processes run in tests/integration.
unit: install
	$(BIN)/pytest tests/unit

slurm: install install-system
	$(BIN)/pytest tests/integration/slurm

# The crash and fault matrix on both Slurm versions (26.05 and 24.11), every crash point and fault, and every
# AWS-side fault of the backend flow; its records become docs/reliability.md (generated, never edited by hand).
RELIABILITY_RECORDS := $(CURDIR)/out/reliability.jsonl
reliability: install install-system
	rm -f $(RELIABILITY_RECORDS)
	TOPOKEEPER_RELIABILITY_FULL=1 TOPOKEEPER_RELIABILITY_OUT=$(RELIABILITY_RECORDS) \
	  $(BIN)/pytest tests/integration/slurm/test_applier_crash_matrix.py tests/unit/service/test_aws_fault_matrix.py
	# Every Allow statement of the stack's policies against every shipped scenario (docs/security.md).
	TOPOKEEPER_RELIABILITY_FULL=1 $(BIN)/pytest -q tests/integration/backend/test_stack_iam.py
	TOPOKEEPER_FUZZ_EXAMPLES=1000 TOPOKEEPER_RELIABILITY_OUT=$(RELIABILITY_RECORDS) \
	  $(BIN)/pytest -q tests/unit/test_hostile_input.py tests/unit/test_agent_hostile_input.py
	$(BIN)/python -m tests.integration.slurm.reliability_report $(RELIABILITY_RECORDS) docs/reliability.md

# The whole system on this machine: emulated AWS, the real functions and applier, a real slurmctld.
demo: install
	@$(MAKE) --no-print-directory system-packages PACKAGES="$(DEMO_PACKAGES)" \
	  WHY="debootstrap builds the demo's real slurmctld" \
	  || echo "demo: Debian packages not installed (no root or sudo?): the head node falls back to a file-only stand-in"
	$(BIN)/topokeeper demo --out out/demo
	$(BIN)/topokeeper demo --mode verify --out out/demo-verify

# Speed goals, measured (never timed tests). Each bench that reports writes its own section of
# docs/performance.md (bench/performance_doc.py assembles the file from docs/performance/*.md).
bench: install install-system
	$(BIN)/python bench/plan_scaling.py
	# The CLI's own speed: every command's --help and plan at 10,000 nodes, whole processes (issue 30).
	$(BIN)/python -m bench.cli_speed
	# The simulation report at 10,000 nodes in headless Chromium (make test runs it at 1,000).
	TOPOKEEPER_REPORT_NODES=10000 $(BIN)/pytest -q tests/e2e/test_report_in_chromium.py -k scale
	$(BIN)/python -m bench.scale --simulate
	$(BIN)/python -m bench.latency
	# Incremental (live node updates) against whole-file applies on the real slurmctld, with a probe of its RPCs.
	$(BIN)/python -m bench.incremental
	# ParallelCluster's 25.11: 600 dynamic nodes, a real slurmd each, placed as they register (issue 32).
	$(BIN)/python -m bench.registration
	# The simulator's own speed: the 1,000-node rolling scale-up make test plays (goal: under 20 s).
	$(BIN)/python -m bench.simulate_scale
	# Handler cold imports in Python 3.14, layer sizes, the applier's CPU and memory at 20,000 nodes.
	$(BIN)/python -m bench.lambda_cold_start
	# topokeeper placement on 20,000 nodes and 10,000 jobs, the whole process (goal: under 5 s).
	$(BIN)/python -m bench.placement_scaling

clean:
	rm -rf $(VENV) $(PCLUSTER_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
