# Everything sets itself up: venv, Python deps, Kafka jars (via mvn, cached in ~/.cache/streamsched).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: venv jars lint test test-kafka-other test-unit test-kafka demo bench broker-start broker-stop clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# The whole suite runs on the default Kafka (the newest tested release); the broker-compat tests
# and the crash matrix run again on the other tested line (its own broker, started by the fixture).
KAFKA_OTHER ?= 3.9.1

jars: venv
	$(BIN)/python -c "from streamsched.ops.broker import ensure_jars; from streamsched.kafka.version import TESTED_KAFKA_VERSIONS as V; [print('kafka jars:', ensure_jars(v)) for v in V]"

lint: venv
	$(BIN)/ruff check streamsched tests consumers bench scripts examples
	$(BIN)/mypy

test: venv jars lint
	$(BIN)/python -m pytest -q -ra
	$(MAKE) --no-print-directory test-kafka-other

test-kafka-other: venv jars
	env -u STREAMSCHED_TEST_BOOTSTRAP STREAMSCHED_KAFKA_VERSION=$(KAFKA_OTHER) \
	  $(BIN)/python -m pytest -q -ra tests/kafka/test_broker_compat.py tests/crash

test-unit: venv
	$(BIN)/python -m pytest -q -m "not kafka"

demo: venv jars
	$(BIN)/python scripts/demo.py

bench: venv jars
	$(BIN)/python bench/turns.py
	$(BIN)/python bench/schedules.py

broker-start: venv jars
	$(BIN)/streamsched broker start

broker-stop: venv
	$(BIN)/streamsched broker stop

clean:
	-$(BIN)/streamsched broker stop
	rm -rf .streamsched .pytest_cache .mypy_cache .ruff_cache
